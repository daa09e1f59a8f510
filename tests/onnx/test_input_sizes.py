"""What an ONNX graph fixes of its dynamic input sizes (backends.onnx.input_sizes)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.backends.onnx import input_sizes

from . import models


def _dynamic(model: onnx.ModelProto, name: str, axes: list) -> onnx.ModelProto:
    """`model` with the given axes of input `name` made dynamic (no dim_param)."""
    for value in model.graph.input:
        if value.name == name:
            for axis in axes:
                value.type.tensor_type.shape.dim[axis].Clear()
    del model.graph.value_info[:]
    return model


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
def test_recurrent_node_fixes_features_batch_and_time(op, layout):
    cfg = models.Config(op=op, layout=layout, input_size=7, initial_h=True)
    model = _dynamic(models.build(cfg)[0], "X", [0, 1, 2])
    model = _dynamic(model, "initial_h", [1 - layout])  # its batch axis
    sizes = input_sizes.infer(model, time_steps=11)
    time_axis, batch_axis = (1, 0) if layout else (0, 1)
    got = {axis: bound.size for axis, bound in sizes.dims["X"].items()}
    assert got == {time_axis: 11, batch_axis: 1, 2: 7}
    assert "input size of rec's W" in sizes.dims["X"][2].why
    assert sizes.dims["initial_h"][1 - layout].size == 1


def test_sequence_lens_input_gets_the_full_length():
    cfg = models.Config(op="GRU", sequence_lens="input", dynamic_steps=True)
    sizes = input_sizes.infer(models.build(cfg)[0], time_steps=9)
    assert sizes.dims["X"][0].size == 9
    assert sizes.values["sequence_lens"].size == 9


def _graph_model(nodes, inputs, initializers, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_matmul_gemm_and_conv_fix_their_input_sizes():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", "k"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, None])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, None, 10])
    weights = [
        numpy_helper.from_array(np.zeros((5, 3), np.float32), "m"),
        numpy_helper.from_array(np.zeros((4, 6), np.float32), "g"),  # transB: K = 6
        numpy_helper.from_array(np.zeros((8, 2, 3), np.float32), "w"),  # group 2: C = 4
    ]
    nodes = [
        helper.make_node("MatMul", ["a", "m"], ["ya"]),
        helper.make_node("Gemm", ["b", "g"], ["yb"], transB=1),
        helper.make_node("Conv", ["c", "w"], ["yc"], group=2),
    ]
    outputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("ya", "yb", "yc")
    ]
    sizes = input_sizes.infer(_graph_model(nodes, [a, b, c], weights, outputs), time_steps=16)
    assert sizes.dims["a"][1].size == 5 and sizes.dims["a"][0] is None
    assert sizes.dims["b"][1].size == 6 and sizes.dims["b"][0] is None
    assert sizes.dims["c"][1].size == 4


def test_shared_dim_param_is_bound_once_for_every_input_that_names_it():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "k"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", "k"])
    m = numpy_helper.from_array(np.zeros((5, 3), np.float32), "m")
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("MatMul", ["s", "m"], ["y"]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    sizes = input_sizes.infer(_graph_model(nodes, [a, b], [m], [y]), time_steps=16)
    assert sizes.dims["a"][1].size == 5 and sizes.dims["b"][1].size == 5


def test_integer_compared_with_a_constant_takes_that_value():
    """silero-vad's shape: If(Equal(sr, 16000)) picks the 16 kHz branch."""
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    const = helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", 7, [], [16000]))
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["o"])],
        "b",
        [],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])],
    )
    nodes = [
        const,
        helper.make_node("Equal", ["sr", "k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["y"], then_branch=branch, else_branch=branch),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    sizes = input_sizes.infer(_graph_model(nodes, [sr, x], [], [y]), time_steps=16)
    assert sizes.values["sr"].size == 16000
