"""Tiny ONNX models with one recurrent node (weights as initializers) for the route's tests.

`recurrent_with_head`: X [T, 1, I] -> GRU/LSTM/RNN -> Y [T, 1, 1, H] -> Squeeze(axis 1)
-> MatMul [H, 1] -> Z [T, 1, 1]; Y_h is a second graph output, so both the sequence and
the final state are checked. `outputs_no_node_computes`: a GRU beside outputs that are a
Constant, an initializer, a graph input and an Identity of one. `weights_as_inputs`: a
model whose initializers are graph inputs too (IR 3's form). `recurrent`: the node
alone, with any attributes, optional initial states and sequence_lens as graph inputs
(feeds returned alongside).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GATES = {"GRU": 3, "LSTM": 4, "RNN": 1}


def _weights(op, input_size, hidden, directions, peepholes=False, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    gates = GATES[op]

    def u(*shape):
        return rng.uniform(-0.3, 0.3, shape).astype(np.float32)

    arrays = {
        "W": u(directions, gates * hidden, input_size),
        "R": u(directions, gates * hidden, hidden),
        "B": u(directions, 2 * gates * hidden),
    }
    if peepholes:
        arrays["P"] = u(directions, 3 * hidden)
    return arrays


def _model(nodes, name, inputs, outputs, arrays, opset):
    graph = helper.make_graph(
        nodes, name, inputs, outputs, [numpy_helper.from_array(a, k) for k, a in arrays.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def recurrent_with_head(
    op: str = "GRU",
    input_size: int = 8,
    hidden: int = 16,
    steps: int = 4,
    opset: int = 17,
    **attributes,
) -> onnx.ModelProto:
    """X -> op (`attributes` on the node) -> Squeeze -> MatMul head: outputs Z and Y_h."""
    arrays = _weights(op, input_size, hidden, 1)
    arrays["head"] = np.random.default_rng(1).uniform(-0.3, 0.3, (hidden, 1)).astype(np.float32)
    arrays["axis1"] = np.array([1], np.int64)
    nodes = [
        helper.make_node(
            op, ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden, name="rec", **attributes
        ),
        helper.make_node("Squeeze", ["Y", "axis1"], ["Y2"], name="squeeze"),
        helper.make_node("MatMul", ["Y2", "head"], ["Z"], name="head"),
    ]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, 1, input_size])]
    outputs = [
        helper.make_tensor_value_info("Z", TensorProto.FLOAT, [steps, 1, 1]),
        helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, 1, hidden]),
    ]
    return _model(nodes, f"{op.lower()}_head", inputs, outputs, arrays, opset)


def outputs_no_node_computes(steps: int = 4, input_size: int = 6, hidden: int = 8):
    """X -> GRU -> Y_h, and outputs no node computes from X: `const_out` (a Constant node),
    `init_out` (an initializer), `aux` (a graph input listed as an output) and `aux_out`
    (an Identity of `aux`). onnxruntime takes all four."""
    arrays = _weights("GRU", input_size, hidden, 1)
    arrays["init_out"] = np.array([0.5, -1.0], np.float32)
    nodes = [
        helper.make_node("GRU", ["X", "W", "R", "B"], ["", "Y_h"], hidden_size=hidden),
        helper.make_node(
            "Constant",
            [],
            ["const_out"],
            value=numpy_helper.from_array(np.arange(3, dtype=np.float32) - 1, "v"),
        ),
        helper.make_node("Identity", ["aux"], ["aux_out"]),
    ]
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("X", f, [steps, 1, input_size]),
        helper.make_tensor_value_info("aux", f, [1, 4]),
    ]
    outputs = [
        helper.make_tensor_value_info("Y_h", f, [1, 1, hidden]),
        helper.make_tensor_value_info("const_out", f, [3]),
        helper.make_tensor_value_info("init_out", f, [2]),
        helper.make_tensor_value_info("aux", f, [1, 4]),
        helper.make_tensor_value_info("aux_out", f, [1, 4]),
    ]
    return _model(nodes, "outputs_no_node_computes", inputs, outputs, arrays, 17)


def weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every initializer also listed as a graph input, as IR 3 wrote them (and
    exporters of that time): an overridable default, which onnxruntime runs unfed."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in copy.graph.initializer
    )
    onnx.checker.check_model(copy)
    return copy


def recurrent(
    op: str,
    opset: int = 17,
    input_size: int = 3,
    hidden: int = 4,
    batch: int = 2,
    steps: int = 5,
    initial_states: bool = False,
    sequence_lens: bool = False,
    peepholes: bool = False,
    dynamic_steps: bool = False,
    **attributes,
) -> tuple[onnx.ModelProto, dict]:
    """(model, feeds): the node alone; `attributes` go on the node (direction, clip, ...)."""
    directions = 2 if attributes.get("direction") == "bidirectional" else 1
    arrays = _weights(op, input_size, hidden, directions, peepholes)
    rng = np.random.default_rng(1)
    feeds = {"X": rng.uniform(-1, 1, (steps, batch, input_size)).astype(np.float32)}
    names = ["X", "W", "R", "B", "", "", "", ""]
    if sequence_lens:
        feeds["sequence_lens"] = np.array([steps] + [max(1, steps - 2)] * (batch - 1), np.int32)
        names[4] = "sequence_lens"
    states = ["initial_h", "initial_c"] if op == "LSTM" else ["initial_h"]
    for k, state in enumerate(states if initial_states else []):
        feeds[state] = rng.uniform(-1, 1, (directions, batch, hidden)).astype(np.float32)
        names[5 + k] = state
    if peepholes:
        names[7] = "P"
    names = names[: 8 if op == "LSTM" else 6]
    while names[-1] == "":
        names.pop()
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, names, outputs, hidden_size=hidden, name="rec", **attributes)
    inputs = []
    for k, v in feeds.items():
        shape = list(v.shape)
        if k == "X" and dynamic_steps:
            shape[0] = "T"
        elem = TensorProto.INT32 if k == "sequence_lens" else TensorProto.FLOAT
        inputs.append(helper.make_tensor_value_info(k, elem, shape))
    t = "T" if dynamic_steps else steps
    shapes = {"Y": [t, directions, batch, hidden], "Y_h": [directions, batch, hidden]}
    shapes["Y_c"] = shapes["Y_h"]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in outputs]
    return _model([node], op.lower(), inputs, outs, arrays, opset), feeds


def sample_input(model: onnx.ModelProto, seed: int = 1) -> np.ndarray:
    (x,) = model.graph.input
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def as_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (float32 initializers, inputs and outputs, no Cast) in float16 throughout."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for k, init in enumerate(graph.initializer):
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            graph.initializer[k].CopyFrom(numpy_helper.from_array(a.astype(np.float16), init.name))
    del graph.value_info[:]
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
