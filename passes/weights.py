"""Weight algebra: arranging weights (directions, gate order, bias folding) whether they are
constants or values fed at run time.

A weight is a numpy array -- a constant: every operation below folds in numpy, so constant
weights cost no ops -- or a `Lazy`: an expression over builder values of known shape
(ONNX's own node tests feed W, R, B and P as graph inputs). A `Lazy` reaches the graph only
through `materialize`, once, when the core emits. Folding keeps runtime weights cheap:

  * a slice of a concat (or of a stack) keeps only the parts it covers;
  * adjacent slices of one value concatenate back into one slice; a full slice is no op;
  * taking row i of a stack is its i-th part;

so a chain of reorderings (ONNX LSTM (i, o, f, c) -> canonical (i, f, g, o) -> internal
(i, f, o, g)) costs one set of slices and one concat in the graph, not two.

Every operation acts on axis 0 (directions, gate blocks, peephole rows): that is all
weight arrangement needs. gate_order.py and cells.prepare use nothing else.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from .builder import Value, is_constant


class Lazy:
    """A runtime weight expression: op in value, take, rows, concat, stack, add."""

    __slots__ = ("op", "args", "attrs", "shape")

    def __init__(self, op: str, args: tuple, attrs: tuple, shape: tuple):
        self.op, self.args, self.attrs, self.shape = op, args, attrs, tuple(shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"Lazy({self.op}, {list(self.shape)})"


Weight = Union[np.ndarray, Lazy]


def runtime(value: Value, shape: Sequence[int]) -> Lazy:
    """A builder value of static `shape` used as a weight."""
    return Lazy("value", (), (value,), shape)


def is_runtime(w) -> bool:
    return isinstance(w, Lazy)


def lift(w, shape: Optional[Sequence[int]] = None):
    """Anything the core accepts as a weight, as a Weight: numpy constants stay, a Lazy
    stays, any other builder value (a NumpyBuilder RuntimeArray, an fx node, an ONNX name)
    becomes a runtime leaf of `shape` (its own, if it has one)."""
    if w is None or isinstance(w, Lazy) or is_constant(w):
        return w
    if shape is None:
        shape = np.shape(w)
    return runtime(w, shape)


def shape(w) -> Optional[tuple]:
    """The static shape of a weight, or None for an opaque builder value."""
    if isinstance(w, Lazy) or isinstance(w, np.ndarray):
        return tuple(w.shape)
    return None


# --- operations (axis 0) -------------------------------------------------------------------


def take(w: Weight, i: int) -> Weight:
    """w[i]: axis 0 dropped (one direction of an ONNX tensor, one peephole row)."""
    if not isinstance(w, Lazy):
        return np.asarray(w)[i]
    if w.op == "stack":
        return w.args[i]
    if w.op == "rows":
        return take(w.args[0], w.attrs[0] + i)
    if w.op == "concat":
        for part, lo in zip(w.args, _offsets(w.args)):
            if lo <= i < lo + _len(part):
                return take(part, i - lo)
    return Lazy("take", (w,), (i,), w.shape[1:])


def rows(w: Weight, start: int, end: int) -> Weight:
    """w[start:end] along axis 0."""
    if not isinstance(w, Lazy):
        return np.asarray(w)[start:end]
    if (start, end) == (0, w.shape[0]):
        return w
    if w.op == "rows":
        base = w.attrs[0]
        return rows(w.args[0], base + start, base + end)
    if w.op in ("concat", "stack"):
        picked = []
        for part, lo in zip(w.args, _offsets(w.args) if w.op == "concat" else range(len(w.args))):
            n = _len(part) if w.op == "concat" else 1
            a, b = max(start, lo), min(end, lo + n)
            if a < b:
                picked.append(rows(part, a - lo, b - lo) if w.op == "concat" else part)
        return concat(picked) if w.op == "concat" else stack(picked)
    return Lazy("rows", (w,), (start, end), (end - start,) + w.shape[1:])


def blocks(w: Optional[Weight], n: int, order: Sequence[int]) -> Optional[Weight]:
    """The n equal blocks of w (axis 0) in `order`: block j of the result is block order[j]."""
    if w is None:
        return None
    size = _len(w) // n
    return concat([rows(w, k * size, (k + 1) * size) for k in order])


def concat(parts: Sequence[Weight]) -> Weight:
    """Parts joined along axis 0; neighbouring slices of one value merge back."""
    flat: list = []
    for p in parts:
        flat.extend(p.args if isinstance(p, Lazy) and p.op == "concat" else [p])
    merged: list = []
    for p in flat:
        q = merged[-1] if merged else None
        if q is not None and not isinstance(p, Lazy) and not isinstance(q, Lazy):
            merged[-1] = np.concatenate([q, p])
        elif (
            isinstance(p, Lazy)
            and isinstance(q, Lazy)
            and p.op == q.op == "rows"
            and p.args[0] is q.args[0]
            and q.attrs[1] == p.attrs[0]
        ):
            merged[-1] = rows(p.args[0], q.attrs[0], p.attrs[1])
        else:
            merged.append(p)
    if len(merged) == 1:
        return merged[0]
    shape0 = sum(_len(p) for p in merged)
    return Lazy("concat", tuple(merged), (), (shape0,) + tuple(merged[0].shape[1:]))


def stack(parts: Sequence[Weight]) -> Weight:
    """Parts of equal shape stacked on a new axis 0."""
    if not any(isinstance(p, Lazy) for p in parts):
        return np.stack([np.asarray(p) for p in parts])
    return Lazy("stack", tuple(parts), (), (len(parts),) + tuple(parts[0].shape))


def add(a: Optional[Weight], b: Optional[Weight]) -> Optional[Weight]:
    """a + b; None is an absent (zero) term."""
    if a is None or b is None:
        return a if b is None else b
    if not isinstance(a, Lazy) and not isinstance(b, Lazy):
        return np.asarray(a) + np.asarray(b)
    return Lazy("add", (a, b), (), a.shape)


def zeros(n: int, like: Optional[Weight]) -> np.ndarray:
    """A constant zero vector of length n in `like`'s dtype (float32 for runtime weights)."""
    dtype = like.dtype if isinstance(like, np.ndarray) else np.float32
    return np.zeros(n, dtype)


def nonzero(w: Optional[Weight]) -> Optional[Weight]:
    """None for an absent or all-zero constant; a runtime weight may be anything: kept."""
    if w is None or isinstance(w, Lazy):
        return w
    return w if np.any(w) else None


def _len(w: Weight) -> int:
    return w.shape[0]


def _offsets(parts) -> list:
    out, pos = [], 0
    for p in parts:
        out.append(pos)
        pos += _len(p)
    return out


# --- emission -------------------------------------------------------------------------------


def materialize(g, w, cache: dict, name: str = ""):
    """w as the program takes it: numpy constants unchanged, a Lazy as nodes of the graph
    `g` (slice/concat/add; each expression once per cache; its runtime leaves become
    `external` nodes). `name` is kept for messages."""
    if not isinstance(w, Lazy):
        return w
    got = cache.get(id(w))
    if got is not None:
        return got[1]

    def arg(a):
        return materialize(g, a, cache, name) if isinstance(a, Lazy) else g.const(np.asarray(a))

    op = w.op
    if op == "value":
        v = g.external(w.attrs[0], w.shape)
    elif op == "take":
        (i,) = w.attrs
        v = g.squeeze(g.slice(arg(w.args[0]), 0, i, i + 1), 0)
    elif op == "rows":
        v = g.slice(arg(w.args[0]), 0, *w.attrs)
    elif op == "concat":
        v = g.concat([arg(p) for p in w.args], 0)
    elif op == "stack":
        v = g.concat([g.unsqueeze(arg(p), 0) for p in w.args], 0)
    elif op == "add":
        v = g.add(arg(w.args[0]), arg(w.args[1]))
    else:
        raise AssertionError(op)
    cache[id(w)] = (w, v)  # keeps w alive, so its id stays unique while cached
    return v
