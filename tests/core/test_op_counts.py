"""Op counts, measured with the CountingBuilder: the minimal numbers docs/core.md publishes.

Per-step counts are the difference between two sequence lengths, so fixed per-layer ops
(projection, layout) drop out; they are asserted separately.
"""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest

from recurrent_lowering.passes import CellKind, Direction, RecurrentSpec, emit
from recurrent_lowering.passes.op_count import CountingBuilder
from recurrent_lowering.tests.core.gen import random_weights

C = collections.Counter

# One direction, one timestep, state known; unrolled. The step's piece of the projection
# and its gate blocks come from per-sequence unstacks (no per-step op).
PER_STEP = {
    # hR = h R^T + Rb_n; [hR_r|hR_z], hR_n; x_rz + hR_rz; f over [r|z]; r, z;
    # n = g(x_n + r * hR_n); h' = n + z*(h-n)
    ("GRU", "lbr=1"): C(slice=4, linear=1, add=3, sigmoid=1, mul=2, tanh=1, sub=1),
    # [x_r|x_z] + h R_rz^T; f; r, z; (r*h) R_n^T; x_n + ..; g; h' = n + z*(h-n)
    ("GRU", "lbr=0"): C(slice=2, linear=2, add=3, sigmoid=1, mul=2, tanh=1, sub=1),
    # hR = h R^T; [hR_i|hR_f|hR_o], hR_g; x_ifo + hR_ifo; f over it; x_g + hR_g; g;
    # i, f, o; c' = f*c + i*g; h' = o * h(c')
    ("LSTM", "plain"): C(slice=5, linear=1, add=3, sigmoid=1, tanh=2, mul=3),
    # f dropped from the projection; c' = c + i * (g - c)
    ("LSTM", "input_forget"): C(slice=4, linear=1, add=3, sigmoid=1, tanh=2, mul=2, sub=1),
    # i, f, o each see c or c' through their own mul, add and activation (one activation
    # over [i|f] would need a concat [c|c], a copy per step on Ethos-U)
    ("LSTM", "peephole"): C(slice=5, linear=1, add=6, sigmoid=3, tanh=2, mul=6),
    # projection: one more linear
    ("LSTM", "proj"): C(slice=5, linear=2, add=3, sigmoid=1, tanh=2, mul=3),
    ("RNN", "plain"): C(linear=1, add=1, tanh=1),
}
# The loop body gets the step's whole projection row: it slices x's gate blocks itself
# (GRU: [x_r|x_z] and x_n; LSTM: [x_i|x_f|x_o] and x_g), which unrolled emission does once
# per sequence.
LOOP_EXTRA = {"GRU": C(slice=2), "LSTM": C(slice=2), "RNN": C()}
VARIANTS = {
    "lbr=1": dict(linear_before_reset=True),
    "lbr=0": dict(linear_before_reset=False),
    "plain": {},
    "input_forget": dict(input_forget=True),
    "peephole": {},
    "proj": dict(proj_size=3),
}


def _emit(
    kind, variant="plain", T=4, D=1, layers=1, init=True, emission="unrolled", lens=None, **kw
):
    cell = CellKind(kind)
    spec = RecurrentSpec(
        name="counted",
        cell=cell,
        input_size=6,
        hidden_size=4,
        num_layers=layers,
        direction=Direction.BIDIRECTIONAL if D == 2 else Direction.FORWARD,
        seq_len=T,
        has_initial_h=init,
        has_initial_c=init and cell is CellKind.LSTM,
        has_sequence_lens=lens is not None,
        **{**VARIANTS[variant], **kw},
    )
    w = random_weights(spec, np.random.default_rng(0), peephole=variant == "peephole")
    b = CountingBuilder()
    lstm = cell is CellKind.LSTM
    h0, c0 = ("h0" if init else None), ("c0" if init and lstm else None)
    emit(b, spec, w, "x", h0, c0, lens, emission=emission)
    return spec, b


def _per_step(kind, variant, **kw):
    _, b4 = _emit(kind, variant, T=4, **kw)
    _, b7 = _emit(kind, variant, T=7, **kw)
    diff = b7.counts()
    diff.subtract(b4.counts())
    assert all(v % 3 == 0 for v in diff.values()), diff
    return C({k: v // 3 for k, v in diff.items() if v})


@pytest.mark.parametrize("kind,variant", PER_STEP, ids=["-".join(k) for k in PER_STEP])
def test_unrolled_ops_per_step(kind, variant):
    assert _per_step(kind, variant) == PER_STEP[kind, variant]


@pytest.mark.parametrize("kind,variant", PER_STEP, ids=["-".join(k) for k in PER_STEP])
def test_bidirectional_doubles_per_step_ops(kind, variant):
    expected = C({k: 2 * v for k, v in PER_STEP[kind, variant].items()})
    assert _per_step(kind, variant, D=2) == expected


@pytest.mark.parametrize("kind,variant", PER_STEP, ids=["-".join(k) for k in PER_STEP])
def test_loop_body_is_the_step_plus_gate_slices_of_x(kind, variant):
    _, b = _emit(kind, variant, T=5, emission="loop")
    (body,) = b.bodies
    assert body.counts() == PER_STEP[kind, variant] + LOOP_EXTRA[kind]
    assert b.counts()["loop"] == 1


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
def test_clip_adds_one_clamp_per_activation_group(kind):
    groups = {"GRU": 2, "LSTM": 2, "RNN": 1}[kind]
    variant = "lbr=1" if kind == "GRU" else "plain"
    assert _per_step(kind, variant, clip=0.5) == PER_STEP[kind, variant] + C(clamp=groups)


@pytest.mark.parametrize(
    "kind,variant,layers,D,T",
    [(k, v, L, D, T) for (k, v), L, D, T in itertools.product(PER_STEP, (1, 3), (1, 2), (1, 9))],
)
def test_input_projection_is_hoisted(kind, variant, layers, D, T):
    """Exactly one input-projection linear per layer, for all T and both directions."""
    spec, b = _emit(kind, variant, T=T, D=D, layers=layers)
    per_step = PER_STEP[kind, variant]["linear"]
    per_layer = 1 + T * D * per_step
    assert b.counts()["linear"] == layers * per_layer
    # the first linear of each layer is its projection, covering both directions
    gates = {"GRU": 3, "LSTM": 3 if variant == "input_forget" else 4, "RNN": 1}[kind]
    projections = b.linears[::per_layer]
    assert projections == [
        (D * gates * spec.hidden_size, spec.layer_input_size(layer)) for layer in range(layers)
    ]


@pytest.mark.parametrize("kind,variant", PER_STEP, ids=["-".join(k) for k in PER_STEP])
def test_zero_initial_state_skips_the_first_recurrent_matmul(kind, variant):
    _, with_state = _emit(kind, variant, T=3)
    _, zero = _emit(kind, variant, T=3, init=False)
    per_step = PER_STEP[kind, variant]["linear"] - (1 if variant == "proj" else 0)
    assert with_state.counts()["linear"] - zero.counts()["linear"] == per_step
    assert zero.total() < with_state.total()


def test_output_layout_costs_and_unwanted_outputs():
    _, b = _emit("GRU", "lbr=1", T=3, D=2)
    fixed = b.counts() - C({k: 2 * 3 * v for k, v in PER_STEP["GRU", "lbr=1"].items()})
    # the projection; per direction: h0's row (slice + squeeze), x_rz and x_n (slice of
    # the projection's columns + unstack each), Y_d (a stack of the steps), the final h
    # (unsqueeze); then Y [T, D, B, H] (a stack of the directions) and Y_h (a concat)
    assert fixed == C(
        linear=1,
        slice=2 * (1 + 2),
        squeeze=2,
        unstack=2 * 2,
        stack=2 + 1,
        unsqueeze=2,
        concat=1,
    )
    _, b = _emit("GRU", "lbr=1", T=3, D=2, want_y=False)
    assert b.counts()["stack"] == 0 and b.counts()["concat"] == 1


def test_constant_lens_mask_only_the_steps_that_need_it():
    T = 4
    _, plain = _emit("GRU", "lbr=1", T=T)
    _, full = _emit("GRU", "lbr=1", T=T, lens=np.array([T, T]))
    assert full.counts() == plain.counts()  # every sequence full: no mask at all
    # steps 2, 3 are partial: h' = h + m * (h_new - h) and y = m * h_new
    _, partial = _emit("GRU", "lbr=1", T=T, lens=np.array([T, 2]))
    assert partial.counts() - plain.counts() == C(sub=2, mul=2 * 2, add=2)
    # steps 2, 3 are covered by no sequence: not emitted (Y gets zero constants)
    _, short = _emit("GRU", "lbr=1", T=T, lens=np.array([2, 2]))
    step = PER_STEP["GRU", "lbr=1"]
    assert plain.counts() - short.counts() == C({k: 2 * v for k, v in step.items()})


def test_runtime_lens_compare_once_then_select_per_step():
    _, plain = _emit("LSTM", T=3, init=False)
    _, masked = _emit("LSTM", T=3, init=False, lens="lens")
    # one less() for all steps (with the lens' two unsqueezes), unstacked into per-step
    # masks at once; per step a where per state and one for y (at the first step, y's is
    # h's: where(m, h', 0)), but for the last step's c, which no output reads
    assert masked.counts() - plain.counts() == C(less=1, unsqueeze=2, unstack=1, where=3 * 3 - 2)
    # given initial states, rows of zero length start from zero (onnxruntime's final
    # state for them): one more less (and its unsqueezes), one where per state tensor
    _, plain = _emit("LSTM", T=3)
    _, masked = _emit("LSTM", T=3, lens="lens")
    assert masked.counts() - plain.counts() == C(
        less=2, unsqueeze=4, unstack=1, where=3 * 3 + 2 - 1
    )
