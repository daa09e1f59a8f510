"""Recurrent layers kept on the CPU (--keep_recurrent_on_cpu): decomposed into portable ops,
rejected by the partitioner, the rest delegated.

- a bare streaming GRU on TOSA-1.0+FP: nothing delegated, the .pte runs in ExecuTorch's host
  runtime (no aten::gru kernel there) and equals torch eager to 1e-5;
- stream_gru on Ethos-U55-128 (INT8): the GRU stays in float on the CPU, the head is one
  delegate; checked split: the CPU part's ops, run as their own CPU-only program on the host,
  feed the delegate's .tosa on the TOSA reference model (runtime/delegate_run.py); the
  whole program run at once (delegate_run.run_program: CPU ops in torch eager) agrees;
- ops Ethos-U55 cannot run (gt, where) stay on the CPU between two delegates, with reasons;
  arm_numerics.check runs that program whole against fp32 torch eager.
"""

import numpy as np
import torch
import tosa_serializer as ts
from torch import nn

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.emission import origin
from recurrent_lowering.backends.executorch_arm.partition import cpu_reasons as fallback
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics, delegate_run, executorch_host, streaming
from recurrent_lowering.tests.executorch_arm.fallback_models import MaskedHead


class Recurrent(nn.Module):
    """Just a module's recurrent layer, streaming: (x, h0) -> (y, h_n)."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h0):
        return self.rnn(x, h0)


def _lower_keeping_recurrent(module, inputs, target, tmp_path, calibration=None):
    return flow.lower(
        module,
        inputs,
        target,
        tmp_path,
        calibration_inputs=calibration,
        keep_recurrent_on_cpu=True,
        run_vela=False,
    )


def test_bare_gru_on_cpu_runs_on_host(tmp_path):
    torch.manual_seed(0)
    module = Recurrent(nn.GRU(8, 16, batch_first=True)).eval()
    inputs = (torch.randn(1, 3, 8), torch.randn(1, 1, 16) * 0.5)
    result = _lower_keeping_recurrent(module, inputs, "TOSA-1.0+FP", tmp_path)
    assert result.num_delegates == 0
    assert result.cpu_nodes > 0
    assert dict(result.cpu_reasons) == {fallback.KEPT_ON_CPU: result.cpu_nodes}
    outputs = executorch_host.run_pte(result.pte, [t.numpy() for t in inputs])
    with torch.no_grad():
        expected = module(*inputs)
    assert len(outputs) == 2
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=0)


def test_stream_gru_u55_gru_on_cpu_head_delegated(tmp_path):
    module, inputs = models.build("stream_gru")
    h0 = torch.zeros(inputs[1].shape)  # a stream starting from rest
    calibration = streaming.fp32_states(module, streaming.frames(32, inputs[0].shape, 1), h0)
    mixed = _lower_keeping_recurrent(module, inputs, "ethos-u55-128", tmp_path / "u55", calibration)
    assert mixed.num_delegates == 1 and b"vela_bin_stream" in mixed.pte
    reasons = dict(mixed.cpu_reasons)
    assert reasons.pop(fallback.QDQ_AT_BOUNDARY) == 2  # quantize into the head, dequantize out
    kept = reasons.pop(fallback.KEPT_ON_CPU)
    assert reasons == {}  # nothing else left on the CPU
    assert kept + 2 == mixed.cpu_nodes
    # the head: fc1, tanh, fc2, sigmoid as TOSA ops, no recurrent op in the delegate
    assert mixed.tosa_op_counts["CONV2D"] == 2  # fc1, fc2 (the GRU's linears would add more)
    assert mixed.tosa_op_counts["TABLE"] == 2  # tanh, sigmoid (the GRU's gates would add three)

    # The CPU part alone: the same recurrent ops, as a CPU-only program on the host runtime.
    cpu = _lower_keeping_recurrent(Recurrent(module.rnn), inputs, "TOSA-1.0+FP", tmp_path / "cpu")
    assert cpu.num_delegates == 0
    assert cpu.cpu_reasons[fallback.KEPT_ON_CPU] == kept
    (boundary,) = mixed.boundaries.values()
    # frames the quantizer was not calibrated on
    samples = streaming.fp32_states(module, streaming.frames(4, inputs[0].shape, 2), h0)
    h_errors, score_errors, whole_vs_split = [], [], []
    for x, h in samples:
        y, h_n = executorch_host.run_pte(cpu.pte, [x.numpy(), h.numpy()])
        (score,) = delegate_run.run_delegate(mixed.tosa_files[0], boundary, [y])
        with torch.no_grad():
            want_score, want_h = (t.numpy() for t in module(x, h))
        h_errors.append(float(np.abs(h_n - want_h).max()))
        score_errors.append(abs(float(score.reshape(-1)[0]) - float(want_score.reshape(-1)[0])))
        # the whole program at once: the same delegate, the CPU part in torch eager
        whole_score, whole_h = delegate_run.run_program(
            mixed.program_module, mixed.tosa_files, (x, h)
        )
        assert float(np.abs(whole_h - h_n).max()) <= 1e-5
        whole_vs_split.append(abs(float(whole_score.reshape(-1)[0]) - float(score.reshape(-1)[0])))
    print(f"split run: h_n max err {max(h_errors):.2e}, score errors {score_errors}")
    assert max(h_errors) <= 1e-5  # a float GRU on the CPU
    assert max(score_errors) < 0.01  # an int8 head (one LSB of its sigmoid is 1/256)
    assert max(whole_vs_split) <= 1 / 256 + 1e-6  # at most one LSB where h_n rounds apart
    numerics = arm_numerics.check(mixed, module, samples[0])
    assert numerics.max_abs_err < 0.01


def test_ops_the_npu_cannot_run_stay_on_cpu(tmp_path):
    torch.manual_seed(0)
    module = MaskedHead().eval()
    result = flow.lower(
        module,
        (torch.randn(1, 3, 4),),
        "ethos-u55-128",
        artifact_dir=tmp_path,
        quantization="int8",
        run_vela=False,
    )
    reasons = dict(result.cpu_reasons)
    spec = "TOSA-1.0+INT+int16+int4+u55"
    assert reasons.pop(f"gt.Tensor not supported on {spec}") == 1
    assert reasons.pop(f"where.self not supported on {spec}") == 1
    assert set(reasons) == {fallback.QDQ_AT_BOUNDARY}  # the rest is delegated
    assert result.num_delegates == 2  # the GRU before the mask, the head after it
    assert sum(result.cpu_reasons.values()) == result.cpu_nodes
    # run whole: both delegates on the TOSA reference model, gt/where and q/dq in eager
    x = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(1))
    numerics = arm_numerics.check(result, module, (x,))
    print(f"MaskedHead int8, two delegates: SQNR {numerics.sqnr_db:.1f} dB")
    # measured 21.9 dB: int8, and gt at 0.1 flips where y rounds across it; delegates run
    # in the wrong order or on the wrong dtype give noise (below 0 dB) or an error
    assert numerics.sqnr_db > 15


def test_recurrent_ops_outside_a_delegate_are_counted_per_layer():
    """What `lower` warns about: ops of a recurrent layer the partitioner left on the CPU
    (q/dq at its edges aside), not the model's other CPU ops nor its delegated ones."""

    def quantize_per_tensor(x):  # stands in for the q/dq ops, recognised by name
        return x

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    gru = origin.tagged(None, layer="rnn")  # what FxBuilder tags the layer's nodes with
    on_cpu = graph.call_function(torch.ops.aten.sigmoid.default, (x,))
    on_cpu.meta["custom"] = gru
    delegated = graph.call_function(torch.ops.aten.tanh.default, (on_cpu,))
    delegated.meta.update(custom=gru, delegation_tag="tag0")
    qdq = graph.call_function(quantize_per_tensor, (delegated,))
    qdq.meta["custom"] = gru
    head = graph.call_function(torch.ops.aten.relu.default, (qdq,))
    graph.output(head)
    assert fallback.recurrent_on_cpu(graph) == {"rnn": 1}


class _ConstantDelegateOutput(nn.Module):
    """A GRU, then where(y > 0.1, y, table): gt and where stay on the CPU for U55, and the
    second delegate outputs a constant that ExecuTorch folded into a CONST."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.register_buffer("table", torch.linspace(-1, 1, 8))

    def forward(self, x):
        y, _ = self.gru(x)
        return torch.where(y > 0.1, y, self.table.view(1, 1, 8)) * 2.0


def test_a_constant_delegate_output_is_checked_in_pieces(tmp_path, monkeypatch):
    """The numerics check of a program whose delegate outputs a constant, with the TOSA run
    in pieces (as a large graph is): the same outputs as run whole."""
    from recurrent_lowering.runtime import tosa_copy, tosa_pieces

    module, x = _ConstantDelegateOutput().eval(), (torch.randn(1, 3, 4),)
    result = flow.lower(module, x, "ethos-u55-128", tmp_path, quantization="int8", run_vela=False)
    assert result.num_delegates == 2
    const_outputs = []
    for f in result.tosa_files:
        block = tosa_copy.load(f.read_bytes()).regions[0].basicBlocks[0]
        producer = {n: op.op for op in block.operators for n in op.outputs}
        const_outputs += [o for o in block.outputs if producer.get(o) == ts.Op.CONST]
    assert const_outputs  # the shape this test is about
    whole = arm_numerics.check(result, module, x)
    monkeypatch.setattr(tosa_pieces, "MAX_OPS", 1)
    pieces = arm_numerics.check(result, module, x)
    for a, b in zip(whole.tosa, pieces.tosa):
        np.testing.assert_array_equal(a, b)
    assert whole.sqnr_db > 30
