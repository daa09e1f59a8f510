"""An .onnx model on its way to a TOSA or Ethos-U target (docs/onnx_to_ethos_u.md).

Static input shapes -> recurrent nodes become nn.GRU/LSTM/RNN or the layer op carrying the
core's description (backends.onnx_to_torch.recurrent_modules: then decomposed like a torch
model's layers, loop form included), the few no torch op carries (float64, run-time
weights) `rewrite_model(emission="unrolled")` -> onnx2torch
(backends.onnx_to_torch.convert) -> a torch module for the Arm flow. The fp32 reference is
onnxruntime on the input model, which shares no code with the route; the converted torch
module is checked against it too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import onnx_inputs
from .calibration import accepted
from .errors import LoweringError, first_line


@dataclasses.dataclass
class Prepared:
    module: Any  # torch.fx.GraphModule of the rewritten model
    carried: list  # names of the recurrent nodes that reach the Arm flow as recurrent layers
    calibration: list  # samples: tuples of torch tensors, in the program's input order
    evaluation: list  # samples the numerics check measures on, likewise
    reference: Any  # inputs (program order) -> onnxruntime's outputs on the input model
    reference_name: str
    output_names: list


def _onnxruntime(model, program_inputs: list) -> tuple[Any, str]:
    """(a function of the program's inputs giving onnxruntime's outputs on the input model,
    or None if it refuses the model; what the reference is)."""
    from recurrent_lowering.runtime.onnxruntime_session import session

    try:
        ort = session(model)
    except Exception as e:  # noqa: BLE001 - ORT refuses some valid models (layout=1 nodes)
        reason = first_line(e)
        return (
            None,
            f"torch module of the rewritten model (onnxruntime refused the input: {reason})",
        )
    names = [i.name for i in ort.get_inputs()]
    fixed: dict = {}

    def run(inputs: list) -> list:
        feeds = dict(zip(program_inputs, (np.asarray(a) for a in inputs)))
        return ort.run(None, {n: feeds.get(n, fixed.get(n)) for n in names})

    run.fixed = fixed  # inputs fixed to constants in the program (scalar integers)
    return run, "onnxruntime on the input model"  # its precision: npu's reference_precision


def _samples(source, specs, calibration, evaluation, report, progress):
    """(calibration feeds, evaluation feeds), each a list of name -> array: the
    --calibration and --evaluation samples (calibration.held_out), else inputs generated
    for the model's dynamic dimensions (onnx_inputs), which then fix the NPU program's
    shapes."""
    from . import calibration as samples

    if calibration is not None:
        report["numerics"]["inputs"] = "--calibration"
        as_feeds = [
            {name: np.asarray(a, dtype=dtype) for a, (name, _, dtype) in zip(sample, specs)}
            for sample in calibration + (evaluation or [])
        ]
        calibrate, measure, warning = samples.held_out(
            as_feeds[: len(calibration)], as_feeds[len(calibration) :] if evaluation else None
        )
        if warning:
            report["warnings"].append(warning)
        return calibrate, measure
    with progress.stage("choose input sizes"):
        generated = onnx_inputs.generate(source.program, progress)
    if generated.refused:  # an NPU program is built for these sizes: they must be right
        raise LoweringError(
            f"{source.path}: onnxruntime refuses the model on the inputs generated for it "
            f"({generated.describe()}: {generated.refused}); pass "
            "--calibration with inputs the model takes"
        )
    report["numerics"]["inputs"] = "generated"
    if generated.chosen:
        report["warnings"].append(generated.warning())
    if report["target"] != "TOSA-1.0+FP":  # every other NPU target is quantized
        report["warnings"].append("no --calibration: quantization calibrated on random inputs")
    return [generated.feeds], [generated.feeds]


def scalar_integers(all_feeds: list, report: dict, program: str = "the NPU program") -> dict:
    """The single-element integer inputs (a sample rate, a mode switch): an NPU program
    is static, so they become constants at their --calibration (or generated) values, the
    same in every sample, and the If nodes and shapes they decide fold away."""
    feeds = all_feeds[0]
    constants = {
        name: a
        for name, a in feeds.items()
        if a.size == 1 and (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_)
    }
    for name, a in constants.items():
        if any(not np.array_equal(f[name], a) for f in all_feeds[1:]):
            raise LoweringError(
                f"input '{name}' takes different values in the samples: {program} fixes its "
                "integer inputs, so every sample must give the same"
            )
    if constants:
        fixed = ", ".join(f"{name} = {a.reshape(-1)[0]}" for name, a in constants.items())
        report["warnings"].append(
            f"integer inputs fixed to their values in the numerics inputs ({fixed}): "
            f"{program} takes the float inputs only"
        )
    return constants


def prepare(source, options, calibration, evaluation, report, progress) -> Prepared:
    """`calibration`, `evaluation`: samples (numpy arrays in graph input order, checked
    against the model's inputs), or None (inputs generated for it)."""
    import torch

    from recurrent_lowering.backends.onnx import reversal, rewrite
    from recurrent_lowering.backends.onnx.input_sizes import input_specs
    from recurrent_lowering.backends.onnx.specialize import specialize
    from recurrent_lowering.backends.onnx_to_torch import convert, recurrent_modules
    from recurrent_lowering.tools.lowering import numerics

    specs = input_specs(source.program)
    selection = recurrent_modules.Selection()  # nodes that travel as torch ops stay nodes

    calibrate, measure = _samples(source, specs, calibration, evaluation, report, progress)
    feeds = calibrate[0]
    report["numerics"]["input_shapes"] = {name: list(a.shape) for name, a in feeds.items()}
    constants = scalar_integers(calibrate + measure, report)
    try:
        with progress.stage("specialise to the input shapes"):
            model = specialize(
                source.program,
                {name: a.shape for name, a in feeds.items() if name not in constants},
                constants,
            )
        with progress.stage("read recurrent nodes"):
            folded, reversed_nodes = reversal.fold_reversals(model)  # no REVERSE on U55
            rewritten = rewrite.rewrite_model(  # NPU weights are compiled in: constants only
                folded,
                emission="unrolled",
                activation_defaults=options.activation_defaults,
                require_constant_weights=True,
                keep=selection,
            )
        with progress.stage("convert to torch (onnx2torch)"):
            module = convert.onnx_to_torch(rewritten, selection.kept)
    except convert.ToTorchError as e:
        raise LoweringError(f"{source.path}: {e}") from e
    names = [read.spec.name for read in selection.kept.values()]
    unrolled = selection.rewritten
    kinds = selection.kinds
    report["recurrent_nodes"] = {
        "as_torch_modules": [n for n in names if kinds[n] == recurrent_modules.TORCH_MODULE],
        "as_layer_ops": [n for n in names if kinds[n] == recurrent_modules.LAYER_OP],
        "unrolled": unrolled,
        "reversals_folded": reversed_nodes,
    }
    report["ops"]["recurrent_layers"] = [*names, *unrolled]
    if unrolled and options.emission == "loop":
        report["warnings"].append(
            f"--emission loop: {', '.join(unrolled)} rewritten unrolled (see "
            "recurrent_nodes.unrolled)"
        )
    program_inputs = [name for name, _, _ in input_specs(model)]  # initializers excluded

    def tensors(sample: dict) -> tuple:
        return tuple(torch.from_numpy(sample[name]) for name in program_inputs)

    reference, reference_name = _onnxruntime(source.program, program_inputs)
    if reference is not None:
        reference.fixed.update(constants)
        with progress.stage("fp32 reference (onnxruntime)"), torch.no_grad():
            example = tensors(feeds)  # calibrate[0]
            if calibration is not None:  # what onnxruntime refuses, the user's data, is named
                samples = [list(tensors(f)) for f in calibrate + measure]
                expected = accepted(reference, samples, "onnxruntime refuses the input model")[0]
            else:
                expected = reference(list(example))
            converted = numerics.compare(expected, module(*example))
        report["numerics"]["conversion_max_abs_err"] = converted["max_abs_err"]
    else:
        report["warnings"].append(f"numerics reference: {reference_name}")
    return Prepared(
        module,
        names,
        [tensors(f) for f in calibrate],
        [tensors(f) for f in measure],
        reference,
        reference_name,
        [value.name for value in source.program.graph.output],
    )
