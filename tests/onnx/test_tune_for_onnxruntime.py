"""rewrite_model(tune_for="onnxruntime"): Scan at every length, and at batch 1 the loop
weights read through Optional -> OptionalGetElement (more rows keep them constant, as
packed products are faster there). Same results as the native op and the portable rewrite;
the onnxruntime behaviour the speed relies on (it does not fold the optional value back
into a constant, so it cannot prepack the weight) is pinned on its optimized graph."""

import dataclasses

import onnx
import onnxruntime as ort
import pytest

from recurrent_lowering.backends.onnx.rewrite import rewrite_model

from . import models
from .ort_util import assert_close, check_rewritten, run

CONFIGS = [
    models.Config(
        op="GRU", direction="bidirectional", initial_h=True, linear_before_reset=1, batch=1
    ),
    models.Config(op="LSTM", direction="reverse", initial_h=True, initial_c=True, peepholes=True),
    models.Config(op="RNN", direction="forward", layout=1, batch=1),
    models.Config(op="GRU", direction="forward", sequence_lens="constant", clip=0.7, batch=1),
    models.Config(op="GRU", direction="forward", batch=3),
]


def _scans(model):
    return [n for n in model.graph.node if n.op_type == "Scan"]


def _body(scan):
    return next(a.g for a in scan.attribute if a.name == "body")


@pytest.mark.parametrize(
    "cfg", CONFIGS, ids=lambda c: f"{c.op}-{c.direction}-l{c.layout}-b{c.batch}"
)
def test_tuned_rewrite_matches_native_and_portable(cfg):
    model, feeds = models.build(cfg)
    tuned = rewrite_model(model, tune_for="onnxruntime")
    check_rewritten(tuned)
    # a static length: auto picks Scan here, where the portable rewrite unrolls
    assert len(_scans(tuned)) == cfg.num_directions
    assert not _scans(rewrite_model(model))
    initializers = {t.name for t in tuned.graph.initializer}
    produced = {o: n.op_type for n in tuned.graph.node for o in n.output}
    for scan in _scans(tuned):
        products = [n for n in _body(scan).node if n.op_type in ("Gemm", "MatMul")]
        assert products
        for n in products:
            if cfg.batch == 1:
                assert n.input[1] not in initializers
                assert produced[n.input[1]] == "OptionalGetElement"
            else:
                assert n.input[1] in initializers
    native = models.to_layout0(model) if cfg.layout else model
    for got, portable, want in zip(
        run(tuned, feeds), run(rewrite_model(model), feeds), run(native, feeds), strict=True
    ):
        assert_close(got, want)
        assert_close(got, portable)


def test_onnxruntime_keeps_the_optional_weights_unfolded(tmp_path):
    """If onnxruntime folded Optional -> OptionalGetElement into an initializer again, it
    would prepack the weight and the tuning would do nothing (docs/onnx.md)."""
    model, _ = models.build(models.Config(op="GRU", batch=1, hidden_size=16, input_size=8))
    tuned = rewrite_model(model, tune_for="onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(tuned.SerializeToString(), options, ["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    ops = [n.op_type for n in optimized.graph.node]
    assert ops.count("OptionalGetElement") == 2  # GRU: the [r|z] and the n products
    initializers = {t.name for t in optimized.graph.initializer}
    (scan,) = _scans(optimized)
    for n in _body(scan).node:
        if n.op_type in ("Gemm", "MatMul", "FusedGemm"):
            assert n.input[1] not in initializers


def test_opsets_without_optional_keep_constant_weights():
    cfg = models.Config(op="LSTM", opset=14)
    model, feeds = models.build(cfg)
    tuned = rewrite_model(model, tune_for="onnxruntime")
    check_rewritten(tuned)
    assert len(_scans(tuned)) == 1
    assert not any(n.op_type.startswith("Optional") for n in tuned.graph.node)
    for got, want in zip(run(tuned, feeds), run(model, feeds), strict=True):
        assert_close(got, want)


def test_forced_unrolled_stays_unrolled_and_unknown_tuning_is_refused():
    model, feeds = models.build(dataclasses.replace(models.Config(op="GRU"), steps=3))
    unrolled = rewrite_model(model, emission="unrolled", tune_for="onnxruntime")
    assert not _scans(unrolled)
    for got, want in zip(run(unrolled, feeds), run(model, feeds), strict=True):
        assert_close(got, want)
    with pytest.raises(ValueError, match="tune_for must be one of"):
        rewrite_model(model, tune_for="tract")
