"""Layers, directions, time and layout, written once for all three cells.

For each layer:
  1. the input projection is hoisted out of the time loop: one `linear` over all timesteps
     and both directions, every foldable bias folded in;
  2. each direction runs its cell over time, either unrolled (static T: one set of ops per
     step) or as a loop (`builder.scan`: the same step as the loop body);
  3. the directions' outputs are concatenated into the next layer's input.
Outputs are then laid out per `IOLayout`; only the wanted ones are emitted.

Inside a layer both forms work time-major ([T, B, .]; a batch-first X is transposed once)
and steps see 2-D values: the states are [B, H], and the unrolled form takes every
timestep of the hoisted projection with one `unstack` (a gate block of a step is sliced
once per sequence, see emitter.py) and stacks the outputs back with one `stack`. So a
step's recurrent product is a plain 2-D linear with its bias (one Gemm in ONNX), and
nothing per step reshapes.

sequence_lens follows onnxruntime: steps t >= len[b] output 0 and keep the state, so
the reverse direction effectively starts at len[b] - 1; a zero-length sequence ends with
zero states (not its initial ones). Constant lengths become constant
float masks (no select needed; steps every sequence covers need no mask, steps none
covers no ops at all); runtime lengths need less/where, and with a run-time T
(a loop) also the steps' positions (`Builder.positions`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import numpy as np

from . import weights as wa
from .builder import SCAN_WITH_INITIAL, Builder, Value, is_constant
from .cells import STEP, CellParams, prepare
from .emitter import Emitter, Expr
from .spec import Direction, LayerWeights, RecurrentSpec
from .validate import validate


@dataclasses.dataclass
class Outputs:
    """Y, Y_h, Y_c in the spec's IOLayout; None for outputs the spec does not want."""

    y: Optional[Value] = None
    h: Optional[Value] = None
    c: Optional[Value] = None


def emit(
    builder: Builder,
    spec: RecurrentSpec,
    weights: Sequence[Sequence[LayerWeights]],
    x: Value,
    initial_h: Optional[Value] = None,
    initial_c: Optional[Value] = None,
    sequence_lens: Union[None, np.ndarray, Value] = None,
    strategy: str = "unrolled",
) -> Outputs:
    """Emit a recurrent layer stack through `builder`.

    weights[layer][direction] are canonical LayerWeights; x, initial_h, initial_c are builder
    values in the spec's IOLayout; sequence_lens is None, a numpy int array (constant) or a
    builder value. strategy: "unrolled" (needs spec.seq_len) or "scan" (needs SCAN).
    """
    validate(builder, spec, weights, initial_h, initial_c, sequence_lens, strategy)
    return _Stack(builder, spec, weights, sequence_lens, loop=strategy == "scan").run(
        x, initial_h, initial_c
    )


def emit_step(
    builder: Builder,
    spec: RecurrentSpec,
    weights: Sequence[Sequence[LayerWeights]],
    x_t: Value,
    h: Optional[Value] = None,
    c: Optional[Value] = None,
) -> Outputs:
    """One timestep with explicit state in and out (streaming): x_t is X with T = 1 in the
    spec's layout, h and c the states in the spec's state layout (None: zero). Returns
    this step's Y and the new states; feed them back as h and c for the next step."""
    spec = dataclasses.replace(
        spec, seq_len=1, has_initial_h=h is not None, has_initial_c=c is not None
    )
    return emit(builder, spec, weights, x_t, h, c, None, "unrolled")


SKIP = "skip"  # a step no sequence covers


@dataclasses.dataclass
class _Mask:
    """Which batch rows a step covers (or, in the loop form, each step)."""

    value: Union[np.ndarray, Value]
    constant: bool  # value is a numpy float 0/1 array, folded by the emitter
    select: bool  # value is boolean: blend with where(); else float: blend arithmetically


class _Lens:
    """Which (step, batch) pairs lie inside their sequence: t < len[b]."""

    def __init__(self, b: Builder, lens, T: Optional[int]):
        self.b, self.T, self.constant = b, T, is_constant(lens)
        self.lens, self.valid = lens, None
        self.valid_v = self.nonempty = self._pieces = None
        if lens is None:
            return
        if self.constant and T is None:  # a loop of run-time length: compared at run time
            self.lens, self.constant = b.constant(np.asarray(lens, np.int64)), False
        if self.constant:
            valid = np.arange(T)[:, None] < lens[None, :]  # [T, B]
            self.batch = len(lens)
            self.valid = None if valid.all() else valid
            return
        if T is None:  # `positions` needs a value with the run-time T: see `run_time_steps`
            return
        # runtime lengths: one comparison for all steps, [T, B, 1]
        self.valid_v = self._within(b.constant(np.arange(T, dtype=np.int64).reshape((T, 1, 1))))

    def _within(self, steps):
        """steps [T, 1, 1] < lens: [T, B, 1] booleans."""
        return self.b.less(steps, self.b.unsqueeze(self.b.unsqueeze(self.lens, 0), 2))

    def run_time_steps(self, xs) -> Optional[_Mask]:
        """The mask of every step of a loop whose length T is known only at run time, from
        the positions of axis 0 of `xs` ([T, ...]); None without sequence lengths."""
        if self.lens is None:
            return None
        if self.valid_v is None:  # one comparison for all layers and directions
            b = self.b
            self.valid_v = self._within(b.unsqueeze(b.unsqueeze(b.positions(xs), 1), 2))
        return _Mask(self.valid_v, constant=False, select=True)

    def empty_rows_zeroed(self, e: Emitter, s0, sa: int):
        """onnxruntime gives a zero-length sequence zero final states, not its initial ones.
        Zeroing those rows of the initial state once, before any layer, does that: the
        steps never change them."""
        if s0 is None or self.lens is None:
            return s0
        shape = (1, -1, 1) if sa == 0 else (-1, 1, 1)
        if self.constant:
            if self.lens.all():
                return s0
            s = e.value(s0) * e.const((self.lens > 0).astype(np.float32).reshape(shape))
            return None if s.is_const(0) else e.emit(s)  # None: every sequence is empty
        if self.nonempty is None:  # one comparison for h0 and c0
            b = self.b
            nonempty = b.less(b.constant(np.zeros((), np.int64)), self.lens)  # [B]
            self.nonempty = b.unsqueeze(b.unsqueeze(nonempty, sa), 2)
        return e.emit(e.where(e.value(self.nonempty), e.value(s0), e.ZERO))

    def step(self, t: int):
        """None (every sequence covers t), SKIP (none does), or a [B, 1] _Mask for step t."""
        if self.valid is not None:
            v = self.valid[t]
            if v.all():
                return None
            if not v.any():
                return SKIP
            return _Mask(v.astype(np.float32).reshape(-1, 1), constant=True, select=False)
        if self.valid_v is not None:
            if self._pieces is None:  # every step's mask at once
                self._pieces = self.b.unstack(self.valid_v, 0, self.T)
            return _Mask(self._pieces[t], constant=False, select=True)
        return None

    def steps(self, start: int, end: int) -> Optional[_Mask]:
        """Mask values for steps [start, end) stacked on axis 0 (loop form), or None if unneeded."""
        if self.valid is not None:
            m = self.valid[start:end]
            if m.all():
                return None
            m = self.b.constant(m.astype(np.float32).reshape(end - start, -1, 1))
            return _Mask(m, constant=False, select=False)
        if self.valid_v is not None:
            v = (
                self.valid_v
                if (start, end) == (0, self.T)
                else self.b.slice(self.valid_v, 0, start, end)
            )
            return _Mask(v, constant=False, select=True)
        return None


def _step(e: Emitter, p: CellParams, x_t: Expr, state: tuple, mask: Optional[_Mask], want_y: bool):
    """One cell step, blended with the sequence mask; returns (state values, output value)."""
    new = STEP[p.kind](e, x_t, state, p)
    y = new[0]
    if mask is not None:
        m = e.const(mask.value) if mask.constant else e.value(mask.value)
        if mask.select:
            new = tuple(e.where(m, n, o) for n, o in zip(new, state))
            y = e.where(m, y, e.ZERO)
        else:
            new = tuple(o + m * (n - o) for n, o in zip(new, state))
            y = m * y
    return [e.emit(s) for s in new], (e.emit(y) if want_y else None)


class _Stack:
    def __init__(self, b: Builder, spec: RecurrentSpec, weights, lens, loop: bool):
        self.b, self.spec, self.loop = b, spec, loop
        self.dtype = b.dtype
        self.D, self.T = spec.num_directions, spec.seq_len
        self.sa = 1 if spec.layout.state_batch_first else 0  # layer*direction axis of states
        self.lens = _Lens(b, lens, self.T)
        self.cells = [
            [
                prepare(spec, weights[layer][d], d, layer, b.split_recurrent_product)
                for d in range(self.D)
            ]
            for layer in range(spec.num_layers)
        ]
        self._weights: dict = {}  # materialized runtime weights (weights.materialize cache)

    # --- the stack -------------------------------------------------------------------------
    def run(self, x, h0, c0) -> Outputs:
        b, spec = self.b, self.spec
        if spec.layout.batch_first:  # time-major inside
            x = b.transpose(x, (1, 0, 2))
        e = Emitter(b, self.dtype)
        h0, c0 = (self.lens.empty_rows_zeroed(e, s, self.sa) for s in (h0, c0))
        finals = []
        for layer, cells in enumerate(self.cells):
            last = layer == spec.num_layers - 1
            want_y = spec.want_y or not last
            xps = self._projections(x, cells, layer)
            ys = []
            for d, p in enumerate(cells):
                p = self._materialized(p)
                xp_d = xps[d]
                idx = layer * self.D + d
                state = tuple(self._initial(e, s0, idx) for s0 in (h0, c0)[: len(p.state_widths)])
                run = self._loop if self.loop else self._unrolled
                y, final = run(e, p, xp_d, state, reverse=self._reverse(d), want_y=want_y)
                ys.append(y)
                finals.append(final)
            if not last:
                x = b.concat(ys, -1) if self.D > 1 else ys[0]
        return Outputs(
            y=self._layout_y(ys) if spec.want_y else None,
            h=self._layout_states([f[0] for f in finals]) if spec.want_h else None,
            c=self._layout_states([f[1] for f in finals]) if spec.want_c else None,
        )

    def _reverse(self, d: int) -> bool:
        return d == 1 or self.spec.direction is Direction.REVERSE

    def _projections(self, x, cells: Sequence[CellParams], layer: int) -> list:
        """x W^T + b of each direction: column blocks of one linear, or one linear each
        (Builder.split_direction_projections)."""
        if len(cells) == 1 or self.b.split_direction_projections:
            return [self._projection(x, [p], layer) for p in cells]
        xp, width = self._projection(x, cells, layer), cells[0].width
        return [self.b.slice(xp, -1, d * width, (d + 1) * width) for d in range(len(cells))]

    def _projection(self, x, cells: Sequence[CellParams], layer: int):
        """x W^T + b for all timesteps of the given directions of a layer: one linear."""
        w = wa.concat([p.w_in for p in cells])
        bias = None
        if any(p.b_in is not None for p in cells):
            bias = wa.concat(
                [wa.zeros(p.width, p.w_in) if p.b_in is None else p.b_in for p in cells]
            )
        name = f"l{layer}_W" if len(cells) > 1 else cells[0].label + "_W"
        m = self._materialize
        return self.b.linear(x, m(w, name), m(bias, name + "_b"), name=name)

    def _materialize(self, w, name: str):
        return wa.materialize(self.b, w, self._weights, name)

    def _materialized(self, p: CellParams) -> CellParams:
        """The step's weights as builder values (runtime) or numpy (constant), written once
        into the outer graph, so every step and a loop body share them."""
        m = {
            f: self._materialize(getattr(p, f), f"{p.label}_{f}")
            for f in ("r", "r_n", "r_g", "b_rec", "p_if", "p_o", "proj")
        }
        return dataclasses.replace(p, **m)

    def _initial(self, e: Emitter, s0, idx: int) -> Expr:
        """Initial state of one (layer, direction), [B, H], or ZERO."""
        if s0 is None:
            return e.ZERO
        s = self.b.slice(s0, self.sa, idx, idx + 1)
        return e.value(self.b.squeeze(s, self.sa))

    def _zeros(self, width: int):
        """A zero [B, width] step/state of known batch size (only reached with constant
        sequence_lens)."""
        return self.b.constant(np.zeros((self.lens.batch, width), np.float32))

    # --- one direction, unrolled ----------------------------------------------------------------
    def _unrolled(self, e: Emitter, p: CellParams, xp, state: tuple, reverse: bool, want_y: bool):
        xs = e.unstack(e.value(xp), 0, self.T)  # [B, G] per step; emitted when first used
        ys = [None] * self.T
        for t in reversed(range(self.T)) if reverse else range(self.T):
            mask = self.lens.step(t)
            if mask is SKIP:
                ys[t] = self._zeros(p.output_size) if want_y else None
                continue
            values, ys[t] = _step(e, p, xs[t], state, mask, want_y)
            state = tuple(e.value(v) for v in values)
        final = [
            self.b.unsqueeze(self._zeros(w) if s.is_const(0) else e.emit(s), self.sa)
            for s, w in zip(state, p.state_widths)
        ]
        y = self.b.stack(ys, 0) if want_y else None
        return y, final

    # --- one direction, as a loop ----------------------------------------------------------------
    def _loop(self, e: Emitter, p: CellParams, xp, state: tuple, reverse: bool, want_y: bool):
        """builder.scan over time; a zero initial state is first stepped outside the loop
        (its ops mostly vanish), so the loop always carries real values."""
        b, T = self.b, self.T
        y_first, peeled, first_mask = None, False, None
        start, end = 0, T  # steps left for the loop (T is None: known only at run time)
        if T is None and any(s.is_const(0) for s in state):
            # a run-time length may be 1, and a loop over no steps fails in onnxruntime:
            # no step outside the loop, the zero states take the run-time batch
            x_0 = b.squeeze(b.slice(xp, 0, 0, 1), 0)
            state = tuple(
                e.value(b.zeros_like_rows(x_0, w)) if s.is_const(0) else s
                for s, w in zip(state, p.state_widths)
            )
        elif any(s.is_const(0) for s in state):  # T is static here
            peeled = True
            t = T - 1 if reverse else 0
            mask = first_mask = self.lens.step(t)
            if mask is SKIP:
                y_first = b.unsqueeze(self._zeros(p.output_size), 0) if want_y else None
                vals = [
                    self._zeros(w) if s.is_const(0) else e.emit(s)
                    for s, w in zip(state, p.state_widths)
                ]
            else:
                x_t = b.squeeze(b.slice(xp, 0, t, t + 1), 0)
                vals, y_first = _step(e, p, e.value(x_t), state, mask, want_y)
                if want_y:
                    y_first = b.unsqueeze(y_first, 0)
            state = tuple(e.value(v) for v in vals)
            if reverse:
                end = T - 1
            else:
                start = 1
        if peeled and end - start <= 0:  # the peeled step was the only one
            final = [b.unsqueeze(e.emit(s), self.sa) for s in state]
            return y_first, final

        dtype = self.dtype
        mask = self.lens.steps(start, end) if T is not None else self.lens.run_time_steps(xp)
        xs = [b.slice(xp, 0, start, end) if peeled else xp]
        if mask is not None:
            xs.append(mask.value)

        def body(bb: Builder, carried: list, x_slices: list):
            be = Emitter(bb, dtype)
            m = _Mask(x_slices[1], False, mask.select) if mask is not None else None
            vals, y = _step(
                be, p, be.value(x_slices[0]), tuple(be.value(v) for v in carried), m, want_y
            )
            return vals, ([y] if want_y else [])

        # y_first is the loop's initial h: a builder that can put it into ys saves a concat
        with_initial = (
            want_y
            and y_first is not None
            and first_mask is None
            and mask is None
            and SCAN_WITH_INITIAL in b.capabilities
        )
        extra = {"initial_in_ys": True} if with_initial else {}
        carried, ys = b.scan(body, [e.emit(s) for s in state], xs, reverse=reverse, **extra)
        final = [b.unsqueeze(v, self.sa) for v in carried]
        y = None
        if with_initial:
            y = ys[0]
        elif want_y:
            parts = (
                [ys[0]] if y_first is None else ([ys[0], y_first] if reverse else [y_first, ys[0]])
            )
            y = b.concat(parts, 0) if len(parts) > 1 else parts[0]
        return y, final

    # --- layout -------------------------------------------------------------------------------
    def _layout_y(self, ys: list):
        """Per-direction [T, B, O] to the spec's Y layout."""
        b, layout = self.b, self.spec.layout
        if layout.y_directions_axis:
            y = b.stack(ys, 1) if self.D > 1 else b.unsqueeze(ys[0], 1)
        else:
            y = b.concat(ys, -1) if self.D > 1 else ys[0]
        if layout.batch_first:
            y = b.transpose(y, (2, 0, 1, 3) if layout.y_directions_axis else (1, 0, 2))
        return y

    def _layout_states(self, states: list):
        """Final states, each with a size-1 axis at sa, to the state layout."""
        return self.b.concat(states, self.sa) if len(states) > 1 else states[0]
