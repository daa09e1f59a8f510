"""--calibration arrays checked against the model's inputs before anything is lowered: a
wrong count or shape would otherwise surface as a traceback deep in export or conversion, or
worse, lower a model for the calibration's shape instead of the model's."""

from __future__ import annotations

from typing import Sequence

from .errors import LoweringError


def check(path, arrays: Sequence, specs: Sequence[tuple]) -> None:
    """`specs`: (input name, shape with None for a dynamic dimension) per model input."""
    names = ", ".join(name for name, _ in specs)
    if len(arrays) != len(specs):
        raise LoweringError(f"{path}: {len(arrays)} arrays for {len(specs)} model inputs ({names})")
    for k, (array, (name, shape)) in enumerate(zip(arrays, specs)):
        got = tuple(array.shape)
        fits = len(got) == len(shape) and all(d is None or d == g for d, g in zip(shape, got))
        if not fits:
            want = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
            raise LoweringError(
                f"{path}: array {k} has shape {list(got)}; model input '{name}' takes {want}"
            )
