"""Bad models fail with a message naming the node and attribute, and rewrite_file never
touches its source nor leaves a partial destination."""

import dataclasses
import os

import onnx
import pytest
from onnx import TensorProto, helper

from recurrent_lowering.backends.onnx import rewrite
from recurrent_lowering.backends.onnx.rewrite import rewrite_file, rewrite_model
from recurrent_lowering.passes.spec import SpecError

from . import models

CFG = models.Config(op="GRU", hidden_size=4, input_size=3)


def _missing_r():
    model, _ = models.build(CFG, name="enc/gru0")
    model.graph.node[0].input[2] = ""
    return model


def _bad_shape():
    w = models.weights(CFG)
    w["R"] = w["R"][:, :, :3]  # [1, 12, 3] but hidden_size is 4
    return models.build(CFG, w=w, name="enc/gru0")[0]


def _unknown_activation():
    cfg = dataclasses.replace(CFG, activations=["Sigmoid", "Swish"])
    return models.build(cfg, name="enc/gru0")[0]


def _runtime_weights():
    model, _ = models.build(CFG, name="enc/gru0")
    g = model.graph
    g.input.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, []))
    g.node.insert(0, helper.make_node("Mul", ["W", "scale"], ["W_scaled"], name="scale_w"))
    g.node[1].input[1] = "W_scaled"
    return model


def _runtime_weights_unknown_shape():
    model = _runtime_weights()
    del model.graph.value_info[:]
    dims = model.graph.input[-1].type.tensor_type.shape.dim  # scale: [n, 1, 1]
    dims.add().dim_param = "n"
    dims.add().dim_value = 1
    dims.add().dim_value = 1
    return model


def _input_size_unlike_w():
    model, _ = models.build(CFG, name="enc/gru0")
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 5  # W takes 3
    return model


def _initial_h_unlike_hidden_size():
    cfg = dataclasses.replace(CFG, initial_h=True)
    model, _ = models.build(cfg, name="enc/gru0")
    h0 = next(i for i in model.graph.input if i.name == "initial_h")
    h0.type.tensor_type.shape.dim[2].dim_value = 7
    return model


def _x_unlike_weights_dtype():
    model, _ = models.build(CFG, name="enc/gru0")
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    return model


def _opset_6():
    return models.build(dataclasses.replace(CFG, opset=6), name="enc/gru0")[0]


CONSTANTS = dict(require_constant_weights=True)
BAD = {  # (model, attribute, detail, rewrite options)
    "missing_weights": (_missing_r, "'R'", "missing", {}),
    "inconsistent_shapes": (_bad_shape, "'R'", "shape", {}),
    "unknown_activation": (_unknown_activation, "'activations'", "Swish", {}),
    "x_input_size": (_input_size_unlike_w, "'X'", "input size 5; W takes 3", {}),
    "initial_h_shape": (_initial_h_unlike_hidden_size, "'initial_h'", "expected [1, 2, 4]", {}),
    "opset_6": (_opset_6, "'opset'", "convert the model to opset 7", {}),
    "x_dtype": (_x_unlike_weights_dtype, "'X'", "is float64, the weights float32", {}),
    "runtime_weights_refused": (_runtime_weights, "'W'", "W_scaled", CONSTANTS),
    "runtime_weight_without_static_shape": (
        _runtime_weights_unknown_shape,
        "'W'",
        "not static",
        {},
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_error_names_node_and_attribute(case):
    make, attribute, detail, options = BAD[case]
    with pytest.raises(SpecError) as err:
        rewrite_model(make(), **options)
    message = str(err.value)
    assert "enc/gru0" in message and attribute in message and detail in message, message


@pytest.mark.parametrize("case", sorted(BAD))
def test_failed_rewrite_file_leaves_no_trace(case, tmp_path):
    src, dst = tmp_path / "in.onnx", tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    onnx.save(BAD[case][0](), str(src))
    before = (src.read_bytes(), os.stat(src).st_mtime_ns)
    with pytest.raises(SpecError):
        rewrite_file(str(src), str(dst), **BAD[case][3])
    assert (src.read_bytes(), os.stat(src).st_mtime_ns) == before
    assert list(dst.parent.iterdir()) == []


def test_write_failure_removes_temp_and_keeps_old_destination(tmp_path, monkeypatch):
    src, dst = tmp_path / "in.onnx", tmp_path / "model.onnx"
    onnx.save(models.build(CFG)[0], str(src))
    dst.write_bytes(b"previous")

    def broken_replace(a, b):
        raise OSError("disk full")

    monkeypatch.setattr(rewrite.os, "replace", broken_replace)
    with pytest.raises(OSError):
        rewrite_file(str(src), str(dst))
    assert dst.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "model.onnx"]


def test_rewrite_file_writes_a_valid_model(tmp_path):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    model, feeds = models.build(CFG)
    onnx.save(model, str(src))
    before = src.read_bytes()
    assert rewrite_file(str(src), str(dst)) == 1
    assert src.read_bytes() == before
    out = onnx.load(str(dst))
    onnx.checker.check_model(out, full_check=True)
    assert not any(n.op_type == "GRU" for n in out.graph.node)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "out.onnx"]


def test_unrolled_needs_static_length():
    cfg = dataclasses.replace(CFG, dynamic_steps=True)
    model, _ = models.build(cfg, name="enc/gru0")
    with pytest.raises(SpecError, match="enc/gru0.*'X'.*static"):
        rewrite_model(model, emission="unrolled")


def test_activation_defaults_option_is_checked():
    with pytest.raises(ValueError, match="activation_defaults"):
        rewrite_model(models.build(CFG)[0], activation_defaults="tensorflow")


def test_wrong_number_of_activations():
    cfg = dataclasses.replace(CFG, activations=["Sigmoid", "Tanh", "Tanh"])
    with pytest.raises(SpecError, match="rec.*'activations'.*expected 2"):
        rewrite_model(models.build(cfg)[0])


def test_excess_alpha_values():
    cfg = dataclasses.replace(
        CFG, activations=["Sigmoid", "LeakyRelu"], activation_alpha=[0.1, 0.2]
    )
    with pytest.raises(SpecError, match="rec.*'activation_alpha'"):
        rewrite_model(models.build(cfg)[0])
