"""passes.verify: a program's invariants, checked after every pass; a broken program is
refused naming the node."""

import numpy as np
import pytest

from recurrent_lowering.passes import plan as plan_mod
from recurrent_lowering.passes.graph import AxisAttrs, Graph, IndexAttrs
from recurrent_lowering.passes.verify import VerifyError, verify


def test_a_built_program_verifies():
    g = Graph()
    x = g.input("x", (4, 6))
    pieces = g.split(x, -1, [2, 4])
    verify([pieces[0] + 1.0, g.concat(pieces, -1), g.linear(x, np.ones((3, 6)))], g)


def test_wrong_attributes_are_refused_at_construction():
    g = Graph()
    x = g.input("x", (4, 6))
    with pytest.raises(TypeError, match="a concat node takes AxisAttrs"):
        g.node("concat", (x, x), IndexAttrs(0), None)


def test_an_index_past_the_outputs_and_a_foreign_input_are_refused():
    g, other = Graph(), Graph()
    x = g.input("x", (4, 6))
    split = g.split(x, -1, 2)[0].args[0]
    with pytest.raises(VerifyError, match="index 2 of 2 outputs"):
        verify([g.node("piece", (split,), IndexAttrs(2), None)], g)
    with pytest.raises(VerifyError, match="another graph"):
        verify([g.node("concat", (x, other.input("y")), AxisAttrs(0), None)], g)


def test_a_pass_that_breaks_the_program_is_named(monkeypatch):
    from recurrent_lowering.passes import tunings
    from recurrent_lowering.passes.program import build
    from recurrent_lowering.passes.spec import CellKind, LayerWeights, RecurrentSpec

    spec = RecurrentSpec(name="gru", cell=CellKind.GRU, input_size=3, hidden_size=2, seq_len=2)
    rng = np.random.default_rng(0)
    weights = [[LayerWeights(w=rng.standard_normal((6, 3)), r=rng.standard_normal((6, 2)))]]
    program = build(spec, weights)

    def broken(p):  # a pass that builds its result in another graph
        other = Graph()
        return p.replace([other.input("y"), None, None])

    monkeypatch.setattr(tunings, "split_projections", broken)
    with pytest.raises(VerifyError, match="after the pass broken"):
        plan_mod.lower(program, plan_mod.Plan(split_projections=True))
