"""ONNX recurrent nodes that torch's nn.GRU/LSTM/RNN compute exactly become those modules
in the converted program, the others the layer op carrying the core's description (both
match onnxruntime); nodes neither carries say why they are rewritten."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
import torch

from recurrent_lowering.backends.onnx import rewrite
from recurrent_lowering.backends.onnx.input_sizes import input_specs
from recurrent_lowering.backends.onnx_to_torch import convert as to_torch
from recurrent_lowering.backends.onnx_to_torch import recurrent_modules as torch_recurrent
from recurrent_lowering.passes.spec import SpecError
from recurrent_lowering.tests.onnx import models

C = models.Config
EXPRESSIBLE = [
    C(op="GRU", linear_before_reset=1),
    C(op="GRU", linear_before_reset=1, direction="bidirectional", initial_h=True, layout=1),
    C(op="GRU", linear_before_reset=1, outputs=(False, True, False)),
    C(op="GRU", linear_before_reset=1, sequence_lens="constant"),  # every sequence full
    C(op="LSTM", initial_h=True, initial_c=True),
    C(op="LSTM", initial_h=True, direction="bidirectional", outputs=(False, True, True)),
    C(op="LSTM", initial_c=True, layout=1),
    C(op="RNN", activations=["Relu"]),
    C(op="RNN", direction="bidirectional", bias=False),
]
LAYER_OPS = [
    C(op="GRU"),  # linear_before_reset=0
    C(op="GRU", direction="bidirectional", initial_h=True, layout=1),
    C(op="LSTM", peepholes=True, initial_h=True, initial_c=True),
    C(op="LSTM", peepholes=True, direction="bidirectional", outputs=(True, True, True)),
    C(op="RNN", direction="reverse"),
    C(op="GRU", linear_before_reset=1, clip=0.5),
    C(op="LSTM", input_forget=1),
    C(op="RNN", activations=["Sigmoid"]),
    C(op="GRU", activations=["HardSigmoid", "Tanh"], activation_alpha=[0.3], activation_beta=[0.4]),
    C(op="GRU", linear_before_reset=1, sequence_lens="input"),
    C(op="LSTM", sequence_lens="input", direction="bidirectional"),
]
NOT_CARRIED = [
    (C(op="GRU", linear_before_reset=1, dtype=np.float64), "float64 (recurrent layers run"),
]


def _convert(model):
    """(converted GraphModule, reasons for the nodes rewritten instead)."""
    selection = torch_recurrent.Selection()
    rewritten = rewrite.rewrite_model(
        model, emission="unrolled", require_constant_weights=True, keep=selection
    )
    return to_torch.onnx_to_torch(rewritten, selection.kept), selection.rewritten


def _build(cfg):
    if cfg.sequence_lens == "constant":
        lens = np.full(cfg.batch, cfg.steps, np.int32)
        return models.build(cfg, feeds={**models.runtime_inputs(cfg), "sequence_lens": lens})
    return models.build(cfg)


def _assert_matches_onnxruntime(gm, model, feeds, layout: int) -> None:
    """onnxruntime runs layout=1 nodes only after conversion to layout 0."""
    native = models.to_layout0(model) if layout else model
    want = ort.InferenceSession(native.SerializeToString()).run(None, feeds)
    names = [name for name, _, _ in input_specs(model)]
    with torch.no_grad():
        got = gm(*[torch.from_numpy(feeds[n]) for n in names])
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg", EXPRESSIBLE, ids=str)
def test_expressible_node_becomes_torch_module_and_matches_onnxruntime(cfg):
    model, feeds = _build(cfg)
    gm, reasons = _convert(model)
    assert reasons == {}
    kinds = [type(m).__name__ for m in gm.modules() if isinstance(m, torch.nn.RNNBase)]
    assert kinds == [cfg.op]
    _assert_matches_onnxruntime(gm, model, feeds, cfg.layout)


@pytest.mark.parametrize("cfg", LAYER_OPS, ids=str)
def test_other_nodes_become_the_layer_op_and_match_onnxruntime(cfg):
    model, feeds = _build(cfg)
    gm, reasons = _convert(model)
    assert reasons == {}
    assert not [m for m in gm.modules() if isinstance(m, torch.nn.RNNBase)]
    assert len([m for m in gm.modules() if isinstance(m, torch_recurrent.OnnxLayer)]) == 1
    _assert_matches_onnxruntime(gm, model, feeds, cfg.layout)


@pytest.mark.parametrize("cfg,reason", NOT_CARRIED, ids=[r for _, r in NOT_CARRIED])
def test_nodes_no_torch_op_carries_are_rewritten_with_the_reason(cfg, reason):
    model, _ = _build(cfg)
    gm, reasons = _convert(model)
    assert len(reasons) == 1 and next(iter(reasons.values())).startswith(reason)
    assert not [m for m in gm.modules() if isinstance(m, torch.nn.RNNBase)]
    assert not [m for m in gm.modules() if isinstance(m, torch_recurrent.OnnxLayer)]


def test_graph_output_read_by_a_later_node():
    """Y_h is both a graph output and read by a later node: the Identity that carries the
    graph output must come before that reader (onnx2torch takes nodes in order)."""
    from onnx import TensorProto, helper

    model, feeds = models.build(C(op="GRU", linear_before_reset=1))
    graph = model.graph
    graph.node.append(helper.make_node("Relu", ["Y_h"], ["Y_h_relu"]))
    graph.output.append(helper.make_tensor_value_info("Y_h_relu", TensorProto.FLOAT, None))
    gm, reasons = _convert(model)
    assert reasons == {}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    with torch.no_grad():
        got = gm(torch.from_numpy(feeds["X"]))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", [0, 1])
def test_streaming_state_pair_is_found_for_sharing(layout):
    """A streaming node (initial_h in, Y_h out) exports with h0 feeding the recurrent op and
    h_n leaving it, directly at layout 0, through the permutes of its layout at layout 1:
    the pair the quantizer gives one scale either way."""
    from recurrent_lowering.backends.executorch_arm.quantization import (
        states as recurrent_quantization,
    )

    cfg = C(op="GRU", linear_before_reset=1, initial_h=True, steps=1, batch=1, layout=layout)
    model, feeds = models.build(dataclasses.replace(cfg, outputs=(False, True, False)))
    gm, _ = _convert(model)
    names = [name for name, _, _ in input_specs(model)]
    program = torch.export.export(gm, tuple(torch.from_numpy(feeds[n]) for n in names))
    assert len(recurrent_quantization.state_pairs(program.graph)) == 1


@pytest.mark.parametrize("module", [torch.nn.GRU(5, 7), torch.nn.LSTM(5, 7, num_layers=2)])
def test_plain_torch_onnx_export(module, tmp_path):
    """torch.onnx.export of a bare layer without h0: its weights all go into the torch
    module, and the zero-h0 chain (Shape -> ... -> Expand) is folded into an initializer
    of a model that had no other (an AttributeError before)."""
    import onnx

    x = torch.randn(6, 2, 5)
    path = tmp_path / "m.onnx"
    torch.onnx.export(module.eval(), (x,), str(path), dynamo=False, opset_version=14)
    model = onnx.load(str(path))
    gm, reasons = _convert(model)
    assert reasons == {}
    want = ort.InferenceSession(str(path)).run(None, {model.graph.input[0].name: x.numpy()})
    with torch.no_grad():
        got = gm(x)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("emission", ["unrolled", "loop"])
@pytest.mark.parametrize(
    "cfg",
    [
        C(op="LSTM", peepholes=True, direction="bidirectional", initial_h=True, clip=2.0),
        C(op="GRU", layout=1, initial_h=True),  # linear_before_reset=0
        C(op="RNN", direction="reverse", activations=["HardSigmoid"], activation_alpha=[0.3]),
        C(op="GRU", sequence_lens="constant_short"),
    ],
    ids=str,
)
def test_layer_op_decomposes_to_what_onnxruntime_computes(cfg, emission):
    """The exported layer op, decomposed by the Arm adapter in either form (the loop form
    run through its step programs), against onnxruntime on the ONNX node."""
    from recurrent_lowering.backends.executorch_arm.emission import decompose
    from recurrent_lowering.backends.executorch_arm.exported import as_module
    from recurrent_lowering.backends.executorch_arm.loop import op as loop_op
    from recurrent_lowering.backends.executorch_arm.recurrent_ops import aten

    feeds = None
    if cfg.sequence_lens == "constant_short":
        lens = np.arange(cfg.batch, dtype=np.int32) % cfg.steps + 1
        cfg = dataclasses.replace(cfg, sequence_lens="constant")
        feeds = {**models.runtime_inputs(cfg), "sequence_lens": lens}
    model, feeds = models.build(cfg, feeds=feeds) if feeds else models.build(cfg)
    gm, reasons = _convert(model)
    assert reasons == {}
    native = models.to_layout0(model) if cfg.layout else model
    want = ort.InferenceSession(native.SerializeToString()).run(None, feeds)
    names = [name for name, _, _ in input_specs(model)]
    example = tuple(torch.from_numpy(feeds[n]) for n in names)
    exported = torch.export.export(gm, example)
    if emission == "loop" and cfg.sequence_lens:  # "auto" unrolls it
        with pytest.raises(SpecError, match="sequence_lens"):
            decompose.decompose_recurrent(exported, emission)
        emission = "auto"
    program = decompose.decompose_recurrent(exported, emission)
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert not targets & aten.TARGET_OPS
    assert (loop_op.OP in targets) == (emission == "loop")  # 2 to 4 steps: "auto" unrolls
    got = loop_op.run_graph(as_module(program), *example, record=False)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, atol=1e-5, rtol=0)
