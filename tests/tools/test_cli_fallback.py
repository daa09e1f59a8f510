"""`lower --keep_recurrent_on_cpu` and `--quantization int16`: the report counts what stays on
the CPU and why, and checks the mixed program's numerics; int16 reaches TOSA-1.0+INT through
its int16 extension and is refused for FP."""

from __future__ import annotations

import json

import torch

from recurrent_lowering.tests.executorch_arm.fallback_models import MaskedHead
from recurrent_lowering.tests.tools.cli import run_lower

KEPT = "recurrent layer kept on CPU (--keep_recurrent_on_cpu)"


def test_keep_recurrent_on_cpu_reports_reasons(tmp_path):
    result = run_lower(
        ["tiny_gru", "--target=TOSA-1.0+FP", "--keep_recurrent_on_cpu", "--report=r.json"],
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    ops = report["ops"]
    assert ops["delegated"] == 2  # the head: linear and sigmoid
    assert ops["cpu_reasons"] == {KEPT: ops["cpu"]} and ops["cpu"] > 10
    assert f"on CPU ({ops['cpu']}): {KEPT}" in result.stdout
    # mixed program, checked whole: the GRU's ops in torch eager, the head on TOSA FP
    numerics = report["numerics"]
    assert numerics["reference"].startswith("delegates on the TOSA reference model, CPU ops")
    assert numerics["max_abs_err"] <= 1e-5
    assert not [w for w in report["warnings"] if "numerics not checked" in w]


def test_int16_on_tosa_int(tmp_path):
    result = run_lower(
        ["tiny_gru", "--target=TOSA-1.0+INT", "--quantization=int16", "--report=r.json"],
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ops"]["cpu_reasons"] == {"q/dq at delegate boundary": 2}
    assert report["numerics"]["sqnr_db"] > 55  # int8 gives about 45 dB on tiny_gru


def test_int16_refused_for_fp(tmp_path):
    result = run_lower(["tiny_gru", "--target=TOSA-1.0+FP", "--quantization=int16"], str(tmp_path))
    assert result.returncode == 1
    assert "--quantization int16 applies to INT targets" in result.stderr


def test_two_delegates_around_cpu_ops_on_u55(tmp_path):
    """Ops the NPU cannot run split the program into two delegates: it still lowers, Vela
    compiles both (figures summed) and the whole program's numerics are checked."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 4)
    torch.export.save(torch.export.export(MaskedHead().eval(), (x,)), str(tmp_path / "m.pt2"))
    result = run_lower(["m.pt2", "--target=ethos-u55-128", "--report=r.json"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["vela"]["delegates"] == 2
    assert report["vela"]["cycles"] > 0
    reasons = report["ops"]["cpu_reasons"]
    assert reasons["gt.Tensor not supported on TOSA-1.0+INT+int16+int4+u55"] == 1
    assert reasons["where.self not supported on TOSA-1.0+INT+int16+int4+u55"] == 1
    assert report["numerics"]["sqnr_db"] > 15  # int8; gt flips where y rounds across 0.1
    assert any("2 NPU delegates" in w for w in report["warnings"])
    assert (tmp_path / "m.pte").stat().st_size > 0
