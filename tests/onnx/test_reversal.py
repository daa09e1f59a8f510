"""Explicit time reversals around forward recurrent nodes fold into direction="reverse"
(the madmom pattern), and the folded model computes what onnxruntime computes on the
original; patterns that are not a whole reversal read back whole are left alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from recurrent_lowering.backends.onnx.reversal import fold_reversals
from recurrent_lowering.tests.onnx.models import bidirectional_by_hand


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def _direction(model, name):
    (node,) = [n for n in model.graph.node if n.name == name]
    return next((a.s for a in node.attribute if a.name == "direction"), b"forward")


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("unsqueeze", [True, False])
def test_reversal_pair_folds_into_a_reverse_node(op, unsqueeze):
    model, feeds = bidirectional_by_hand(op, unsqueeze=unsqueeze)
    folded, names = fold_reversals(model)
    assert names == ["bwd"]
    assert _direction(folded, "bwd") == b"reverse" and _direction(folded, "fwd") == b"forward"
    assert not [n for n in folded.graph.node if n.op_type == "Slice"]
    assert not [t for t in folded.graph.initializer if t.name.startswith("rev_")]
    for got, want in zip(_run(folded, feeds), _run(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "variant",
    [
        {"axis": 1},  # the input's features reversed, not its time axis
        {"extra_y_reader": True},  # Y is also read in its own order
        {"sequence_lens": True},  # reverse direction honours lengths, the Slices do not
    ],
    ids=str,
)
def test_other_patterns_are_left_alone(variant):
    model, feeds = bidirectional_by_hand(**variant)
    folded, names = fold_reversals(model)
    assert names == []
    assert len(folded.graph.node) == len(model.graph.node)
    for got, want in zip(_run(folded, feeds), _run(model, feeds), strict=True):
        np.testing.assert_array_equal(got, want)
