"""Error figures shared by every target: max abs error and SQNR against a reference."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import LoweringError


def _flat(outputs: Any) -> list[np.ndarray]:
    if isinstance(outputs, (list, tuple)):
        return [a for o in outputs for a in _flat(o)]
    if hasattr(outputs, "detach"):
        outputs = outputs.detach().cpu()
        if outputs.is_floating_point():  # numpy has no bfloat16
            outputs = outputs.double()
        return [outputs.numpy()]
    return [np.asarray(outputs)]


def sqnr_db(reference: np.ndarray, actual: np.ndarray) -> float:
    signal = float(np.sum(np.square(reference.astype(np.float64))))
    noise = float(np.sum(np.square(reference.astype(np.float64) - actual.astype(np.float64))))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def compare(reference: Any, actual: Any) -> dict[str, float]:
    """max abs error and SQNR over all outputs together (in order)."""
    ref = np.concatenate([a.ravel() for a in _flat(reference)]).astype(np.float64)
    act = np.concatenate([a.ravel() for a in _flat(actual)]).astype(np.float64)
    if ref.shape != act.shape:
        raise ValueError(f"output sizes differ: reference {ref.shape}, actual {act.shape}")
    return {
        "max_abs_err": float(np.max(np.abs(ref - act))) if ref.size else 0.0,
        "sqnr_db": sqnr_db(ref, act),
    }


def count_call_functions(graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function")


def random_onnx_inputs(model, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for an ONNX model's graph inputs; dynamic dimensions become 1."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[value.name] = np.full(shape, 1, dtype=dtype)
        else:
            feeds[value.name] = rng.uniform(-1, 1, size=shape).astype(dtype)
    return feeds


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def compare_onnx(original, rewritten, feeds: dict | None = None) -> dict[str, Any]:
    """Runs both models in onnxruntime on `feeds` (default: random inputs). If onnxruntime
    refuses the original (for instance layout=1 recurrent nodes), only the rewritten model
    runs. Given feeds that onnxruntime refuses (the original runs on random ones) are an
    error: a --calibration that does not fit the model (e.g. lengths beyond T)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1

    def run(model, inputs):
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return session.run(None, inputs)

    given = feeds is not None
    feeds = random_onnx_inputs(rewritten) if feeds is None else feeds
    try:
        actual = run(rewritten, feeds)
    except Exception as e:  # onnxruntime's errors have many types
        if given:
            reason = _first_line(e)
            raise LoweringError(
                f"onnxruntime cannot run the model on --calibration: {reason}"
            ) from e
        raise
    try:
        expected = run(original, feeds)
    except Exception as e:  # ORT refuses some valid models, e.g. layout=1 GRU
        if given:
            try:
                run(original, random_onnx_inputs(original))
            except Exception:  # noqa: BLE001 - refused whatever the inputs: the model
                pass
            else:
                raise LoweringError(
                    f"onnxruntime refuses the input model on --calibration: {_first_line(e)}"
                ) from e
        return {"reference": f"none: onnxruntime refused the input model ({type(e).__name__})"}
    return {"reference": "onnxruntime on the input model", **compare(expected, actual)}
