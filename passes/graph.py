"""The program the core hands adapters: a small DAG of typed nodes, built with algebra.

Cells write `n + z * (h - n)` on `Node`s; a `Graph` builds each node through constructors
that do the algebra a reader would do by hand, so the program holds only what a result
needs:

  * a state known to be zero is `ZERO`: `h @ R`, `r * h`, `p * c` vanish with it;
  * constants fold in numpy (biases of a zero state, masks), `x * 1` and `x + 0` vanish;
  * negation is absorbed: `n + z * (0 - n)` becomes `n - z * n` (two ops, not three);
  * a slice of (value + constant) becomes (slice + sliced constant), which often folds;
  * identical nodes are built once (hash-consing), so `pre[..., :H]` twice is one slice;
  * a gate block of one timestep of the projection is that timestep of the block: the
    slice happens once per sequence, not once per step.

Node kinds (`op`) form a closed set, which is what an adapter translates (translate.py):

  input, external             program inputs (x, states, lengths; an adapter's runtime weight)
  const                       a numpy array; weights carry a WeightRole
  linear                      x @ w.T (+ b): w, b constant (attrs) or nodes (runtime weights)
  add sub mul neg             elementwise, numpy broadcasting
  act clamp                   an Activation; clamp to [lo, hi]
  slice concat squeeze unsqueeze transpose reshape
  unstack piece stack split   a static axis into pieces, and back
  less where positions zeros_like_rows      masks for sequence lengths
  recurrence                  one layer direction over time (program.py); passes turn it
                              into unrolled steps or a `loop`
  loop result                 a loop over time with a body graph (attrs: Loop); its k-th result

Every node has `shape`, a tuple whose unknown dims are None (or None when the rank is
unknown), so passes and translators need no shape inference of their own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from .roles import WeightRole
from .spec import Activation


class NoAttrs(NamedTuple):
    """add sub mul neg less where positions"""


class InputAttrs(NamedTuple):
    name: str  # bound to a value when the program is translated


class ExternalAttrs(NamedTuple):
    value: Any  # an adapter's value, or a node of the enclosing program (a loop body's)


class ConstAttrs(NamedTuple):
    array: np.ndarray
    role: Optional[WeightRole] = None


class ClampAttrs(NamedTuple):
    lo: Optional[float]
    hi: Optional[float]


class ActAttrs(NamedTuple):
    act: Activation


class LinearAttrs(NamedTuple):
    weight: Any  # a numpy constant, or IN_ARGS: the node after x in the node's args
    bias: Any  # the same, or None
    role: Optional[WeightRole]


class SliceAttrs(NamedTuple):
    axis: int
    start: int
    end: int


class AxisAttrs(NamedTuple):
    axis: int  # concat, stack, squeeze, unsqueeze


class TransposeAttrs(NamedTuple):
    perm: tuple


class ReshapeAttrs(NamedTuple):
    shape: tuple  # one dim may be -1


class UnstackAttrs(NamedTuple):
    axis: int
    n: int


class SplitAttrs(NamedTuple):
    axis: int
    sizes: Any  # a tuple of sizes, or a count of equal pieces


class IndexAttrs(NamedTuple):
    index: int  # piece: of its unstack or split; result: of its loop or recurrence


class WidthAttrs(NamedTuple):
    width: int


class LoopAttrs(NamedTuple):
    loop: "Loop"


class RecurrenceAttrs(NamedTuple):
    recurrence: Any  # program.Recurrence


# Each node kind's attributes: what `Graph.node` takes and `verify` checks.
ATTRS = {
    **dict.fromkeys(("add", "sub", "mul", "neg", "less", "where", "positions"), NoAttrs),
    "input": InputAttrs,
    "external": ExternalAttrs,
    "const": ConstAttrs,
    "clamp": ClampAttrs,
    "act": ActAttrs,
    "linear": LinearAttrs,
    "slice": SliceAttrs,
    **dict.fromkeys(("concat", "stack", "squeeze", "unsqueeze"), AxisAttrs),
    "transpose": TransposeAttrs,
    "reshape": ReshapeAttrs,
    "unstack": UnstackAttrs,
    "split": SplitAttrs,
    **dict.fromkeys(("piece", "result"), IndexAttrs),
    "zeros_like_rows": WidthAttrs,
    "loop": LoopAttrs,
    "recurrence": RecurrenceAttrs,
}


class Node:
    """One operation of a Graph; supports + - * and [..., a:b] (a slice of the last axis)."""

    __slots__ = ("graph", "op", "args", "attrs", "shape", "__weakref__")
    __array_ufunc__ = None  # numpy array (op) Node defers to Node's reflected operators

    def __init__(self, graph: "Graph", op: str, args: tuple, attrs: tuple, shape):
        self.graph, self.op, self.args, self.attrs, self.shape = graph, op, args, attrs, shape

    @property
    def array(self) -> Optional[np.ndarray]:
        return self.attrs.array if self.op == "const" else None

    def is_const(self, value: Optional[float] = None) -> bool:
        a = self.array
        return a is not None and (value is None or bool(np.all(a == value)))

    def __add__(self, o):
        return self.graph.add(self, o)

    def __radd__(self, o):
        return self.graph.add(o, self)

    def __sub__(self, o):
        return self.graph.sub(self, o)

    def __rsub__(self, o):
        return self.graph.sub(o, self)

    def __mul__(self, o):
        return self.graph.mul(self, o)

    def __rmul__(self, o):
        return self.graph.mul(o, self)

    def __neg__(self):
        return self.graph.neg(self)

    def __getitem__(self, index):
        if not (
            isinstance(index, tuple)
            and len(index) == 2
            and index[0] is Ellipsis
            and isinstance(index[1], slice)
            and index[1].step is None
        ):
            raise TypeError("Node supports only x[..., start:stop]")
        s = index[1]
        if s.start is None and s.stop is None:
            return self
        if s.stop is None or (s.start or 0) < 0 or s.stop < 0:
            raise TypeError("Node slices need explicit non-negative bounds")
        return self.graph.slice(self, -1, s.start or 0, s.stop)

    def __repr__(self):
        return f"Node({self.op}, {self.shape})"


def _broadcast(shapes):
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = [d for d in dims if d is not None and d != 1]
        out.append(known[0] if known else (None if None in dims else 1))
    return tuple(out)


def _axis(shape, axis: int, extra: int = 0) -> int:
    return axis % (len(shape) + extra) if shape is not None else axis


class Graph:
    """Builds nodes with the algebra above; one per program (a loop body gets its own)."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self._nodes: dict = {}  # hash-consing: (op, arg ids, attr keys) -> Node
        self.ZERO = self.const(0.0)

    # --- leaves ---------------------------------------------------------------------------
    def node(self, op: str, args: tuple = (), attrs: tuple = (), shape=None) -> Node:
        """A node of kind `op` as it is, no algebra: `attrs` is `ATTRS[op]`'s type. The
        constructors below go through it; a pass uses it for the kinds without one
        (`recurrence`, `loop`, `result`). Identical nodes are one node (hash-consing)."""
        if not isinstance(attrs, ATTRS[op]):
            raise TypeError(f"a {op} node takes {ATTRS[op].__name__} attributes, not {attrs!r}")
        key = (op, tuple(id(a) for a in args), tuple(_attr_key(a) for a in attrs))
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = Node(self, op, args, attrs, shape)
        return node

    def input(self, name: str, shape=None) -> Node:
        """A program input, bound by name when the program is translated."""
        return self.node("input", (), InputAttrs(name), None if shape is None else tuple(shape))

    def external(self, value, shape=None) -> Node:
        """An adapter's value used as it is (a runtime weight, a loop body's outer value)."""
        shape = None if shape is None else tuple(shape)
        return self.node("external", (), ExternalAttrs(value), shape)

    def const(self, a, role: Optional[WeightRole] = None) -> Node:
        arr = np.asarray(a)
        if arr.dtype.kind == "f" or arr.dtype == object:
            arr = arr.astype(self.dtype)
        if arr.ndim == 0 and role is None:
            return self.node("const", (), ConstAttrs(arr), ())  # scalars are keyed by value
        return Node(self, "const", (), ConstAttrs(arr, role), tuple(arr.shape))

    def wrap(self, x) -> Node:
        """Nodes as they are; None is ZERO; numbers and arrays are constants."""
        if isinstance(x, Node):
            return x
        if x is None:
            return self.ZERO
        return self.const(x)

    # --- arithmetic, folded ----------------------------------------------------------------
    def _binary(self, op: str, a: Node, b: Node) -> Node:
        return self.node(op, (a, b), NoAttrs(), _broadcast([a.shape, b.shape]))

    def add(self, a, b) -> Node:
        a, b = self.wrap(a), self.wrap(b)
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
        return self._binary("add", a, b)

    def sub(self, a, b) -> Node:
        a, b = self.wrap(a), self.wrap(b)
        if b.is_const(0):
            return a
        if a.is_const(0):
            return self.neg(b)
        if a.is_const() and b.is_const():
            return self.const(a.array - b.array)
        if b.op == "neg":
            return self.add(a, b.args[0])
        return self._binary("sub", a, b)

    def mul(self, a, b) -> Node:
        a, b = self.wrap(a), self.wrap(b)
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
        return self._binary("mul", a, b)

    def neg(self, a) -> Node:
        a = self.wrap(a)
        if a.is_const():
            return self.const(-a.array)
        if a.op == "neg":
            return a.args[0]
        return self.node("neg", (a,), NoAttrs(), a.shape)

    def clamp(self, x, lo: Optional[float], hi: Optional[float]) -> Node:
        x = self.wrap(x)
        if x.is_const():
            return self.const(np.clip(x.array, lo, hi))
        return self.node("clamp", (x,), ClampAttrs(lo, hi), x.shape)

    def act(self, act: Activation, x) -> Node:
        x = self.wrap(x)
        return self.node("act", (x,), ActAttrs(act), x.shape)

    def linear(self, x, weight, bias=None, role: Optional[WeightRole] = None) -> Node:
        """x @ weight.T + bias; a ZERO x leaves the bias or ZERO. `weight` and `bias` are
        numpy constants or nodes (runtime weights)."""
        x = self.wrap(x)
        if x.is_const(0):
            return self.ZERO if bias is None else self.wrap(bias)
        w_rows = np.shape(weight)[0] if not isinstance(weight, Node) else _dim(weight, 0)
        shape = None if x.shape is None else x.shape[:-1] + (w_rows,)
        args = (x,) + tuple(v for v in (weight, bias) if isinstance(v, Node))
        consts = tuple(IN_ARGS if isinstance(v, Node) else v for v in (weight, bias))
        return self.node("linear", args, LinearAttrs(*consts, role), shape)

    # --- shape ------------------------------------------------------------------------------
    def slice(self, x, axis: int, start: int, end: int) -> Node:
        x = self.wrap(x)
        if x.is_const() and (x.array.ndim == 0 or axis < 0):
            a = x.array
            if a.ndim < -axis or a.shape[axis] == 1:
                return x  # a broadcast constant is the same along the sliced axis
            return self.const(a[(Ellipsis, slice(start, end)) + (slice(None),) * (-axis - 1)])
        if x.op in ("add", "sub", "mul") and any(a.is_const() for a in x.args):
            # slice(v + c) == slice(v) + slice(c): the constant part often folds away (a
            # constant is sliced on the axis counted from the back, where it broadcasts)
            back = axis if axis < 0 else (None if x.shape is None else axis - len(x.shape))
            if back is not None:
                sliced = [self.slice(a, back if a.is_const() else axis, start, end) for a in x.args]
                return getattr(self, x.op)(*sliced)
        if x.op == "neg":
            return self.neg(self.slice(x.args[0], axis, start, end))
        if (
            x.op == "concat"
            and x.shape is not None
            and _axis(x.shape, axis) == _axis(x.shape, x.attrs.axis)
        ):
            parts = _parts(x, _axis(x.shape, axis), start, end)
            if parts is not None:  # the parts it covers: a weight's gate block, say
                return self.concat([self.slice(p, axis, a, b) for p, a, b in parts], axis)
        if x.op == "slice" and x.attrs.axis == axis:
            base = x.attrs.start
            return self.slice(x.args[0], axis, base + start, base + end)
        if x.op == "piece" and axis == -1 and x.args[0].op == "unstack":
            # a gate block of one timestep is that timestep of the sequence's gate block:
            # one slice per sequence instead of one per step
            (u,), t = x.args, x.attrs.index
            return self.piece("unstack", self.slice(u.args[0], -1, start, end), u.attrs, t)
        shape = None
        if x.shape is not None:
            a = _axis(x.shape, axis)
            dim = x.shape[a]
            size = None if dim is None else len(range(*slice(start, end).indices(dim)))
            shape = x.shape[:a] + (size,) + x.shape[a + 1 :]
        return self.node("slice", (x,), SliceAttrs(axis, start, end), shape)

    def concat(self, xs: Sequence, axis: int) -> Node:
        xs = [self.wrap(x) for x in xs]
        if len(xs) == 1:
            return xs[0]
        if all(x.is_const(0) and x.shape == () for x in xs):
            return self.ZERO
        shape = None
        if all(x.shape is not None for x in xs):
            a = _axis(xs[0].shape, axis)
            dims = [x.shape[a] for x in xs]
            base = _broadcast([x.shape for x in xs])
            total = None if None in dims else sum(dims)
            shape = base[:a] + (total,) + base[a + 1 :]
        return self.node("concat", tuple(xs), AxisAttrs(axis), shape)

    def squeeze(self, x, axis: int) -> Node:
        x = self.wrap(x)
        if x.op == "unsqueeze" and x.attrs.axis == axis:
            return x.args[0]
        shape = None if x.shape is None else _without(x.shape, _axis(x.shape, axis))
        return self.node("squeeze", (x,), AxisAttrs(axis), shape)

    def unsqueeze(self, x, axis: int) -> Node:
        x = self.wrap(x)
        shape = None
        if x.shape is not None:
            a = _axis(x.shape, axis, extra=1)
            shape = x.shape[:a] + (1,) + x.shape[a:]
        return self.node("unsqueeze", (x,), AxisAttrs(axis), shape)

    def transpose(self, x, perm: Sequence[int]) -> Node:
        x = self.wrap(x)
        shape = None if x.shape is None else tuple(x.shape[p] for p in perm)
        return self.node("transpose", (x,), TransposeAttrs(tuple(perm)), shape)

    def reshape(self, x, shape: Sequence[int]) -> Node:
        """To `shape` (one dim may be -1); its known dims become the node's shape."""
        x = self.wrap(x)
        out = tuple(None if d == -1 else int(d) for d in shape)
        if -1 in shape and x.shape is not None and None not in x.shape:  # the -1, computed
            known = int(np.prod([d for d in shape if d != -1]))
            out = tuple(int(np.prod(x.shape)) // known if d == -1 else int(d) for d in shape)
        return self.node("reshape", (x,), ReshapeAttrs(tuple(int(d) for d in shape)), out)

    def unstack(self, x, axis: int, n: int) -> list:
        """The n pieces of x along static `axis`, each without it."""
        x = self.wrap(x)  # once: an array would make a constant per piece
        return [self.piece("unstack", x, UnstackAttrs(axis, n), t) for t in range(n)]

    def split(self, x, axis: int, sizes) -> list:
        """Pieces of x along `axis`, each keeping it: `sizes` (together the whole axis), or
        an int n for n equal pieces."""
        x = self.wrap(x)  # once: an array would make a constant per piece
        key = sizes if isinstance(sizes, int) else tuple(sizes)
        count = key if isinstance(key, int) else len(key)
        return [self.piece("split", x, SplitAttrs(axis, key), k) for k in range(count)]

    def piece(self, op: str, x, attrs, index: int) -> Node:
        """Piece `index` of `op` ("unstack" or "split") of x with `attrs`: the node that
        unstack / split list at `index`, built alone (a rebuild of one piece of a T-piece
        parent then costs one node, not T)."""
        x = self.wrap(x)
        parent = self.node(op, (x,), attrs, x.shape)
        shape = None
        if x.shape is not None:
            a = _axis(x.shape, attrs.axis)
            if op == "unstack":
                shape = _without(x.shape, a)
            else:
                dim, key = x.shape[a], attrs.sizes
                size = (None if dim is None else dim // key) if isinstance(key, int) else key[index]
                shape = x.shape[:a] + (size,) + x.shape[a + 1 :]
        return self.node("piece", (parent,), IndexAttrs(index), shape)

    def stack(self, xs: Sequence, axis: int) -> Node:
        xs = [self.wrap(x) for x in xs]
        shape = None
        if xs[0].shape is not None:
            a = _axis(xs[0].shape, axis, extra=1)
            shape = xs[0].shape[:a] + (len(xs),) + xs[0].shape[a:]
        return self.node("stack", tuple(xs), AxisAttrs(axis), shape)

    # --- masks ------------------------------------------------------------------------------
    def less(self, a, b) -> Node:
        a, b = self.wrap(a), self.wrap(b)
        return self._binary("less", a, b)

    def where(self, cond, a, b) -> Node:
        cond, a, b = self.wrap(cond), self.wrap(a), self.wrap(b)
        shape = _broadcast([cond.shape, a.shape, b.shape])
        return self.node("where", (cond, a, b), NoAttrs(), shape)

    def positions(self, like) -> Node:
        """int64 [0, 1, ..., n-1] for the size n of axis 0 of `like` (known at run time)."""
        like = self.wrap(like)
        n = None if like.shape is None else like.shape[0]
        return self.node("positions", (like,), NoAttrs(), (n,))

    def zeros_like_rows(self, like, width: int) -> Node:
        """Zeros [B, width] with the (run-time) batch B of a [B, X] value."""
        like = self.wrap(like)
        b = None if like.shape is None else like.shape[0]
        return self.node("zeros_like_rows", (like,), WidthAttrs(width), (b, width))

    # --- loops ------------------------------------------------------------------------------
    def loop(self, attrs: "Loop", carried: Sequence, xs: Sequence) -> list:
        """A loop over `xs` (lax.scan semantics, see Loop): body(carried, x slices) ->
        (carried', ys). Returns [final carried..., ys stacked on axis 0...]."""
        carried = [self.wrap(v) for v in carried]
        xs = [self.wrap(v) for v in xs]
        node = self.node("loop", (*carried, *xs), LoopAttrs(attrs), None)
        results = []
        for k, out in enumerate(attrs.body.outputs):
            shape = out.shape
            if k >= len(carried) and shape is not None:
                steps = attrs.steps_of(xs[0].shape if xs else None)
                shape = (None if steps is None else steps + attrs.initial_in_ys,) + shape
            results.append(self.node("result", (node,), IndexAttrs(k), shape))
        return results


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """The attributes of a loop node. Each step reads the next slice of every sequence in
    xs along axis 0, from row `first` on, for `steps` steps (None: to the end), in reverse
    time order when `reverse`; with `rows_per_step` B the sequences are 2-D [T*B, X] views
    and a step reads B rows. The ys hold each step's outputs in time order; with
    `initial_in_ys` (one y, which is the new carried[0]) they also hold the initial
    carried[0], first in time order (last when reverse)."""

    body: "Body"
    reverse: bool = False
    initial_in_ys: bool = False
    first: int = 0
    steps: Optional[int] = None
    rows_per_step: Optional[int] = None

    def steps_of(self, xs_shape) -> Optional[int]:
        if self.steps is not None:
            return self.steps
        if xs_shape is None or xs_shape[0] is None:
            return None
        rows = xs_shape[0] // (self.rows_per_step or 1)
        return rows - self.first


IN_ARGS = "in args"  # a linear's weight or bias that is a node (a runtime weight)


def linear_operands(node: Node, args: Optional[Sequence] = None) -> tuple:
    """(x, weight, bias) of a `linear` node: constants as they are, runtime weights as the
    nodes (or, given `args`, the values standing for its inputs) they are."""
    args = node.args if args is None else args
    rest = iter(args[1:])
    at = node.attrs
    w, b = (next(rest) if a is IN_ARGS else a for a in (at.weight, at.bias))
    return args[0], w, b


class Body:
    """A loop body: its own Graph, leaves `inputs` (carried values, then the slices of the
    loop's sequences) and `outputs` (new carried values, then the per-step outputs)."""

    def __init__(self, graph: Graph, inputs: list, outputs: list, num_carried: int):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.num_carried = num_carried


def _parts(x: Node, axis: int, start: int, end: int):
    """(part, start, end) of the parts of concat `x` that [start, end) covers, or None when a
    part's size is unknown."""
    sizes = [None if p.shape is None else p.shape[_axis(p.shape, axis)] for p in x.args]
    if None in sizes:
        return None
    start, end, _ = slice(start, end).indices(sum(sizes))
    out, pos = [], 0
    for part, size in zip(x.args, sizes):
        a, b = max(start, pos), min(end, pos + size)
        if a < b:
            out.append((part, a - pos, b - pos))
        pos += size
    return out or None


def _dim(node: Node, axis: int):
    return None if node.shape is None else node.shape[axis]


def _without(shape: tuple, axis: int) -> tuple:
    return shape[:axis] + shape[axis + 1 :]


def _attr_key(a):
    if isinstance(a, np.ndarray):
        return ("array", a.dtype.str, a.tobytes()) if a.ndim == 0 else ("id", id(a))
    if isinstance(a, (int, float, str, type(None), Activation, WeightRole, tuple)):
        return a
    return ("id", id(a))


def rebuild(outputs: Sequence, hook=None, graph: Optional[Graph] = None) -> list:
    """The nodes reachable from `outputs`, built again through `graph`'s constructors (the
    outputs' own graph by default), so the algebra runs again over changed inputs.

    `hook(node, args, new)`, given a node, its rebuilt inputs and `new` (the rebuilt
    version of any node already visited), returns a replacement or None (rebuild as it
    is). Substituting leaves this way instantiates a step graph, and
    replacing nodes of a kind is how passes transform a program. None outputs stay None."""
    target = graph or next(o.graph for o in outputs if o is not None)
    done: dict = {}  # id(node) -> rebuilt node (or, for multi-output parents, their list)
    order = reachable([o for o in outputs if o is not None])
    for node in order:
        args = tuple(done[id(a)] for a in node.args)
        new = hook(node, args, lambda old: done[id(old)]) if hook is not None else None
        done[id(node)] = new if new is not None else _copy(target, node, args, done)
    return [None if o is None else done[id(o)] for o in outputs]


def reachable(outputs: list) -> list:
    """The nodes `outputs` depend on, each once, every node after its inputs."""
    seen, order = set(), []
    stack = [(o, False) for o in reversed(outputs)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((a, False) for a in reversed(node.args) if id(a) not in seen)
    return order


def _copy(g: Graph, node: Node, args: tuple, done: dict):
    op, at = node.op, node.attrs
    if op == "input":
        return g.input(at.name, node.shape)
    if op == "external":
        return g.external(at.value, node.shape)
    if op == "const":
        return g.const(at.array, at.role)
    if op in ("add", "sub", "mul", "less", "where", "neg", "positions"):
        return getattr(g, op)(*args)
    if op == "act":
        return g.act(at.act, args[0])
    if op == "linear":
        return g.linear(*linear_operands(node, args), at.role)
    if op in ("clamp", "slice", "squeeze", "unsqueeze", "transpose", "reshape"):
        return getattr(g, op)(args[0], *at)
    if op == "zeros_like_rows":
        return g.zeros_like_rows(args[0], at.width)
    if op in ("concat", "stack"):
        return getattr(g, op)(list(args), at.axis)
    if op in ("unstack", "split"):
        return node  # a multi-output parent: its pieces rebuild it
    if op in ("loop", "recurrence", "result"):  # passes expand a recurrence; a loop's and
        return g.node(op, args, at, node.shape)  # a result's inputs are rebuilt as they are
    if op == "piece":
        parent = node.args[0]
        return g.piece(parent.op, done[id(parent.args[0])], parent.attrs, at.index)
    raise AssertionError(f"cannot rebuild a {op} node")
