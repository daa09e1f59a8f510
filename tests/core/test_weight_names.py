"""Builder.reads_every_step: the weight names the core gives `linear` tell the recurrent
products (read at every timestep) from the hoisted input projection (read once). Adapters
rely on it to treat recurrent weights apart (fewer bits on Ethos-U), so every cell form is
checked: a linear inside the time loop reads a one-step [B, X] value, the hoisted one the
whole [T, B, I] sequence."""

from __future__ import annotations

import numpy as np
import pytest

from recurrent_lowering.passes import CellKind, Direction, RecurrentSpec, emit
from recurrent_lowering.passes.builder import reads_every_step
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.tests.core.gen import random_weights


class _Recording(NumpyBuilder):
    def __init__(self):
        super().__init__()
        self.linears: list[tuple[str, int]] = []  # (weight name, rank of x)

    def linear(self, x, weight, bias=None, name=""):
        self.linears.append((name, np.ndim(x)))
        return super().linear(x, weight, bias, name)


CASES = [
    ("GRU", dict(linear_before_reset=True)),
    ("GRU", dict(linear_before_reset=False)),
    ("LSTM", dict(proj_size=3)),
    ("LSTM", {}),
    ("RNN", {}),
]


@pytest.mark.parametrize("split_product", [False, True])
@pytest.mark.parametrize("kind,extra", CASES)
def test_names_mark_exactly_the_per_step_products(kind, extra, split_product):
    cell = CellKind(kind)
    spec = RecurrentSpec(
        "names", cell, 3, 4, num_layers=2, direction=Direction.BIDIRECTIONAL, seq_len=3, **extra
    )
    b = _Recording()
    b.split_recurrent_product = split_product
    x = np.random.default_rng(1).uniform(-1, 1, (3, 2, 3))
    emit(b, spec, random_weights(spec, np.random.default_rng(0)), b.input(x), None, None)
    per_step = [name for name, rank in b.linears if rank == 2]
    hoisted = [name for name, rank in b.linears if rank == 3]
    assert per_step and hoisted
    assert all(reads_every_step(n) for n in per_step), per_step
    assert not any(reads_every_step(n) for n in hoisted), hoisted
    if extra.get("proj_size"):
        assert any(n.endswith("_proj") for n in per_step)


def test_names_outside_the_convention_are_not_per_step():
    assert not reads_every_step("")
    assert not reads_every_step("weight")
    assert not reads_every_step("l0_fwd_Rx")
    assert reads_every_step("l12_rev_R_ifo")
