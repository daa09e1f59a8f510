"""tunings.split_products: one recurrent product per activation group.

Same numbers as the single product (NumpyBuilder, unrolled and loop, every LSTM/GRU
variant), and the op counts docs/core.md states for it.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from recurrent_lowering.passes import CellKind, Direction, RecurrentSpec, emit
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.op_count import CountingBuilder
from recurrent_lowering.passes.plan import Plan
from recurrent_lowering.tests.core.gen import random_weights

C = collections.Counter
VARIANTS = {  # (cell, spec fields, peepholes)
    "GRU-lbr=1": ("GRU", dict(linear_before_reset=True), False),
    "GRU-lbr=1-clip": ("GRU", dict(linear_before_reset=True, clip=0.7), False),
    "LSTM": ("LSTM", {}, False),
    "LSTM-peephole": ("LSTM", {}, True),
    "LSTM-input_forget-peephole": ("LSTM", dict(input_forget=True), True),
    "LSTM-proj-clip": ("LSTM", dict(proj_size=3, clip=0.5), False),
}


@pytest.mark.parametrize("emission", ["unrolled", "loop"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_split_products_give_the_same_numbers(variant, emission):
    kind, extra, peephole = VARIANTS[variant]
    cell = CellKind(kind)
    lstm = cell is CellKind.LSTM
    spec = RecurrentSpec(
        "split",
        cell,
        3,
        4,
        num_layers=2,
        direction=Direction.BIDIRECTIONAL,
        seq_len=5,
        has_initial_h=True,
        has_initial_c=lstm,
        **extra,
    )
    w = random_weights(spec, np.random.default_rng(0), peephole=peephole)
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (5, 2, 3))
    h0 = rng.uniform(-1, 1, (4, 2, spec.output_size))
    c0 = rng.uniform(-1, 1, (4, 2, 4))

    def run(split: bool):
        b = NumpyBuilder()
        plan = Plan(emission=emission, split_products=split)
        out = emit(b, spec, w, b.input(x), b.input(h0), b.input(c0) if lstm else None, plan=plan)
        return [v for v in (out.y, out.h, out.c) if v is not None]

    for g, r in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6)


SPLIT_PER_STEP = {  # unrolled, one direction; the x + product adds stay core ops
    ("GRU", "lbr=1"): C(linear=2, slice=2, add=3, sigmoid=1, mul=2, tanh=1, sub=1),
    ("LSTM", "plain"): C(linear=2, slice=3, add=3, sigmoid=1, mul=3, tanh=2),
}


def _count(kind, T):
    cell = CellKind(kind)
    lstm = cell is CellKind.LSTM
    spec = RecurrentSpec("counted", cell, 6, 4, seq_len=T, has_initial_h=True, has_initial_c=lstm)
    b = CountingBuilder()
    weights = random_weights(spec, np.random.default_rng(0))
    emit(b, spec, weights, "x", "h0", "c0" if lstm else None, plan=Plan(split_products=True))
    return b.counts()


@pytest.mark.parametrize("kind,variant", SPLIT_PER_STEP, ids=["-".join(k) for k in SPLIT_PER_STEP])
def test_split_products_per_step(kind, variant):
    diff = _count(kind, 7)
    diff.subtract(_count(kind, 4))
    assert C({k: v // 3 for k, v in diff.items() if v}) == SPLIT_PER_STEP[kind, variant]
