"""Error figures shared by every target: max abs error and SQNR against a reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from recurrent_lowering.runtime.metrics import judged, sqnr_db

from .errors import LoweringError, first_line


def _flat(outputs: Any) -> list[np.ndarray]:
    if isinstance(outputs, (list, tuple)):
        return [a for o in outputs for a in _flat(o)]
    if hasattr(outputs, "detach"):
        outputs = outputs.detach().cpu()
        if outputs.is_floating_point():  # numpy has no bfloat16
            outputs = outputs.double()
        return [outputs.numpy()]
    return [np.asarray(outputs)]


def compare(reference: Any, actual: Any) -> dict[str, float]:
    """max abs error and SQNR over all outputs together (in order); over the floating ones
    alone when there are any (an integer output, a class index, is not in their units:
    the report gives its share of equal elements)."""
    expected, got = _flat(reference), _flat(actual)
    if len(expected) != len(got):
        raise ValueError(f"output counts differ: reference {len(expected)}, actual {len(got)}")
    pairs = [pair for pair, j in zip(zip(expected, got), judged(expected)) if j]
    ref = np.concatenate([r.ravel() for r, _ in pairs]).astype(np.float64)
    act = np.concatenate([a.ravel() for _, a in pairs]).astype(np.float64)
    if ref.shape != act.shape:
        raise ValueError(f"output sizes differ: reference {ref.shape}, actual {act.shape}")
    return {
        "max_abs_err": float(np.max(np.abs(ref - act))) if ref.size else 0.0,
        "sqnr_db": sqnr_db(ref, act),
    }


def count_call_functions(graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function")


def compare_onnx(original, rewritten, feeds: list, from_user: bool) -> dict[str, Any]:
    """Runs both models in onnxruntime on each sample of `feeds` (dicts, input name to
    array; their shapes may differ) and compares all their outputs together. When
    onnxruntime cannot load the original (it refuses layout=1 recurrent nodes) only the
    rewritten model runs, with no reference. `from_user`: the feeds are --calibration
    data, whose refusal by onnxruntime is the user's to fix (lengths beyond T, say)."""
    from recurrent_lowering.runtime.onnxruntime_session import session

    def run(model_session, which: str) -> list:
        taken = {i.name for i in model_session.get_inputs()}  # less what was fixed to a constant
        try:
            return [
                model_session.run(None, {n: a for n, a in sample.items() if n in taken})
                for sample in feeds
            ]
        except Exception as e:  # noqa: BLE001 - its refusals have many types
            if not from_user:
                raise
            raise LoweringError(
                f"onnxruntime refuses the {which} model on --calibration: {first_line(e)}"
            ) from e

    try:
        reference = session(original)
    except Exception as e:  # noqa: BLE001 - its refusals have many types
        run(session(rewritten), "rewritten")
        return {"reference": f"none: onnxruntime refused the input model ({first_line(e)})"}
    expected = run(reference, "input")  # first: data it refuses is refused by the model itself
    actual = run(session(rewritten), "rewritten")
    return {"reference": "onnxruntime on the input model", **compare(expected, actual)}
