"""Bad input to //tools:lower: a one-line reason, a non-zero exit, and no output file left."""

from __future__ import annotations

import json
import os

import pytest

from recurrent_lowering.tests.tools.cli import run_lower


def _error_line(result) -> str:
    """The one line that says why; nothing else on stderr but stage lines ("  load ...")."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("lower: error:")]
    assert len(lines) == 1, result.stderr
    others = [line for line in result.stderr.splitlines() if not line.startswith(("  ", "lower:"))]
    assert not others, result.stderr  # e.g. torch's logger on a truncated .pt2
    assert result.returncode == 1
    return lines[0]


@pytest.fixture
def workdir(tmp_path):
    return tmp_path


def test_text_file_named_onnx(workdir):
    (workdir / "model.onnx").write_text("this is not a protobuf\n")
    result = run_lower(["model.onnx", "--target", "onnx", "--output", "out.onnx"], str(workdir))
    assert result.returncode != 0
    assert "model.onnx: not a valid ONNX model" in _error_line(result)
    assert sorted(os.listdir(workdir)) == ["model.onnx"]


def test_truncated_pt2(workdir):
    (workdir / "model.pt2").write_bytes(b"PK\x03\x04truncated")
    result = run_lower(["model.pt2", "--target", "aten", "--report", "r.json"], str(workdir))
    assert result.returncode != 0
    assert "model.pt2: not a valid torch.export .pt2 file" in _error_line(result)
    assert sorted(os.listdir(workdir)) == ["model.pt2"]


def test_unknown_target(workdir):
    result = run_lower(["tiny_gru", "--target", "ethos-u99-7"], str(workdir))
    assert result.returncode != 0
    line = _error_line(result)
    assert "unknown target 'ethos-u99-7'" in line and "ethos-u55-128" in line
    assert os.listdir(workdir) == []


def test_missing_file_and_unknown_name(workdir):
    result = run_lower(["absent.onnx", "--target", "onnx"], str(workdir))
    assert result.returncode != 0 and "absent.onnx: no such file" in _error_line(result)
    result = run_lower(["no_such_example", "--target", "aten"], str(workdir))
    assert result.returncode != 0 and "bundled example" in _error_line(result)
    assert os.listdir(workdir) == []


@pytest.mark.parametrize(
    "args,reason",
    [
        (["--target", "onnx", "--recurrent_weight_bits", "4"], "applies to TOSA and Ethos-U"),
        (["--target", "aten", "--quantization", "int16"], "applies to TOSA and Ethos-U"),
        (["--target", "aten", "--tosa_output", "m.tosa"], "applies to TOSA and Ethos-U"),
        (
            ["--target", "ethos-u55-128", "--system_config", "Ethos_U85_SYS_DRAM_Low"],
            "Ethos_U85_SYS_DRAM_Low is not a system config for ethos-u55-128",
        ),
        (["--target", "onnx", "--keep_recurrent_on_cpu"], "applies to TOSA and Ethos-U"),
        (["--target", "aten", "--memory_mode", "Sram_Only"], "applies to TOSA and Ethos-U"),
        (["--target", "TOSA-1.0+FP", "--recurrent_weight_bits", "6"], "applies to INT targets"),
        (["--target", "TOSA-1.0+INT", "--memory_mode", "Sram_Only"], "are Vela's: not for"),
        (["--target", "ethos-u55-128", "--memory_mode", "Sram"], "Vela knows Sram_Only,"),
        (["--target", "ethos-u85-256", "--system_config", "U85"], "Vela knows Ethos_U55_"),
        (
            [
                "--target",
                "ethos-u85-256",
                "--recurrent_weight_bits",
                "4",
                "--quantization",
                "int16",
            ],
            "need int8 activations",
        ),
        (
            [
                "--target",
                "ethos-u55-128",
                "--recurrent_weight_bits",
                "6",
                "--keep_recurrent_on_cpu",
            ],
            "keeps them in float on the CPU",
        ),
    ],
)
def test_npu_options_refused_where_they_do_not_apply(args, reason, workdir):
    result = run_lower(["tiny_gru", *args, "--output", "out.bin"], str(workdir))
    assert result.returncode != 0
    assert reason in _error_line(result)
    assert os.listdir(workdir) == []


@pytest.mark.parametrize(
    "arrays,reason",
    [
        ({"x": (1, 6, 8)}, "array 0 has shape [1, 6, 8]; model input 'input 0' takes [1, 4, 8]"),
        ({"x": (1, 4, 5)}, "array 0 has shape [1, 4, 5]; model input 'input 0' takes [1, 4, 8]"),
        ({"x": (1, 4, 8), "y": (1, 4, 8)}, "2 arrays for 1 model inputs (input 0)"),
    ],
)
@pytest.mark.parametrize("target", ["TOSA-1.0+INT", "aten"])
def test_calibration_that_does_not_fit_the_model(arrays, reason, target, workdir):
    """A wrong time axis would otherwise lower a model for the calibration's length; aten
    checks its numerics on the calibration arrays, so it checks them too."""
    import numpy as np

    np.savez(workdir / "c.npz", **{k: np.zeros(s, np.float32) for k, s in arrays.items()})
    args = ["tiny_gru", "--target", target, "--calibration", "c.npz", "--output", "o.bin"]
    result = run_lower(args, str(workdir))
    assert result.returncode != 0
    assert reason in _error_line(result)
    assert os.listdir(workdir) == ["c.npz"]


@pytest.mark.parametrize("target", ["TOSA-1.0+INT", "onnx"])
def test_onnx_calibration_that_does_not_fit_the_model(target, workdir):
    import numpy as np
    import onnx

    from recurrent_lowering.tests.onnx import models

    model, feeds = models.build(models.Config(op="GRU"))
    onnx.save(model, str(workdir / "m.onnx"))
    np.savez(workdir / "c.npz", X=np.zeros((5, 2, 2), np.float32))  # the model takes [5, 2, 3]
    args = ["m.onnx", "--target", target, "--calibration", "c.npz", "--output", "o.bin"]
    result = run_lower(args, str(workdir))
    assert result.returncode != 0
    assert "array 0 has shape [5, 2, 2]; model input 'X' takes [5, 2, 3]" in _error_line(result)
    assert sorted(os.listdir(workdir)) == ["c.npz", "m.onnx"]


def test_output_naming_a_directory_is_refused_and_the_directory_kept(workdir):
    (workdir / "out").mkdir()
    (workdir / "out" / "keep.txt").write_text("keep me")
    result = run_lower(["tiny_gru", "--target", "aten", "--output", "out"], str(workdir))
    assert result.returncode != 0
    assert "out: is a directory; --output names the file to write" in _error_line(result)
    assert (workdir / "out" / "keep.txt").read_text() == "keep me"
    assert os.listdir(workdir) == ["out"]


def test_vela_refusing_a_configuration_is_one_line(workdir):
    """The U55's default system config has flash on its second port, where Dedicated_Sram
    would put the arena."""
    args = ["tiny_gru", "--target", "ethos-u55-128", "--memory_mode", "Dedicated_Sram"]
    result = run_lower([*args, "--output", "o.pte"], str(workdir), timeout=1200)
    assert result.returncode != 0
    assert "Vela (default system config, Dedicated_Sram): " in _error_line(result)
    assert "Traceback" not in result.stderr
    assert os.listdir(workdir) == []


def test_two_outputs_naming_one_file_are_refused(workdir):
    result = run_lower(
        ["tiny_gru", "--target", "aten", "--output", "m.pt2", "--report", "m.pt2"], str(workdir)
    )
    assert result.returncode != 0
    assert "m.pt2: named by both --output and --report" in _error_line(result)
    assert os.listdir(workdir) == []


def test_dynamic_dimensions_fixed_for_an_npu_are_reported(workdir):
    """An NPU program is static: a .pt2's dynamic batch takes the example's size, which the
    report says instead of lowering for it silently."""
    import torch

    class Gru(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(4, 8, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[0]

    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(
        Gru().eval(), (torch.randn(2, 3, 4),), dynamic_shapes={"x": {0: batch}}
    )
    torch.export.save(program, str(workdir / "gru.pt2"))
    args = ["gru.pt2", "--target", "TOSA-1.0+FP", "--report", "r.json"]
    result = run_lower(args, str(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((workdir / "r.json").read_text())
    assert report["warnings"] == [
        "dynamic dimensions of x taken from the example inputs ([2, 3, 4]) (an NPU program is "
        "static; pass --calibration to choose)"
    ]
    assert report["numerics"]["inputs"] == "example inputs"
    assert report["numerics"]["max_abs_err"] <= 1e-5


def test_output_under_a_regular_file_is_refused_up_front(workdir):
    (workdir / "afile").write_text("x")
    args = ["tiny_gru", "--target", "aten", "--output", "o.pt2", "--report", "afile/r.json"]
    result = run_lower(args, str(workdir))
    assert result.returncode != 0
    assert "afile is a file, not a directory (--report)" in _error_line(result)
    assert sorted(os.listdir(workdir)) == ["afile"]


def test_onnx_activation_defaults_refused_for_a_torch_model(workdir):
    args = ["tiny_gru", "--target", "aten", "--onnx_activation_defaults", "spec"]
    result = run_lower(args, str(workdir))
    assert result.returncode != 0
    assert "tiny_gru is not an .onnx model" in _error_line(result)
    assert os.listdir(workdir) == []


def test_float64_model_refused_for_tosa(workdir):
    import torch

    gru = torch.nn.GRU(3, 4).double().eval()
    program = torch.export.export(gru, (torch.randn(5, 1, 3, dtype=torch.float64),))
    torch.export.save(program, str(workdir / "g.pt2"))
    result = run_lower(["g.pt2", "--target", "TOSA-1.0+FP", "--output", "o.pte"], str(workdir))
    assert result.returncode != 0
    assert "is float64, which TOSA has no type for" in _error_line(result)
    assert sorted(os.listdir(workdir)) == ["g.pt2"]


def test_float64_onnx_model_refused_for_tosa(workdir):
    """It ended in onnxruntime's RuntimeException (no double GRU kernel): an internal error."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.uniform(-0.3, 0.3, shape), name)
        for name, shape in (("W", (1, 12, 3)), ("R", (1, 12, 4)), ("B", (1, 24)))
    ]
    gru = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y"], hidden_size=4)
    graph = helper.make_graph(
        [gru],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [5, 1, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [5, 1, 1, 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(workdir / "g.onnx"))
    result = run_lower(["g.onnx", "--target", "TOSA-1.0+FP", "--output", "o.pte"], str(workdir))
    assert result.returncode == 1
    assert "'X' is float64, which TOSA has no type for" in _error_line(result)
    assert sorted(os.listdir(workdir)) == ["g.onnx"]


@pytest.mark.parametrize("target", ["ethos-u55-128", "onnx"])
def test_calibration_onnxruntime_refuses_is_one_line(target, workdir):
    """A token past an embedding's table in the second sample: onnxruntime refuses the
    input model on it. It ended in an internal error (onnxruntime's exception) on the NPU
    targets, and on --target onnx was blamed on the rewritten model."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.uniform(-0.3, 0.3, shape).astype(np.float32), name)
        for name, shape in (("E", (10, 3)), ("W", (1, 12, 3)), ("R", (1, 12, 4)))
    ]
    nodes = [
        helper.make_node("Gather", ["E", "tokens"], ["X"]),
        helper.make_node("GRU", ["X", "W", "R"], ["Y"], hidden_size=4),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [6, 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6, 1, 1, 4])],
        weights,
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        str(workdir / "g.onnx"),
    )
    tokens = np.array([[[1], [2], [3], [4], [5], [6]], [[1], [2], [40], [4], [5], [6]]])
    np.savez(workdir / "c.npz", tokens=tokens)
    args = ["g.onnx", "--target", target, "--calibration", "c.npz", "--output", "o.bin"]
    line = _error_line(run_lower(args, str(workdir)))
    assert "onnxruntime refuses the input model on" in line and "idx=40" in line
    assert sorted(os.listdir(workdir)) == ["c.npz", "g.onnx"]


def test_calibration_the_torch_model_fails_on_is_one_line(workdir):
    """The same for a .pt2: it ended in `internal error: IndexError` in calibration."""
    import numpy as np
    import torch

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.gru = torch.nn.Embedding(10, 3), torch.nn.GRU(3, 4)

        def forward(self, tokens):
            return self.gru(self.embed(tokens))[0]

    program = torch.export.export(Tokens().eval(), (torch.zeros(6, 1, dtype=torch.int64),))
    torch.export.save(program, str(workdir / "t.pt2"))
    tokens = np.array([[[1], [2], [3], [4], [5], [6]], [[1], [2], [40], [4], [5], [6]]])
    np.savez(workdir / "c.npz", tokens=tokens)
    args = ["t.pt2", "--target", "ethos-u55-128", "--calibration", "c.npz", "--output", "o.pte"]
    line = _error_line(run_lower(args, str(workdir)))
    assert "the model fails in torch eager on sample 1" in line and "IndexError" in line
    np.savez(workdir / "c.npz", tokens=tokens[1])  # --target aten checks on its one sample
    args = ["t.pt2", "--target", "aten", "--calibration", "c.npz", "--output", "o.pt2"]
    line = _error_line(run_lower(args, str(workdir)))
    assert "the model fails in torch eager on sample 0" in line and "IndexError" in line
    assert sorted(os.listdir(workdir)) == ["c.npz", "t.pt2"]
