"""`lower model.onnx --target ethos-u55-128 / TOSA-1.0+FP`: an ONNX model with a recurrent
node and a MatMul head reaches a Vela-compiled .pte, its numerics checked on the TOSA
reference model against onnxruntime running the original model (fp32).

SQNR bounds: measured with random calibration (GRU 39.5 dB, LSTM 38.5 dB; see
docs/results/onnx_to_ethos_u.md) minus 3.5-4.5 dB; the upper bound shows the result really is INT8.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from recurrent_lowering.tests.onnx_ethos_u import models
from recurrent_lowering.tests.tools.cli import run_lower

ORT_REFERENCE = "TOSA reference model vs onnxruntime on the input model (fp32)"


def _lower(tmp_path, model, target, *flags):
    onnx.save(model, str(tmp_path / "model.onnx"))
    result = run_lower(
        ["model.onnx", f"--target={target}", "--report=r.json", *flags], str(tmp_path), 900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "r.json").read_text())


def _check_ethos_u(tmp_path, report, sqnr_floor):
    assert (tmp_path / "model.pte").stat().st_size > 1000
    assert report["vela"]["cycles"] > 0
    assert report["vela"]["flash_bytes"] > 0
    assert report["ops"]["delegated"] > 0
    num = report["numerics"]
    assert num["reference"] == ORT_REFERENCE
    assert num["conversion_max_abs_err"] <= 1e-5  # rewrite + onnx2torch, fp32
    assert sqnr_floor < num["sqnr_db"] < 80
    # The torch module and onnxruntime agree, so both comparisons tell the same story.
    assert abs(num["vs_torch_module"]["sqnr_db"] - num["sqnr_db"]) < 0.5


@pytest.mark.parametrize("op,opset,sqnr_floor", [("GRU", 22, 36.0), ("LSTM", 17, 34.0)])
def test_onnx_recurrent_model_to_ethos_u55(tmp_path, op, opset, sqnr_floor):
    """The GRU (linear_before_reset=0, which torch's GRU is not) becomes the layer op, the
    LSTM torch's nn.LSTM; both are decomposed like a torch model's layers."""
    model = models.recurrent_with_head(op, opset=opset)
    report = _lower(tmp_path, model, "ethos-u55-128")
    _check_ethos_u(tmp_path, report, sqnr_floor)
    assert "no --calibration: quantization calibrated on random inputs" in report["warnings"]
    if op == "GRU":
        assert report["recurrent_nodes"] == {
            "as_torch_modules": [],
            "as_layer_ops": ["rec"],
            "unrolled": {},
            "reversals_folded": [],
        }
    else:
        assert report["recurrent_nodes"] == {
            "as_torch_modules": ["rec"],
            "as_layer_ops": [],
            "unrolled": {},
            "reversals_folded": [],
        }


def test_outputs_no_node_computes_lower_to_u55(tmp_path):
    """Outputs that are a constant or a graph input passed through: conversion raised
    KeyError, and an Identity kept as a copy gave Vela a TOSA output no op writes ("TOSA
    FB Reader error")."""
    report = _lower(
        tmp_path, models.outputs_no_node_computes(), "ethos-u55-128", "--quantization=int8"
    )
    num = report["numerics"]
    assert num["outputs"] == ["Y_h", "const_out", "init_out", "aux", "aux_out"]
    assert min(num["sqnr_db_per_output"]) > 30  # int8: 44-66 dB measured


def test_weights_listed_as_inputs_are_weights(tmp_path):
    """Initializers listed as graph inputs too: the feeds of the converted module took them
    for inputs (KeyError); they are weights, as onnxruntime runs such a model unfed."""
    model = models.weights_as_inputs(models.recurrent_with_head("GRU"))
    report = _lower(tmp_path, model, "ethos-u55-128", "--quantization=int8")
    _check_ethos_u(tmp_path, report, 34.0)


def test_calibration_npz_by_input_name(tmp_path):
    model = models.recurrent_with_head("GRU")
    np.savez(tmp_path / "calib.npz", X=models.sample_input(model))
    report = _lower(tmp_path, model, "ethos-u55-128", "--calibration=calib.npz")
    _check_ethos_u(tmp_path, report, 36.0)
    assert not any("random" in w for w in report["warnings"])
    # one sample: quantization and the check share it, which the report says
    assert any("flatters" in w for w in report["warnings"])


def test_onnx_gru_to_tosa_fp_matches_onnxruntime(tmp_path):
    report = _lower(tmp_path, models.recurrent_with_head("GRU"), "TOSA-1.0+FP")
    assert report["numerics"]["reference"] == ORT_REFERENCE
    assert report["numerics"]["max_abs_err"] <= 1e-5
    assert report["ops"]["cpu"] == 0
    assert report["vela"]["cycles"] is None


def _lower_12_step_gru_with_int4_weights(tmp_path, **gru_attributes):
    """The head model's GRU at 12 steps to U55, calibrated, with 4-bit recurrent weights:
    the report and how many CONV2D weight inputs of the .tosa are INT4."""
    from recurrent_lowering.runtime import tosa_flatbuffer

    model = models.recurrent_with_head("GRU", steps=12, **gru_attributes)
    np.savez(tmp_path / "calib.npz", X=models.sample_input(model))
    report = _lower(
        tmp_path,
        model,
        "ethos-u55-128",
        "--calibration=calib.npz",
        "--recurrent_weight_bits=4",
        "--tosa_output=m.tosa",
    )
    types = [t.tosa_dtype for t in tosa_flatbuffer.op_inputs(tmp_path / "m.tosa", "CONV2D", 1)]
    return report, types.count("INT4")


def test_a_node_torch_cannot_express_gets_the_loop_form_and_its_options(tmp_path):
    """An ONNX GRU with linear_before_reset=0 (no nn.GRU computes it) travels as the layer
    op: the loop form at 12 steps and 4-bit recurrent weights, as a torch model's layer."""
    report, int4 = _lower_12_step_gru_with_int4_weights(tmp_path)
    assert report["recurrent_nodes"]["as_layer_ops"] == ["rec"]
    _check_ethos_u(tmp_path, report, 30.0)
    assert report["ops"]["delegated"] < 100  # unrolled: 400 and more
    assert int4 >= 11  # R at every step the loop copies


def test_pytorch_style_gru_gets_the_torch_adapter(tmp_path):
    """A GRU as PyTorch exports it (linear_before_reset=1) becomes nn.GRU, so the torch
    adapter's choices apply: the loop form at 12 steps (a few dozen nodes, not one set per
    step) and 4-bit recurrent weights (TOSA INT4)."""
    report, int4 = _lower_12_step_gru_with_int4_weights(tmp_path, linear_before_reset=1)
    assert report["recurrent_nodes"] == {
        "as_torch_modules": ["rec"],
        "as_layer_ops": [],
        "unrolled": {},
        "reversals_folded": [],
    }
    _check_ethos_u(tmp_path, report, 30.0)
    assert report["ops"]["delegated"] < 100  # unrolled: 400 and more
    assert report["quantization"]["recurrent_weight_bits"] == 4
    assert int4 == 11  # R at every step the loop copies; step 0 is peeled


def test_onnx_lstm_kept_on_the_cpu(tmp_path):
    from recurrent_lowering.backends.executorch_arm.partition import cpu_reasons as fallback

    model = models.recurrent_with_head("LSTM")
    report = _lower(tmp_path, model, "ethos-u55-128", "--keep_recurrent_on_cpu")
    assert report["ops"]["cpu_reasons"].get(fallback.KEPT_ON_CPU, 0) > 0
    assert not any("--keep_recurrent_on_cpu" in w for w in report["warnings"])
    assert report["numerics"]["sqnr_db"] > 30


def test_bidirectional_layer_written_by_hand_runs_whole_on_u55(tmp_path):
    """madmom writes a bidirectional layer as a forward node between two time reversals:
    folded into a reverse node, no reversal is left for U55 (whose TOSA profile has none),
    so nothing but the boundary's q/dq stays on the CPU."""
    from recurrent_lowering.tests.onnx.models import bidirectional_by_hand

    model, feeds = bidirectional_by_hand("GRU", T=12, F=8, H=16)
    np.savez(tmp_path / "calib.npz", **feeds)
    report = _lower(tmp_path, model, "ethos-u55-128", "--calibration=calib.npz")
    assert report["recurrent_nodes"]["reversals_folded"] == ["bwd"]
    assert report["recurrent_nodes"]["as_layer_ops"] == ["fwd", "bwd"]  # linear_before_reset=0
    assert set(report["ops"]["cpu_reasons"]) == {"q/dq at delegate boundary"}
    assert report["vela"]["delegates"] == 1
    assert 25.0 < report["numerics"]["sqnr_db"] < 80
    # Vela refuses this program in int16 (docs/precision.md): auto lowers it again in int8.
    assert report["quantization"]["auto"]["fallback"].startswith("int16 did not lower: ")
    assert any(w.startswith("--quantization auto: int16 did not lower") for w in report["warnings"])


def test_silero_vad_reaches_u55_whole(tmp_path):
    """silero-vad's LSTM sits in an If on the sample rate behind shape arithmetic and an
    STFT (reflect Pad on a 2-D input, power spectrum): specialised to the calibration's
    sizes and sample rate, everything but the boundary q/dq and its packed state's slices and
    concatenation (quantization/state_parts.py) runs on the NPU."""
    import importlib.resources
    import shutil

    path = importlib.resources.files("silero_vad") / "data" / "silero_vad.onnx"
    with importlib.resources.as_file(path) as p:
        shutil.copy(p, tmp_path / "model.onnx")
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "c.npz",
        input=(0.3 * rng.standard_normal((1, 512))).astype(np.float32),
        state=np.zeros((2, 1, 128), np.float32),
        sr=np.array(16000, np.int64),
    )
    result = run_lower(
        ["model.onnx", "--target=ethos-u55-128", "--calibration=c.npz", "--report=r.json"],
        str(tmp_path),
        900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ops"]["cpu_reasons"] == {
        "q/dq at delegate boundary": 6,  # its state's two parts in, two out, the audio, prob
        "a packed stream state's slices and concatenation (each part at its own scale)": 3,
    }
    assert report["recurrent_nodes"]["as_torch_modules"] == [
        "If_0_then_branch__Inline_0__/decoder/rnn/LSTM"
    ]
    assert any("sr = 16000" in w for w in report["warnings"])
    assert report["numerics"]["conversion_max_abs_err"] <= 1e-4  # torch module vs onnxruntime
    assert report["vela"]["cycles"] > 0
    per_output = report["numerics"]["sqnr_db_per_output"]  # speech probability, state
    assert len(per_output) == 2 and min(per_output) <= report["numerics"]["sqnr_db"]
    assert "(per output: " in result.stdout


def _streaming_block():
    """GTCRN's idioms on a small scale: a frame appended to a cache, sliding windows over
    frequency as a Gather (indices in three runs), a depthwise ConvTranspose, and the
    cache's last two rows written back by ScatterND; returns (model, feeds)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    C, F = 4, 10
    windows = np.stack([np.arange(F) + k for k in range(3)])  # [3, F] into F + 2
    writes = np.array([[[[0, c, t] for t in (1, 2)] for c in range(C)]])  # [1, C, 2, 3]
    init = {
        "pads": np.array([0, 0, 0, 1, 0, 0, 0, 1], np.int64),
        "windows": windows.astype(np.int64),
        "shape": np.array([1, 3 * C, 4, F], np.int64),
        "mix": (0.3 * rng.standard_normal((C, 3 * C, 1, 1))).astype(np.float32),
        "dw": (0.3 * rng.standard_normal((C, 1, 3, 3))).astype(np.float32),
        "writes": writes.astype(np.int64),
        "starts": np.array([2], np.int64),
        "ends": np.array([4], np.int64),
        "axes": np.array([2], np.int64),
    }
    nodes = [
        helper.make_node("Concat", ["cache", "x"], ["frames"], axis=2),  # [1, C, 4, F]
        helper.make_node("Pad", ["frames", "pads"], ["padded"]),
        helper.make_node("Gather", ["padded", "windows"], ["win"], axis=3),  # [1,C,4,3,F]
        helper.make_node("Transpose", ["win"], ["win_t"], perm=[0, 1, 3, 2, 4]),
        helper.make_node("Reshape", ["win_t", "shape"], ["stacked"]),
        helper.make_node("Conv", ["stacked", "mix"], ["mixed"]),
        helper.make_node("ConvTranspose", ["mixed", "dw"], ["y"], group=C, pads=[1, 1, 1, 1]),
        helper.make_node("Slice", ["frames", "starts", "ends", "axes"], ["kept"]),
        helper.make_node("ScatterND", ["cache", "writes", "kept"], ["new_cache"]),
    ]
    graph = helper.make_graph(
        nodes,
        "streaming_block",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 1, F]),
            helper.make_tensor_value_info("cache", TensorProto.FLOAT, [1, C, 3, F]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("new_cache", TensorProto.FLOAT, None),
        ],
        [numpy_helper.from_array(v, k) for k, v in init.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {
        "x": rng.standard_normal((1, C, 1, F)).astype(np.float32),
        "cache": rng.standard_normal((1, C, 3, F)).astype(np.float32),
    }
    return model, feeds


def test_streaming_block_runs_whole_on_u55(tmp_path):
    """Windows gathered in runs become slices, the cache write slices and a concat, the
    depthwise ConvTranspose a convolution: nothing but the boundary's q/dq on the CPU
    (GTCRN left index_select, unquantized narrows and grouped transposed convs there)."""
    model, feeds = _streaming_block()
    np.savez(tmp_path / "calib.npz", **feeds)
    report = _lower(
        tmp_path, model, "ethos-u55-128", "--calibration=calib.npz", "--quantization=int8"
    )
    assert set(report["ops"]["cpu_reasons"]) == {"q/dq at delegate boundary"}
    assert report["vela"]["delegates"] == 1
    assert report["numerics"]["conversion_max_abs_err"] <= 1e-5
    assert 20.0 < report["numerics"]["sqnr_db"] < 80


def _two_direction_streaming_lstm(steps: int = 12, hidden: int = 6) -> onnx.ModelProto:
    """madmom's shape: a forward and a reverse LSTM node, each with its own state inputs and
    outputs (graph inputs and outputs), their Ys concatenated: both directions' final states
    leave through that concat's quantization."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    features, nodes, inits = 5, [], []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, features])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 1, 2, hidden])]
    ys = []
    for d, direction in enumerate(("forward", "reverse")):
        w = rng.uniform(-0.4, 0.4, (1, 4 * hidden, features)).astype(np.float32)
        r = rng.uniform(-0.4, 0.4, (1, 4 * hidden, hidden)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{d}"), numpy_helper.from_array(r, f"r{d}")]
        for s in ("h", "c"):
            shape = [1, 1, hidden]
            inputs.append(helper.make_tensor_value_info(f"{s}{d}", TensorProto.FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(f"{s}{d}_n", TensorProto.FLOAT, shape))
        nodes.append(
            helper.make_node(
                "LSTM",
                ["x", f"w{d}", f"r{d}", "", "", f"h{d}", f"c{d}"],
                [f"y{d}", f"h{d}_n", f"c{d}_n"],
                hidden_size=hidden,
                direction=direction,
                name=f"lstm_{direction}",
            )
        )
        ys.append(f"y{d}")
    nodes.append(helper.make_node("Concat", ys, ["y"], axis=2))
    graph = helper.make_graph(nodes, "two_direction_lstm", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_two_directions_with_their_own_states_share_one_concat(tmp_path):
    """Each direction's h0 pairs with its h_n; both h_n reach the outputs through the Ys'
    concat, whose quantization PT2E keeps whole: the second pair joins the first's group
    (it once pointed the earlier input at the later one, and prepare_pt2e refused)."""
    model = _two_direction_streaming_lstm()
    rng = np.random.default_rng(1)
    np.savez(
        tmp_path / "c.npz",
        x=rng.standard_normal((4, 12, 1, 5)).astype(np.float32),
        **{f"{s}{d}": np.zeros((1, 1, 6), np.float32) for s in "hc" for d in (0, 1)},
    )
    report = _lower(tmp_path, model, "TOSA-1.0+INT", "--calibration=c.npz")
    assert report["numerics"]["stream"] == [
        ["h0", "h0_n"],
        ["c0", "c0_n"],
        ["h1", "h1_n"],
        ["c1", "c1_n"],
    ]
    assert report["numerics"]["sqnr_db"] > 15  # measured 18.5: int8, random weights


@pytest.mark.parametrize(
    "op,attributes,kept,target,floor",
    [
        ("LSTM", {}, "as_torch_modules", "TOSA-1.0+FP", 55.0),
        ("LSTM", {}, "as_torch_modules", "TOSA-1.0+INT", 26.0),
        ("GRU", {"linear_before_reset": 0}, "as_layer_ops", "TOSA-1.0+INT", 30.0),
    ],
)
def test_a_float16_node_travels_as_a_torch_layer(tmp_path, op, attributes, kept, target, floor):
    """A float16 node was rewritten into plain ops (4.8x the cycles of its float32 twin
    on ethos-u85-256, 6 dB worse in int8); it now reaches the Arm flow in float16 as nn.LSTM
    or the layer op, as a torch model's layer would, in the loop form at 12 steps (whose FP
    step was exported with float32 example inputs and refused). Against onnxruntime's
    float16 (int8: LSTM 29.6, GRU 34.0 dB measured)."""
    model = models.as_float16(models.recurrent_with_head(op, steps=12, **attributes))
    rng = np.random.default_rng(4)
    np.savez(tmp_path / "c.npz", X=rng.standard_normal((6, 12, 1, 8)).astype(np.float16))
    np.savez(tmp_path / "e.npz", X=rng.standard_normal((2, 12, 1, 8)).astype(np.float16))
    report = _lower(tmp_path, model, target, "--calibration=c.npz", "--evaluation=e.npz")
    assert report["recurrent_nodes"][kept] == ["rec"]
    num = report["numerics"]
    assert num["reference"] == "TOSA reference model vs onnxruntime on the input model (fp16)"
    assert num["reference_precision"] == "fp16"
    assert floor < num["sqnr_db"] < 90
    assert report["ops"]["delegated"] < 100  # unrolled: 400 and more
