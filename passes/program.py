"""A recurrent layer stack as a program: what the core hands to passes and adapters.

`build(spec, weights, ...)` lays a stack out once for all three cells:

  1. per layer, the input projection hoisted out of time: one `linear` over all timesteps
     and both directions (typed WeightRole), every foldable bias folded in;
  2. per direction, a `recurrence` node: the cell's step graph over (x_t, h[, c]) (a
     `Body`, built from cells.py), the direction, the initial states and the masks of
     sequence_lens as data;
  3. the directions' outputs concatenated into the next layer's input, and the outputs
     laid out per the spec's IOLayout; only the wanted ones exist.

Passes then turn each recurrence into steps (unroll.py) or a loop (loop.py) and tune the
program for a target (tunings.py); `translate` writes it through an adapter's builder.
Inside a layer everything is time-major ([T, B, .]; a batch-first X is transposed once)
and steps see 2-D [B, H] states.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import numpy as np

from . import weights as wa
from .cells import STEP, CellParams, prepare
from .graph import Body, Graph, IndexAttrs, Node, RecurrenceAttrs, reachable
from .masks import Lens
from .roles import WeightKind, WeightRole
from .spec import Direction, LayerWeights, RecurrentSpec


@dataclasses.dataclass(eq=False)
class Recurrence:
    """One layer direction over time: the attrs of a `recurrence` node, whose inputs are
    the projection [T, B, G] and the initial states [B, W] (ZERO when absent), and whose
    results are Y [T, B, O] (when wanted) and then the final states."""

    step: Body  # inputs x_t, h[, c]; outputs h'[, c'] (h' is the step's y)
    cell: CellParams
    reverse: bool
    want_y: bool
    lens: Lens
    steps: Optional[int]  # T, when static

    def zeros(self, g: Graph, width: int) -> Node:
        """A zero [B, width] step or state of known batch size (only reached with constant
        sequence_lens, which give the batch)."""
        return g.const(np.zeros((self.lens.batch, width), np.float32))


@dataclasses.dataclass
class RecurrentProgram:
    """`outputs` (Y, Y_h, Y_c in the spec's layout; None when not wanted) over `graph`."""

    spec: RecurrentSpec
    graph: Graph
    outputs: list

    def replace(self, outputs: list) -> "RecurrentProgram":
        return dataclasses.replace(self, outputs=outputs)


def recurrences(program: RecurrentProgram) -> list:
    return [n for n in reachable([o for o in program.outputs if o]) if n.op == "recurrence"]


def build(
    spec: RecurrentSpec,
    weights: Sequence[Sequence[LayerWeights]],
    dtype=np.float32,
    shapes: Optional[dict] = None,
    sequence_lens: Union[None, np.ndarray, str] = None,
) -> RecurrentProgram:
    """The program of a stack. Its inputs are named "x", "h0", "c0" (when the spec has
    them) and "sequence_lens" (when the lengths are known only at run time: pass "input";
    constant lengths are an int array). Runtime weights (weights.Lazy) become nodes.
    `shapes` gives the inputs' static shapes by name (dims None where unknown)."""
    g = Graph(dtype)
    return _Stack(g, spec, weights, sequence_lens, shapes or {}).run()


class _Stack:
    def __init__(self, g: Graph, spec, weights, lens, shapes: dict):
        self.g, self.spec = g, spec
        self.D, self.T = spec.num_directions, spec.seq_len
        self.sa = 1 if spec.layout.state_batch_first else 0  # layer*direction axis of states
        self.x = g.input("x", shapes.get("x"))
        self.h0 = g.input("h0", shapes.get("h0")) if spec.has_initial_h else g.ZERO
        self.c0 = g.input("c0", shapes.get("c0")) if spec.has_initial_c else g.ZERO
        if isinstance(lens, str):
            lens = g.input("sequence_lens", (None,))
        self.lens = Lens(g, lens, self.T)
        self.cells = [
            [prepare(spec, weights[layer][d], d, layer) for d in range(self.D)]
            for layer in range(spec.num_layers)
        ]
        self._weights: dict = {}  # materialized runtime weights (weights.materialize cache)

    def run(self) -> RecurrentProgram:
        g, spec = self.g, self.spec
        x = self.x
        if spec.layout.batch_first:  # time-major inside
            x = g.transpose(x, (1, 0, 2))
        h0, c0 = (self.lens.empty_rows_zeroed(s, self.sa) for s in (self.h0, self.c0))
        finals = []
        for layer, cells in enumerate(self.cells):
            last = layer == spec.num_layers - 1
            want_y = spec.want_y or not last
            xps = self._projections(x, cells, layer)
            ys = []
            for d, p in enumerate(cells):
                p = self._materialized(p)
                idx = layer * self.D + d
                states = [self._initial(s0, idx) for s0 in (h0, c0)[: len(p.state_widths)]]
                y, *final = self._recurrence(p, xps[d], states, d, want_y)
                ys.append(y)
                finals.append(final)
            if not last:
                x = g.concat(ys, -1) if self.D > 1 else ys[0]
        outputs = [
            self._layout_y(ys) if spec.want_y else None,
            self._layout_states([f[0] for f in finals]) if spec.want_h else None,
            self._layout_states([f[1] for f in finals]) if spec.want_c else None,
        ]
        return RecurrentProgram(spec, g, outputs)

    def _recurrence(self, p: CellParams, xp: Node, states: list, d: int, want_y: bool) -> list:
        g = self.g
        reverse = d == 1 or self.spec.direction is Direction.REVERSE
        step = _step_body(g, p, xp)
        rec = Recurrence(step, p, reverse, want_y, self.lens, self.T)
        b = None if xp.shape is None else xp.shape[1]
        node = g.node("recurrence", (xp, *states), RecurrenceAttrs(rec), None)
        y_shape = (self.T, b, p.output_size)
        y = g.node("result", (node,), IndexAttrs(0), y_shape)
        finals = [
            g.unsqueeze(g.node("result", (node,), IndexAttrs(1 + k), (b, w)), self.sa)
            for k, w in enumerate(p.state_widths)
        ]
        return [y, *finals]

    def _projections(self, x: Node, cells: Sequence[CellParams], layer: int) -> list:
        """x W^T + b of each direction: column blocks of one linear over both directions
        (passes.tunings.split_projections makes one linear each where a target wants)."""
        if len(cells) == 1:
            return [self._projection(x, cells, layer)]
        xp, width = self._projection(x, cells, layer), cells[0].width
        return [self.g.slice(xp, -1, d * width, (d + 1) * width) for d in range(len(cells))]

    def _projection(self, x: Node, cells: Sequence[CellParams], layer: int) -> Node:
        """x W^T + b for all timesteps of the given directions of a layer: one linear."""
        w = wa.concat([p.w_in for p in cells])
        bias = None
        if any(p.b_in is not None for p in cells):
            bias = wa.concat(
                [wa.zeros(p.width, p.w_in) if p.b_in is None else p.b_in for p in cells]
            )
        direction = cells[0].direction if len(cells) == 1 else None
        role = WeightRole(WeightKind.INPUT, layer, direction)
        m = self._materialize
        return self.g.linear(x, m(w, str(role)), m(bias, str(role.of_bias())), role)

    def _materialize(self, w, name: str):
        return wa.materialize(self.g, w, self._weights, name)

    def _materialized(self, p: CellParams) -> CellParams:
        """The step's runtime weights as nodes of the program, written once (before the
        first step, outside any loop) so every step and a loop body share them."""
        fields = ("r", "r_n", "b_rec", "p_if", "p_o", "proj")
        m = {f: self._materialize(getattr(p, f), f"{p.layer}_{p.direction}_{f}") for f in fields}
        return dataclasses.replace(p, **m)

    def _initial(self, s0: Node, idx: int) -> Node:
        """Initial state of one (layer, direction), [B, H], or ZERO."""
        if s0.is_const(0):
            return s0
        g = self.g
        return g.squeeze(g.slice(s0, self.sa, idx, idx + 1), self.sa)

    def _layout_y(self, ys: list) -> Node:
        """Per-direction [T, B, O] to the spec's Y layout."""
        g, layout = self.g, self.spec.layout
        if layout.y_directions_axis:
            y = g.stack(ys, 1) if self.D > 1 else g.unsqueeze(ys[0], 1)
        else:
            y = g.concat(ys, -1) if self.D > 1 else ys[0]
        if layout.batch_first:
            y = g.transpose(y, (2, 0, 1, 3) if layout.y_directions_axis else (1, 0, 2))
        return y

    def _layout_states(self, states: list) -> Node:
        """Final states, each with a size-1 axis at sa, to the state layout."""
        return self.g.concat(states, self.sa) if len(states) > 1 else states[0]


def _step_body(outer: Graph, p: CellParams, xp: Node) -> Body:
    """The cell's step as a graph over (x_t, h[, c]): leaves are `input` nodes, runtime
    weights (nodes of the program) are `external` leaves."""
    bg = Graph(outer.dtype)
    b = None if xp.shape is None else xp.shape[1]
    x_t = bg.input("x_t", None if xp.shape is None else xp.shape[1:])
    states = [bg.input(n, (b, w)) for n, w in zip(("h", "c"), p.state_widths)]
    inner = dataclasses.replace(
        p,
        **{
            f: bg.external(v, v.shape)
            for f in ("r", "r_n", "b_rec", "p_if", "p_o", "proj")
            if isinstance(v := getattr(p, f), Node)
        },
    )
    new = STEP[p.kind](bg, x_t, tuple(states), inner)
    return Body(bg, [*states, x_t], list(new), len(states))
