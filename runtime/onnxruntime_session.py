"""onnxruntime as this project runs it: the fp32 reference every ONNX figure is checked
against, single-threaded on the CPU (repeatable, and fair to a 2-core machine), with
onnxruntime's own error log silenced: callers turn its exceptions into their messages."""

from __future__ import annotations

import os

import onnx


def session(model: "onnx.ModelProto | os.PathLike | str"):
    """An InferenceSession for a ModelProto or a path (a path keeps external data)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # fatal only: errors reach the caller as exceptions
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
