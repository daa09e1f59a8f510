"""What a user sees: stage lines and the report on the terminal, other libraries' logs in a
log file, one line for any failure (internal errors included), everything with --verbose."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

from recurrent_lowering.tests.tools.cli import run_lower

# absl/glog lines ("I1126 23:54:56.811696 ..."), Python warnings, ExecuTorch's quantizer
# report, Vela's banner, tracebacks: none of them is ours.
FOREIGN = re.compile(
    r"^[IWEF]\d{4} |Warning|warnings.warn|QUANTIZATION REPORT|Traceback|Network summary|"
    r"onnxruntime:"
)


def test_main_command_prints_stages_and_report_and_logs_the_rest(tmp_path):
    result = run_lower(["tiny_gru", "--target", "ethos-u55-128"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) <= 40, lines
    assert not [line for line in lines if FOREIGN.search(line)]
    assert "partition and lower to ethos-u55-128" in result.stderr  # a stage line
    assert "NPU cycles (Vela estimate)" in result.stdout
    log = (tmp_path / "tiny_gru.log").read_text()
    assert "QUANTIZATION REPORT" in log  # ExecuTorch's, kept for whoever wants it
    assert f"log of other libraries' messages: {tmp_path / 'tiny_gru.log'}" in result.stdout


def test_verbose_shows_other_libraries_logs_and_writes_no_log(tmp_path):
    args = ["tiny_rnn", "--target", "TOSA-1.0+INT", "--verbose", "--report", "r.json"]
    result = run_lower(args, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "QUANTIZATION REPORT" in result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["log"] is None
    assert sorted(os.listdir(tmp_path)) == ["r.json", "tiny_rnn.error.png", "tiny_rnn.pte"]


def test_log_flag_and_report_name_the_log(tmp_path):
    from recurrent_lowering.tests.onnx import models

    onnx.save(models.build(models.Config(op="GRU"))[0], str(tmp_path / "m.onnx"))
    args = ["m.onnx", "--target", "onnx", "--report", "out/r.json", "--log", "logs/lower.log"]
    result = run_lower(args, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "r.json").read_text())
    assert report["log"] == str(tmp_path / "logs" / "lower.log")
    assert (tmp_path / "logs" / "lower.log").is_file()


def _lower_with_failing_load(tmp_path, *flags, said="a library says goodbye"):
    """The CLI with model loading replaced by a function that prints `said` to stderr and
    raises KeyError: an internal error the CLI does not expect."""
    code = (
        "import sys\n"
        "from recurrent_lowering.tools import lower\n"
        "from recurrent_lowering.tools.lowering import model_source\n"
        "def load(arg):\n"
        f"    print({said!r}, file=sys.stderr)\n"
        "    raise KeyError('boom')\n"
        "model_source.load = load\n"
        "sys.argv = ['lower', 'tiny_gru', '--target', 'onnx', *sys.argv[1:]]\n"
        "lower.entry()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", code, *flags],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_internal_error_is_one_line_with_the_log_tail(tmp_path):
    result = _lower_with_failing_load(tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    *tail, last = result.stderr.rstrip().splitlines()
    match = re.fullmatch(
        r"lower: internal error: KeyError: 'boom' \(rerun with --verbose for the traceback; "
        r"log: (\S+)\)",
        last,
    )
    assert match, last
    assert tail == ["  | a library says goodbye"]  # the log's last words before ours
    log = open(match.group(1)).read()
    assert "Traceback" in log and "KeyError: 'boom'" in log
    os.unlink(match.group(1))
    assert os.listdir(tmp_path) == []


def test_a_traceback_a_library_logged_stays_in_the_log(tmp_path):
    said = 'Traceback (most recent call last):\n  File "lib.py", line 3, in f\nValueError: no'
    result = _lower_with_failing_load(tmp_path, said=said)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("lower: internal error: KeyError: 'boom'")
    log = re.search(r"log: (\S+)\)", line).group(1)
    assert 'File "lib.py", line 3' in open(log).read()
    os.unlink(log)


def test_internal_error_with_verbose_shows_the_traceback(tmp_path):
    result = _lower_with_failing_load(tmp_path, "--verbose")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "a library says goodbye" in result.stderr
    assert result.stderr.strip().endswith(
        "lower: internal error: KeyError: 'boom' (rerun with --verbose for the traceback)"
    )


def test_onnx_without_output_shapes_is_repaired_and_rewritten(tmp_path):
    """onnxruntime runs a model whose graph outputs carry no shape or type; the ONNX
    checker refuses it. It is lowered, with a warning."""
    from recurrent_lowering.tests.onnx import models

    model, feeds = models.build(models.Config(op="LSTM"))
    model.graph.output[0].type.tensor_type.ClearField("shape")
    model.graph.output[1].ClearField("type")
    del model.graph.value_info[:]
    onnx.save(model, str(tmp_path / "m.onnx"))
    result = run_lower(["m.onnx", "--target", "onnx", "--report", "r.json"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert any("types and shapes inferred" in w for w in report["warnings"])
    assert report["numerics"]["max_abs_err"] <= 1e-5
    got = ort.InferenceSession(str(tmp_path / "m.rewritten.onnx")).run(None, feeds)
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


def test_onnx_neither_checker_nor_onnxruntime_takes_is_refused_with_both_reasons(tmp_path):
    from recurrent_lowering.tests.onnx import models

    model, _ = models.build(models.Config(op="GRU"))
    model.graph.node[0].input[1] = "no_such_weight"
    onnx.save(model, str(tmp_path / "m.onnx"))
    result = run_lower(["m.onnx", "--target", "onnx"], str(tmp_path))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "m.onnx: not a valid ONNX model (onnx checker:" in line and "onnxruntime:" in line
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


def test_inputs_the_check_cannot_feed(tmp_path):
    """No size makes onnxruntime run the model: --target onnx writes the rewrite (which does
    not depend on the check) and warns; an NPU target, whose program would be built for
    those sizes, refuses in one line."""
    from recurrent_lowering.tests.onnx import models

    onnx.save(models.reflect_pad(10**6), str(tmp_path / "m.onnx"))
    result = run_lower(["m.onnx", "--target", "onnx", "--report", "r.json"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    (warning,) = [w for w in report["warnings"] if w.startswith("numerics not checked")]
    assert "x [1, 1]" in warning and "pass --calibration" in warning
    assert report["numerics"]["sqnr_db"] is None

    result = run_lower(["m.onnx", "--target", "TOSA-1.0+FP", "--output", "m.pte"], str(tmp_path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    line = result.stderr.rstrip().splitlines()[-1]
    assert line.startswith("lower: error:") and "pass --calibration" in line
    assert not (tmp_path / "m.pte").exists()


def test_the_cli_imports_no_noisy_library_before_it_captures_their_output():
    """torch, torchao and ExecuTorch print at import time; the CLI must import them only
    inside `console.captured`, or those lines reach the terminal."""
    noisy = ("torch", "torchao", "executorch", "onnxruntime", "tosa", "ethosu")
    code = (
        "import sys, recurrent_lowering.tools.lower\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {noisy!r}))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
