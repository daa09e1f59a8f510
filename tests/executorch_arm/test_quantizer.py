"""Our quantizer's decomposition in ExecuTorch's annotation pipeline: it decomposes what
ExecuTorch's own recurrent passes fail on, leaves nodes the quantizer keeps in float alone,
and what it writes is quantized (every weight through a dequantize, SQNR vs torch eager)."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from executorch.backends.arm._passes.arm_pass_manager import ArmPassManager
from executorch.backends.arm.constants import DISALLOW_TFA_META_KEY
from executorch.backends.arm.tosa import TosaSpecification
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from recurrent_lowering.backends.executorch_arm.plan import ArmPlan
from recurrent_lowering.backends.executorch_arm.quantization import quantizer
from recurrent_lowering.backends.executorch_arm.recurrent_ops.aten import TARGET_OPS

warnings.filterwarnings("ignore", message=".*were assigned during export.*")

INT = TosaCompileSpec(TosaSpecification.create_from_string("TOSA-1.0+INT"))


class Head(nn.Module):
    def __init__(self, rnn: nn.Module, width: int):
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        y = self.rnn(x)[0]
        return torch.sigmoid(self.head(y))


def model(kind: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    rnn = {
        "gru": lambda: nn.GRU(4, 6, batch_first=True),
        "lstm": lambda: nn.LSTM(4, 6, batch_first=True, bidirectional=True),
        "rnn": lambda: nn.RNN(4, 6, nonlinearity="relu", num_layers=2),
    }[kind]()
    width = 12 if kind == "lstm" else 6
    return Head(rnn, width).eval(), torch.randn(1, 3, 4)


def recurrent_ops(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.target in TARGET_OPS]


def user_module(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """`ep.module()` as user code gets it.

    torch 2.13 leaves out the `_guards_fn` call_module whenever any caller's file name
    contains "executorch" or "torchao" (torch/export/_unlift.py), and this file's path
    does; a thread started from code with a neutral file name has no such caller.
    """
    ns: dict = {}
    exec(compile("def run(ep, out):\n    out.append(ep.module())\n", "/user/train.py", "exec"), ns)
    out: list = []
    thread = threading.Thread(target=ns["run"], args=(ep, out))
    thread.start()
    thread.join()
    return out[0]


def _ours():
    return quantizer.create(INT, ArmPlan("TOSA-1.0+INT"))


def test_tfa_with_default_module_matches_eager():
    """With the `_guards_fn` call_module of a default `.module()`, ExecuTorch's own
    DecomposeGruPass fails (it retraces); our decomposition does not retrace and succeeds."""
    m, x = model("gru")
    gm = user_module(torch.export.export(m, (x,)))
    assert [n.target for n in gm.graph.find_nodes(op="call_module")] == ["_guards_fn"]
    with pytest.raises(Exception, match="DecomposeGruPass"):
        ArmPassManager(INT).transform_for_annotation_pipeline(
            user_module(torch.export.export(m, (x,)))
        )
    for kind in ("gru", "lstm", "rnn"):
        m, x = model(kind)
        gm = user_module(torch.export.export(m, (x,)))
        out = _ours().transform_for_annotation(gm)
        assert not recurrent_ops(out), kind
        torch.testing.assert_close(out(x), m(x), atol=1e-5, rtol=0)


def test_disallowed_nodes_keep_their_op():
    m, x = model("gru")
    gm = torch.export.export(m, (x,)).module()
    for n in gm.graph.nodes:
        if n.target in TARGET_OPS:
            n.meta[DISALLOW_TFA_META_KEY] = True
    assert not _ours().decompose(gm)
    assert recurrent_ops(gm)


def test_quantizer_quantizes_our_ops():
    m, x = model("gru")
    gm = torch.export.export(m, (x,)).module()
    prepared = prepare_pt2e(gm, _ours())
    prepared(x)
    q = convert_pt2e(prepared)
    assert not recurrent_ops(q)
    linears = q.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    assert len(linears) >= 3  # input projection, recurrent steps, head
    for n in linears:  # every weight arrives through a dequantize
        assert "dequantize" in str(n.args[1].target), n.name
    ref, got = m(x), q(x)
    sqnr = 10 * torch.log10((ref**2).sum() / ((ref - got) ** 2).sum())
    assert sqnr > 35, float(sqnr)
