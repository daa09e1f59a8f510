"""gate_order against the frameworks themselves, and composed activations against closed forms."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from recurrent_lowering.passes import Activation, CellKind, Direction, RecurrentSpec
from recurrent_lowering.passes import activations as A
from recurrent_lowering.passes.gate_order import from_onnx, from_torch_module_params, to_onnx
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.op_count import CountingBuilder
from recurrent_lowering.passes.spec import RELU
from recurrent_lowering.tests.core.gen import random_weights
from recurrent_lowering.tests.core.ort_ref import run_ort
from recurrent_lowering.tests.core.torch_ref import make_module, run_module

KINDS = ("GRU", "LSTM", "RNN_TANH", "RNN_RELU")


@pytest.mark.parametrize("kind,bidir,bias", itertools.product(KINDS, (False, True), (False, True)))
def test_torch_weights_through_onnx_match_torch(kind, bidir, bias):
    """PyTorch -> LayerWeights -> ONNX W/R/B, run by onnxruntime, equals torch eager:
    both conversions agree with the frameworks without the core in between."""
    m = make_module(kind, 3, 4, 1, bidir, bias, False, 0, seed=7)
    cell = CellKind(kind.split("_")[0])
    D = 2 if bidir else 1
    named = {k: v.detach().numpy() for k, v in m.named_parameters()}
    weights = from_torch_module_params(cell, named, 1, D)
    spec = RecurrentSpec(
        "t",
        cell,
        3,
        4,
        direction=Direction.BIDIRECTIONAL if bidir else Direction.FORWARD,
        activations=[(RELU,)] * D if kind == "RNN_RELU" else None,
        linear_before_reset=True,
    )
    x = np.random.default_rng(0).standard_normal((6, 2, 3)).astype(np.float32)
    y, h, _ = run_ort(spec, weights, x)
    y_t, h_t, _ = run_module(m, x, None, None)
    # ONNX Y is [T, D, B, H]; torch's [T, B, D*H]
    np.testing.assert_allclose(np.concatenate(list(np.moveaxis(y, 1, 0)), -1), y_t, atol=1e-5)
    np.testing.assert_allclose(h, h_t, atol=1e-5)


@pytest.mark.parametrize("cell", list(CellKind))
def test_onnx_round_trip(cell):
    spec = RecurrentSpec("t", cell, 3, 4, direction=Direction.BIDIRECTIONAL)
    weights = random_weights(spec, np.random.default_rng(1), peephole=True)[0]
    W, R, B, P = to_onnx(cell, weights)
    assert W.shape == (2, cell.num_gates * 4, 3) and B.shape == (2, 2 * cell.num_gates * 4)
    for d, lw in enumerate(weights):
        back = from_onnx(cell, W, R, B, P, d)
        for f in ("w", "r", "b_w", "b_r", "peephole"):
            a, b = getattr(lw, f), getattr(back, f)
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b)


def test_onnx_gate_blocks_land_where_the_spec_says():
    # GRU: ONNX (z, r, h) -> canonical (r, z, n); LSTM: ONNX (i, o, f, c) -> (i, f, g, o)
    for cell, onnx_order, canonical in (
        (CellKind.GRU, "zrh", "rzh"),
        (CellKind.LSTM, "iofc", "ifco"),
    ):
        G = len(onnx_order)
        W = np.repeat(np.arange(G, dtype=np.float32), 2)[None, :, None]  # block j holds j
        got = from_onnx(cell, W, W[:, :, :1].repeat(2, 2)).w[::2, 0]
        assert [onnx_order[int(j)] for j in got] == list(canonical)
    P = np.array([[1, 1, 2, 2, 3, 3]], np.float32)  # ONNX (i, o, f)
    np.testing.assert_array_equal(
        from_onnx(CellKind.LSTM, np.zeros((1, 8, 1)), np.zeros((1, 8, 2)), None, P).peephole,
        [[1, 1], [3, 3], [2, 2]],  # canonical (i, f, o)
    )


CLOSED_FORMS = {
    "Relu": lambda x, a, b: np.maximum(x, 0),
    "Tanh": lambda x, a, b: np.tanh(x),
    "Sigmoid": lambda x, a, b: 1 / (1 + np.exp(-x)),
    "Affine": lambda x, a, b: a * x + b,
    "LeakyRelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "ThresholdedRelu": lambda x, a, b: np.where(x > a, x, 0),
    "ScaledTanh": lambda x, a, b: a * np.tanh(b * x),
    "HardSigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "Elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)),
    "Softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "Softplus": lambda x, a, b: np.log1p(np.exp(x)),
}


@pytest.mark.parametrize(
    "name,params",
    [(n, p) for n in CLOSED_FORMS for p in ((0.7, -0.4), (1.0, 0.0), (0.0, 1.0), (-1.5, 2.0))],
)
def test_activation_matches_closed_form(name, params):
    alpha, beta = params
    act = Activation(name, alpha, beta)
    x = np.linspace(-4, 4, 81)
    got = A.apply(NumpyBuilder(np.float64), act, x)
    np.testing.assert_allclose(got, CLOSED_FORMS[name](x, alpha, beta), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_activation_stays_finite_in_float16(name):
    """Composed forms must not overflow where the function itself is in range: e.g.
    Softplus as log(exp(x) + 1) is inf in float16 from x = 11.1 on."""
    act = Activation(name, 0.7, 0.4)
    x = np.linspace(-15, 15, 61)
    got = A.apply(NumpyBuilder(np.float16), act, x.astype(np.float16))
    want = CLOSED_FORMS[name](x, 0.7, 0.4)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(
    "act,ops",
    [
        (Activation("Affine", 1.0, 0.0), []),
        (Activation("Affine", 2.0, 0.0), ["mul"]),
        (Activation("Affine", 1.0, 0.5), ["add"]),
        (Activation("ScaledTanh", 1.0, 1.0), ["tanh"]),
        (Activation("LeakyRelu", 0.0), ["relu"]),
        (Activation("LeakyRelu", 0.1), ["mul", "relu", "mul", "add"]),
        (Activation("HardSigmoid", 1.0, 0.0), ["clamp"]),
        (Activation("Elu", 1.0), ["relu", "clamp", "exp", "add", "add"]),
    ],
)
def test_activation_skips_multiplying_by_one_and_adding_zero(act, ops):
    b = CountingBuilder()
    A.apply(b, act, "x")
    assert [op for op in b.ops if op != "constant"] == ops


def test_native_activation_wins():
    class Native(CountingBuilder):
        def activation(self, act, x):
            return self._op("native_" + act.name)

    b = Native()
    A.apply(b, Activation("HardSigmoid", 0.2, 0.5), "x")
    assert b.ops == ["native_HardSigmoid"]
