"""Every int16 activation range of a quantization widened, for stream_attribution --widen.

A calibrated range that clips what a held-out stream needs costs accuracy that a wider
range gives back; where rounding is what limits an output, a wider range costs about
6 dB a doubling on it. Widening every int16 range at once (the loop steps' too, states
included) tells the two apart on a real model (docs/results/real_model_accuracy.md).
"""

from __future__ import annotations

import contextlib

from recurrent_lowering.backends.executorch_arm.compat import histogram_observer


@contextlib.contextmanager
def int16(factor: float):
    """Our HistogramObserver's int16 ranges `factor` times wider while inside (--widen):
    as quantization.inputs widens a model input (`widened_qparams`), but every observer,
    pinned ones aside."""
    observer = histogram_observer.HistogramObserver
    original = observer.calculate_qparams

    def calculate_qparams(self):
        widened = isinstance(self, histogram_observer.WidenedHistogramObserver)
        if self._pinned is not None or self.min_val == float("inf") or widened:
            return original(self)
        if self.quant_max <= 255:  # int8
            return original(self)
        return histogram_observer.widened_qparams(self, factor)

    observer.calculate_qparams = calculate_qparams
    try:
        yield
    finally:
        observer.calculate_qparams = original
