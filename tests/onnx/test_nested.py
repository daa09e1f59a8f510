"""Recurrent nodes inside If branches and a Loop body are rewritten in place, with their
weights (outer-scope initializers) folded, and the model computes the same as before."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.backends.onnx.rewrite import count_recurrent_nodes, rewrite_model

from . import models
from .ort_util import assert_close, check_rewritten, run

H, IN, B, T = 4, 3, 2, 5


def _weights(op, seed):
    return models.weights(models.Config(op=op, hidden_size=H, input_size=IN), seed)


def _model():
    gru, lstm, loop_gru = _weights("GRU", 0), _weights("LSTM", 1), _weights("GRU", 2)
    inits = []
    for prefix, w in (("gru_", gru), ("lstm_", lstm), ("loop_", loop_gru)):
        inits += [numpy_helper.from_array(v, prefix + k) for k, v in w.items()]
    y_h = helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [1, B, H])

    then_graph = helper.make_graph(
        [
            helper.make_node(
                "GRU",
                ["X", "gru_W", "gru_R", "gru_B"],
                ["", "then_h"],
                name="then/GRU",
                hidden_size=H,
            )
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_h", TensorProto.FLOAT, [1, B, H])],
    )
    else_graph = helper.make_graph(
        [
            helper.make_node(
                "LSTM",
                ["X", "lstm_W", "lstm_R", "lstm_B"],
                ["", "else_h"],
                name="else/LSTM",
                hidden_size=H,
            )
        ],
        "else",
        [],
        [helper.make_tensor_value_info("else_h", TensorProto.FLOAT, [1, B, H])],
    )
    if_node = helper.make_node(
        "If", ["cond"], ["y_h"], name="branch", then_branch=then_graph, else_branch=else_graph
    )

    # Loop: h <- GRU(X, initial_h=h) three times, Y of the last step scanned out.
    body = helper.make_graph(
        [
            helper.make_node(
                "GRU",
                ["X", "loop_W", "loop_R", "loop_B", "", "h_in"],
                ["loop_y", "h_out"],
                name="loop/GRU",
                hidden_size=H,
            ),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, B, H]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, B, H]),
            helper.make_tensor_value_info("loop_y", TensorProto.FLOAT, [T, 1, B, H]),
        ],
    )
    loop = helper.make_node(
        "Loop", ["trip", "", "h0"], ["loop_h", "loop_ys"], name="loop", body=body
    )
    inits.append(numpy_helper.from_array(np.array(3, np.int64), "trip"))
    graph = helper.make_graph(
        [if_node, loop],
        "nested",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, B, IN]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, B, H]),
        ],
        [
            y_h,
            helper.make_tensor_value_info("loop_h", TensorProto.FLOAT, [1, B, H]),
            helper.make_tensor_value_info("loop_ys", TensorProto.FLOAT, [3, T, 1, B, H]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_if_and_loop_bodies_are_rewritten():
    model = _model()
    onnx.checker.check_model(model, full_check=True)
    assert count_recurrent_nodes(model) == 3
    rewritten = rewrite_model(model)
    check_rewritten(rewritten)
    # the old weights are gone, new ones live in the top-level graph
    names = {t.name for t in rewritten.graph.initializer}
    assert not names & {"gru_W", "lstm_R", "loop_B"} and "trip" in names
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (T, B, IN)).astype(np.float32)
    h0 = rng.uniform(-1, 1, (1, B, H)).astype(np.float32)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "X": x, "h0": h0}
        got, want = run(rewritten, feeds), run(model, feeds)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w)


def test_ir3_model_lists_new_weights_as_inputs():
    """IR version 3 requires every initializer to be a graph input too (opset 7 GRU)."""
    model, feeds = models.build(models.Config(op="GRU", opset=7))
    model.ir_version = 3
    for t in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    rewritten = rewrite_model(model)
    check_rewritten(rewritten)
    inputs = {i.name for i in rewritten.graph.input}
    assert all(t.name in inputs for t in rewritten.graph.initializer)
    for g, w in zip(run(rewritten, feeds), run(model, feeds), strict=True):
        assert_close(g, w)


def test_sibling_branches_defining_one_name_with_two_lengths():
    """Each If branch slices its own 'xs' (3 and 5 steps) for a GRU: both are rewritten
    for their own length, not the one shape inference reported for the name first."""
    rng = np.random.default_rng(0)
    w = _weights("GRU", 0)
    inits = [numpy_helper.from_array(w[k], k) for k in ("W", "R")]

    def branch(name, steps):
        def ints(value):
            return numpy_helper.from_array(np.array([value], np.int64), "v")

        nodes = [
            helper.make_node("Constant", [], [f"end_{name}"], value=ints(steps)),
            helper.make_node("Constant", [], [f"start_{name}"], value=ints(0)),
            helper.make_node("Slice", ["X", f"start_{name}", f"end_{name}"], ["xs"]),
            helper.make_node("GRU", ["xs", "W", "R"], ["", f"h_{name}"], hidden_size=H),
        ]
        out = helper.make_tensor_value_info(f"h_{name}", TensorProto.FLOAT, [1, B, H])
        return helper.make_graph(nodes, name, [], [out])

    choose = helper.make_node(
        "If", ["cond"], ["h"], then_branch=branch("then", 3), else_branch=branch("else", 5)
    )
    graph = helper.make_graph(
        [choose],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, B, IN]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, B, H])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    rewritten = rewrite_model(model)
    check_rewritten(rewritten)
    assert count_recurrent_nodes(rewritten) == 0
    x = rng.uniform(-1, 1, (T, B, IN)).astype(np.float32)
    for cond in (True, False):
        feeds = {"X": x, "cond": np.array(cond)}
        assert_close(run(rewritten, feeds)[0], run(model, feeds)[0])


def test_recurrent_node_in_a_local_function_is_rewritten():
    """A model-local function holding a GRU is inlined and the GRU rewritten (it used to be
    left in place with nothing said)."""
    w = _weights("GRU", 3)
    gru = helper.make_node("GRU", ["X", "W", "R"], ["", "Y_h"], hidden_size=H)
    opsets = [helper.make_opsetid("", 17)]
    encoder = helper.make_function("local", "Enc", ["X", "W", "R"], ["Y_h"], [gru], opsets)
    graph = helper.make_graph(
        [helper.make_node("Enc", ["X", "W", "R"], ["h"], domain="local")],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, B, IN])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, B, H])],
        [numpy_helper.from_array(w[k], k) for k in ("W", "R")],
    )
    model = helper.make_model(
        graph, opset_imports=[*opsets, helper.make_opsetid("local", 1)], functions=[encoder]
    )
    model.ir_version = 10
    assert count_recurrent_nodes(model) == 1
    rewritten = rewrite_model(model)
    check_rewritten(rewritten)
    assert count_recurrent_nodes(rewritten) == 0
    feeds = {"X": np.random.default_rng(0).uniform(-1, 1, (T, B, IN)).astype(np.float32)}
    assert_close(run(rewritten, feeds)[0], run(model, feeds)[0])
