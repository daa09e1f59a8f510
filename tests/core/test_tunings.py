"""The target tunings of passes/tunings.py that have no test file of their own: each keeps
the numbers (the numpy translation of the program with and without it) and makes the
change it is for (node kinds of the lowered program)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

from recurrent_lowering.passes import CellKind, Direction, RecurrentSpec
from recurrent_lowering.passes.graph import reachable
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.plan import Plan, lower
from recurrent_lowering.passes.program import build
from recurrent_lowering.passes.translate import translate
from recurrent_lowering.tests.core.gen import random_weights

T, B, IN, H = 6, 2, 3, 4


def _spec(kind="GRU", **kw):
    return RecurrentSpec(
        "tuned", CellKind(kind), IN, H, direction=Direction.BIDIRECTIONAL, seq_len=T, **kw
    )


def _lowered(spec, plan: Plan, B=B):
    weights = random_weights(spec, np.random.default_rng(0))
    x_shape = (T, B, IN)
    state = (spec.num_directions, B, spec.output_size)
    shapes = {"x": x_shape, "h0": state, "c0": (spec.num_directions, B, H)}
    return lower(build(spec, weights, shapes=shapes), plan)


def _run(program, spec, B=B):
    rng = np.random.default_rng(1)
    b = NumpyBuilder()
    bindings = {"x": b.input(rng.uniform(-1, 1, (T, B, IN)))}
    if spec.has_initial_h:
        bindings["h0"] = b.input(rng.uniform(-1, 1, (spec.num_directions, B, spec.output_size)))
    if spec.has_initial_c:
        bindings["c0"] = b.input(rng.uniform(-1, 1, (spec.num_directions, B, H)))
    return [v for v in translate(b, program.outputs, bindings) if v is not None]


def _kinds(program) -> collections.Counter:
    nodes = reachable([o for o in program.outputs if o is not None])
    kinds = collections.Counter(n.op for n in nodes)
    for n in nodes:  # and the loop bodies'
        if n.op == "loop":
            kinds.update(m.op for m in reachable(n.attrs[0].body.outputs))
    return kinds


def _same_numbers(spec, base: Plan, tuned: Plan, B=B):
    a, b = _lowered(spec, base, B), _lowered(spec, tuned, B)
    for x, y in zip(_run(a, spec, B), _run(b, spec, B), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    return _kinds(a), _kinds(b), b


@pytest.mark.parametrize("emission", ["unrolled", "loop"])
def test_merge_slices_makes_one_split_of_disjoint_slices(emission):
    spec = _spec()
    base = Plan(emission=emission, split_products=True)
    before, after, _ = _same_numbers(spec, base, dataclasses.replace(base, merge_slices=True))
    assert before["split"] == 0 and after["split"] > 0
    assert after["slice"] < before["slice"]


@pytest.mark.parametrize("emission", ["unrolled", "loop"])
def test_fuse_linear_add_takes_the_added_value_as_bias(emission):
    spec = _spec("LSTM", has_initial_h=True, has_initial_c=True)
    base = Plan(emission=emission, split_products=True)
    before, after, tuned = _same_numbers(
        spec, base, dataclasses.replace(base, fuse_linear_add=True)
    )
    fused = before["add"] - after["add"]
    assert fused > 0 and after["linear"] == before["linear"]
    # each fused product reads the added value as its bias: a node, not a constant
    nodes = reachable([o for o in tuned.outputs if o is not None])
    bodies = [m for n in nodes if n.op == "loop" for m in reachable(n.attrs[0].body.outputs)]
    with_node_bias = [n for n in nodes + bodies if n.op == "linear" and isinstance(n.attrs[1], str)]
    assert len(with_node_bias) == fused


def test_row_views_read_steps_as_rows_of_one_view():
    spec = _spec()
    base = Plan(emission="unrolled")
    before, after, _ = _same_numbers(spec, base, dataclasses.replace(base, row_views="static"))
    assert before["unstack"] > 0 and after["unstack"] == 0
    assert after["reshape"] > 0 and after["split"] == before["unstack"]
    # the two directions' time stacks; Y's stack of the directions (axis 1) stays at B = 2
    assert before["stack"] == 3 and after["stack"] == 1


@pytest.mark.parametrize("emission", ["unrolled", "loop"])
def test_row_views_stack_the_directions_of_one_sequence_as_columns(emission):
    spec = _spec("LSTM")
    base = Plan(emission=emission)
    before, after, tuned = _same_numbers(
        spec, base, dataclasses.replace(base, row_views="static"), B=1
    )
    assert before["stack"] >= 1 and after["stack"] == 0
    y = tuned.outputs[0]  # [T, D, 1, H]: the directions' [T, 1, H] side by side, viewed
    assert y.op == "reshape" and y.shape == (T, 2, 1, H)
    assert y.args[0].op == "concat" and y.args[0].attrs == (-1,)


def test_loop_rows_reads_the_projection_in_place_through_one_view():
    spec = dataclasses.replace(_spec(), direction=Direction.FORWARD)
    base = Plan(emission="loop", loop_initial_in_ys=True)
    _, _, tuned = _same_numbers(spec, base, dataclasses.replace(base, loop_rows=True))
    (loop,) = [n for n in reachable([o for o in tuned.outputs if o]) if n.op == "loop"]
    attrs = loop.attrs[0]
    assert (attrs.first, attrs.steps, attrs.rows_per_step) == (1, T - 1, B)  # after the peel
    xs = loop.args[-1]
    assert xs.op == "reshape" and xs.shape == (T * B, 3 * H)
