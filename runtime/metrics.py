"""The error figures every comparison in the project reports."""

from __future__ import annotations

import math

import numpy as np


def sqnr_db(reference, actual) -> float:
    """Signal-to-quantization-noise ratio, 10 log10(sum(ref^2) / sum((ref - actual)^2)) in dB:
    inf when they are equal, -inf for a zero reference with any noise."""
    reference = np.asarray(reference, dtype=np.float64)
    noise = float(np.sum(np.square(reference - np.asarray(actual, dtype=np.float64))))
    return db(float(np.sum(np.square(reference))), noise)


def db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) for energies: inf for no noise, -inf for noise on no signal."""
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def sqnr_per_output(reference: list, actual: list) -> list[float]:
    """SQNR of each output: one figure over all hides a state output that went wrong
    behind a large one, or a small one behind a state."""
    return [sqnr_db(np.ravel(r), np.ravel(a)) for r, a in zip(reference, actual, strict=True)]


def _integer(array) -> bool:
    return np.asarray(array).dtype.kind in "iub"


def equal_per_output(reference: list, actual: list) -> list:
    """The share of elements equal to the reference for each integer output (a class index,
    a count), None for a floating one: an index's SQNR weighs a flip by how far apart the
    two indices happen to be."""
    return [
        float(np.mean(np.ravel(r) == np.ravel(a))) if _integer(r) else None
        for r, a in zip(reference, actual, strict=True)
    ]


def judged(reference: list) -> list[bool]:
    """Which outputs an SQNR target, or a figure over all outputs, judges: the floating ones
    when there are any (an integer output, a class index, follows from the values it is
    taken from, and is not in their units), else all."""
    floating = [not _integer(r) for r in reference]
    return floating if any(floating) else [True] * len(floating)


def judged_sqnr_per_output(reference: list, actual: list) -> list[float]:
    """sqnr_per_output with the outputs the target does not judge at inf."""
    figures = sqnr_per_output(reference, actual)
    return [f if j else math.inf for f, j in zip(figures, judged(reference))]
