"""Shared helpers for the ONNX adapter tests: run under onnxruntime, validate models."""

import numpy as np
import onnx
import onnxruntime as ort

from recurrent_lowering.backends.onnx.rewrite import count_recurrent_nodes


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict) -> list:
    return session(model).run(None, feeds)


def check_rewritten(model: onnx.ModelProto) -> None:
    """What every rewritten model must satisfy: valid, inferable, no recurrent node left."""
    assert count_recurrent_nodes(model) == 0
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def assert_close(got, want, tol=1e-5):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
