"""Weights known only at run time give the same numbers as the same weights as constants,
and cost ops once per layer, never per step.

NumpyBuilder marks runtime values (RuntimeArray), so the core takes the runtime path for
them and evaluates the slices/concats/adds it emits; the constant path folds in numpy.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

import numpy as np
import pytest

from recurrent_lowering.passes import (
    CellKind,
    Direction,
    LayerWeights,
    RecurrentSpec,
    emit,
    gate_order,
)
from recurrent_lowering.passes import weights as wa
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.op_count import CountingBuilder
from recurrent_lowering.tests.core.gen import random_weights

FIELDS = ("w", "r", "b_w", "b_r", "peephole", "proj")
CONFIGS = [  # (cell, extra spec fields, peepholes)
    ("GRU", dict(linear_before_reset=True), False),
    ("GRU", dict(linear_before_reset=False), False),
    ("LSTM", {}, True),
    ("LSTM", dict(input_forget=True), True),
    ("LSTM", dict(proj_size=3), False),
    ("RNN", {}, False),
]


def _spec(kind, extra, D=2, layers=2, T=5, strategy_loop=False):
    cell = CellKind(kind)
    return RecurrentSpec(
        name="rt",
        cell=cell,
        input_size=3,
        hidden_size=4,
        num_layers=layers,
        direction=Direction.BIDIRECTIONAL if D == 2 else Direction.REVERSE,
        seq_len=T,
        has_initial_h=True,
        has_initial_c=cell is CellKind.LSTM,
        **extra,
    )


def _run(spec, weights, emission):
    nb = NumpyBuilder()
    rng = np.random.default_rng(1)
    L = spec.num_layers * spec.num_directions
    x = nb.input(rng.uniform(-1, 1, (spec.seq_len, 2, spec.input_size)))
    h0 = nb.input(rng.uniform(-1, 1, (L, 2, spec.output_size)))
    c0 = nb.input(rng.uniform(-1, 1, (L, 2, spec.hidden_size))) if spec.has_initial_c else None
    out = emit(nb, spec, weights, x, h0, c0, emission=emission)
    return [v for v in (out.y, out.h, out.c) if v is not None]


def _runtime(weights, wrap):
    return [
        [
            LayerWeights(
                **{f: None if getattr(lw, f) is None else wrap(getattr(lw, f)) for f in FIELDS}
            )
            for lw in row
        ]
        for row in weights
    ]


@pytest.mark.parametrize(
    "config,emission",
    list(itertools.product(range(len(CONFIGS)), ["unrolled", "loop"])),
)
def test_runtime_canonical_weights_match_constants(config, emission):
    kind, extra, peephole = CONFIGS[config]
    spec = _spec(kind, extra)
    weights = random_weights(spec, np.random.default_rng(0), peephole=peephole)
    nb = NumpyBuilder()
    runtime = _runtime(weights, nb.input)
    for g, w in zip(_run(spec, runtime, emission), _run(spec, weights, emission), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(  # ONNX has no projection
    "config", [i for i, c in enumerate(CONFIGS) if "proj_size" not in c[1]]
)
def test_runtime_onnx_weights_through_from_onnx_match_constants(config):
    """ONNX gate order, B split and P rows arranged lazily from whole runtime tensors."""
    kind, extra, peephole = CONFIGS[config]
    spec = _spec(kind, extra, layers=1)
    weights = random_weights(spec, np.random.default_rng(0), peephole=peephole)
    onnx_tensors = gate_order.to_onnx(spec.cell, weights[0])
    nb = NumpyBuilder()
    lazy = [wa.runtime(nb.input(a), a.shape) if a is not None else None for a in onnx_tensors]
    runtime = [[gate_order.from_onnx(spec.cell, *lazy, direction_index=d) for d in range(2)]]
    assert all(wa.is_runtime(lw.w) for lw in runtime[0])
    for g, w in zip(_run(spec, runtime, "unrolled"), _run(spec, weights, "unrolled"), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def _counts(spec, weights):
    b = CountingBuilder()
    lstm = spec.cell is CellKind.LSTM
    emit(b, spec, weights, "x", "h0", "c0" if lstm else None)
    return b


@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_runtime_weights_add_no_ops_per_step(config):
    kind, extra, peephole = CONFIGS[config]

    def counts(T, runtime):
        spec = _spec(kind, extra, T=T)
        weights = random_weights(spec, np.random.default_rng(0), peephole=peephole)
        if runtime:
            weights = _runtime(weights, lambda a: wa.runtime(object(), a.shape))
        return _counts(spec, weights).counts()

    per_step = []
    for runtime in (False, True):
        diff = counts(7, runtime)
        diff.subtract(counts(4, runtime))
        per_step.append(diff)
    assert per_step[0] == per_step[1]
    # arranging runtime weights: a few slices/concats/adds per (layer, direction)
    extra_ops = counts(4, True)
    extra_ops.subtract(counts(4, False))
    assert all(v >= 0 for v in extra_ops.values()) and sum(extra_ops.values()) <= 4 * 25


def test_linear_gets_weight_roles():
    spec = _spec("GRU", dict(linear_before_reset=False), D=2, layers=1, T=2)
    b = _counts(spec, random_weights(spec, np.random.default_rng(0)))
    names = {"l0_W", "l0_fwd_R_0_8", "l0_fwd_R_8_12", "l0_rev_R_0_8", "l0_rev_R_8_12"}
    assert {str(role) for role in b.roles} == names
    spec = _spec("LSTM", dict(proj_size=2), D=1, layers=1, T=2)
    spec = dataclasses.replace(spec, direction=Direction.FORWARD)
    b = _counts(spec, random_weights(spec, np.random.default_rng(0)))
    assert {str(role) for role in b.roles} == {"l0_fwd_W", "l0_fwd_R", "l0_fwd_proj"}


def test_weight_algebra_folds_reorderings_into_one_concat():
    """ONNX LSTM (i, o, f, c) -> canonical -> internal (i, f, o, g) is one concat of
    slices of W (adjacent slices merged), not two rounds of reordering."""
    W = wa.runtime("W", (1, 8, 3))  # H = 2
    lw = gate_order.from_onnx(CellKind.LSTM, W, wa.runtime("R", (1, 8, 2)))
    from recurrent_lowering.passes.cells import prepare
    from recurrent_lowering.passes.graph import Graph, reachable

    spec = RecurrentSpec("alg", CellKind.LSTM, 3, 2, seq_len=1)
    p = prepare(spec, lw, 0)
    node = wa.materialize(Graph(), p.w_in, {})
    # take direction 0: slice + squeeze; ONNX (i, o, f, c) -> (i, f, o, g) = (0, 2, 1, 3):
    # [0:2], [4:6], [2:4], [6:8] of the squeezed W, then one concat
    kinds = collections.Counter(n.op for n in reachable([node]))
    assert kinds == {"external": 1, "slice": 5, "squeeze": 1, "concat": 1}
