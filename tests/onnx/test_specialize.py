"""specialize: with the input shapes fixed and scalar integer inputs made constants, shape
arithmetic and If nodes fold away, and the model computes what the original does in
onnxruntime."""

from __future__ import annotations

import importlib.resources

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.backends.onnx.specialize import specialize

from .ort_util import session


def _branch(name: str, op: str, constant: float) -> onnx.GraphProto:
    c = numpy_helper.from_array(np.array(constant, np.float32), f"{name}_c")
    return helper.make_graph(
        [helper.make_node(op, ["r", f"{name}_c"], [f"{name}_out"])],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)],
        [c],
    )


def _exporter_like() -> onnx.ModelProto:
    """Reshape through Shape -> Gather -> Concat, an If on an integer input, a reflect Pad
    whose pads are computed from a shape."""
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero_axis"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Equal", ["mode", "one"], ["cond"]),
        helper.make_node(
            "If",
            ["cond"],
            ["picked"],
            then_branch=_branch("then", "Mul", 2.0),
            else_branch=_branch("else", "Add", 1.0),
        ),
        helper.make_node("Gather", ["s", "two"], ["f"], axis=0),  # pads = [0, 1, 0, F - 3]
        helper.make_node("Sub", ["f", "three"], ["f3"]),
        helper.make_node("Unsqueeze", ["f3", "zero_axis"], ["f31"]),
        helper.make_node("Concat", ["pads_head", "f31"], ["pads"], axis=0),
        helper.make_node("Pad", ["picked", "pads"], ["y"], mode="reflect"),
    ]
    initializers = [
        ints("zero", 0),
        ints("two", 2),
        ints("three", 3),
        ints("one", 1),
        ints("zero_axis", [0]),
        ints("minus_one", [-1]),
        ints("pads_head", [0, 1, 0]),
    ]
    graph = helper.make_graph(
        nodes,
        "exporter_like",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", "F"]),
            helper.make_tensor_value_info("mode", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", [0, 1])
def test_shape_arithmetic_and_if_fold_to_what_onnxruntime_computes(mode):
    model = _exporter_like()
    x = np.random.default_rng(mode).standard_normal((2, 3, 4)).astype(np.float32)
    special = specialize(model, {"x": x.shape}, {"mode": np.array(mode, np.int64)})
    ops = {n.op_type for n in special.graph.node}
    assert ops.isdisjoint({"Shape", "If", "Gather", "Concat", "Equal"}), ops
    assert [i.name for i in special.graph.input] == ["x"]
    want = session(model).run(None, {"x": x, "mode": np.array(mode, np.int64)})[0]
    got = session(special).run(None, {"x": x})[0]
    assert want.shape == (2, 14)  # [2, 12] padded by 1 on both sides
    np.testing.assert_array_equal(got, want)


def test_a_dynamic_input_keeps_its_shape_arithmetic():
    model = _exporter_like()
    special = specialize(model, {}, {"mode": np.array(1, np.int64)})
    assert "Shape" in {n.op_type for n in special.graph.node}
    assert "If" not in {n.op_type for n in special.graph.node}


@pytest.mark.parametrize("sr,samples", [(16000, 512), (8000, 256)])
def test_silero_vad_specialised_to_its_sample_rate(sr, samples):
    path = importlib.resources.files("silero_vad") / "data" / "silero_vad.onnx"
    with importlib.resources.as_file(path) as p:
        model = onnx.load(str(p))
    special = specialize(
        model, {"input": (1, samples), "state": (2, 1, 128)}, {"sr": np.array(sr, np.int64)}
    )
    assert "If" not in {n.op_type for n in special.graph.node}
    (lstm,) = [n for n in special.graph.node if n.op_type == "LSTM"]
    shapes = {v.name: v.type.tensor_type.shape for v in special.graph.value_info}
    assert [d.dim_value for d in shapes[lstm.input[0]].dim] == [1, 1, 128]
    want, got = session(model), session(special)
    rng = np.random.default_rng(sr)
    state_want = state_got = np.zeros((2, 1, 128), np.float32)
    for _ in range(3):  # a stream: the state each call returns feeds the next
        audio = (0.3 * rng.standard_normal((1, samples))).astype(np.float32)
        prob_w, state_want = want.run(
            None, {"input": audio, "state": state_want, "sr": np.array(sr, np.int64)}
        )
        prob_g, state_got = got.run(None, {"input": audio, "state": state_got})
        np.testing.assert_allclose(prob_g, prob_w, atol=1e-6)
        np.testing.assert_allclose(state_got, state_want, atol=1e-6)
