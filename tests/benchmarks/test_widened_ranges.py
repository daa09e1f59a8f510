"""benchmarks.widened_ranges: every int16 range F times torchao's own, int8 and pinned
observers untouched, and the observer class as it was once outside."""

from __future__ import annotations

import torch
from torchao.quantization.pt2e import observer

from recurrent_lowering.backends.executorch_arm.compat import histogram_observer
from recurrent_lowering.benchmarks import widened_ranges

INT16 = dict(
    dtype=torch.qint32, quant_min=-32768, quant_max=32767, qscheme=torch.per_tensor_symmetric
)


def _observed(cls, **kwargs):
    torch.manual_seed(0)
    o = cls(**kwargs)
    o(torch.randn(4000) * 3)
    return o


def test_int16_range_widened_from_torchao_search():
    theirs = _observed(observer.HistogramObserver, **INT16)
    low, high = theirs._non_linear_param_search()
    expected = theirs._calculate_qparams(low * 2.0, high * 2.0)
    plain = _observed(histogram_observer.HistogramObserver, **INT16).calculate_qparams()
    with widened_ranges.int16(2.0):
        scale, zero_point = _observed(
            histogram_observer.HistogramObserver, **INT16
        ).calculate_qparams()
    assert torch.equal(scale, expected[0]) and torch.equal(zero_point, expected[1])
    assert float(scale) > 1.9 * float(plain[0])
    after = _observed(histogram_observer.HistogramObserver, **INT16).calculate_qparams()
    assert torch.equal(after[0], plain[0])


def test_int8_and_pinned_untouched():
    plain = _observed(histogram_observer.HistogramObserver).calculate_qparams()
    pinned = (torch.tensor([0.5]), torch.tensor([0]))
    with widened_ranges.int16(2.0):
        int8 = _observed(histogram_observer.HistogramObserver).calculate_qparams()
        held = _observed(histogram_observer.HistogramObserver, **INT16)
        held._pinned = pinned
        assert held.calculate_qparams() is pinned
    assert torch.equal(int8[0], plain[0]) and torch.equal(int8[1], plain[1])
