"""Inconsistent specs and weights fail up front with a SpecError naming layer and attribute."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recurrent_lowering.passes import (
    SCAN,
    SELECT,
    Activation,
    CellKind,
    RecurrentSpec,
    SpecError,
    emit,
)
from recurrent_lowering.passes.op_count import CountingBuilder
from recurrent_lowering.tests.core.gen import random_weights

NAME = "encoder.gru_3"
BASE = RecurrentSpec(name=NAME, cell=CellKind.GRU, input_size=3, hidden_size=4, seq_len=5)


def _weights(spec, **changes):
    w = random_weights(spec, np.random.default_rng(0))
    for field, value in changes.items():
        setattr(w[0][0], field, value)
    return w


# (id, spec changes, weight changes, emit kwargs, builder capabilities, attribute named)
CASES = [
    ("proj_size_on_gru", dict(proj_size=2), {}, {}, None, "proj_size"),
    ("input_forget_on_gru", dict(input_forget=True), {}, {}, None, "input_forget"),
    ("want_c_on_gru", dict(want_c=True), {}, {}, None, "want_c"),
    ("clip_not_positive", dict(clip=0.0), {}, {}, None, "clip"),
    ("activation_count", dict(activations=[(Activation("Tanh"),)]), {}, {}, None, "activations"),
    ("activation_directions", dict(activations=[]), {}, {}, None, "activations"),
    (
        "affine_without_alpha",
        dict(activations=[(Activation("Affine"), Activation("Tanh"))]),
        {},
        {},
        None,
        "activations",
    ),
    (
        "thresholded_relu_without_select",
        dict(activations=[(Activation("ThresholdedRelu", 1.0), Activation("Tanh"))]),
        {},
        {},
        frozenset(),
        "activations",
    ),
    ("w_shape", {}, dict(w=np.zeros((12, 2), np.float32)), {}, None, "weights[0][0].w"),
    ("r_missing", {}, dict(r=None), {}, None, "weights[0][0].r"),
    ("bias_shape", {}, dict(b_r=np.zeros(3, np.float32)), {}, None, "weights[0][0].b_r"),
    (
        "peephole_on_gru",
        {},
        dict(peephole=np.zeros((3, 4), np.float32)),
        {},
        None,
        "weights[0][0].peephole",
    ),
    (
        "proj_without_proj_size",
        {},
        dict(proj=np.zeros((2, 4), np.float32)),
        {},
        None,
        "weights[0][0].proj",
    ),
    ("initial_h_flag", dict(has_initial_h=True), {}, {}, None, "initial_h"),
    ("initial_h_unflagged", {}, {}, dict(initial_h="h0"), None, "initial_h"),
    (
        "runtime_lens_without_select",
        dict(has_sequence_lens=True),
        {},
        dict(sequence_lens="lens"),
        frozenset(),
        "sequence_lens",
    ),
    (
        "lens_out_of_range",
        dict(has_sequence_lens=True),
        {},
        dict(sequence_lens=np.array([6])),
        None,
        "sequence_lens",
    ),
    (
        "run_time_loop_lens_without_positions",
        dict(has_sequence_lens=True, seq_len=None),
        {},
        dict(sequence_lens="lens", emission="loop"),
        frozenset({SELECT, SCAN}),
        "sequence_lens",
    ),
    ("scan_without_scan", {}, {}, dict(emission="loop"), frozenset(), "emission"),
    ("unknown_strategy", {}, {}, dict(emission="fast"), None, "emission"),
    ("unrolled_without_seq_len", dict(seq_len=None), {}, {}, None, "seq_len"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_spec_error_names_layer_and_attribute(case):
    _, spec_changes, weight_changes, kwargs, caps, attribute = case
    spec = dataclasses.replace(BASE, **spec_changes)
    weights = _weights(dataclasses.replace(spec, proj_size=0, activations=None), **weight_changes)
    builder = CountingBuilder() if caps is None else CountingBuilder(caps)
    with pytest.raises(SpecError) as err:
        emit(builder, spec, weights, "x", **kwargs)
    assert err.value.layer == NAME and err.value.attribute == attribute
    assert NAME in str(err.value) and repr(attribute) in str(err.value)
    assert builder.ops == []  # nothing was emitted before the error


def test_layer_count_mismatch():
    spec = dataclasses.replace(BASE, num_layers=2)
    with pytest.raises(SpecError, match=r"encoder\.gru_3: attribute 'weights'"):
        emit(CountingBuilder(), spec, _weights(BASE), "x")
