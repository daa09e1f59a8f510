"""`--emission loop`: the loop form through the CLI (TOSA INT, numerics checked), and refused
for --target aten, whose output must hold elementary ops only."""

from __future__ import annotations

import json

from recurrent_lowering.tests.tools.cli import run_lower


def _lower(tmp_path, emission: str) -> dict:
    result = run_lower(
        [
            "tiny_gru",
            "--target=TOSA-1.0+INT",
            f"--emission={emission}",
            f"--report={emission}.json",
        ],
        str(tmp_path),
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / f"{emission}.json").read_text())


def test_loop_form_to_tosa_int(tmp_path):
    loop, unrolled = _lower(tmp_path, "loop"), _lower(tmp_path, "unrolled")
    assert loop["numerics"]["sqnr_db"] > 25
    # the layer is one scan node after its peeled first step, not a copy of the step per
    # timestep: fewer nodes go through ExecuTorch's passes
    assert loop["ops"]["delegated"] < unrolled["ops"]["delegated"]


def test_loop_form_refused_for_aten(tmp_path):
    result = run_lower(["tiny_gru", "--target=aten", "--emission=loop"], str(tmp_path))
    assert result.returncode != 0
    assert "--target aten" in result.stderr and "loop" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written
