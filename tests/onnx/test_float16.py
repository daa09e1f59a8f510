"""float16 graphs: weights become float16 initializers and the rewritten graph runs in
float16 under onnxruntime, close to the float32 native result."""

import dataclasses

import numpy as np
import onnx
import pytest

from recurrent_lowering.backends.onnx.rewrite import rewrite_model

from . import models
from .ort_util import check_rewritten, run


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
def test_float16_graph(op, layout):
    """layout=1 too: onnxruntime 1.32 crashes on a float16 Transpose -> MatMul, which the
    builder then does not emit (the product comes before the transpose)."""
    cfg32 = models.Config(
        op=op,
        direction="bidirectional",
        initial_h=True,
        sequence_lens="input",
        clip=2.0,
        layout=layout,
    )
    cfg16 = dataclasses.replace(cfg32, dtype=np.float16)
    w32, feeds32 = models.weights(cfg32), models.runtime_inputs(cfg32)
    w16 = {k: v.astype(np.float16) for k, v in w32.items()}
    feeds16 = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds32.items()}
    model16, _ = models.build(cfg16, w16, feeds16)
    rewritten = rewrite_model(model16)
    check_rewritten(rewritten)
    floats = {t.data_type for t in rewritten.graph.initializer} - {onnx.TensorProto.INT64}
    assert floats == {onnx.TensorProto.FLOAT16}
    got = run(rewritten, feeds16)
    model32 = models.build(cfg32, w32, feeds32)[0]
    want = run(models.to_layout0(model32) if layout else model32, feeds32)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float16
        np.testing.assert_allclose(g.astype(np.float32), w, atol=1e-2, rtol=1e-2)
