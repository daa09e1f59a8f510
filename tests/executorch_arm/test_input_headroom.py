"""An int16 program input keeps 6 dB of headroom over its calibrated range; a stream's
fed-back state keeps its own (quantization/inputs.py).

The model is DTLN's shape in small: a non-negative spectrum-like input through an LSTM whose
h and c, one state tensor, are fed back. Held out, the input is 1.8x louder than anything
calibration saw (DTLN's held-out recordings reach 70 where its calibration reached 38);
without headroom the CPU's quantize at the delegate's boundary clips it and the stream's
state drifts from fp32 (TOSA reference model against torch; the figures in the test).
The state's h and c are quantized each on its own (quantization/state_parts.py): their
scales, read at the delegate's boundary, stay as calibrated.
"""

from __future__ import annotations

import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.compat import histogram_observer
from recurrent_lowering.backends.executorch_arm.precision import accuracy
from recurrent_lowering.backends.executorch_arm.quantization import inputs
from recurrent_lowering.runtime import streams
from recurrent_lowering.runtime.metrics import sqnr_per_output

HEADROOM = inputs.HEADROOM


class _Stream(torch.nn.Module):
    """An LSTM whose h and c travel in one state tensor, as DTLN's do: no recurrent op reads
    the state input itself, so only the stream's rule (inputs after the first that come back
    as outputs) tells it from the other inputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(12, 16, batch_first=True)
        self.mask = torch.nn.Linear(16, 12)

    def forward(self, x, state):
        h, c = state[..., :16], state[..., 16:]
        y, (h_n, c_n) = self.lstm(x, (h.contiguous(), c.contiguous()))
        return torch.sigmoid(self.mask(y)), torch.cat([h_n, c_n], -1)


def _frames(n: int, level: float, generator) -> list:
    state = torch.zeros(1, 1, 32)
    return [(torch.randn(1, 4, 12, generator=generator).abs() * level, state) for _ in range(n)]


def _lowered(tmp_path, headroom: float, monkeypatch):
    monkeypatch.setattr(inputs, "HEADROOM", headroom)
    generator = torch.Generator().manual_seed(1)
    calibration = _frames(8, 10.0, generator)
    held_out = _frames(24, 18.0, generator)
    module = _Stream().eval()
    stream = [(1, 1)]  # the state in, its next value out
    calibration = [
        tuple(torch.as_tensor(a) for a in s)
        for s in streams.fed_back(accuracy.of_module(module), calibration, stream)[0]
    ]
    result = flow.lower(
        module,
        calibration[0],
        "TOSA-1.0+INT",
        tmp_path / str(headroom),
        quantization="int16",
        calibration_inputs=calibration,
    )
    samples = accuracy.Evaluation(held_out, stream)
    want = accuracy.outputs(accuracy.of_module(module), samples)
    got = accuracy.outputs(accuracy.of_lowered(result), samples)
    return result, calibration, sqnr_per_output(want, got)


def _scales(result) -> dict:
    """The delegate's input shape -> the scales quantizing values of that shape there."""
    (boundary,) = result.boundaries.values()
    scales: dict = {}
    for value in boundary.inputs:
        scales.setdefault(tuple(value.shape), []).append(value.quant.scale)
    return scales


def test_a_louder_held_out_input_is_not_clipped(tmp_path, monkeypatch):
    plain, calibration, before = _lowered(tmp_path, 1.0, monkeypatch)
    wide, _, after = _lowered(tmp_path, HEADROOM, monkeypatch)
    plain_scales, wide_scales = _scales(plain), _scales(wide)
    x_scale = [s.pop((1, 4, 12))[0] for s in (plain_scales, wide_scales)]
    assert x_scale[1] == pytest.approx(HEADROOM * x_scale[0], rel=1e-6), x_scale
    assert wide_scales == plain_scales, wide_scales  # h and c keep their calibrated ranges
    assert sorted(plain_scales) == [(1, 1, 16)], plain_scales
    largest = max(float(s[0].max()) for s in calibration)
    assert x_scale[0] * 32767 < 1.8 * largest < x_scale[1] * 32767  # clipped only before
    assert after[0] > before[0] + 20 and after[1] > before[1] + 3, (before, after)


def test_the_observer_widens_a_range_above_its_floor_only():
    def scale(make, values):
        observer = make()
        observer(values)
        return float(observer.calculate_qparams()[0])

    kwargs = dict(dtype=torch.int16, qscheme=torch.per_tensor_symmetric, eps=2.0**-12)
    kwargs.update(quant_min=-32767, quant_max=32767)
    plain = lambda: histogram_observer.HistogramObserver(**kwargs)  # noqa: E731
    wide = lambda: histogram_observer.WidenedHistogramObserver(factor=2.0, **kwargs)  # noqa: E731
    x = torch.linspace(-30.0, 30.0, 1001)
    assert scale(wide, x) == pytest.approx(2 * scale(plain, x), rel=1e-6)
    for small in (x / 100, x / 6):  # ranges (0.3, 5) under the floor's (8): it stays
        assert scale(wide, small) == scale(plain, small) == 2.0**-12
