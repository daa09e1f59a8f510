"""The core (numpy builder) against onnxruntime's native GRU/LSTM/RNN, every ONNX attribute."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

from recurrent_lowering.passes import (
    Activation,
    CellKind,
    Direction,
    IOLayout,
    RecurrentSpec,
    emit,
)
from recurrent_lowering.passes.activations import PARAMETERS
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.spec import ACTIVATIONS, DEFAULT_ACTIVATIONS
from recurrent_lowering.tests.core.gen import random_weights
from recurrent_lowering.tests.core.ort_ref import ORT_DEFAULTS, run_ort

# Explicit parameters chosen so each activation's shape matters on O(1) inputs.
EXPLICIT = {
    "Affine": (0.8, 0.1),
    "LeakyRelu": (0.2, None),
    "ThresholdedRelu": (0.1, None),
    "ScaledTanh": (1.2, 0.7),
    "HardSigmoid": (0.3, 0.45),
    "Elu": (0.6, None),
}


def _act(name: str, explicit: bool) -> Activation:
    if name not in PARAMETERS:
        return Activation(name)
    alpha, beta = (EXPLICIT if explicit else ORT_DEFAULTS)[name]
    return Activation(name, alpha, beta)


def _activation_sets(cell: CellKind):
    """(activations per direction or None, explicit params): the defaults, then every
    activation in every position, with and without alpha/beta where it takes them."""
    sets = [(None, True)]
    n = cell.num_activations
    for pos, name in itertools.product(range(n), ACTIVATIONS):
        for explicit in (True, False) if name in PARAMETERS else (True,):
            acts = list(DEFAULT_ACTIVATIONS[cell])
            acts[pos] = _act(name, explicit)
            sets.append((tuple(acts), explicit))
    return sets


def _cases():
    common = dict(
        direction=list(Direction),
        clip=(None, 0.7),
        lens=(None, "const", "runtime"),
        init=(False, True, "h_only"),
        layout=(0, 1),
        bias=(True, False),
        emission=("unrolled", "loop"),
    )
    per_cell = {
        CellKind.GRU: dict(linear_before_reset=(False, True)),
        CellKind.LSTM: dict(input_forget=(False, True), peephole=(False, True)),
        CellKind.RNN: {},
    }
    cases = []
    for cell, extra in per_cell.items():
        axes = dict(common, acts=_activation_sets(cell), **extra)
        full = [dict(zip(axes, v), cell=cell) for v in itertools.product(*axes.values())]
        # a fixed sample; every activation set appears (it is the longest axis)
        rnd = random.Random(cell.value)
        picked = [rnd.choice([c for c in full if c["acts"] == a]) for a in axes["acts"]]
        cases += picked + rnd.sample(full, 40)
    return cases


CASES = _cases()


def _id(c):
    acts = c["acts"][0]
    names = "default" if acts is None else "+".join(a.name for a in acts)
    rest = [f"{k}={v}" for k, v in c.items() if k not in ("acts", "cell")]
    return "-".join([c["cell"].value, names, "explicit" if c["acts"][1] else "ortdefaults"] + rest)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_matches_onnxruntime(case):
    cell = case["cell"]
    T, B, I, H = 5, 4, 4, 3  # noqa: E741
    D = case["direction"].num_directions
    acts, explicit = case["acts"]
    rng = np.random.default_rng(len(CASES))
    lstm = cell is CellKind.LSTM
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    h0 = rng.standard_normal((D, B, H)).astype(np.float32) if case["init"] else None
    c0 = (
        rng.standard_normal((D, B, H)).astype(np.float32) if case["init"] is True and lstm else None
    )
    lens = np.array([T, 2, 4, 0], np.int32) if case["lens"] else None
    spec = RecurrentSpec(
        name="ort_node",
        cell=cell,
        input_size=I,
        hidden_size=H,
        direction=case["direction"],
        activations=None if acts is None else [acts] * D,
        clip=case["clip"],
        linear_before_reset=case.get("linear_before_reset", True),
        input_forget=case.get("input_forget", False),
        seq_len=T,
        has_initial_h=h0 is not None,
        has_initial_c=c0 is not None,
        has_sequence_lens=lens is not None,
        want_c=lstm,
    )
    weights = random_weights(spec, rng, bias=case["bias"], peephole=case.get("peephole", False))
    y_ref, h_ref, c_ref = run_ort(spec, weights, x, h0, c0, lens, explicit_params=explicit)

    # ours, in the case's layout; layout=1 (batch-major, which onnxruntime refuses) is
    # compared against onnxruntime's layout=0 result transposed
    b = NumpyBuilder()
    if case["layout"] == 1:
        spec = dataclasses.replace(spec, layout=IOLayout(True, True, True))
        x, h0, c0 = (None if a is None else np.swapaxes(a, 0, 1) for a in (x, h0, c0))
        y_ref = np.transpose(y_ref, (2, 0, 1, 3))
        h_ref, c_ref = (None if a is None else np.swapaxes(a, 0, 1) for a in (h_ref, c_ref))
    seq = None if lens is None else (lens if case["lens"] == "const" else b.input(lens))
    out = emit(b, spec, weights, x, h0, c0, seq, emission=case["emission"])
    np.testing.assert_allclose(out.y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.h, h_ref, rtol=1e-5, atol=1e-5)
    if lstm:
        np.testing.assert_allclose(out.c, c_ref, rtol=1e-5, atol=1e-5)


def test_every_activation_in_every_position():
    for cell in CellKind:
        seen = {
            (pos, a.name)
            for c in CASES
            if c["cell"] is cell and c["acts"][0]
            for pos, a in enumerate(c["acts"][0])
        }
        assert seen >= {(p, n) for p in range(cell.num_activations) for n in ACTIVATIONS}
