"""onnxruntime's native GRU/LSTM/RNN as the reference: one-node models built from a spec."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.passes import CellKind, RecurrentSpec
from recurrent_lowering.passes.activations import PARAMETERS
from recurrent_lowering.passes.gate_order import to_onnx

# onnxruntime's values when activation_alpha/beta are omitted (measured; ONNX's differ).
ORT_DEFAULTS = {
    "Affine": (0.0, 0.0),
    "LeakyRelu": (0.01, None),
    "ThresholdedRelu": (0.0, None),
    "ScaledTanh": (0.0, 0.0),
    "HardSigmoid": (0.2, 0.5),
    "Elu": (1.0, None),
}


def run_ort(spec: RecurrentSpec, weights, x, h0=None, c0=None, lens=None, explicit_params=True):
    """Y, Y_h, Y_c of onnxruntime for a one-layer spec, time-major (layout=0) tensors.

    explicit_params=False leaves activation_alpha/beta out, so onnxruntime applies its
    defaults (the spec must then carry ORT_DEFAULTS)."""
    assert spec.num_layers == 1
    W, R, B, P = to_onnx(spec.cell, weights[0])
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R")]
    inputs = ["X", "W", "R", "", "", "", "", ""][: {CellKind.LSTM: 8}.get(spec.cell, 6)]
    feeds = {"X": x}
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))]
    if B is not None:
        inits.append(numpy_helper.from_array(B, "B"))
        inputs[3] = "B"
    for pos, name, value, dtype in (
        (4, "sequence_lens", lens, TensorProto.INT32),
        (5, "initial_h", h0, TensorProto.FLOAT),
        (6, "initial_c", c0, TensorProto.FLOAT),
    ):
        if value is not None:
            inputs[pos] = name
            feeds[name] = value.astype(np.int32) if dtype == TensorProto.INT32 else value
            graph_inputs.append(helper.make_tensor_value_info(name, dtype, list(value.shape)))
    if P is not None:
        inits.append(numpy_helper.from_array(P, "P"))
        inputs[7] = "P"
    while inputs[-1] == "":
        inputs.pop()
    attrs = dict(hidden_size=spec.hidden_size, direction=spec.direction.value)
    if spec.activations is not None:
        acts = [a for per_dir in spec.activations for a in per_dir]
        attrs["activations"] = [a.name for a in acts]
        if explicit_params:
            alphas = [a.alpha for a in acts if "alpha" in PARAMETERS.get(a.name, ())]
            betas = [a.beta for a in acts if "beta" in PARAMETERS.get(a.name, ())]
            if alphas:
                attrs["activation_alpha"] = alphas
            if betas:
                attrs["activation_beta"] = betas
    if spec.clip is not None:
        attrs["clip"] = spec.clip
    if spec.cell is CellKind.GRU:
        attrs["linear_before_reset"] = int(spec.linear_before_reset)
    if spec.cell is CellKind.LSTM:
        attrs["input_forget"] = int(spec.input_forget)
    outputs = ["Y", "Y_h"] + (["Y_c"] if spec.cell is CellKind.LSTM else [])
    node = helper.make_node(spec.cell.value, inputs, outputs, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        graph_inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    res = sess.run(None, feeds)
    return res + [None] * (3 - len(res))
