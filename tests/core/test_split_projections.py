"""tunings.split_projections: one input projection per direction.

Same numbers as one projection sliced per direction (NumpyBuilder, GRU/LSTM/RNN, unrolled
and loop), and the op counts: a linear per direction, and the slices each step's gate
blocks take are the same (of the shared projection, the direction's columns and the gate
block fold into one slice).
"""

from __future__ import annotations

import numpy as np
import pytest

from recurrent_lowering.passes import CellKind, Direction, RecurrentSpec, emit
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.op_count import CountingBuilder
from recurrent_lowering.passes.plan import Plan
from recurrent_lowering.tests.core.gen import random_weights


def _spec(kind: str, layers: int = 2) -> RecurrentSpec:
    cell = CellKind(kind)
    return RecurrentSpec(
        "dirs",
        cell,
        3,
        4,
        num_layers=layers,
        direction=Direction.BIDIRECTIONAL,
        seq_len=5,
        has_initial_h=True,
        has_initial_c=cell is CellKind.LSTM,
    )


@pytest.mark.parametrize("emission", ["unrolled", "loop"])
@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
def test_split_projections_give_the_same_numbers(kind, emission):
    spec = _spec(kind)
    w = random_weights(spec, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (5, 2, 3))
    h0 = rng.uniform(-1, 1, (4, 2, 4))
    c0 = rng.uniform(-1, 1, (4, 2, 4)) if spec.cell is CellKind.LSTM else None

    def run(split: bool):
        b = NumpyBuilder()
        plan = Plan(emission=emission, split_projections=split)
        c = b.input(c0) if c0 is not None else None
        out = emit(b, spec, w, b.input(x), b.input(h0), c, plan=plan)
        return [v for v in (out.y, out.h, out.c) if v is not None]

    for got, want in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layers", [1, 2])
def test_one_linear_per_direction_and_no_slice(layers):
    spec = _spec("GRU", layers)
    w = random_weights(spec, np.random.default_rng(0))
    counts = {}
    for split in (False, True):
        b = CountingBuilder()
        emit(b, spec, w, "x", "h0", None, plan=Plan(split_projections=split))
        counts[split] = b.counts()
        roles = [role for role in b.roles if not role.per_step]
        assert [r.direction for r in roles] == (["fwd", "rev"] if split else [None]) * layers
    assert counts[True]["linear"] - counts[False]["linear"] == layers  # 2 per layer, not 1
    assert counts[False]["slice"] == counts[True]["slice"]
