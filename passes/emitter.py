"""Lazy arithmetic over builder values, so cell functions read like their equations.

The cells in `cells.py` write `n + z * (h - n)` on `Expr`s; nothing reaches the builder
until a strategy asks for a result with `Emitter.emit`, and then only the operations that
result needs are emitted, each once. On the way, the algebra a reader would do by hand:

  * a state known to be zero is `ZERO`: `h @ R`, `r * h`, `p * c` vanish with it;
  * constants fold in numpy (biases of a zero state, masks), `x * 1` and `x + 0` vanish;
  * negation is absorbed: `n + z * (0 - n)` becomes `n - z * n` (two ops, not three);
  * a slice of (value + constant) becomes (slice + sliced constant), which often folds;
  * identical expressions are built once (hash-consing), so `pre[..., :H]` twice is one slice;
  * a gate block of one timestep of the projection is that timestep of the block: the
    slice happens once per sequence, not once per step.

Expressions never span timesteps: strategies emit each step's state and wrap the result
as a fresh leaf, so recursion depth stays at one step's worth.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import activations
from .builder import Builder, Value, is_constant
from .spec import Activation


class Expr:
    """A node of one emitter's expression graph; supports + - * and [..., a:b]."""

    __slots__ = ("em", "op", "args", "attrs")
    __array_ufunc__ = None  # numpy array (op) Expr defers to Expr's reflected operators

    def __init__(self, em: "Emitter", op: str, args: tuple, attrs: tuple):
        self.em, self.op, self.args, self.attrs = em, op, args, attrs

    # constants ------------------------------------------------------------------------
    @property
    def array(self) -> Optional[np.ndarray]:
        return self.attrs[0] if self.op == "const" else None

    def is_const(self, value: Optional[float] = None) -> bool:
        a = self.array
        return a is not None and (value is None or bool(np.all(a == value)))

    # operators ------------------------------------------------------------------------
    def __add__(self, o):
        return self.em.add(self, o)

    def __radd__(self, o):
        return self.em.add(o, self)

    def __sub__(self, o):
        return self.em.sub(self, o)

    def __rsub__(self, o):
        return self.em.sub(o, self)

    def __mul__(self, o):
        return self.em.mul(self, o)

    def __rmul__(self, o):
        return self.em.mul(o, self)

    def __neg__(self):
        return self.em.neg(self)

    def __getitem__(self, index):
        """x[..., a:b]: a slice of the last axis (gate blocks), numpy style."""
        if not (
            isinstance(index, tuple)
            and len(index) == 2
            and index[0] is Ellipsis
            and isinstance(index[1], slice)
            and index[1].step is None
        ):
            raise TypeError("Expr supports only x[..., start:stop]")
        s = index[1]
        if s.start is None and s.stop is None:
            return self
        if s.stop is None or (s.start or 0) < 0 or s.stop < 0:
            raise TypeError("Expr slices need explicit non-negative bounds")
        return self.em.slice(self, -1, s.start or 0, s.stop)

    def __repr__(self):
        return f"Expr({self.op})"


class Emitter:
    """Builds `Expr`s for one builder (a scan body gets its own emitter) and emits them."""

    def __init__(self, builder: Builder, float_dtype=np.float32):
        self.builder = builder
        self.dtype = float_dtype
        self._nodes: dict = {}  # hash-consing: (op, arg ids, attr keys) -> Expr
        self._emitted: dict = {}  # id(Expr) -> builder Value
        self._scalars: dict = {}  # float -> builder Value
        self.ZERO = self.const(0.0)

    # --- leaves ---------------------------------------------------------------------------
    def _node(self, op: str, args: tuple = (), attrs: tuple = ()) -> Expr:
        key = (op, tuple(id(a) for a in args), tuple(_attr_key(a) for a in attrs))
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = Expr(self, op, args, attrs)
        return node

    def value(self, v: Value) -> Expr:
        """Wrap a builder value; None (an absent state) is ZERO."""
        if v is None:
            return self.ZERO
        if isinstance(v, Expr):
            return v
        node = self._node("value", (), (v,))
        self._emitted.setdefault(id(node), v)
        return node

    def const(self, a) -> Expr:
        arr = np.asarray(a, dtype=self.dtype)
        if arr.ndim == 0:
            return self._node("const", (), (arr,))  # scalars are keyed by value
        return Expr(self, "const", (), (arr,))

    def _wrap(self, x) -> Expr:
        """Exprs as they are; None is ZERO; numbers and constant arrays are constants; any
        other builder value (a runtime weight such as a peephole) is a value."""
        if isinstance(x, Expr):
            return x
        if x is None:
            return self.ZERO
        if isinstance(x, (float, int, np.generic)) or is_constant(x):
            return self.const(x)
        return self.value(x)

    # --- arithmetic, folded ----------------------------------------------------------------
    def add(self, a, b) -> Expr:
        a, b = self._wrap(a), self._wrap(b)
        if a.is_const(0):
            return b
        if b.is_const(0):
            return a
        if a.is_const() and b.is_const():
            return self.const(a.array + b.array)
        if b.op == "neg":
            return self.sub(a, b.args[0])
        if a.op == "neg":
            return self.sub(b, a.args[0])
        return self._node("add", (a, b))

    def sub(self, a, b) -> Expr:
        a, b = self._wrap(a), self._wrap(b)
        if b.is_const(0):
            return a
        if a.is_const(0):
            return self.neg(b)
        if a.is_const() and b.is_const():
            return self.const(a.array - b.array)
        if b.op == "neg":
            return self.add(a, b.args[0])
        return self._node("sub", (a, b))

    def mul(self, a, b) -> Expr:
        a, b = self._wrap(a), self._wrap(b)
        if a.is_const(0) or b.is_const(0):
            return self.ZERO
        if a.is_const(1):
            return b
        if b.is_const(1):
            return a
        if a.is_const() and b.is_const():
            return self.const(a.array * b.array)
        if a.op == "neg":
            return self.neg(self.mul(a.args[0], b))
        if b.op == "neg":
            return self.neg(self.mul(a, b.args[0]))
        return self._node("mul", (a, b))

    def neg(self, a) -> Expr:
        a = self._wrap(a)
        if a.is_const():
            return self.const(-a.array)
        if a.op == "neg":
            return a.args[0]
        return self._node("neg", (a,))

    def clamp(self, x, lo: Optional[float], hi: Optional[float]) -> Expr:
        x = self._wrap(x)
        if x.is_const():
            return self.const(np.clip(x.array, lo, hi))
        return self._node("clamp", (x,), (lo, hi))

    def act(self, act: Activation, x) -> Expr:
        return self._node("act", (self._wrap(x),), (act,))

    def linear(self, x, weight, bias=None, name: str = "") -> Expr:
        """x @ weight.T + bias; a ZERO x leaves the bias or ZERO. `name` names the weight
        for the builder (see Builder.linear)."""
        x = self._wrap(x)
        if x.is_const(0):
            return self._wrap(bias)
        return self._node("linear", (x,), (weight, bias, name))

    # --- shape -----------------------------------------------------------------------------------
    def slice(self, x, axis: int, start: int, end: int) -> Expr:
        x = self._wrap(x)
        if x.is_const() and (x.array.ndim == 0 or axis < 0):
            a = x.array
            if a.ndim < -axis or a.shape[axis] == 1:
                return x  # a broadcast constant is the same along the sliced axis
            return self.const(a[(Ellipsis, slice(start, end)) + (slice(None),) * (-axis - 1)])
        if x.op in ("add", "sub", "mul") and any(a.is_const() for a in x.args):
            # slice(v + c) == slice(v) + slice(c): the constant part often folds away
            sliced = [self.slice(a, axis, start, end) for a in x.args]
            return getattr(self, x.op)(*sliced)
        if x.op == "neg":
            return self.neg(self.slice(x.args[0], axis, start, end))
        if x.op == "slice" and x.attrs[0] == axis:
            base = x.attrs[1]
            return self.slice(x.args[0], axis, base + start, base + end)
        if x.op == "piece" and axis == -1:
            # a gate block of one timestep is that timestep of the sequence's gate block:
            # one slice per sequence instead of one per step
            (u,), (t,) = x.args, x.attrs
            src, (u_axis, n) = u.args[0], u.attrs
            return self.unstack(self.slice(src, -1, start, end), u_axis, n)[t]
        return self._node("slice", (x,), (axis, start, end))

    def unstack(self, x, axis: int, n: int) -> list:
        """The n pieces of x along `axis` (each without it), emitted as one builder.unstack."""
        u = self._node("unstack", (self._wrap(x),), (axis, n))
        return [self._node("piece", (u,), (t,)) for t in range(n)]

    def concat(self, xs: Sequence, axis: int) -> Expr:
        xs = [self._wrap(x) for x in xs]
        if all(x.is_const(0) for x in xs):
            return self.ZERO
        if len(xs) == 1:
            return xs[0]
        return self._node("concat", tuple(xs), (axis,))

    def where(self, cond, a, b) -> Expr:
        return self._node("where", (self._wrap(cond), self._wrap(a), self._wrap(b)))

    # --- emission ---------------------------------------------------------------------------------
    def scalar(self, v: float) -> Value:
        """A scalar constant of the builder's graph, made once per value."""
        key = float(v)
        if key not in self._scalars:
            self._scalars[key] = self.builder.constant(np.array(v, self.dtype))
        return self._scalars[key]

    def emit(self, x) -> Value:
        """The builder value of `x`, emitting whatever it needs that was not emitted yet."""
        x = self._wrap(x)
        got = self._emitted.get(id(x))
        if got is not None:
            return got
        b, op = self.builder, x.op
        args = [self.emit(a) for a in x.args]
        if op == "const":
            a = x.array
            v = self.scalar(float(a)) if a.ndim == 0 else b.constant(a)
        elif op in ("add", "sub", "mul", "where", "slice", "clamp"):
            v = getattr(b, op)(*args, *x.attrs)
        elif op == "neg":
            v = b.mul(args[0], self.scalar(-1.0))
        elif op == "act":
            v = activations.apply(b, x.attrs[0], args[0], const=self.scalar)
        elif op == "linear":
            weight, bias, name = x.attrs
            v = b.linear(args[0], weight, bias, name=name)
        elif op == "concat":
            v = b.concat(args, *x.attrs)
        elif op == "unstack":
            v = b.unstack(args[0], *x.attrs)
        elif op == "piece":
            v = args[0][x.attrs[0]]
        else:
            raise AssertionError(op)
        self._emitted[id(x)] = v
        return v


def _attr_key(a):
    if isinstance(a, np.ndarray):
        return ("array", a.tobytes(), a.shape) if a.ndim == 0 else ("id", id(a))
    if isinstance(a, (int, float, str, type(None), Activation)):
        return a
    return ("id", id(a))
