"""Weights fed at run time (W, R, B, P as graph inputs), rewritten as they are.

ONNX's own node tests feed every weight as a graph input; the rewritten graph must read
them there (no conversion to initializers) and give the tests' expected outputs under
onnxruntime. A few configurations of the matrix check runtime weights against the core's
numpy reference with the same weights as constants.
"""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import helper

from recurrent_lowering.backends.onnx.rewrite import rewrite_model

from . import models
from .cases import node_cases, numpy_reference
from .ort_util import assert_close, check_rewritten, run

CASES = node_cases()

WEIGHTS = ("W", "R", "B", "P")


@pytest.mark.parametrize("emission", ["auto", "loop"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case_as_is(name, emission):
    case = CASES[name]
    model = case.model
    (node,) = model.graph.node
    runtime = {node.input[i] for i in (1, 2, 3, 7) if i < len(node.input) and node.input[i]}
    assert runtime <= {i.name for i in model.graph.input} and not model.graph.initializer
    rewritten = rewrite_model(model, emission=emission)
    check_rewritten(rewritten)
    assert not runtime & {t.name for t in rewritten.graph.initializer}
    assert [i.name for i in rewritten.graph.input] == [i.name for i in model.graph.input]
    read = {i for n in rewritten.graph.node for i in n.input}
    assert node.input[1] in read  # the weights are read where the model feeds them
    # R only where some step has a state: more than one step, or an initial h
    steps = case.data_sets[0][0][0].shape[0 if _layout(node) == 0 else 1]
    initial_h = len(node.input) > 5 and bool(node.input[5])
    assert (node.input[2] in read) == (steps > 1 or initial_h)
    for inputs, expected in case.data_sets:
        names = [i.name for i in model.graph.input]
        got = run(rewritten, {n: np.asarray(v) for n, v in zip(names, inputs)})
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_close(g, e)


def _layout(node) -> int:
    return next((a.i for a in node.attribute if a.name == "layout"), 0)


def _as_graph_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """The model with its weight initializers turned into graph inputs, and their values."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    moved = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer if t.name in WEIGHTS}
    kept = [t for t in g.initializer if t.name not in moved]
    del g.initializer[:]
    g.initializer.extend(kept)
    for name, v in moved.items():
        elem = helper.np_dtype_to_tensor_dtype(v.dtype)
        g.input.append(helper.make_tensor_value_info(name, elem, list(v.shape)))
    return out, moved


MATRIX = [
    models.Config(op="GRU", direction="bidirectional", linear_before_reset=1, initial_h=True),
    models.Config(op="GRU", direction="reverse", linear_before_reset=0, sequence_lens="input"),
    models.Config(op="GRU", linear_before_reset=1, layout=1, clip=0.9),
    models.Config(
        op="LSTM", direction="bidirectional", peepholes=True, initial_h=True, initial_c=True
    ),
    models.Config(op="LSTM", input_forget=1, peepholes=True, sequence_lens="constant"),
    models.Config(op="LSTM", dtype=np.float64, opset=11, bias=False),
    models.Config(op="RNN", direction="bidirectional", initial_h=True),
    models.Config(op="RNN", direction="reverse", activations=["Relu"]),
]


@pytest.mark.parametrize("emission", ["unrolled", "loop"])
@pytest.mark.parametrize("index", range(len(MATRIX)), ids=lambda i: MATRIX[i].op + str(i))
def test_runtime_weights_match_the_numpy_reference(index, emission):
    cfg = MATRIX[index]
    model, feeds = models.build(cfg)
    runtime_model, weights = _as_graph_inputs(model)
    rewritten = rewrite_model(runtime_model, emission=emission)
    check_rewritten(rewritten)
    assert not set(weights) & {t.name for t in rewritten.graph.initializer}
    got = run(rewritten, {**feeds, **weights})
    for g, r in zip(got, numpy_reference(model, feeds), strict=True):
        assert_close(g, r)


def test_runtime_weights_cost_no_ops_per_step():
    """Arranging runtime weights happens once per node, not per timestep."""

    def nodes(steps, runtime):
        cfg = dataclasses.replace(MATRIX[3], steps=steps)
        model = models.build(cfg)[0]
        if runtime:
            model = _as_graph_inputs(model)[0]
        return len(rewrite_model(model, emission="unrolled").graph.node)

    per_step_constant = nodes(7, False) - nodes(4, False)
    assert nodes(7, True) - nodes(4, True) == per_step_constant
