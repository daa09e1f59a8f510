"""backends.onnx_to_torch.convert: rewritten ONNX graphs become exportable torch modules that
compute what onnxruntime computes on the original model."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.backends.onnx import rewrite
from recurrent_lowering.backends.onnx.input_sizes import input_specs
from recurrent_lowering.backends.onnx.specialize import specialize
from recurrent_lowering.backends.onnx_to_torch import convert as to_torch
from recurrent_lowering.tests.onnx_ethos_u import models

# onnx2torch classes that read index tensors at run time (torch.export cannot trace them),
# Identity copies, and MatMul/Gemm by constants the Arm quantizer would treat as
# activation x activation (nn.Linear gets per-channel weights).
UNWANTED = {
    "OnnxGather",
    "OnnxPadDynamic",
    "OnnxPow",
    "OnnxScatterND",
    "OnnxSlice",
    "OnnxSplit13",
    "OnnxSqueezeDynamicAxes",
    "OnnxUnsqueezeDynamicAxes",
    "OnnxReshape",
    "OnnxCopyIdentity",
    "OnnxMatMul",
    "OnnxGemm",
}
FLAGGED_ALWAYS = {"OnnxCopyIdentity", "OnnxMatMul", "OnnxGemm"}


def _ort(model, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, feeds)


def _torch_outputs(module, feeds, model):
    args = [torch.from_numpy(feeds[name]) for name, _, _ in input_specs(model)]
    with torch.no_grad():
        out = module(*args)
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]


def _classes(module):
    """onnx2torch classes still called with index tensors (an equal Split is fine), plus
    copies and MatMuls; every other class as is."""
    names = set()
    for node in module.graph.nodes:
        if node.op == "call_module":
            name = type(module.get_submodule(node.target)).__name__
            if name not in UNWANTED or len(node.args) > 1 or name in FLAGGED_ALWAYS:
                names.add(name)
    return names


R = models.recurrent
CONFIGS = {
    f"{op}-opset{opset}-{name}": (op, dict(opset=opset, **kw))
    for op in ("GRU", "LSTM", "RNN")
    for opset in (14, 17, 22)
    for name, kw in {
        "forward": dict(batch=1),
        "bidir-states-clip": dict(direction="bidirectional", initial_states=True, clip=1.5),
        "reverse-seqlens": dict(direction="reverse", sequence_lens=True),
    }.items()
}
CONFIGS.update(
    {
        "GRU-lbr-hardsigmoid-softsign": (
            "GRU",
            dict(linear_before_reset=1, activations=["HardSigmoid", "Softsign"]),
        ),
        "LSTM-peepholes-elu-softplus": (
            "LSTM",
            dict(peepholes=True, input_forget=1, activations=["Sigmoid", "Elu", "Softplus"]),
        ),
        "RNN-relu": ("RNN", dict(activations=["Relu"])),
        "RNN-leakyrelu-opset22": (
            "RNN",
            dict(opset=22, activations=["LeakyRelu"], activation_alpha=[0.1]),
        ),
        "RNN-thresholdedrelu-opset22": (
            "RNN",
            dict(opset=22, activations=["ThresholdedRelu"], activation_alpha=[0.2]),
        ),
        "RNN-affine": ("RNN", dict(activations=["Affine"], activation_alpha=[0.5])),
    }
)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_rewritten_node_converts_and_matches_onnxruntime(name):
    op, kw = CONFIGS[name]
    model, feeds = R(op, **kw)
    rewritten = rewrite.rewrite_model(model, emission="unrolled")
    module = to_torch.onnx_to_torch(rewritten)
    assert not _classes(module) & UNWANTED
    expected = _ort(model, feeds)
    actual = _torch_outputs(module, feeds, rewritten)
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=0)


def test_outputs_no_node_computes_convert():
    """onnx2torch looks a graph output up among node outputs: a Constant's (folded to an
    initializer), an initializer's and a graph input's raised KeyError."""
    model = models.outputs_no_node_computes()
    rewritten = rewrite.rewrite_model(model, emission="unrolled")
    module = to_torch.onnx_to_torch(rewritten)
    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.normal(size=(4, 1, 6)).astype(np.float32),
        "aux": rng.normal(size=(1, 4)).astype(np.float32),
    }
    expected = _ort(model, feeds)
    actual = _torch_outputs(module, feeds, rewritten)
    assert [a.shape for a in actual] == [e.shape for e in expected]
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=0)
    assert "OnnxCopyIdentity" not in _classes(module)  # a copy the Arm backend would carry


def _reduce18_model():
    """Opset-18 Reduce ops (axes an input), as torch.onnx.export writes a .mean() there."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 4])
    nodes = [
        helper.make_node("ReduceMean", ["X", "axes_m"], ["mean"], keepdims=1),
        helper.make_node("ReduceMax", ["X", "axes_x"], ["max"], keepdims=0),
        helper.make_node("ReduceL2", ["X"], ["l2"], keepdims=0),  # no axes: over all
        helper.make_node("ReduceSumSquare", ["X"], ["same"], noop_with_empty_axes=1),
    ]
    axes = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes_m"),
        numpy_helper.from_array(np.array([0, 2], np.int64), "axes_x"),
    ]
    outputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
        for n in ("mean", "max", "l2", "same")
    ]
    graph = helper.make_graph(nodes, "reduce18", [x], outputs, initializer=axes)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_opset18_reduce_ops_convert_and_match_onnxruntime():
    """onnx2torch 1.5.15 has no opset-18 converter for the Reduce ops but ReduceSum: a
    torch.onnx.export at opset 18 of a model with a .mean() was refused."""
    model = _reduce18_model()
    module = to_torch.onnx_to_torch(model)
    feeds = {"X": np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)}
    expected = _ort(model, feeds)
    actual = _torch_outputs(module, feeds, model)
    assert [a.shape for a in actual] == [e.shape for e in expected]
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=0)


@pytest.mark.parametrize("op,opset", [("GRU", 22), ("LSTM", 17), ("RNN", 14)])
def test_head_model_exports_with_the_same_numerics(op, opset):
    model = models.recurrent_with_head(op, opset=opset)
    module = to_torch.onnx_to_torch(rewrite.rewrite_model(model, emission="unrolled"))
    x = models.sample_input(model)
    program = torch.export.export(module, (torch.from_numpy(x),))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "aten.linear.default" in targets and "aten.matmul.default" not in targets
    with torch.no_grad():
        out = program.module()(torch.from_numpy(x))
    for e, a in zip(_ort(model, {"X": x}), out):
        np.testing.assert_allclose(a.numpy(), e, atol=1e-5, rtol=0)


def _constant_tensor(name, value):
    """Index inputs as int64, Gemm's B and C as floats (a 2-D C keeps onnx2torch from
    making nn.Linear itself, so our Gemm replacement runs)."""
    dtype = np.float32 if name in ("b", "c", "updates") else np.int64
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _single_op_model(op, inputs, consts, attrs=None, opset=18, outputs=1):
    names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op, ["x", *consts], names, **(attrs or {}))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(inputs))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [_constant_tensor(k, v) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


BIG = 2**63 - 1
SINGLE_OPS = {
    "slice-neg-step": ("Slice", dict(s=[-1], e=[-BIG - 1], a=[1], p=[-2]), {}, 1),
    "slice-clamped-neg-axis": ("Slice", dict(s=[1, -100], e=[BIG, 3], a=[-1, 0]), {}, 1),
    "slice-neg-step-partial": ("Slice", dict(s=[4, 3], e=[0, -7], a=[2, 0], p=[-3, -1]), {}, 1),
    "split-sizes": ("Split", dict(sizes=[1, 4]), dict(axis=2), 2),
    "split18-uneven": ("Split", {}, dict(axis=2, num_outputs=2), 2),
    "squeeze-neg": ("Squeeze", dict(axes=[-2]), {}, 1),
    "unsqueeze-neg": ("Unsqueeze", dict(axes=[-1, 0]), {}, 1),
    "reshape-zero-infer": ("Reshape", dict(shape=[0, -1]), {}, 1),
    "pad-reflect-last-dim": ("Pad", dict(pads=[0, 0, 2, 0, 0, 3]), dict(mode="reflect"), 1),
    "pad-edge-last-two": ("Pad", dict(pads=[0, 1, 2, 0, 0, 1]), dict(mode="edge"), 1),
    "pad-constant": ("Pad", dict(pads=[1, 0, 0, 0, 2, 1]), {}, 1),
    "gather-scalar-neg": ("Gather", dict(i=-1), dict(axis=0), 1),
    "gather-range": ("Gather", dict(i=[1, 2, 3]), dict(axis=2), 1),
    "gather-2d-any": ("Gather", dict(i=[[4, 0], [-1, 2]]), dict(axis=-1), 1),
    "gather-windows": ("Gather", dict(i=[[0, 1, 2], [1, 2, 3], [2, 3, 4]]), dict(axis=-1), 1),
    "pow-2": ("Pow", dict(e=2), {}, 1),
    "scatternd-block": (
        "ScatterND",
        dict(i=[[[1, 2], [1, 3]], [[2, 2], [2, 3]]], updates=-np.arange(20).reshape(2, 2, 5)),
        {},
        1,
    ),
    "scatternd-whole-rows": (
        "ScatterND",
        dict(i=[[[0, 1]], [[1, 1]], [[2, 1]]], updates=-np.arange(15).reshape(3, 1, 5) - 1),
        {},
        1,
    ),
    "scatternd-points": (
        "ScatterND",
        dict(i=[[2, 0], [0, 3], [-1, 1]], updates=-np.arange(15).reshape(3, 5) - 1),
        {},
        1,
    ),
    "gemm-transb-alpha-beta": (
        "Gemm",
        dict(b=np.arange(10).reshape(2, 5) - 4, c=np.arange(6).reshape(3, 2)),
        dict(transB=1, alpha=0.5, beta=-2.0),
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(SINGLE_OPS))
def test_static_replacements_keep_onnx_semantics(name):
    op, consts, attrs, outputs = SINGLE_OPS[name]
    shape = {"Slice": (4, 3, 6), "Gemm": (3, 5), "ScatterND": (3, 4, 5)}.get(op, (3, 1, 5))
    opset = 13 if op == "Pad" else 18  # onnx2torch converts Pad up to 13 (no axes input)
    model = _single_op_model(op, shape, consts, attrs, opset=opset, outputs=outputs)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    module = to_torch.onnx_to_torch(model)
    assert not _classes(module) & UNWANTED
    exported = torch.export.export(module, (torch.from_numpy(x),))  # the indices are ints now
    for e, a in zip(_ort(model, {"x": x}), _torch_outputs(module, {"x": x}, model)):
        np.testing.assert_array_equal(a, e)
    ops = [n for n in exported.graph.nodes if n.op == "call_function"]
    # what the Arm quantizer would leave in float on the CPU: values nothing reads, empty
    # values, narrow (it annotates slice), and (for indices in a few runs) index_select,
    # which U55 has no operator for
    assert all(n.users for n in ops), [n.name for n in ops if not n.users]
    assert "aten.narrow.default" not in {str(n.target) for n in ops}
    assert all(n.meta["val"].numel() for n in ops if isinstance(n.meta.get("val"), torch.Tensor))
    if name in ("gather-range", "gather-windows", "scatternd-block", "scatternd-whole-rows"):
        assert "aten.index_select.default" not in {str(n.target) for n in ops}


def test_recurrent_and_control_flow_nodes_are_refused_by_name():
    model = models.recurrent_with_head("GRU")
    with pytest.raises(to_torch.ToTorchError, match=r"node 'rec' \(GRU\).*unrolled"):
        to_torch.onnx_to_torch(model)
    scan = rewrite.rewrite_model(R("GRU", dynamic_steps=True)[0], emission="loop")
    with pytest.raises(to_torch.ToTorchError, match=r"\(Scan\): control flow"):
        to_torch.onnx_to_torch(scan)


def test_specialised_inputs_pin_dynamic_dims_for_an_unrolled_rewrite():
    model, feeds = R("LSTM", dynamic_steps=True, batch=1)
    assert input_specs(model)[0][1] == (None, 1, 3)
    with pytest.raises(Exception, match="static sequence length"):
        rewrite.rewrite_model(model, emission="unrolled")
    pinned = specialize(model, {"X": feeds["X"].shape}, {})
    module = to_torch.onnx_to_torch(rewrite.rewrite_model(pinned, emission="unrolled"))
    for e, a in zip(_ort(model, feeds), _torch_outputs(module, feeds, pinned)):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=0)


_STUB_PROBE = textwrap.dedent(
    """
    import importlib.util, sys
    assert importlib.util.find_spec("torchvision") is None, "torchvision must not be installed"
    from recurrent_lowering.backends.onnx_to_torch import compat
    from recurrent_lowering.backends.onnx_to_torch.compat import torchvision_stub as _stub
    onnx2torch = compat.onnx2torch()
    users = sorted(
        name for name, module in list(sys.modules.items())
        if name.startswith("onnx2torch")
        and any(_stub.is_stub(v) for v in vars(module).values())
    )
    print("users", users)
    print("left", sorted(n for n in sys.modules if n.split(".")[0] == "torchvision"))
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        print("import torchvision: ModuleNotFoundError")
    """
)


def test_torchvision_stub_serves_only_the_import_of_onnx2torch():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, "-c", _STUB_PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert (
        "users ['onnx2torch.node_converters.nms', 'onnx2torch.node_converters.roialign']" in lines
    )
    assert "left []" in lines
    assert "import torchvision: ModuleNotFoundError" in lines


def test_nms_converter_says_torchvision_is_missing():
    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 3, 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 3])
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max"], ["sel"])
    selected = helper.make_tensor_value_info("sel", TensorProto.INT64, None)
    most = numpy_helper.from_array(np.array([2], np.int64), "max")
    graph = helper.make_graph([node], "g", [boxes, scores], [selected], [most])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = to_torch.onnx_to_torch(model)
    with pytest.raises(ImportError, match="torchvision is not installed"):
        module(torch.rand(1, 3, 4), torch.rand(1, 1, 3))


def test_shape_chains_of_exported_models_fold_to_constants():
    """torch.onnx.export writes h0 = Expand(0, Concat(1, Shape(X)[1], H)); with static
    input shapes that chain is folded, so Expand gets a constant shape and exports."""
    model, feeds = R("GRU", batch=2)
    graph = model.graph
    hidden = graph.initializer[1].dims[2]
    extra = [
        helper.make_node("Shape", ["X"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "one"], ["batch"], axis=0),
        helper.make_node("Concat", ["one_1d", "batch", "hidden"], ["h0_shape"], axis=0),
        helper.make_node("Expand", ["zero"], ["h0"], name="expand"),
    ]
    extra[-1].input.append("h0_shape")
    rec = graph.node[0]
    rec.input.extend(["", "h0"])
    nodes = extra + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([1], np.int64), "one_1d"),
            numpy_helper.from_array(np.array([hidden], np.int64), "hidden"),
            numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "zero"),
        ]
    )
    rewritten = rewrite.rewrite_model(model, emission="unrolled")
    module = to_torch.onnx_to_torch(rewritten)
    assert module.replaced_modules["folded constants"] >= 1
    assert not _classes(module) & (UNWANTED | {"OnnxShape", "OnnxExpand"})
    torch.export.export(module, (torch.from_numpy(feeds["X"]),))
    for e, a in zip(_ort(model, feeds), _torch_outputs(module, feeds, rewritten)):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=0)


def _transposed_conv_bn(group: int):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 4 // group, 1, 3)).astype(np.float32)  # [in, out/groups, ...]
    bn = [
        rng.uniform(0.5, 2, 4),
        rng.standard_normal(4),
        rng.standard_normal(4),
        rng.uniform(0.5, 2, 4),
    ]
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=group, strides=[1, 2]),
        helper.make_node("BatchNormalization", ["y", "g", "b", "m", "v"], ["z"], epsilon=1e-3),
    ]
    initializers = [numpy_helper.from_array(weight, "w")] + [
        numpy_helper.from_array(a.astype(np.float32), n) for n, a in zip("gbmv", bn)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 5])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("group", [1, 2])
def test_batchnorm_after_transposed_conv_survives_the_quantizer(group):
    """torch's conv-BN fold (run by prepare_pt2e) breaks on a grouped ConvTranspose's
    weight: that BatchNorm becomes an affine the fold does not touch. Both keep ONNX's
    numerics (running statistics untouched by the conversion's own runs)."""
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa import TosaSpecification
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    model = _transposed_conv_bn(group)
    x = np.random.default_rng(1).standard_normal((1, 4, 2, 5)).astype(np.float32)
    module = to_torch.onnx_to_torch(model)
    assert module.replaced_modules["BatchNorm after grouped ConvTranspose"] == (group > 1)
    np.testing.assert_allclose(
        _torch_outputs(module, {"x": x}, model)[0], _ort(model, {"x": x})[0], atol=1e-5
    )
    exported = torch.export.export(module, (torch.from_numpy(x),)).module()
    quantizer = TOSAQuantizer(TosaSpecification.create_from_string("TOSA-1.0+INT"))
    quantizer.set_global(get_symmetric_quantization_config())
    prepare_pt2e(exported, quantizer)  # group 2 raised "size of tensor a (8) must match ..."


@pytest.mark.parametrize(
    "group, strides, dilations, pads, kind",
    [
        (4, [1, 1], [2, 1], [2, 1, 2, 1], "Conv2d"),  # GTCRN's depthwise, dilated
        (2, [1, 1], [1, 1], [0, 0, 0, 0], "Conv2d"),
        (2, [1, 2], [1, 1], [0, 1, 0, 1], "PerGroup"),  # GTCRN's last but one
        (4, [1, 1], [1, 1], [0, 5, 0, 5], "PerGroup"),  # padding beyond the kernel
    ],
)
def test_grouped_transposed_conv_takes_a_form_the_npu_runs(group, strides, dilations, pads, kind):
    """ExecuTorch refuses grouped transposed convolutions with per-channel weights (CPU):
    stride 1 becomes the equal convolution, others one ConvTranspose per group."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 8 // group, 3, 5)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    node = helper.make_node(
        "ConvTranspose",
        ["x", "w", "b"],
        ["y"],
        group=group,
        strides=strides,
        dilations=dilations,
        pads=pads,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 4, 6, 7)).astype(np.float32)
    module = to_torch.onnx_to_torch(model)
    modules = [type(m).__name__ for m in module.modules()]
    assert kind in modules
    transposed = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
    grouped = [m for m in module.modules() if isinstance(m, transposed) and m.groups > 1]
    assert not grouped
    np.testing.assert_allclose(
        _torch_outputs(module, {"x": x}, model)[0], _ort(model, {"x": x})[0], atol=1e-4
    )
