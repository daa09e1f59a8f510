"""OnnxBuilder ops against numpy, for every op form the opset changes (Slice, Squeeze,
Unsqueeze, Clip, Gemm's optional C) and for float32/float64 graphs, including Scan."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from recurrent_lowering.backends.onnx.builder import Names, OnnxBuilder
from recurrent_lowering.passes.graph import Body, Graph, Loop
from recurrent_lowering.passes.spec import TANH, Activation


def _run(builder, inputs, outputs, opset, feeds):
    graph = helper.make_graph(
        builder.nodes,
        "g",
        [helper.make_tensor_value_info(n, builder.float_type, s) for n, s in inputs],
        [helper.make_tensor_value_info(o, builder.float_type, builder.shape(o)) for o in outputs],
        builder.pool.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("opset", [9, 11, 13, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("linear_mode", ["gemm", "matmul"])
def test_ops_match_numpy(opset, dtype, linear_mode):
    rng = np.random.default_rng(opset)
    w, bias = rng.standard_normal((4, 3)), rng.standard_normal(4)
    r = rng.standard_normal((4, 4))
    b = OnnxBuilder("n", dtype, opset, Names({"x"}), linear_mode=linear_mode)
    b.declare("x", b.float_type, (5, None, 3))
    p = b.linear("x", w, bias)  # [5, B, 4] (rank 3: MatMul + Add)
    s = b.slice(p, -1, 1, 3)
    t0 = b.squeeze(b.slice(p, 0, 0, 1), 0)
    g = b.linear(t0, r)  # rank 2, no bias (Gemm without C needs opset 11)
    hard = b.activation(Activation("HardSigmoid", 0.2, 0.5), g)
    assert (hard is None) == (dtype != np.float32)  # native only where ORT has a kernel
    c = b.concat([b.sigmoid(g), b.tanh(g), hard if hard is not None else b.relu(g)], -1)
    cl = b.clamp(c, -0.3, 0.9)
    tr = b.transpose(b.unsqueeze(cl, 0), [1, 0, 2])
    m = b.where(b.less(b.constant(np.array([0.5])), tr), tr, b.sub(tr, b.constant(np.array(2.0))))

    bg = Graph(dtype)  # the loop body, as the core hands it over
    h, xt = bg.input("h", (None, 2)), bg.input("x_t", (None, 2))
    nh = bg.act(TANH, bg.linear(h, np.eye(2) * 0.5) + xt)
    body = Body(bg, [h, xt], [nh, nh, xt * 2.0], 1)

    h0 = b.squeeze(b.slice(s, 0, 0, 1), 0)
    (h_t,), (ys, ab) = b.loop(Loop(body, reverse=True), [h0], [s], outer={})
    assert b.shape(m) == (None, 1, 12) and b.shape(ys) == (5, None, 2)

    x = rng.standard_normal((5, 2, 3)).astype(dtype)
    got = _run(b, [("x", [5, None, 3])], [m, h_t, ys, ab], opset, {"x": x})

    pn = x @ w.T + bias
    gn = pn[0] @ r.T
    sig = 1 / (1 + np.exp(-gn))
    third = np.clip(0.2 * gn + 0.5, 0, 1) if dtype == np.float32 else np.maximum(gn, 0)
    cn = np.clip(np.concatenate([sig, np.tanh(gn), third], -1), -0.3, 0.9)[:, None, :]
    mn = np.where(0.5 < cn, cn, cn - 2.0)
    sn = pn[..., 1:3]
    h, ysn = sn[0], [None] * 5
    for t in reversed(range(5)):
        h = np.tanh(h @ (np.eye(2) * 0.5).T + sn[t])
        ysn[t] = h
    tol = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0], mn, **tol)
    np.testing.assert_allclose(got[1], h, **tol)
    np.testing.assert_allclose(got[2], np.stack(ysn), **tol)
    np.testing.assert_allclose(got[3], 2 * sn, **tol)
    ops = {n.op_type for n in b.nodes}
    assert ("Gemm" in ops) == (linear_mode == "gemm" and opset >= 11)


def test_names_stay_unique_and_constants_are_shared():
    b = OnnxBuilder("lstm", np.float32, 17, Names({"lstm/Add", "lstm/scalar"}))
    b.declare("x", b.float_type, (2, 3))
    one_a = b.constant(np.array(1.0))
    one_b = b.constant(np.array(1.0, np.float64))  # cast to the graph's float dtype
    assert one_a == one_b and one_a != "lstm/scalar"
    outs = [b.add("x", one_a) for _ in range(3)]
    assert len(set(outs)) == 3 and "lstm/Add" not in outs
    assert b.pool.initializers[0].data_type == onnx.TensorProto.FLOAT
