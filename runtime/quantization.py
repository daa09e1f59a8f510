"""Affine per-tensor quantization parameters of a delegate's inputs and outputs.

A quantized TOSA graph takes and returns int8/int16 tensors; the float <-> int mapping lives in
the quantize/dequantize nodes ExecuTorch leaves on the CPU around the delegate. Runners take
these parameters so callers can feed and read floats.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class QuantParams:
    """q = clamp(round(x / scale) + zero_point, qmin, qmax); x = (q - zero_point) * scale."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: str  # numpy dtype name of the quantized tensor: "int8" or "int16"

    def quantize(self, x: np.ndarray) -> np.ndarray:
        q = np.round(np.asarray(x, dtype=np.float32) / np.float32(self.scale)) + self.zero_point
        return np.clip(q, self.qmin, self.qmax).astype(self.dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q).astype(np.float32)
        return (q - np.float32(self.zero_point)) * np.float32(self.scale)
