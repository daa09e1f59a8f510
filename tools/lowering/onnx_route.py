"""An .onnx model on its way to a TOSA or Ethos-U target (docs/onnx_to_ethos_u.md).

Static input shapes -> recurrent nodes that torch's nn.GRU/LSTM/RNN express become those
(backends.onnx.torch_recurrent: then decomposed like a torch model's layers, loop form
included), the others `rewrite_model(strategy="unrolled")` -> onnx2torch
(backends.onnx.to_torch) -> a torch module for the Arm flow. The fp32 reference is
onnxruntime on the input model, which shares no code with the route; the converted torch
module is checked against it too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import calibration
from .errors import LoweringError


@dataclasses.dataclass
class Prepared:
    module: Any  # torch.fx.GraphModule of the rewritten model
    as_torch_modules: list  # names of the recurrent nodes that became nn.GRU/LSTM/RNN
    example: tuple  # torch tensors, in graph input order
    reference: list | None  # onnxruntime on the input model, or None if it refused it
    reference_name: str


def _pinned_shapes(specs, arrays, report) -> dict:
    """name -> static shape: from the calibration arrays, else dynamic dimensions set to 1."""
    if arrays is not None:
        return {name: tuple(a.shape) for (name, _, _), a in zip(specs, arrays)}
    dynamic = calibration.dynamic_warning(specs, "set to 1")
    if dynamic:
        report["warnings"].append(dynamic)
    return {name: tuple(1 if d is None else d for d in shape) for name, shape, _ in specs}


def _onnxruntime(model, example) -> tuple[list | None, str]:
    import onnxruntime as ort

    from recurrent_lowering.backends.onnx import to_torch

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    feeds = {name: t.numpy() for (name, _, _), t in zip(to_torch.input_specs(model), example)}
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return session.run(None, feeds), "onnxruntime on the input model (fp32)"
    except Exception as e:  # ORT refuses some valid models, e.g. layout=1 recurrent nodes
        return None, f"torch module of the rewritten model (onnxruntime refused the input: {e})"


def prepare(source, options, calibration_arrays, report, progress) -> Prepared:
    """`calibration_arrays`: numpy arrays in graph input order, checked against the model's
    inputs, or None (random inputs)."""
    import torch

    from recurrent_lowering.backends.onnx import rewrite, to_torch, torch_recurrent
    from recurrent_lowering.passes import SpecError
    from recurrent_lowering.tools.lowering import numerics

    specs = to_torch.input_specs(source.program)
    selection = torch_recurrent.Selection()  # what nn.GRU/LSTM/RNN compute stays a node

    try:
        model = to_torch.with_static_inputs(
            source.program, _pinned_shapes(specs, calibration_arrays, report)
        )
        with progress.stage("rewrite recurrent nodes (unrolled)"):
            rewritten = rewrite.rewrite_model(  # NPU weights are compiled in: constants only
                model,
                strategy="unrolled",
                activation_defaults=options.activation_defaults,
                require_constant_weights=True,
                keep=selection,
            )
        with progress.stage("convert to torch (onnx2torch)"):
            module = to_torch.onnx_to_torch(rewritten, selection.kept)
    except to_torch.ToTorchError as e:
        raise LoweringError(f"{source.path}: {e}") from e
    except SpecError as e:  # a size set to 1 may be why (e.g. constant lengths beyond T = 1)
        pinned = calibration_arrays is None and calibration.dynamic_warning(specs, "set to 1")
        if not pinned:
            raise
        raise LoweringError(f"{e} ({pinned})") from e
    names = [read.spec.name for read in selection.kept.values()]
    unrolled = selection.rewritten
    report["recurrent_nodes"] = {"as_torch_modules": names, "unrolled": unrolled}
    report["ops"]["recurrent_layers"] = [*names, *unrolled]
    if unrolled and options.strategy == "scan":
        report["warnings"].append(
            f"--emission loop: {', '.join(unrolled)} rewritten unrolled (no torch module "
            "computes them exactly; see recurrent_nodes.unrolled)"
        )
    report["numerics"]["inputs"] = "random" if calibration_arrays is None else "--calibration"
    if calibration_arrays is None:
        example = to_torch.example_inputs(model)
        if report["target"] != "TOSA-1.0+FP":  # every other NPU target is quantized
            report["warnings"].append("no --calibration: quantization calibrated on random inputs")
    else:
        example = tuple(
            torch.from_numpy(np.asarray(a, dtype=dtype))
            for a, (_, _, dtype) in zip(calibration_arrays, specs)
        )
    with progress.stage("fp32 reference (onnxruntime)"):
        reference, reference_name = _onnxruntime(model, example)
    if reference is not None:
        with torch.no_grad():
            converted = numerics.compare(reference, module(*example))
        report["numerics"]["conversion_max_abs_err"] = converted["max_abs_err"]
    else:
        report["warnings"].append(f"numerics reference: {reference_name}")
    return Prepared(module, names, example, reference, reference_name)


def compare_with_reference(prepared: Prepared, tosa_outputs: list) -> dict:
    """TOSA reference model outputs vs the fp32 reference, in graph output order."""
    from recurrent_lowering.tools.lowering import numerics

    shaped = [np.reshape(t, np.shape(r)) for t, r in zip(tosa_outputs, prepared.reference)]
    return {"reference_outputs": prepared.reference, "tosa_outputs": shaped} | numerics.compare(
        prepared.reference, shaped
    )
