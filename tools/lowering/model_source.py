"""Reads what the user names on the command line: a .pt2, an .onnx file or a bundled example."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from .errors import LoweringError, first_line


@dataclasses.dataclass
class ModelSource:
    """A loaded model. `program` is a torch ExportedProgram (kind "torch") or an ONNX
    ModelProto (kind "onnx"); `example_inputs` are tensors for torch models, else None."""

    name: str
    kind: str
    path: pathlib.Path | None
    program: Any
    example_inputs: tuple | None = None
    eager: Any = None  # the torch module, for bundled examples (fp32 reference)
    notes: list = dataclasses.field(default_factory=list)  # for the report's warnings


def bundled_names() -> list[str]:
    from recurrent_lowering.tools import models

    return sorted(models.MODELS)


def resolve_path(arg: str) -> pathlib.Path:
    """Relative paths are relative to the caller's directory, also under `bazel run`."""
    base = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
    return pathlib.Path(base, arg).resolve()


def load(arg: str) -> ModelSource:
    if arg.endswith(".onnx"):
        return _load_onnx(resolve_path(arg))
    if arg.endswith(".pt2"):
        return _load_pt2(resolve_path(arg))
    if arg in bundled_names():
        return _load_bundled(arg)
    raise LoweringError(
        f"{arg}: not a .pt2 or .onnx file, nor a bundled example ({', '.join(bundled_names())})"
    )


def _require_file(path: pathlib.Path) -> None:
    if not path.is_file():
        raise LoweringError(f"{path}: no such file")


def _load_onnx(path: pathlib.Path) -> ModelSource:
    """Accepts what the ONNX checker or onnxruntime accepts. A model the checker refuses
    only for missing type or shape information (onnxruntime runs such models) gets them
    from shape inference."""
    import onnx

    _require_file(path)
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf's errors have many types
        raise LoweringError(f"{path}: not a valid ONNX model ({first_line(e)})") from e
    try:
        onnx.checker.check_model(model)
        return ModelSource(path.stem, "onnx", path, model)
    except Exception as e:  # the checker's errors have several types
        checker = first_line(e)
    try:
        import onnxruntime as ort

        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's errors have many types
        raise LoweringError(
            f"{path}: not a valid ONNX model (onnx checker: {checker}; onnxruntime: "
            f"{first_line(e)})"
        ) from e
    try:
        repaired = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(repaired)
    except Exception as e:
        raise LoweringError(
            f"{path}: onnxruntime runs it, but the ONNX checker refuses it ({checker}) and "
            f"shape inference cannot repair it ({first_line(e)})"
        ) from e
    note = f"the ONNX checker refused the model ({checker}); types and shapes inferred"
    return ModelSource(path.stem, "onnx", path, repaired, notes=[note])


def _load_pt2(path: pathlib.Path) -> ModelSource:
    import torch

    _require_file(path)
    try:
        program = torch.export.load(str(path))
    except Exception as e:
        raise LoweringError(f"{path}: not a valid torch.export .pt2 file ({first_line(e)})") from e
    example = program.example_inputs[0] if program.example_inputs else None
    return ModelSource(path.stem, "torch", path, program, example)


def _load_bundled(name: str) -> ModelSource:
    import torch

    from recurrent_lowering.tools import models

    module, inputs = models.build(name)
    program = torch.export.export(module, inputs)
    return ModelSource(name, "torch", None, program, inputs, eager=module)
