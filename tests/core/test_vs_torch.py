"""The core (numpy builder) against torch eager over a generated configuration matrix."""

from __future__ import annotations

import itertools
import random
import zlib

import numpy as np
import pytest

from recurrent_lowering.passes import emit
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.tests.core.torch_ref import make_module, run_module, spec_and_weights

KINDS = ("GRU", "LSTM", "RNN_TANH", "RNN_RELU")
FULL = [
    dict(
        kind=k, layers=L, bidir=d, bias=b, batch_first=bf, proj=p, batch=B, T=T, init=i, emission=s
    )
    for k, L, d, b, bf, p, B, T, i, s in itertools.product(
        KINDS,
        (1, 2, 3),
        (False, True),
        (True, False),
        (False, True),
        (0, 3),
        (1, 3),
        (1, 7, 64),
        (False, True),
        ("unrolled", "loop"),
    )
    if not (p and k != "LSTM")
]
# The product has ~2000 cases; a fixed sample keeps the file within seconds.
CASES = random.Random(0).sample(FULL, 160)


def _id(c):
    return "-".join(f"{k}={v}" for k, v in c.items())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_matches_torch_eager(case):
    I, H = 4, 5  # noqa: E741
    m = make_module(
        case["kind"],
        I,
        H,
        case["layers"],
        case["bidir"],
        case["bias"],
        case["batch_first"],
        case["proj"],
        seed=zlib.crc32(_id(case).encode()),
    )
    D = 2 if case["bidir"] else 1
    B, T = case["batch"], case["T"]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, I) if case["batch_first"] else (T, B, I)).astype(np.float32)
    lstm = case["kind"] == "LSTM"
    h0 = c0 = None
    if case["init"]:
        h0 = rng.standard_normal((case["layers"] * D, B, case["proj"] or H)).astype(np.float32)
        c0 = rng.standard_normal((case["layers"] * D, B, H)).astype(np.float32) if lstm else None
    spec, weights = spec_and_weights(m, case["kind"], T, h0 is not None, c0 is not None)
    out = emit(NumpyBuilder(), spec, weights, x, h0, c0, emission=case["emission"])
    y, hn, cn = run_module(m, x, h0, c0)
    np.testing.assert_allclose(out.y, y, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.h, hn, atol=1e-5, rtol=0)
    if lstm:
        np.testing.assert_allclose(out.c, cn, atol=1e-5, rtol=0)


def test_sample_covers_every_value():
    """The sample still exercises every value of every axis of the matrix."""
    for key in FULL[0]:
        assert {c[key] for c in CASES} == {c[key] for c in FULL}, key
