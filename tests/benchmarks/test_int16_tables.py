"""benchmarks/int16_tables.py: a converted module with ExecuTorch's int16 TABLEs emulated
computes what the lowered program does on the TOSA reference model, where the exact
functions do not."""

from __future__ import annotations

import numpy as np
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.options import Options
from recurrent_lowering.backends.executorch_arm.precision import candidates
from recurrent_lowering.backends.executorch_arm.quantization import quantizer as our_quantizer
from recurrent_lowering.benchmarks import int16_tables
from recurrent_lowering.runtime import arm_numerics

TARGET = "TOSA-1.0+INT+int16"


class _Tables(torch.nn.Module):
    def forward(self, x):  # |x| by a root over values spanning decades, and a gate
        return torch.sqrt(x * x), torch.sigmoid(x)


def _inputs(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 512, generator=g) * torch.exp(torch.linspace(-7, 1, 512)),)


def test_emulated_tables_follow_the_tosa_program(tmp_path):
    module = _Tables().eval()
    calibration = [_inputs(seed) for seed in range(4)]
    held_out = _inputs(100)
    plan = candidates.candidates(Options(TARGET, quantization="int16"), module, held_out)[0]
    spec = flow.compile_spec(plan.target, tmp_path, None, None)
    quantizer = our_quantizer.create(spec, plan)
    converted = flow.quantize(module, calibration[0], quantizer, calibration)
    emulated, names = int16_tables.emulate(converted, int16_tables.chooser("all"))
    assert sorted(n.split("_")[0] for n in names) == ["pow", "sigmoid"]  # sqrt: pow(x, 0.5)

    result = flow.lower(
        module,
        calibration[0],
        TARGET,
        artifact_dir=tmp_path / "lowered",
        quantization="int16",
        calibration_inputs=calibration,
    )
    program = arm_numerics.run(result, held_out)
    for k, (exact, table) in enumerate(zip(converted(*held_out), emulated(*held_out))):
        want = np.reshape(program[k], exact.shape)
        code = result.output_quant[result.output_map[k]].scale
        assert np.max(np.abs(table.numpy() - want)) <= 1e-3 * code, f"output {k}"
        if k == 0:  # sqrt's first step from 0 is interpolated: the exact root is off there
            assert np.max(np.abs(exact.numpy() - want)) > 100 * code
