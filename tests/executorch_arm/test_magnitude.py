"""An int16 magnitude sqrt(a*a + b*b) over two ranges (quantization/magnitude.py): on the
TOSA reference model it follows torch where one range loses the quiet values, and int8
programs keep the single root."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.quantization import magnitude
from recurrent_lowering.runtime import arm_numerics
from recurrent_lowering.runtime.metrics import sqnr_db


class _Magnitude(torch.nn.Module):
    def forward(self, a, b):
        return torch.sqrt(a * a + b * b)


def _spectrum(seed: int, level: float = 1.0) -> tuple:
    """Real and imaginary parts whose magnitudes span 8 decades of power, as a spectrum's
    bins from loud to quiet do."""
    g = torch.Generator().manual_seed(seed)
    scale = level * torch.exp(torch.linspace(-8, 0, 256))
    return tuple(torch.randn(1, 256, generator=g) * scale for _ in range(2))


def _lowered(tmp_path, quantization: str, split: bool, monkeypatch) -> tuple:
    """(TOSA outputs on a held-out input, torch's, TABLE count)."""
    if not split:
        monkeypatch.setattr(magnitude, "split", lambda model, samples: 0)
    module = _Magnitude().eval()
    calibration = [_spectrum(seed) for seed in range(8)]
    held_out = _spectrum(100, level=0.5)  # within the calibrated range
    result = flow.lower(
        module,
        calibration[0],
        "TOSA-1.0+INT+int16",
        artifact_dir=tmp_path,
        quantization=quantization,
        calibration_inputs=calibration,
    )
    want = module(*held_out).numpy()
    got = np.reshape(arm_numerics.run(result, held_out)[0], want.shape)
    return got, want, result.tosa_op_counts["TABLE"]


def test_two_ranges_follow_torch_where_one_loses_the_quiet_values(tmp_path, monkeypatch):
    got, want, tables = _lowered(tmp_path, "int16", True, monkeypatch)
    quiet = slice(0, 128)  # the lower 4 decades of power
    with monkeypatch.context() as m:
        one, _, one_table = _lowered(tmp_path / "one", "int16", False, m)
    assert (tables, one_table) == (2, 1)
    assert sqnr_db(want, got) > 40 and sqnr_db(want[:, quiet], got[:, quiet]) > 9
    assert sqnr_db(want, one) < 30 and sqnr_db(want[:, quiet], one[:, quiet]) < 3


def test_int8_keeps_one_root(tmp_path, monkeypatch):
    _, _, tables = _lowered(tmp_path, "int8", True, monkeypatch)
    assert tables == 1


@pytest.mark.parametrize(
    "expression,found",
    [(lambda a, b: torch.sqrt(a * a + b * b), 1), (lambda a, b: torch.sqrt(a * a + b), 0)],
)
def test_only_sums_of_two_squares_are_magnitudes(expression, found):
    class M(torch.nn.Module):
        def forward(self, a, b):
            return expression(a, b)

    graph = torch.export.export(M(), _spectrum(0)).graph
    assert len(magnitude.magnitudes(graph)) == found
