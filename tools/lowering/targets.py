"""What each --target does. Handlers take a loaded model and write through a Staging."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

from recurrent_lowering.backends.executorch_arm.targets import ETHOS_U_TARGETS, TOSA_TARGETS

from .errors import LoweringError
from .model_source import ModelSource
from .progress import Progress
from .staging import Staging

TARGETS = ("aten", "onnx", *TOSA_TARGETS, *ETHOS_U_TARGETS)


@dataclasses.dataclass
class Options:
    emission: str = "auto"  # auto | unrolled | scan (--emission loop)
    quantization: str = "auto"  # auto | int8 | int16 (activations) | int16_w16 | int16_state
    cycle_budget: float | None = None  # percent over int8 that auto may spend (None: 3)
    min_sqnr: float | None = None  # dB auto holds its choice to (None: 30)
    calibration: list | None = None  # .npz paths of samples to quantize on
    evaluation: list | None = None  # .npz paths of samples to measure on (held out)
    stream: bool = True  # a model whose states come back as outputs runs as a stream
    keep_recurrent_on_cpu: bool = False
    activation_defaults: str = "onnxruntime"  # onnxruntime | onnx (the spec's; ONNX inputs)
    tune_for: str = "portable"  # portable | onnxruntime (--target onnx)
    tosa_output: pathlib.Path | None = None  # extra copy of the .tosa given to Vela
    vela_summary: pathlib.Path | None = None  # extra copy of Vela's summary CSV
    recurrent_weight_bits: int = 8  # < 8: weights every step reads narrowed (Ethos-U, TOSA INT)
    system_config: str | None = None  # Vela's; None: ExecuTorch's default for the target
    memory_mode: str | None = None


def extension(target: str) -> str:
    return {"aten": ".pt2", "onnx": ".onnx"}.get(target, ".pte")


def default_output_name(model_name: str, target: str) -> str:
    """kws.onnx -> kws.rewritten.onnx, kws.pt2 -> kws.decomposed.pt2, else kws.pte: the
    default never names the input file itself."""
    infix = {"aten": ".decomposed", "onnx": ".rewritten"}.get(target, "")
    return model_name + infix + extension(target)


Handler = Callable[[ModelSource, Options, Staging, pathlib.Path, dict, Progress], None]


# Why --target aten writes no loop node (the core plan unrolls, or refuses --emission loop).
_NO_LOOP = (
    "--target aten: a .pt2 of elementary ATen ops, where a loop node, which exists only "
    "while lowering for TOSA/Ethos-U, cannot be; use --emission unrolled or auto"
)


def _lower_aten(source, options, staging, output, report, progress) -> None:
    import copy

    import torch

    from recurrent_lowering.backends.executorch_arm.emission import decompose
    from recurrent_lowering.backends.executorch_arm.plan import core_plan
    from recurrent_lowering.backends.executorch_arm.recurrent_ops import cell_chains
    from recurrent_lowering.tools.lowering import calibration, numerics

    if source.kind != "torch":
        raise LoweringError(f"{source.path}: --target aten takes a .pt2 or a bundled example")
    specs = calibration.torch_input_specs(source)
    # every sample at its own shapes: the decomposed program keeps the .pt2's dynamic ones,
    # and a shape outside them the input model refuses first (calibration.accepted)
    samples = calibration.load_samples(options.evaluation or options.calibration, specs, None)
    if samples is not None:  # the user's data for the numerics check
        inputs = [
            tuple(torch.from_numpy(a).to(dtype) for a, (_, _, dtype) in zip(arrays, specs))
            for arrays in samples
        ]
    else:
        inputs = [source.example_inputs] if source.example_inputs is not None else []
    report["numerics"]["inputs"] = "--calibration" if samples is not None else "example inputs"
    if inputs:
        shapes = {name: list(t.shape) for (name, _, _), t in zip(specs, inputs[0])}
        report["numerics"]["input_shapes"] = shapes
        report["numerics"]["samples"] = {"calibration": 0, "evaluation": len(inputs)}
        # The reference first (decomposition may reuse the graph), on a copy (a state
        # buffer written in place must stay as loaded), each sample once, in order.
        with torch.no_grad():
            eager = copy.deepcopy(source.program).module()
            if samples is not None:  # the user's data: a sample the model fails on is named
                expected = calibration.accepted(
                    lambda x: eager(*x), inputs, calibration.TORCH_EAGER
                )
            else:
                expected = [eager(*x) for x in inputs]
    report["ops"]["recurrent_layers"] = cell_chains.layers(source.program.graph)
    if not report["ops"]["recurrent_layers"]:
        report["warnings"].append("no recurrent layer in the model: written unchanged")
    with progress.stage("decompose recurrent layers"):
        lowered = decompose.decompose_recurrent(
            source.program, core_plan(options.emission, no_loop=_NO_LOOP)
        )
    with progress.stage("save .pt2"):
        torch.export.save(lowered, str(staging.path_for(output)))
    if inputs:
        with progress.stage("numerics vs input model"), torch.no_grad():
            program = copy.deepcopy(lowered).module()  # its state as loaded, like the reference
            actual = [program(*x) for x in inputs]
            report["numerics"].update(
                numerics.compare(expected, actual), reference="input model (torch eager, fp32)"
            )
    report["ops"]["cpu"] = numerics.count_call_functions(lowered.graph_module.graph)
    report["ops"]["delegated"] = 0


# Why --emission unrolled takes samples of one shape only.
_ONE_LENGTH = (
    "--emission unrolled writes one sequence length, the first sample's; pass samples of "
    "one shape, or --emission loop or auto for a model that takes several"
)


def _lower_onnx(source, options, staging, output, report, progress) -> None:
    import onnx

    from recurrent_lowering.backends.onnx import input_sizes, rewrite
    from recurrent_lowering.tools.lowering import calibration, numerics, onnx_inputs

    if source.kind != "onnx":
        raise LoweringError(f"{source.name}: --target onnx takes an .onnx file")
    specs = input_sizes.input_specs(source.program)
    emission = options.emission
    samples = calibration.load_samples(  # the loop form takes each sample at its own shapes
        options.evaluation or options.calibration,
        specs,
        static=_ONE_LENGTH if emission == "unrolled" else None,
    )
    feeds = [
        {name: a.astype(dtype) for a, (name, _, dtype) in zip(arrays, specs)}
        for arrays in samples or []
    ]
    model = source.program
    if feeds and emission == "unrolled":  # unrolling needs static lengths
        from recurrent_lowering.backends.onnx.specialize import specialize
        from recurrent_lowering.tools.lowering.onnx_route import scalar_integers

        constants = scalar_integers(feeds, report, "the rewritten model")
        shapes = {name: a.shape for name, a in feeds[0].items() if name not in constants}
        with progress.stage("specialise to the --calibration shapes"):
            model = specialize(source.program, shapes, constants)
        fixed = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        report["warnings"].append(
            f"--emission unrolled: the rewritten model takes the --calibration shapes only "
            f"({fixed}), which fix its sequence lengths"
        )
    with progress.stage("rewrite recurrent nodes"):
        rewritten = rewrite.rewrite_model(
            model,
            emission=emission,
            activation_defaults=options.activation_defaults,
            tune_for=options.tune_for,
        )
    replaced = rewrite.count_recurrent_nodes(source.program)
    report["rewrite"] = {"tune_for": options.tune_for, "replaced": replaced}
    if not replaced:
        report["warnings"].append("no GRU/LSTM/RNN node in the model: written unchanged")
    with progress.stage("save .onnx"):
        onnx.save(rewritten, str(staging.path_for(output)))
    report["ops"]["cpu"] = sum(1 for _ in rewritten.graph.node)
    report["ops"]["delegated"] = 0
    if not feeds:
        with progress.stage("choose input sizes"):
            generated = onnx_inputs.generate(source.program, progress)
        report["warnings"] += [generated.warning()] if generated.chosen else []
        if generated.refused:  # the rewrite does not depend on the check: written anyway
            report["warnings"].append(
                f"numerics not checked: onnxruntime refuses the input model on the inputs "
                f"generated for it ({generated.describe()}: {generated.refused}); pass "
                "--calibration with inputs the model takes"
            )
            return
        feeds = [generated.feeds]
    report["numerics"]["inputs"] = "--calibration" if samples else "generated"
    report["numerics"]["samples"] = {"calibration": 0, "evaluation": len(feeds)}  # none quantized
    report["numerics"]["input_shapes"] = {name: list(a.shape) for name, a in feeds[0].items()}
    with progress.stage("numerics vs input model (onnxruntime)"):
        checked = numerics.compare_onnx(source.program, rewritten, feeds, from_user=bool(samples))
    report["numerics"].update(checked)
    if "sqnr_db" not in checked:  # the rewritten model ran; nothing to hold it against
        report["warnings"].append(
            f"numerics not checked: {checked['reference'].removeprefix('none: ')}"
        )


def _lower_npu(source, options, staging, output, report, progress) -> None:
    from recurrent_lowering.tools.lowering import npu

    npu.lower(source, options, staging, output, report, progress)


def handler(target: str) -> Handler:
    if target not in TARGETS:
        raise LoweringError(f"unknown target {target!r}; choose one of: {', '.join(TARGETS)}")
    if target == "aten":
        return _lower_aten
    if target == "onnx":
        return _lower_onnx
    return _lower_npu


def describe() -> dict[str, Any]:
    return {"targets": list(TARGETS)}
