"""Our Arm passes in ExecuTorch's pipelines: scheduling, cheap skips, numerics, quantization."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from executorch.backends.arm._passes.arm_pass_manager import ArmPassManager
from executorch.backends.arm.constants import DISALLOW_TFA_META_KEY
from executorch.backends.arm.quantizer import get_symmetric_quantization_config
from executorch.backends.arm.tosa import TosaSpecification
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from recurrent_lowering.backends.executorch_arm import arm_hooks, arm_passes
from recurrent_lowering.backends.executorch_arm.decompose import TARGET_OPS

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


def test_manager_puts_ours_in_each_executorch_slot():
    base, ours = ArmPassManager(INT), arm_passes.RecurrentArmPassManager(INT)
    gm = torch.export.export(*_args(model("gru"))).module()
    base.transform_for_annotation_pipeline(gm)
    ours.transform_for_annotation_pipeline(torch.export.export(*_args(model("gru"))).module())
    names = [type(p).__name__ for p in base.passes]
    swapped = [type(p).__name__ for p in ours.passes]
    for et, mine in arm_passes.REPLACEMENTS.items():
        assert swapped[names.index(et.__name__)] == mine.__name__
    assert not set(arm_passes.REPLACEMENTS) & {type(p) for p in ours.passes}


def _args(mx):
    m, x = mx
    return m, (x,)


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


def test_tfa_pipeline_with_default_module_matches_eager():
    """With the `_guards_fn` call_module of a default `.module()`, ExecuTorch's own
    DecomposeGruPass fails (it retraces); ours does not retrace and succeeds."""
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
        out = arm_passes.RecurrentArmPassManager(INT).transform_for_annotation_pipeline(gm)
        assert not recurrent_ops(out), kind
        torch.testing.assert_close(out(x), m(x), atol=1e-5, rtol=0)


class Counting(arm_passes.DecomposeGruRecurrentPass):
    calls = 0

    def call(self, graph_module):
        Counting.calls += 1
        return super().call(graph_module)


def test_graphs_without_target_ops_are_skipped_before_call():
    lstm_only, x = model("lstm")
    gm = torch.export.export(lstm_only, (x,)).module()
    before = [n.format_node() for n in gm.graph.nodes]
    result = Counting(tfa_pass=True)(gm)
    assert Counting.calls == 0 and not result.modified
    assert [n.format_node() for n in gm.graph.nodes] == before
    Counting(tfa_pass=True)(torch.export.export(*_args(model("gru"))).module())
    assert Counting.calls == 1


def test_disallowed_nodes_keep_their_op():
    m, x = model("gru")
    gm = torch.export.export(m, (x,)).module()
    for n in gm.graph.nodes:
        if n.target in TARGET_OPS:
            n.meta[DISALLOW_TFA_META_KEY] = True
    result = arm_passes.DecomposeGruRecurrentPass(tfa_pass=True)(gm)
    assert not result.modified and recurrent_ops(gm)


def test_quantizer_hook_quantizes_our_ops():
    m, x = model("gru")
    gm = torch.export.export(m, (x,)).module()
    quantizer = arm_hooks.create_quantizer(INT)
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(gm, quantizer)
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
