"""Dynamic sequence length: auto picks ONNX Scan; one rewritten model serves several T and
matches the unrolled rewrite of each static twin and onnxruntime's native op."""

import dataclasses

import numpy as np
import pytest

from recurrent_lowering.backends.onnx.rewrite import rewrite_model

from . import models
from .ort_util import assert_close, check_rewritten, run

CONFIGS = [
    models.Config(op="GRU", direction="bidirectional", initial_h=True, linear_before_reset=1),
    models.Config(op="LSTM", direction="reverse", initial_h=True, initial_c=True, peepholes=True),
    models.Config(op="RNN", direction="forward", layout=1),
    models.Config(op="GRU", direction="reverse", layout=1, clip=0.8),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.op}-{c.direction}-l{c.layout}")
def test_scan_serves_every_length(cfg):
    dynamic, _ = models.build(dataclasses.replace(cfg, dynamic_steps=True))
    rewritten = rewrite_model(dynamic)
    check_rewritten(rewritten)
    assert sum(n.op_type == "Scan" for n in rewritten.graph.node) == cfg.num_directions
    for steps in (1, 2, 7):  # 1: no step outside the loop when the length is dynamic
        static_cfg = dataclasses.replace(cfg, steps=steps)
        static, feeds = models.build(static_cfg)
        unrolled = rewrite_model(static, emission="unrolled")
        assert not any(n.op_type == "Scan" for n in unrolled.graph.node)
        native = models.to_layout0(static) if cfg.layout else static
        got = run(rewritten, feeds)
        for g, u, n in zip(got, run(unrolled, feeds), run(native, feeds), strict=True):
            assert_close(g, u)
            assert_close(g, n)


def test_forced_scan_on_static_length_matches_unrolled():
    cfg = models.Config(op="LSTM", direction="bidirectional", initial_h=True, steps=6)
    model, feeds = models.build(cfg)
    scan, unrolled = rewrite_model(model, emission="loop"), rewrite_model(model, "unrolled")
    assert any(n.op_type == "Scan" for n in scan.graph.node)
    # the loop's graph does not grow with T; the unrolled one grows by a step's ops per step
    longer, _ = models.build(dataclasses.replace(cfg, steps=12))
    assert len(rewrite_model(longer, emission="loop").graph.node) == len(scan.graph.node)
    grown = len(rewrite_model(longer, "unrolled").graph.node) - len(unrolled.graph.node)
    assert grown >= 2 * 6 * 5  # two directions, six more steps, at least five ops a step
    for g, w in zip(run(scan, feeds), run(unrolled, feeds), strict=True):
        assert_close(g, w)


LENGTH_CONFIGS = [
    models.Config(op="GRU", direction="bidirectional", initial_h=True, sequence_lens="input"),
    models.Config(
        op="LSTM",
        direction="reverse",
        initial_h=True,
        initial_c=True,
        batch=3,
        sequence_lens="input",
    ),
    models.Config(op="RNN", layout=1, batch=3, sequence_lens="input"),
    models.Config(op="GRU", linear_before_reset=1, batch=3, sequence_lens="constant"),
]


@pytest.mark.parametrize(
    "cfg", LENGTH_CONFIGS, ids=lambda c: f"{c.op}-{c.direction}-l{c.layout}-{c.sequence_lens}"
)
def test_sequence_lens_with_a_dynamic_length(cfg):
    """sequence_lens masks a loop whose T is known only at run time (the steps' positions
    come from a Range over X's time axis): lengths 0, T and between, at several T, match
    onnxruntime's native op."""
    dynamic, _ = models.build(dataclasses.replace(cfg, dynamic_steps=True))
    rewritten = rewrite_model(dynamic)
    check_rewritten(rewritten)
    assert any(n.op_type == "Range" for n in rewritten.graph.node)
    for steps in (1, 3, 6):
        static_cfg = dataclasses.replace(cfg, steps=steps, dynamic_steps=False)
        lens = np.array([0, steps, max(1, steps - 1)][: cfg.batch], np.int32)
        if cfg.sequence_lens == "constant":  # one set of lengths is compiled in
            if steps < 3:
                continue
            lens = np.array([0, 3, 2], np.int32)
        static, feeds = models.build(static_cfg)
        if cfg.sequence_lens == "input":
            feeds["sequence_lens"] = lens
        else:
            static, _ = models.build(static_cfg, feeds={**feeds, "sequence_lens": lens})
            rewritten, _ = models.build(
                dataclasses.replace(cfg, dynamic_steps=True), feeds={**feeds, "sequence_lens": lens}
            )
            rewritten = rewrite_model(rewritten)
        native = models.to_layout0(static) if cfg.layout else static
        got, want = run(rewritten, feeds), run(native, feeds)
        for g, n in zip(got, want, strict=True):
            assert_close(g, n)


@pytest.mark.parametrize(
    "cfg, body_ops",
    [  # emitted per step; onnxruntime then fuses Gemm + Sigmoid (GRU) or both (LSTM)
        (
            models.Config(op="GRU", linear_before_reset=1, steps=6),
            {"Gemm": 2, "Sigmoid": 1, "Split": 1, "Mul": 2, "Add": 2, "Tanh": 1, "Sub": 1},
        ),
        (
            models.Config(op="LSTM", steps=6, outputs=(True, True, False)),
            {"Gemm": 2, "Sigmoid": 1, "Split": 1, "Mul": 3, "Add": 1, "Tanh": 2},
        ),
    ],
    ids=["GRU-lbr1", "LSTM"],
)
def test_scan_body_reads_gate_groups_and_outputs_no_copies(cfg, body_ops):
    """x_t's gate groups arrive as separate scan inputs (split once before the loop) and
    h' leaves as the two operands of its last op (no Identity per step); results match."""
    model, feeds = models.build(cfg)
    scan = rewrite_model(model, emission="loop")
    (loop,) = [n for n in scan.graph.node if n.op_type == "Scan"]
    attrs = {a.name: a for a in loop.attribute}
    body, scan_inputs = attrs["body"].g, attrs["num_scan_inputs"].i
    counts: dict = {}
    for n in body.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    assert counts == body_ops
    states = 2 if cfg.op == "LSTM" else 1
    x_pieces = [i.name for i in body.input][states:]
    assert scan_inputs == len(x_pieces) == 2  # [r|z] and n, or [i|f|o] and g
    assert not any(n.op_type == "Split" and n.input[0] in x_pieces for n in body.node)
    assert len(body.output) == states + 2  # the states, then Y's two operands
    for g, w in zip(run(scan, feeds), run(model, feeds), strict=True):
        assert_close(g, w)
