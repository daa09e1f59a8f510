"""A lowering leaves the caller's module as it was: ExecuTorch 1.5.1 folds `conv(x) * s` into
the convolution's weight in place, and the quantization works on copies
(exported.with_own_tensors)."""

from __future__ import annotations

import copy

import torch
from executorch.backends.arm._passes.fold_scalar_mul_into_conv_pass import (
    FoldScalarMulIntoConvPass,
)
from executorch.backends.arm.tosa import TosaSpecification
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.exported import module_of, with_own_tensors
from recurrent_lowering.backends.executorch_arm.plan import ArmPlan
from recurrent_lowering.backends.executorch_arm.quantization import quantizer
from recurrent_lowering.runtime import arm_numerics


class _ScaledConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, (1, 3), padding=(0, 1))
        self.head = torch.nn.Conv2d(8, 4, (1, 1))

    def forward(self, x):
        return self.head(torch.tanh(self.conv(x) * 4))


def _model_and_input():
    torch.manual_seed(0)
    return _ScaledConv().eval(), (torch.randn(1, 4, 1, 20),)


def _folded(gm) -> bool:
    return FoldScalarMulIntoConvPass(tfa_pass=True)(gm).modified


def test_executorch_folds_into_the_exported_modules_own_weight():
    """The behaviour with_own_tensors answers; should ExecuTorch stop writing in place,
    the copy is no longer needed."""
    model, x = _model_and_input()
    before = model.conv.weight.detach().clone()
    assert _folded(module_of(torch.export.export(model, x)))
    assert torch.allclose(model.conv.weight, 4 * before)


def test_a_copy_keeps_the_caller_s_weights():
    model, x = _model_and_input()
    before = model.conv.weight.detach().clone()
    assert _folded(with_own_tensors(module_of(torch.export.export(model, x))))
    assert torch.equal(model.conv.weight, before)


def test_lowering_twice_gives_one_program_and_leaves_the_module(tmp_path):
    model, x = _model_and_input()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    results = [
        flow.lower(model, x, "TOSA-1.0+INT", tmp_path / str(k), quantization="int16")
        for k in range(2)
    ]
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    first, second = (r.tosa_files[0].read_bytes() for r in results)
    assert first == second
    assert arm_numerics.check(results[1], model, x).sqnr_db > 40


def _quantized(model, x, graph_module=None):
    spec = TosaCompileSpec(TosaSpecification.create_from_string("TOSA-1.0+INT"))
    made = quantizer.create(spec, ArmPlan("TOSA-1.0+INT"))
    return flow.quantize(model, x, made, graph_module=graph_module)


def test_candidates_quantize_copies_of_one_export():
    """auto exports the module once and each candidate quantizes a copy (flow._converted):
    every copy folds into its own weights, so each candidate gets the program a fresh
    export gives and the shared graph stays the float one."""
    model, x = _model_and_input()
    graph = flow.float_graph(model, x)
    weights = {k: v.clone() for k, v in graph.state_dict().items()}
    fresh = _quantized(model, x)
    copies = [_quantized(model, x, copy.deepcopy(graph)) for _ in range(2)]
    assert all(torch.equal(v, weights[k]) for k, v in graph.state_dict().items())
    for converted in copies:
        assert converted.code == fresh.code
        assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in converted.state_dict().items())
        assert torch.equal(converted(*x), fresh(*x))
