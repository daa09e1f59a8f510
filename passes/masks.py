"""Which (step, batch row) pairs lie inside their sequence: t < len[b] (sequence_lens).

onnxruntime's semantics: steps t >= len[b] output 0 and keep the state, so the reverse
direction effectively starts at len[b] - 1; a zero-length sequence ends with zero states
(not its initial ones). Constant lengths become constant float masks, blended
arithmetically (no select; steps every sequence covers get no mask, steps none covers no
ops at all); run-time lengths need less/where, and a loop of run-time length also the
steps' positions. One `Lens` serves every layer and direction of a program, so each
comparison is made once.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np

from .graph import Graph, Node

SKIP = "skip"  # a step no sequence covers


@dataclasses.dataclass
class Mask:
    """Which batch rows a step covers (or, in the loop form, each step)."""

    value: Union[np.ndarray, Node]
    constant: bool  # value is a numpy float 0/1 array
    select: bool  # value is boolean: blend with where(); else float: blend arithmetically

    def node(self, g: Graph) -> Node:
        return g.const(self.value) if self.constant else self.value


def blend(g: Graph, mask: Optional[Mask], new: tuple, old: tuple, y: Node) -> tuple:
    """(states, y) of one step with the mask applied: rows outside keep the old state and
    output zero."""
    if mask is None:
        return new, y
    m = mask.node(g)
    if mask.select:
        return tuple(g.where(m, n, o) for n, o in zip(new, old)), g.where(m, y, g.ZERO)
    return tuple(o + m * (n - o) for n, o in zip(new, old)), m * y


class Lens:
    def __init__(self, g: Graph, lens, T: Optional[int]):
        """`lens`: None, a numpy int array (constant) or a node (run-time lengths)."""
        self.g, self.T = g, T
        self.constant = lens is not None and not isinstance(lens, Node)
        self.lens, self.valid = lens, None
        self.valid_v = self.nonempty = self._pieces = None
        if lens is None:
            return
        if self.constant and T is None:  # a loop of run-time length: compared at run time
            self.lens, self.constant = g.const(np.asarray(lens, np.int64)), False
        if self.constant:
            valid = np.arange(T)[:, None] < lens[None, :]  # [T, B]
            self.batch = len(lens)
            self.valid = None if valid.all() else valid
            return
        if T is None:  # positions need a value with the run-time T: see run_time_steps
            return
        # run-time lengths: one comparison for all steps, [T, B, 1]
        self.valid_v = self._within(g.const(np.arange(T, dtype=np.int64).reshape((T, 1, 1))))

    def _within(self, steps: Node) -> Node:
        """steps [T, 1, 1] < lens: [T, B, 1] booleans."""
        g = self.g
        return g.less(steps, g.unsqueeze(g.unsqueeze(self.lens, 0), 2))

    def run_time_steps(self, xs: Node) -> Optional[Mask]:
        """The mask of every step of a loop whose length T is known only at run time, from
        the positions of axis 0 of `xs` ([T, ...]); None without sequence lengths."""
        if self.lens is None:
            return None
        if self.valid_v is None:  # one comparison for all layers and directions
            g = self.g
            self.valid_v = self._within(g.unsqueeze(g.unsqueeze(g.positions(xs), 1), 2))
        return Mask(self.valid_v, constant=False, select=True)

    def empty_rows_zeroed(self, s0: Node, sa: int) -> Node:
        """onnxruntime gives a zero-length sequence zero final states, not its initial ones.
        Zeroing those rows of the initial state once, before any layer, does that: the
        steps never change them."""
        g = self.g
        if s0.is_const(0) or self.lens is None:
            return s0
        shape = (1, -1, 1) if sa == 0 else (-1, 1, 1)
        if self.constant:
            if self.lens.all():
                return s0
            return s0 * g.const((self.lens > 0).astype(np.float32).reshape(shape))
        if self.nonempty is None:  # one comparison for h0 and c0
            nonempty = g.less(g.const(np.zeros((), np.int64)), self.lens)  # [B]
            self.nonempty = g.unsqueeze(g.unsqueeze(nonempty, sa), 2)
        return g.where(self.nonempty, s0, g.ZERO)

    def step(self, t: int):
        """None (every sequence covers t), SKIP (none does), or a [B, 1] Mask for step t."""
        if self.valid is not None:
            v = self.valid[t]
            if v.all():
                return None
            if not v.any():
                return SKIP
            return Mask(v.astype(np.float32).reshape(-1, 1), constant=True, select=False)
        if self.valid_v is not None:
            if self._pieces is None:  # every step's mask at once
                self._pieces = self.g.unstack(self.valid_v, 0, self.T)
            return Mask(self._pieces[t], constant=False, select=True)
        return None

    def steps(self, start: int, end: int) -> Optional[Mask]:
        """Masks for steps [start, end) stacked on axis 0 (loop form), or None if unneeded."""
        if self.valid is not None:
            m = self.valid[start:end]
            if m.all():
                return None
            m = self.g.const(m.astype(np.float32).reshape(end - start, -1, 1))
            return Mask(m, constant=False, select=False)
        if self.valid_v is not None:
            whole = (start, end) == (0, self.T)
            v = self.valid_v if whole else self.g.slice(self.valid_v, 0, start, end)
            return Mask(v, constant=False, select=True)
        return None
