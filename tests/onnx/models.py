"""Small ONNX models with one recurrent node, built from a configuration, for the tests."""

import dataclasses
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GATES = {"GRU": 3, "LSTM": 4, "RNN": 1}
NUM_ACTIVATIONS = {"GRU": 2, "LSTM": 3, "RNN": 1}
ELEM = {
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
}


@dataclasses.dataclass
class Config:
    op: str = "GRU"
    direction: str = "forward"
    layout: int = 0
    input_size: int = 3
    hidden_size: int = 4
    batch: int = 2
    steps: int = 5
    bias: bool = True
    initial_h: bool = False
    initial_c: bool = False
    sequence_lens: Optional[str] = None  # None, "constant" or "input"
    peepholes: bool = False
    clip: Optional[float] = None
    activations: Optional[list] = None
    activation_alpha: Optional[list] = None
    activation_beta: Optional[list] = None
    linear_before_reset: int = 0
    input_forget: int = 0
    outputs: tuple = (True, True, True)  # Y, Y_h, Y_c wanted
    dtype: type = np.float32
    opset: int = 22
    dynamic_steps: bool = False

    @property
    def num_directions(self):
        return 2 if self.direction == "bidirectional" else 1


def weights(cfg: Config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    d, g, h, i = cfg.num_directions, GATES[cfg.op], cfg.hidden_size, cfg.input_size

    def u(*shape, scale=0.5):
        return rng.uniform(-scale, scale, shape).astype(cfg.dtype)

    out = {"W": u(d, g * h, i), "R": u(d, g * h, h)}
    if cfg.bias:
        out["B"] = u(d, 2 * g * h)
    if cfg.peepholes:
        out["P"] = u(d, 3 * h)
    return out


def runtime_inputs(cfg: Config, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    b, t, d, h = cfg.batch, cfg.steps, cfg.num_directions, cfg.hidden_size
    x_shape = (b, t, cfg.input_size) if cfg.layout else (t, b, cfg.input_size)
    s_shape = (b, d, h) if cfg.layout else (d, b, h)
    feeds = {"X": rng.uniform(-1, 1, x_shape).astype(cfg.dtype)}
    if cfg.initial_h:
        feeds["initial_h"] = rng.uniform(-1, 1, s_shape).astype(cfg.dtype)
    if cfg.initial_c and cfg.op == "LSTM":
        feeds["initial_c"] = rng.uniform(-1, 1, s_shape).astype(cfg.dtype)
    if cfg.sequence_lens:
        lens = np.array([t] + [max(1, t - 2 - k) for k in range(b - 1)], np.int32)
        feeds["sequence_lens"] = lens
    return feeds


def node_inputs(cfg: Config, w: dict) -> list:
    names = ["X", "W", "R", "B" if "B" in w else "", "", "", "", ""]
    if cfg.sequence_lens:
        names[4] = "sequence_lens"
    if cfg.initial_h:
        names[5] = "initial_h"
    if cfg.op == "LSTM":
        if cfg.initial_c:
            names[6] = "initial_c"
        if "P" in w:
            names[7] = "P"
        return _trim(names)
    return _trim(names[:6])


def _trim(names):
    while names and names[-1] == "":
        names.pop()
    return names


def attributes(cfg: Config) -> dict:
    attrs = {"hidden_size": cfg.hidden_size, "direction": cfg.direction}
    if cfg.layout:
        attrs["layout"] = cfg.layout
    if cfg.clip is not None:
        attrs["clip"] = cfg.clip
    if cfg.activations is not None:
        attrs["activations"] = cfg.activations
    if cfg.activation_alpha:
        attrs["activation_alpha"] = cfg.activation_alpha
    if cfg.activation_beta:
        attrs["activation_beta"] = cfg.activation_beta
    if cfg.op == "GRU" and cfg.linear_before_reset:
        attrs["linear_before_reset"] = cfg.linear_before_reset
    if cfg.op == "LSTM" and cfg.input_forget:
        attrs["input_forget"] = cfg.input_forget
    return attrs


def build(cfg: Config, w: Optional[dict] = None, feeds: Optional[dict] = None, name="rec"):
    """(model, feeds): one node, weights as initializers, the rest as graph inputs."""
    w = weights(cfg) if w is None else w
    feeds = runtime_inputs(cfg) if feeds is None else dict(feeds)
    elem = ELEM[np.dtype(cfg.dtype)]
    inputs = node_inputs(cfg, w)
    initializers = [numpy_helper.from_array(v, k) for k, v in w.items() if k in inputs]
    if cfg.sequence_lens == "constant":
        initializers.append(numpy_helper.from_array(feeds.pop("sequence_lens"), "sequence_lens"))
    graph_inputs = []
    for k, v in feeds.items():
        shape = list(v.shape)
        if k == "X" and cfg.dynamic_steps:
            shape[1 if cfg.layout else 0] = "T"
        t = TensorProto.INT32 if k == "sequence_lens" else elem
        graph_inputs.append(helper.make_tensor_value_info(k, t, shape))
    wanted = cfg.outputs if cfg.op == "LSTM" else cfg.outputs[:2]
    out_names = _trim([n if want else "" for n, want in zip(["Y", "Y_h", "Y_c"], wanted)])
    node = helper.make_node(cfg.op, inputs, out_names, name=name, **attributes(cfg))
    graph = helper.make_graph(
        [node],
        "g",
        graph_inputs,
        [helper.make_tensor_value_info(n, elem, _output_shape(cfg, n)) for n in out_names if n],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", cfg.opset)])
    model = onnx.shape_inference.infer_shapes(model)
    return model, feeds


def _output_shape(cfg: Config, name: str) -> list:
    t = "T" if cfg.dynamic_steps else cfg.steps
    b, d, h = cfg.batch, cfg.num_directions, cfg.hidden_size
    if name == "Y":
        return [b, t, d, h] if cfg.layout else [t, d, b, h]
    return [b, d, h] if cfg.layout else [d, b, h]


def to_layout0(model: onnx.ModelProto) -> onnx.ModelProto:
    """The layout=0 twin of a layout=1 model, wrapped in Transposes (same interface).

    onnxruntime refuses layout=1; this twin lets its native op check layout=1 rewrites.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    (node,) = [n for n in g.node if n.op_type in GATES]
    for a in list(node.attribute):
        if a.name == "layout":
            node.attribute.remove(a)
    pre, post = [], []
    for idx, perm in ((0, [1, 0, 2]), (5, [1, 0, 2]), (6, [1, 0, 2])):
        if idx < len(node.input) and node.input[idx]:
            name = node.input[idx]
            node.input[idx] = name + "_l0"
            pre.append(helper.make_node("Transpose", [name], [name + "_l0"], perm=perm))
    for idx, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):
        if idx < len(node.output) and node.output[idx]:
            name = node.output[idx]
            node.output[idx] = name + "_l0"
            post.append(helper.make_node("Transpose", [name + "_l0"], [name], perm=perm))
    nodes = pre + list(g.node) + post
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return out


def reflect_pad(pad: int) -> onnx.ModelProto:
    """[1, n] -> reflect-pad `pad` on the last axis, which onnxruntime runs only for
    n > pad: an STFT front-end (silero-vad's) in miniature, with no recurrent node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])
    pads = helper.make_tensor("p", TensorProto.INT64, [4], [0, pad, 0, pad])
    nodes = [
        helper.make_node("Constant", [], ["pads"], value=pads),
        helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


_INT64_MIN = np.iinfo(np.int64).min


def _reverse_slice(name, source, out, starts=-1, ends=_INT64_MIN, axis=0):
    consts = {
        f"{name}_starts": [starts],
        f"{name}_ends": [ends],
        f"{name}_axes": [axis],
        f"{name}_steps": [-1],
    }
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    return helper.make_node("Slice", [source, *consts], [out], name=name), inits


def bidirectional_by_hand(
    op="RNN",
    axis=0,
    unsqueeze=True,
    extra_y_reader=False,
    sequence_lens=False,
    T=7,
    F=5,
    H=6,
):
    """madmom's bidirectional layer: x [T, F] -> forward node, and x reversed (Slice on
    `axis`) -> forward node -> Y reversed back; Concat of both. Returns (model, feeds)."""
    rng = np.random.default_rng(0)
    g = {"GRU": 3, "LSTM": 4, "RNN": 1}[op]
    inits = [
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, s).astype(np.float32), n)
        for n, s in (("W", (1, g * H, F)), ("R", (1, g * H, H)), ("B", (1, 2 * g * H)))
    ]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax1"))
    inits.append(numpy_helper.from_array(np.array([1, 2], np.int64), "ax12"))
    inits.append(numpy_helper.from_array(np.full(1, T, np.int32), "lens"))
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax1"], ["x3"]),
        helper.make_node(op, ["x3", "W", "R", "B"], ["y_f", "h_f"], hidden_size=H, name="fwd"),
        helper.make_node("Squeeze", ["y_f", "ax12"], ["y_f2"]),
    ]
    reverse_in, more = _reverse_slice("rev_in", "x", "x_rev", axis=axis)
    nodes.append(reverse_in)
    inits += more
    if unsqueeze:
        nodes.append(helper.make_node("Unsqueeze", ["x_rev", "ax1"], ["x_rev3"]))
    x_in = "x_rev3" if unsqueeze else "x_rev"
    inputs = [x_in, "W", "R", "B"] + (["lens"] if sequence_lens else [])
    nodes.append(helper.make_node(op, inputs, ["y_b", "h_b"], hidden_size=H, name="bwd"))
    nodes.append(helper.make_node("Squeeze", ["y_b", "ax12"], ["y_b2"]))
    reverse_out, more = _reverse_slice("rev_out", "y_b2", "y_b_rev")
    nodes.append(reverse_out)
    inits += more
    nodes.append(helper.make_node("Concat", ["y_f2", "y_b_rev"], ["y"], axis=1))
    outputs = ["y", "h_b"] + (["y_b2"] if extra_y_reader else [])
    x_shape = [T, F] if unsqueeze else [T, 1, F]
    if not unsqueeze:  # the forward node reads x as [T, 1, F] too
        nodes[0] = helper.make_node("Identity", ["x"], ["x3"])
    graph = helper.make_graph(
        nodes,
        "brnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal(x_shape).astype(np.float32)}
