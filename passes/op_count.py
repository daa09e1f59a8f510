"""A Builder that only records which ops the core emits: op counts to assert and publish.

Values are opaque tokens; nothing is computed. `ops` lists every call in order (constants
included, marked as such); a loop records one "loop" op and keeps its body's ops in
`bodies`, so per-iteration counts are visible too.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from .builder import SCAN, SELECT, Builder

CONSTANT = "constant"


class _Token:
    __slots__ = ("op",)

    def __init__(self, op: str):
        self.op = op

    def __repr__(self):
        return f"<{self.op}>"


class CountingBuilder(Builder):
    def __init__(self, capabilities=frozenset({SELECT, SCAN}), dtype=np.float32):
        self.capabilities = frozenset(capabilities)
        self.dtype = np.dtype(dtype)
        self.ops: list[str] = []
        self.linears: list = []  # weight shapes of every linear, in order (None: runtime)
        self.roles: list = []  # the WeightRole of every linear, in order
        self.bodies: list["CountingBuilder"] = []

    def _op(self, name: str) -> _Token:
        self.ops.append(name)
        return _Token(name)

    def counts(self) -> collections.Counter:
        """Ops by name, constants left out (they are data, not work)."""
        return collections.Counter(op for op in self.ops if op != CONSTANT)

    def total(self) -> int:
        return sum(self.counts().values())

    def constant(self, array, name=""):
        return self._op(CONSTANT)

    def linear(self, x, weight, bias=None, role=None):
        shape = getattr(weight, "shape", None)  # None: a runtime weight (a token)
        self.linears.append(tuple(shape) if shape is not None else None)
        self.roles.append(role)
        return self._op("linear")

    def add(self, a, b):
        return self._op("add")

    def sub(self, a, b):
        return self._op("sub")

    def mul(self, a, b):
        return self._op("mul")

    def div(self, a, b):
        return self._op("div")

    def sigmoid(self, x):
        return self._op("sigmoid")

    def tanh(self, x):
        return self._op("tanh")

    def relu(self, x):
        return self._op("relu")

    def exp(self, x):
        return self._op("exp")

    def log(self, x):
        return self._op("log")

    def abs(self, x):
        return self._op("abs")

    def clamp(self, x, lo: Optional[float], hi: Optional[float]):
        return self._op("clamp")

    def slice(self, x, axis, start, end):
        return self._op("slice")

    def concat(self, xs, axis):
        return self._op("concat")

    def squeeze(self, x, axis):
        return self._op("squeeze")

    def unsqueeze(self, x, axis):
        return self._op("unsqueeze")

    def transpose(self, x, perm):
        return self._op("transpose")

    def unstack(self, x, axis, n):
        """One op (a Split in ONNX): counted once, whatever n."""
        self._op("unstack")
        return [_Token("piece") for _ in range(n)]

    def stack(self, xs, axis):
        return self._op("stack")

    def less(self, a, b):
        return self._op("less")

    def where(self, cond, a, b):
        return self._op("where")

    def reshape(self, x, shape):
        return self._op("reshape")

    def split(self, x, axis, sizes):
        self._op("split")
        return [_Token("piece") for _ in range(sizes if isinstance(sizes, int) else len(sizes))]

    def loop(self, loop, carried, xs, outer, used=None):
        from .translate import translate_body

        inner = CountingBuilder(self.capabilities, self.dtype)
        self.bodies.append(inner)
        leaves = [*carried, *(_Token("x") for _ in xs)]
        new_carried, ys = translate_body(loop.body, inner, leaves, outer)
        self._op("loop")
        return [_Token("carried") for _ in new_carried], [_Token("ys") for _ in ys]
