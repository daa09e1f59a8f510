"""The three cells, one timestep each, as their equations (ONNX semantics, PyTorch's projection).

A cell receives `x`, this step's slice of the hoisted input projection (x W^T with every
bias that can be folded already in it), and the previous state as graph `Node`s (ZERO when
known to be zero), and returns the new state; its first element is the step's output.
Each step has one recurrent product for all gates (two for GRU linear_before_reset=0);
`passes.tunings.split_products` splits it per activation group where a target wants that.
`prepare` arranges one (layer, direction)'s `LayerWeights` for its cell: internal gate
order, folded biases. Everything framework-specific happened before (gate_order.py); the
layers and directions come after (program.py), time after that (unroll.py, loop.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from . import weights as wa
from .graph import Graph, Node
from .roles import WeightKind, WeightRole
from .spec import Activation, CellKind, Direction, LayerWeights, RecurrentSpec


@dataclasses.dataclass
class CellParams:
    """One (layer, direction), arranged for emission. Gate blocks are in internal order."""

    kind: CellKind
    hidden_size: int
    activations: tuple[Activation, ...]
    clip: Optional[float]
    linear_before_reset: bool
    input_forget: bool
    layer: int
    direction: str  # "fwd" | "rev"
    out_size: int  # width of h: proj_size or hidden_size
    # Weights: numpy constants, or runtime (weights.Lazy until the sequence materializes
    # them into builder values, before any step is emitted).
    w_in: Any  # [G*H, I] hoisted input projection
    b_in: Any  # [G*H] every bias that folds into it, or None
    r: Any  # [G*H, O] recurrent weights (GRU lbr=0: only r, z rows)
    r_n: Any = None  # GRU lbr=0: n rows of R, applied to r * h
    b_rec: Any = None  # recurrent bias that cannot fold (GRU lbr=1: [0, 0, Rb_n])
    p_if: Any = None  # LSTM peepholes of i, f (just i with input_forget)
    p_o: Any = None
    proj: Any = None  # LSTM projection [P, H]

    def role(self, kind: WeightKind = WeightKind.RECURRENT) -> WeightRole:
        return WeightRole(kind, self.layer, self.direction)

    def clip_(self, e: Graph, v: Node) -> Node:
        """ONNX clip: bound a gate's pre-activation to [-clip, clip]."""
        return v if self.clip is None else e.clamp(v, -self.clip, self.clip)

    @property
    def output_size(self) -> int:
        return self.out_size

    @property
    def width(self) -> int:
        """Rows of the input projection: gates (internal order) times hidden_size."""
        return wa.shape(self.w_in)[0]

    @property
    def state_widths(self) -> tuple[int, ...]:
        """Widths of (h,) or (h, c)."""
        if self.kind is CellKind.LSTM:
            return (self.output_size, self.hidden_size)
        return (self.output_size,)


def gru(e: Graph, x: Node, state: tuple, p: CellParams) -> tuple:
    """GRU, gates (r, z, n); x holds x W^T + Wb + every Rb that folds.

    r = f(x_r + h R_r^T)                z = f(x_z + h R_z^T)
    n = g(x_n + r * (h R_n^T + Rb_n))   linear_before_reset
    n = g(x_n + (r * h) R_n^T)          otherwise (Rb_n folded into x_n)
    h' = (1 - z) * n + z * h  =  n + z * (h - n)
    """
    (h,) = state
    H, (f, g) = p.hidden_size, p.activations
    if p.linear_before_reset:
        hr = e.linear(h, p.r, p.b_rec, p.role())  # one recurrent matmul for all three gates
        # r, z share f: one activation. Slicing x and hr (not their sum) leaves x's slices to
        # the sequence (once, not per step) and hr's two slices are one split of hr.
        rz = e.act(f, p.clip_(e, x[..., : 2 * H] + hr[..., : 2 * H]))
        r, z = rz[..., :H], rz[..., H : 2 * H]
        n = e.act(g, p.clip_(e, x[..., 2 * H : 3 * H] + r * hr[..., 2 * H : 3 * H]))
    else:
        role_rz = p.role().sliced(0, 2 * H)
        rz = e.act(f, p.clip_(e, x[..., : 2 * H] + e.linear(h, p.r, role=role_rz)))
        r, z = rz[..., :H], rz[..., H : 2 * H]
        role_n = p.role().sliced(2 * H, 3 * H)
        n = e.act(g, p.clip_(e, x[..., 2 * H : 3 * H] + e.linear(r * h, p.r_n, role=role_n)))
    return (n + z * (h - n),)


def lstm(e: Graph, x: Node, state: tuple, p: CellParams) -> tuple:
    """LSTM, internal gates (i, f, o, g), or (i, o, g) with input_forget; x holds x W^T + Wb + Rb.

    i = f(x_i + h R_i^T + p_i * c)      f = f(x_f + h R_f^T + p_f * c)   (input_forget: f = 1 - i)
    g = g(x_g + h R_g^T)
    c' = f * c + i * g                  (input_forget: c + i * (g - c))
    o = f(x_o + h R_o^T + p_o * c')
    h' = o * h(c')                      (projection: h' = (o * h(c')) P^T)
    """
    h, c = state
    H, (act_f, act_g, act_h) = p.hidden_size, p.activations
    k = 1 if p.input_forget else 2  # gates before o: (i) or (i, f)
    # one recurrent matmul for all gates, added per activation group (as the GRU's): each
    # sum is read by its activation alone, which an NPU fuses into the add
    hr = e.linear(h, p.r, role=p.role())
    pre = x[..., : (k + 1) * H] + hr[..., : (k + 1) * H]
    pre_g = x[..., (k + 1) * H : (k + 2) * H] + hr[..., (k + 1) * H : (k + 2) * H]

    def block(v, j):  # gate j of a [.., n*H] value
        return v[..., j * H : (j + 1) * H]

    if p.p_o is None:  # no peepholes: i, f, o share one activation
        gates = e.act(act_f, p.clip_(e, pre))
        i_f = [block(gates, j) for j in range(k)]
    else:  # i, f see c, o sees c'; an activation each (one over [i|f] needs p_if * [c|c]:
        # a concat, a copy per step on Ethos-U)
        i_f = [e.act(act_f, p.clip_(e, block(pre, j) + block(p.p_if, j) * c)) for j in range(k)]
    i = i_f[0]
    g = e.act(act_g, p.clip_(e, pre_g))
    if p.input_forget:  # f = 1 - i (onnxruntime): c' = (1 - i) * c + i * g
        c_new = c + i * (g - c)
    else:
        f = i_f[1]
        c_new = f * c + i * g
    if p.p_o is None:
        o = block(gates, k)
    else:
        o = e.act(act_f, p.clip_(e, block(pre, k) + p.p_o * c_new))
    h_new = o * e.act(act_h, c_new)
    if p.proj is not None:
        h_new = e.linear(h_new, p.proj, role=p.role(WeightKind.PROJECTION))
    return h_new, c_new


def rnn(e: Graph, x: Node, state: tuple, p: CellParams) -> tuple:
    """Elman RNN; x holds x W^T + Wb + Rb.

    h' = f(x + h R^T)
    """
    (h,) = state
    (f,) = p.activations
    return (e.act(f, p.clip_(e, x + e.linear(h, p.r, role=p.role()))),)


STEP: dict[CellKind, Callable[[Graph, Node, tuple, CellParams], tuple]] = {
    CellKind.GRU: gru,
    CellKind.LSTM: lstm,
    CellKind.RNN: rnn,
}


# --- weights, arranged for the cells ---------------------------------------------------------


def prepare(
    spec: RecurrentSpec, lw: LayerWeights, direction_index: int, layer: int = 0
) -> CellParams:
    """Arrange one (layer, direction) for its cell: internal gate order, folded biases.

    Through the weight algebra (`weights`): constants fold in numpy, runtime weights become
    lazy expressions the program materializes once.
    """
    H, G, out = spec.hidden_size, spec.cell.num_gates, spec.output_size
    lw = LayerWeights(  # opaque runtime values get their canonical shapes
        w=wa.lift(lw.w, (G * H, spec.layer_input_size(layer))),
        r=wa.lift(lw.r, (G * H, out)),
        b_w=wa.lift(lw.b_w, (G * H,)),
        b_r=wa.lift(lw.b_r, (G * H,)),
        peephole=wa.lift(lw.peephole, (3, H)),
        proj=wa.lift(lw.proj, (spec.proj_size, H)),
    )
    direction = "rev" if direction_index == 1 or spec.direction is Direction.REVERSE else "fwd"
    common = dict(
        kind=spec.cell,
        hidden_size=H,
        activations=spec.activations_for(direction_index),
        clip=spec.clip,
        linear_before_reset=spec.linear_before_reset,
        input_forget=spec.input_forget,
        layer=layer,
        direction=direction,
        out_size=out,
    )
    if spec.cell is CellKind.GRU:
        b_r = lw.b_r
        if spec.linear_before_reset:
            # Rb_r, Rb_z fold into the projection, Rb_n stays inside r * (.)
            folded = keep = None
            if b_r is not None:
                folded = wa.concat([wa.rows(b_r, 0, 2 * H), wa.zeros(H, b_r)])
                keep = wa.concat([wa.zeros(2 * H, b_r), wa.rows(b_r, 2 * H, 3 * H)])
            b_in = wa.nonzero(wa.add(lw.b_w, folded))
            return CellParams(**common, w_in=lw.w, b_in=b_in, r=lw.r, b_rec=wa.nonzero(keep))
        return CellParams(  # (r * h) R_n^T + Rb_n: Rb_n folds too
            **common,
            w_in=lw.w,
            b_in=wa.nonzero(wa.add(lw.b_w, b_r)),
            r=_own(wa.rows(lw.r, 0, 2 * H)),
            r_n=_own(wa.rows(lw.r, 2 * H, 3 * H)),
        )
    if spec.cell is CellKind.LSTM:
        # canonical (i, f, g, o) -> internal (i, f, o, g); input_forget drops f entirely
        order = (0, 3, 2) if spec.input_forget else (0, 1, 3, 2)
        peep = wa.nonzero(lw.peephole)  # rows (i, f, o)
        p_if = p_o = None
        if peep is not None:
            p_if = wa.concat([wa.take(peep, k) for k in ((0,) if spec.input_forget else (0, 1))])
            p_o = _own(wa.take(peep, 2))
        return CellParams(
            **common,
            w_in=_own(wa.blocks(lw.w, 4, order)),
            b_in=wa.nonzero(wa.blocks(wa.add(lw.b_w, lw.b_r), 4, order)),
            r=_own(wa.blocks(lw.r, 4, order)),
            p_if=_own(p_if),
            p_o=p_o,
            proj=lw.proj,
        )
    return CellParams(**common, w_in=lw.w, b_in=wa.nonzero(wa.add(lw.b_w, lw.b_r)), r=lw.r)


def _own(a):
    """Contiguous numpy (the builder caches constants by id and copies them once)."""
    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a
