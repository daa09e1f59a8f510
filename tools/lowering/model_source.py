"""Reads what the user names on the command line: a .pt2, an .onnx file or a bundled example."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from .errors import LoweringError


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


def bundled_names() -> list[str]:
    from recurrent_lowering.examples import models

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
    import onnx

    _require_file(path)
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as e:  # protobuf and checker errors have many types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LoweringError(f"{path}: not a valid ONNX model ({reason})") from e
    return ModelSource(path.stem, "onnx", path, model)


def _load_pt2(path: pathlib.Path) -> ModelSource:
    import torch

    _require_file(path)
    try:
        program = torch.export.load(str(path))
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LoweringError(f"{path}: not a valid torch.export .pt2 file ({reason})") from e
    example = program.example_inputs[0] if program.example_inputs else None
    return ModelSource(path.stem, "torch", path, program, example)


def _load_bundled(name: str) -> ModelSource:
    import torch

    from recurrent_lowering.examples import models

    module, inputs = models.build(name)
    program = torch.export.export(module, inputs)
    return ModelSource(name, "torch", None, program, inputs, eager=module)
