"""A deterministic sample of attribute combinations: rewritten graph (onnxruntime) vs the
core's numpy reference and vs onnxruntime's native op (via a layout=0 twin for layout=1).

The full product has thousands of cells; a fixed-seed sample of them keeps the file under
a minute while every axis value appears many times.
"""

import dataclasses
import itertools
import random

import numpy as np
import pytest

from recurrent_lowering.backends.onnx.rewrite import rewrite_model

from . import models
from .cases import numpy_reference
from .ort_util import assert_close, check_rewritten, run

# (name, alpha or None, beta or None); None leaves the value to the defaults.
POOL = [
    ("HardSigmoid", 0.3, 0.4),
    ("LeakyRelu", 0.05, None),
    ("Elu", 0.7, None),
    ("Softsign", None, None),
    ("Affine", 0.8, 0.1),
    ("ScaledTanh", 1.2, 0.6),
    ("ThresholdedRelu", 0.2, None),
    ("Softplus", None, None),
    ("Relu", None, None),
    ("Sigmoid", None, None),
    ("Tanh", None, None),
    ("LeakyRelu", None, None),
    ("HardSigmoid", None, None),
    ("Elu", None, None),
]

AXES = dict(
    op=["GRU", "LSTM", "RNN"],
    direction=["forward", "reverse", "bidirectional"],
    layout=[0, 1],
    bias=[True, False],
    initial_state=[False, True],
    sequence_lens=[None, "constant", "input"],
    clip=[None, 0.9],
    activations=["default", "custom"],
    variant=[0, 1],  # GRU linear_before_reset / LSTM input_forget
    peepholes=[False, True],
    emission=["unrolled", "loop"],
    outputs=["all", "y_only", "states_only"],
    dtype=["float32", "float64"],  # onnxruntime has no native float64 kernels: numpy only
    opset=[22, 11],  # 11: attribute forms of Squeeze/Unsqueeze (layout=1 needs 14)
)
SAMPLES = 240


def _sample():
    keys = list(AXES)
    cells = list(itertools.product(*AXES.values()))
    picked = random.Random(20261126).sample(cells, SAMPLES)
    return [dict(zip(keys, c)) for c in picked]


def _activations(op, directions, offset, omit_params):
    n = models.NUM_ACTIVATIONS[op] * directions
    names, alphas, betas = [], [], []
    for k in range(n):
        name, a, b = POOL[(offset + 3 * k) % len(POOL)]
        names.append(name)
        if a is not None and not omit_params:
            alphas.append(a)
        if b is not None and not omit_params:
            betas.append(b)
    return names, alphas, betas


def _config(p, index):
    op = p["op"]
    cfg = models.Config(
        op=op,
        direction=p["direction"],
        layout=p["layout"],
        bias=p["bias"],
        initial_h=p["initial_state"],
        initial_c=p["initial_state"],
        sequence_lens=p["sequence_lens"],
        clip=p["clip"],
        linear_before_reset=p["variant"] if op == "GRU" else 0,
        input_forget=p["variant"] if op == "LSTM" else 0,
        peepholes=p["peepholes"] and op == "LSTM",
        outputs={
            "all": (True, True, True),
            "y_only": (True, False, False),
            "states_only": (False, True, True),
        }[p["outputs"]],
        dtype=np.dtype(p["dtype"]).type,
        opset=p["opset"] if p["layout"] == 0 else 22,
    )
    if p["activations"] == "custom":
        # alpha/beta given except in every third custom case: those exercise the defaults
        names, alphas, betas = _activations(op, cfg.num_directions, index, index % 3 == 0)
        cfg = dataclasses.replace(
            cfg, activations=names, activation_alpha=alphas, activation_beta=betas
        )
    return cfg


CASES = _sample()


def test_sample_covers_every_axis_value():
    for key, values in AXES.items():
        assert {c[key] for c in CASES} == set(values), key


@pytest.mark.parametrize("index", range(SAMPLES), ids=lambda i: _config(CASES[i], i).op + str(i))
def test_combination(index):
    p = CASES[index]
    cfg = _config(p, index)
    model, feeds = models.build(cfg)
    rewritten = rewrite_model(model, emission=p["emission"])
    check_rewritten(rewritten)
    got = run(rewritten, feeds)

    for g, r in zip(got, numpy_reference(model, feeds), strict=True):
        assert_close(g, r)
    if cfg.dtype == np.float32:
        native = models.to_layout0(model) if cfg.layout else model
        for g, r in zip(got, run(native, feeds), strict=True):
            assert_close(g, r)


@pytest.mark.parametrize("opset", [7, 9, 10])
@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_clip_before_opset_11(op, opset):
    """Clip-6 (attributes) where Clip-11 (inputs) does not exist yet; Max/Min against a
    scalar would not broadcast at opset 7."""
    cfg = models.Config(op=op, clip=0.4, opset=opset, direction="bidirectional")
    model, feeds = models.build(cfg)
    rewritten = rewrite_model(model, emission="unrolled")
    check_rewritten(rewritten)
    assert any(n.op_type == "Clip" and not n.input[1:] for n in rewritten.graph.node)
    for g, r in zip(run(rewritten, feeds), run(model, feeds), strict=True):
        assert_close(g, r)


@pytest.mark.parametrize(
    "cfg",
    [
        models.Config(op="GRU", opset=7, sequence_lens="input", direction="bidirectional"),
        models.Config(op="RNN", opset=8, activations=["ThresholdedRelu"], activation_alpha=[0.1]),
    ],
    ids=["runtime-lengths-opset7", "thresholded-relu-opset8"],
)
def test_selection_before_opset_9(cfg):
    """No Where (nor integer Less) before opset 9: the selection is written arithmetically."""
    model, feeds = models.build(cfg)
    rewritten = rewrite_model(model, emission="unrolled")
    check_rewritten(rewritten)
    assert not any(n.op_type == "Where" for n in rewritten.graph.node)
    for g, r in zip(run(rewritten, feeds), numpy_reference(model, feeds), strict=True):
        assert_close(g, r)
