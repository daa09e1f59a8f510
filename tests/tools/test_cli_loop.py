"""`--emission loop`: the loop form through the CLI (TOSA INT, numerics checked), and refused
for --target aten, whose output must hold elementary ops only."""

from __future__ import annotations

import json

from recurrent_lowering.tests.tools.cli import run_lower


def _lower(tmp_path, emission: str, quantization: str = "int8") -> dict:
    report = f"{emission}_{quantization}.json"
    result = run_lower(
        [
            "tiny_gru",
            "--target=TOSA-1.0+INT",
            f"--emission={emission}",
            f"--quantization={quantization}",
            f"--report={report}",
        ],
        str(tmp_path),
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / report).read_text())


def test_loop_form_to_tosa_int(tmp_path):
    loop, unrolled = _lower(tmp_path, "loop"), _lower(tmp_path, "unrolled")
    assert loop["numerics"]["sqnr_db"] > 25
    # the layer is one scan node after its peeled first step, not a copy of the step per
    # timestep: fewer nodes go through ExecuTorch's passes
    assert loop["ops"]["delegated"] < unrolled["ops"]["delegated"]
    # the same loop with its steps (state, gate arithmetic) in int16, int8 around them; on
    # tiny_gru the int8 output dominates the error (tests/executorch_arm/test_scan.py checks
    # the gain on a model without a head)
    state16 = _lower(tmp_path, "loop", "int16_state")
    assert state16["numerics"]["sqnr_db"] >= loop["numerics"]["sqnr_db"]


def test_loop_form_refused_for_aten(tmp_path):
    result = run_lower(["tiny_gru", "--target=aten", "--emission=loop"], str(tmp_path))
    assert result.returncode != 0
    assert "--target aten" in result.stderr and "loop" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written
