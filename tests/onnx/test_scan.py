"""Dynamic sequence length: auto picks ONNX Scan; one rewritten model serves several T and
matches the unrolled rewrite of each static twin and onnxruntime's native op."""

import dataclasses

import pytest

from recurrent_lowering.backends.onnx.rewrite import rewrite_model
from recurrent_lowering.passes.spec import SpecError

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
    for steps in (2, 7):
        static_cfg = dataclasses.replace(cfg, steps=steps)
        static, feeds = models.build(static_cfg)
        unrolled = rewrite_model(static, strategy="unrolled")
        assert not any(n.op_type == "Scan" for n in unrolled.graph.node)
        native = models.to_layout0(static) if cfg.layout else static
        got = run(rewritten, feeds)
        for g, u, n in zip(got, run(unrolled, feeds), run(native, feeds), strict=True):
            assert_close(g, u)
            assert_close(g, n)


def test_forced_scan_on_static_length_matches_unrolled():
    cfg = models.Config(op="LSTM", direction="bidirectional", initial_h=True, steps=6)
    model, feeds = models.build(cfg)
    scan, unrolled = rewrite_model(model, strategy="scan"), rewrite_model(model, "unrolled")
    assert any(n.op_type == "Scan" for n in scan.graph.node)
    # the loop's graph does not grow with T; the unrolled one grows by a step's ops per step
    longer, _ = models.build(dataclasses.replace(cfg, steps=12))
    assert len(rewrite_model(longer, strategy="scan").graph.node) == len(scan.graph.node)
    grown = len(rewrite_model(longer, "unrolled").graph.node) - len(unrolled.graph.node)
    assert grown >= 2 * 6 * 5  # two directions, six more steps, at least five ops a step
    for g, w in zip(run(scan, feeds), run(unrolled, feeds), strict=True):
        assert_close(g, w)


def test_runtime_lengths_with_dynamic_steps_are_refused_by_name():
    cfg = models.Config(op="GRU", sequence_lens="input", dynamic_steps=True)
    model, _ = models.build(cfg, name="enc/gru")
    with pytest.raises(SpecError, match="enc/gru.*sequence_lens"):
        rewrite_model(model)
