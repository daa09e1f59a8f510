"""An int16 magnitude sqrt(a*a + b*b), or sqrt(a*a + b*b + e), over three ranges
(quantization/magnitude.py): on the TOSA reference model it follows torch where one range
loses the quiet values, and int8 programs keep the single root."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.quantization import magnitude
from recurrent_lowering.runtime import arm_numerics
from recurrent_lowering.runtime.metrics import sqnr_db


class _Magnitude(torch.nn.Module):
    def __init__(self, offset: float = 0.0):
        super().__init__()
        self.offset = offset

    def forward(self, a, b):
        if self.offset:  # GTCRN's sqrt(re^2 + im^2 + 1e-12)
            return torch.sqrt(a * a + b * b + self.offset)
        return torch.sqrt(a * a + b * b)


def _spectrum(seed: int, level: float = 1.0) -> tuple:
    """Real and imaginary parts whose magnitudes span 8 decades of power, as a spectrum's
    bins from loud to quiet do."""
    g = torch.Generator().manual_seed(seed)
    scale = level * torch.exp(torch.linspace(-8, 0, 256))
    return tuple(torch.randn(1, 256, generator=g) * scale for _ in range(2))


def _lowered(tmp_path, quantization: str, split: bool, monkeypatch, offset=0.0) -> tuple:
    """(TOSA outputs on a held-out input, torch's, TABLE count)."""
    if not split:
        monkeypatch.setattr(magnitude, "split", lambda model, samples: 0)
    module = _Magnitude(offset).eval()
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


@pytest.mark.parametrize("offset", [0.0, 1e-12], ids=["plain", "offset"])
def test_three_ranges_follow_torch_where_one_loses_the_quiet_values(tmp_path, monkeypatch, offset):
    got, want, tables = _lowered(tmp_path, "int16", True, monkeypatch, offset)
    quiet = slice(0, 128)  # the lower 4 decades of power
    with monkeypatch.context() as m:
        one, _, one_table = _lowered(tmp_path / "one", "int16", False, m, offset)
    assert (tables, one_table) == (3, 1)
    assert sqnr_db(want, got) > 45 and sqnr_db(want[:, quiet], got[:, quiet]) > 25
    assert sqnr_db(want, one) < 30 and sqnr_db(want[:, quiet], one[:, quiet]) < 3


def test_int8_keeps_one_root(tmp_path, monkeypatch):
    _, _, tables = _lowered(tmp_path, "int8", True, monkeypatch)
    assert tables == 1


@pytest.mark.parametrize(
    "expression,found",
    [
        (lambda a, b, e: torch.sqrt(a * a + b * b), 1),
        (lambda a, b, e: torch.sqrt(a * a + b * b + 1e-12), 1),
        (lambda a, b, e: torch.sqrt(a * a + b * b + e), 1),  # a tensor attribute (onnx2torch's)
        (lambda a, b, e: torch.sqrt(a * a + b), 0),
        (lambda a, b, e: torch.sqrt(a * a + b * b + (-1.0)), 0),  # sqrt(s - 1): no magnitude
        (lambda a, b, e: torch.sqrt(a * a + b * b + b), 0),
    ],
)
def test_only_sums_of_two_squares_are_magnitudes(expression, found):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("e", torch.tensor(1e-12))

        def forward(self, a, b):
            return expression(a, b, self.e)

    graph = torch.export.export(M(), _spectrum(0)).module().graph  # as the quantizer sees it
    assert len(magnitude.magnitudes(graph)) == found


def test_an_offset_magnitude_splits_to_the_same_function():
    """In float, the split computes sqrt(s + e) itself: sqrt(max(s + e, t1)) +
    sqrt(clamp(s + e, t2, t1)) + sqrt(min(s + e, t2)) - sqrt(t1) - sqrt(t2), here with
    e = 1e-5, large enough to count, and sums in all three ranges."""

    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.sqrt(a * a + b * b + 1e-5)

    calibration = [_spectrum(seed) for seed in range(4)]
    model = torch.export.export(M(), calibration[0]).module()
    assert magnitude.split(model, calibration) == 1
    held_out = _spectrum(100, level=0.5)
    torch.testing.assert_close(model(*held_out), M()(*held_out), rtol=1e-6, atol=1e-7)
