"""A Builder that evaluates with numpy: the reference every adapter's tests compare against.

Values are numpy arrays in the builder's float dtype (float32 unless asked otherwise).
Supports every capability, so every emission and tuning runs here.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .builder import LOOP_ROWS, POSITIONS, SCAN, SCAN_WITH_INITIAL, SELECT, Builder, RuntimeArray


class NumpyBuilder(Builder):
    capabilities = frozenset({SELECT, SCAN, SCAN_WITH_INITIAL, POSITIONS, LOOP_ROWS})

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)

    def _f(self, a):
        a = np.asarray(a)
        return a.astype(self.dtype) if a.dtype.kind == "f" else a

    def input(self, array) -> np.ndarray:
        """A runtime input (x, states, sequence_lens) as this builder's value."""
        return self._f(array).view(RuntimeArray)

    def constant(self, array, name=""):
        return self._f(array)

    def linear(self, x, weight, bias=None, role=None):
        y = x @ self._f(weight).T  # constant or runtime weight alike
        return y if bias is None else y + self._f(bias)

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def div(self, a, b):
        return a / b

    def sigmoid(self, x):
        with np.errstate(over="ignore"):
            return (1 / (1 + np.exp(-x))).astype(self.dtype)

    def tanh(self, x):
        return np.tanh(x)

    def relu(self, x):
        return np.maximum(x, 0).astype(self.dtype)

    def exp(self, x):
        with np.errstate(over="ignore"):
            return np.exp(x)

    def log(self, x):
        return np.log(x)

    def abs(self, x):
        return np.abs(x)

    def clamp(self, x, lo: Optional[float], hi: Optional[float]):
        return np.clip(x, lo, hi).astype(self.dtype)

    def slice(self, x, axis, start, end):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, end)
        return x[tuple(index)]

    def zeros_like_rows(self, like, width):
        return np.zeros((np.shape(like)[0], width), self.dtype).view(RuntimeArray)

    def concat(self, xs: Sequence, axis):
        return np.concatenate(xs, axis=axis)

    def squeeze(self, x, axis):
        return np.squeeze(x, axis=axis)

    def unsqueeze(self, x, axis):
        return np.expand_dims(x, axis)

    def transpose(self, x, perm):
        return np.transpose(x, perm)

    def positions(self, like):
        return np.arange(np.shape(like)[0], dtype=np.int64).view(RuntimeArray)

    def less(self, a, b):
        return np.less(a, b)

    def where(self, cond, a, b):
        return np.where(cond, a, b).astype(self.dtype)

    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def split(self, x, axis, sizes):
        if isinstance(sizes, int):
            return np.split(x, sizes, axis=axis)
        return np.split(x, np.cumsum(sizes)[:-1], axis=axis)

    def loop(self, loop, carried, xs, outer, used=None):
        from .translate import translate_body

        carried = list(carried)
        initial = carried[0]
        if loop.rows_per_step:  # [T*B, X] views: back to [T, B, X]
            xs = [np.reshape(x, (-1, loop.rows_per_step) + np.shape(x)[1:]) for x in xs]
        n = xs[0].shape[0] - loop.first if loop.steps is None else loop.steps
        xs = [x[loop.first : loop.first + n] for x in xs]
        steps = range(n)
        ys = []
        leaves = carried
        for t in reversed(steps) if loop.reverse else steps:
            leaves = [*carried, *(x[t].view(RuntimeArray) for x in xs)]
            carried, y = translate_body(loop.body, self, leaves, outer)
            ys.append(y)
        if not ys:  # zero iterations: the body once on zeros for the outputs' shapes
            zeros = [np.zeros(x.shape[1:], x.dtype).view(RuntimeArray) for x in xs]
            _, y = translate_body(loop.body, self, [*carried, *zeros], outer)
            return carried, [np.zeros((0,) + np.shape(v), self.dtype) for v in y]
        if loop.reverse:
            ys.reverse()
        stacked = [np.stack([y[k] for y in ys]) for k in range(len(ys[0]))]
        if loop.initial_in_ys:  # the initial h is a row of Y too: first in time order
            parts = [stacked[0], initial[None]] if loop.reverse else [initial[None], stacked[0]]
            stacked[0] = np.concatenate(parts)
        return carried, stacked
