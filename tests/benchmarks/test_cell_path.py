"""benchmarks/cell_path.py: an LSTM loop step with its cell-state path unquantized carries
a c beyond the step's calibrated range as the float step does, where the quantized step
clips it to its state's scale."""

from __future__ import annotations

import pathlib

import torch

from recurrent_lowering.backends.executorch_arm import compat, flow
from recurrent_lowering.backends.executorch_arm.loop import op as loop_op
from recurrent_lowering.backends.executorch_arm.loop import step as loop_step
from recurrent_lowering.backends.executorch_arm.options import Options
from recurrent_lowering.backends.executorch_arm.precision import candidates
from recurrent_lowering.backends.executorch_arm.quantization import quantizer
from recurrent_lowering.benchmarks import cell_path
from recurrent_lowering.tests.executorch_arm.sequence_output import SequenceOutput


def test_the_cell_state_path_escapes_the_state_scale(tmp_path):
    torch.manual_seed(0)
    module = SequenceOutput(torch.nn.LSTM(8, 16, batch_first=True)).eval()
    samples = [(torch.randn(1, 16, 8),) for _ in range(4)]
    plan = candidates.candidates(
        Options("TOSA-1.0+INT+int16", quantization="int16"), module, samples[0]
    )[0]
    with compat.lowering():
        spec = flow.compile_spec(plan.target, pathlib.Path(tmp_path), None, None)
        ours = quantizer.create(spec, plan)
        converted = flow.quantize(module, samples[0], ours, samples)
        loops = [n for n in converted.graph.nodes if n.target is loop_op.OP]
        assert len(loops) == 1
        program = loop_op.program_of(loops[0])
        step = loop_step.simulated(loops[0], ours.tosa_spec)
    assert program.num_states == 2
    chosen = cell_path.path(step, 2)
    assert chosen[0].op == "placeholder" and len(chosen) >= 4  # c, f * c, c', i * g
    wide = cell_path.unquantized(step, 2)
    assert cell_path.path(step, 2)[0].name == chosen[0].name  # the original is left as it was

    h, c, x = (t.clone() for t in program.samples[0])
    c = torch.full_like(c, 50.0)  # far beyond what calibration saw
    with torch.no_grad():
        want = program.step(h, c, x)[1]
        got = wide(h, c, x)[1]
        clipped = step(h, c, x)[1]
    assert (got - want).abs().max() < 0.01 * 50, (got - want).abs().max()
    assert (clipped - want).abs().max() > 10  # the quantized step's c stays in its range
