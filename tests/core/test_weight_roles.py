"""WeightRole.per_step: the role the core gives every `linear` tells the recurrent products
(read at every timestep) from the hoisted input projection (read once). Adapters rely on
it to treat recurrent weights apart (fewer bits on Ethos-U), so every cell form is
checked, with and without the tunings that split products: a linear inside the time loop
reads a one-step [B, X] value, the hoisted one the whole [T, B, I] sequence."""

from __future__ import annotations

import numpy as np
import pytest

from recurrent_lowering.passes import CellKind, Direction, RecurrentSpec, emit
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.plan import Plan
from recurrent_lowering.passes.roles import WeightKind
from recurrent_lowering.tests.core.gen import random_weights


class _Recording(NumpyBuilder):
    def __init__(self):
        super().__init__()
        self.linears: list = []  # (role, rank of x)

    def linear(self, x, weight, bias=None, role=None):
        self.linears.append((role, np.ndim(x)))
        return super().linear(x, weight, bias, role)


CASES = [
    ("GRU", dict(linear_before_reset=True)),
    ("GRU", dict(linear_before_reset=False)),
    ("LSTM", dict(proj_size=3)),
    ("LSTM", {}),
    ("RNN", {}),
]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("kind,extra", CASES)
def test_roles_mark_exactly_the_per_step_products(kind, extra, split):
    cell = CellKind(kind)
    spec = RecurrentSpec(
        "roles", cell, 3, 4, num_layers=2, direction=Direction.BIDIRECTIONAL, seq_len=3, **extra
    )
    b = _Recording()
    plan = Plan(split_products=split, split_projections=split)
    x = np.random.default_rng(1).uniform(-1, 1, (3, 2, 3))
    emit(b, spec, random_weights(spec, np.random.default_rng(0)), b.input(x), plan=plan)
    per_step = [role for role, rank in b.linears if rank == 2]
    hoisted = [role for role, rank in b.linears if rank == 3]
    assert per_step and hoisted
    assert all(role.per_step for role in per_step), per_step
    assert not any(role.per_step for role in hoisted), hoisted
    assert {role.direction for role in hoisted} == ({"fwd", "rev"} if split else {None})
    assert {(role.layer, role.direction) for role in per_step} == {
        (layer, d) for layer in (0, 1) for d in ("fwd", "rev")
    }
    if extra.get("proj_size"):
        assert any(role.kind is WeightKind.PROJECTION for role in per_step)
