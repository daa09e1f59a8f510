"""Properties over random configurations (hypothesis, bounded and derandomized).

Unrolled == loop (static or dynamic T, constant or runtime lengths) == emit_step chained;
bidirectional == forward + reversed reverse; float32 == float64 reference.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recurrent_lowering.passes import (
    Activation,
    CellKind,
    Direction,
    IOLayout,
    RecurrentSpec,
    emit,
    emit_step,
)
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.tests.core.gen import random_weights

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
BOUNDED = ("Sigmoid", "Tanh", "HardSigmoid", "Softsign", "ScaledTanh")


@st.composite
def configs(draw, directions=tuple(Direction), lens=True, bidir_layers=True):
    cell = draw(st.sampled_from(list(CellKind)))
    direction = draw(st.sampled_from(directions))
    D = direction.num_directions
    acts = None
    if draw(st.booleans()):
        acts = [
            tuple(
                Activation(n, 0.9, 0.3) if n in ("HardSigmoid", "ScaledTanh") else Activation(n)
                for n in draw(
                    st.lists(
                        st.sampled_from(BOUNDED),
                        min_size=cell.num_activations,
                        max_size=cell.num_activations,
                    )
                )
            )
            for _ in range(D)
        ]
    lstm = cell is CellKind.LSTM
    T = draw(st.integers(1, 9))
    B = draw(st.integers(1, 3))
    spec = RecurrentSpec(
        name="prop",
        cell=cell,
        input_size=draw(st.integers(1, 5)),
        hidden_size=draw(st.integers(1, 5)),
        num_layers=draw(st.integers(1, 3 if bidir_layers or D == 1 else 1)),
        direction=direction,
        layout=IOLayout(draw(st.booleans()), draw(st.booleans()), draw(st.booleans())),
        activations=acts,
        clip=draw(st.sampled_from([None, 0.4, 3.0])),
        linear_before_reset=draw(st.booleans()),
        input_forget=lstm and draw(st.booleans()),
        proj_size=draw(st.sampled_from([0, 2])) if lstm else 0,
        seq_len=T,
        has_initial_h=draw(st.booleans()),
        has_initial_c=lstm and draw(st.booleans()),
        want_c=lstm,
    )
    seq = None
    if lens and draw(st.booleans()):
        seq = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)), np.int64)
        spec = dataclasses.replace(spec, has_sequence_lens=True)
    peephole = lstm and draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return spec, B, seq, peephole, seed


def _inputs(spec: RecurrentSpec, B: int, seed: int, peephole: bool):
    rng = np.random.default_rng(seed)
    weights = random_weights(spec, rng, bias=True, peephole=peephole)
    lay, T = spec.layout, spec.seq_len
    x = rng.standard_normal((B, T, spec.input_size) if lay.batch_first else (T, B, spec.input_size))
    LD = spec.num_layers * spec.num_directions

    def state(width):
        return rng.standard_normal((B, LD, width) if lay.state_batch_first else (LD, B, width))

    h0 = state(spec.output_size) if spec.has_initial_h else None
    c0 = state(spec.hidden_size) if spec.has_initial_c else None
    return weights, x, h0, c0


def _run(spec, weights, x, h0, c0, seq, emission="unrolled", dtype=np.float32, runtime=False):
    b = NumpyBuilder(dtype)
    args = [None if a is None else b.input(a) for a in (x, h0, c0)]
    if runtime and seq is not None:
        seq = b.input(seq)
    return emit(b, spec, weights, *args, seq, emission=emission)


def _close(a, b, tol=1e-5):
    for u, v in zip(a, b):
        assert (u is None) == (v is None)
        if u is not None:
            np.testing.assert_allclose(u, v, rtol=tol, atol=tol)


@SETTINGS
@given(configs())
def test_unrolled_equals_loop_and_runtime_lens(cfg):
    spec, B, seq, peephole, seed = cfg
    weights, x, h0, c0 = _inputs(spec, B, seed, peephole)
    ref = _run(spec, weights, x, h0, c0, seq)
    ref = (ref.y, ref.h, ref.c)
    for emission in ("unrolled", "loop"):
        for runtime in (False, True) if seq is not None else (False,):
            out = _run(spec, weights, x, h0, c0, seq, emission, runtime=runtime)
            _close((out.y, out.h, out.c), ref)
    # the loop needs no static T (slices run to the end; lengths compare with positions)
    dynamic = dataclasses.replace(spec, seq_len=None)
    for runtime in (False, True) if seq is not None else (False,):
        out = _run(dynamic, weights, x, h0, c0, seq, "loop", runtime=runtime)
        _close((out.y, out.h, out.c), ref)


@SETTINGS
@given(configs(directions=(Direction.FORWARD,), lens=False))
def test_emit_step_chained_equals_unrolled(cfg):
    spec, B, _, peephole, seed = cfg
    weights, x, h0, c0 = _inputs(spec, B, seed, peephole)
    ref = _run(spec, weights, x, h0, c0, None)
    ta = 1 if spec.layout.batch_first else 0
    b = NumpyBuilder()
    h, c, ys = h0, c0, []
    for t in range(spec.seq_len):
        out = emit_step(b, spec, weights, np.take(x, [t], axis=ta), h, c)
        h, c = out.h, out.c
        ys.append(out.y)
    _close((np.concatenate(ys, axis=ta), h, c), (ref.y, ref.h, ref.c))


@SETTINGS
@given(configs(directions=(Direction.BIDIRECTIONAL,), bidir_layers=False))
def test_bidirectional_is_forward_plus_reversed_reverse(cfg):
    spec, B, seq, peephole, seed = cfg
    spec = dataclasses.replace(spec, layout=IOLayout(False, True, False))  # [T, D, B, H]
    weights, x, h0, c0 = _inputs(spec, B, seed, peephole)
    both = _run(spec, weights, x, h0, c0, seq)
    for d, direction in enumerate((Direction.FORWARD, Direction.REVERSE)):
        one = dataclasses.replace(
            spec,
            direction=direction,
            activations=None if spec.activations is None else [spec.activations[d]],
        )
        sl = slice(d, d + 1)
        out = _run(
            one,
            [[weights[0][d]]],
            x,
            None if h0 is None else h0[sl],
            None if c0 is None else c0[sl],
            seq,
        )
        _close(
            (out.y, out.h, out.c),
            (both.y[:, sl], both.h[sl], None if both.c is None else both.c[sl]),
        )


@SETTINGS
@given(configs())
def test_float32_close_to_float64(cfg):
    spec, B, seq, peephole, seed = cfg
    weights, x, h0, c0 = _inputs(spec, B, seed, peephole)
    lo = _run(spec, weights, x, h0, c0, seq, dtype=np.float32)
    hi = _run(spec, weights, x, h0, c0, seq, dtype=np.float64)
    assert hi.h.dtype == np.float64
    _close((lo.y, lo.h, lo.c), (hi.y, hi.h, hi.c), tol=1e-4)
