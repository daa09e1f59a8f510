"""TOSA and Ethos-U targets: ExecuTorch's Arm flow, Vela's estimate, TOSA reference numerics."""

from __future__ import annotations

import copy
import gc
import re
import shutil
import tempfile
from typing import Any

import numpy as np

from recurrent_lowering.runtime import streams
from recurrent_lowering.runtime.metrics import (
    equal_per_output,
    judged_sqnr_per_output,
    sqnr_per_output,
)

from . import calibration, console
from .errors import LoweringError
from .numerics import compare
from .plot import plot_error_per_timestep


def _module(source):
    """The torch module to lower: the bundled example itself, or a loaded .pt2 unlifted by
    the adapter (a module the Arm flow can `.eval()` and re-export)."""
    from recurrent_lowering.backends.executorch_arm.exported import as_module

    return source.eager if source.eager is not None else as_module(source.program)


def _inputs(source, options, report) -> tuple[list, list]:
    """(calibration samples, evaluation samples), each a list of tuples of tensors. They
    come from --calibration and --evaluation (calibration.held_out), else the model's own
    example inputs, else random inputs (with a warning in the report)."""
    import torch

    specs = calibration.torch_input_specs(source)
    calibrate = calibration.load_samples(options.calibration, specs)
    measure = calibration.load_samples(options.evaluation, specs)
    if calibrate is not None:
        report["numerics"]["inputs"] = "--calibration"

        def tensors(sample):
            return tuple(
                torch.from_numpy(np.asarray(a)).to(dtype) for a, (_, _, dtype) in zip(sample, specs)
            )

        calibrate, measure, warning = calibration.held_out(
            [tensors(x) for x in calibrate],
            None if measure is None else [tensors(x) for x in measure],
        )
        if warning:
            report["warnings"].append(warning)
        return calibrate, measure
    if measure is not None:
        raise LoweringError("--evaluation needs --calibration: samples to quantize on")
    quantized = report["target"] != "TOSA-1.0+FP"
    if source.example_inputs is not None:
        report["numerics"]["inputs"] = "example inputs"
        example = tuple(source.example_inputs)
        sizes = ", ".join(str(list(t.shape)) for t in example)
        dynamic = calibration.dynamic_warning(specs, f"taken from the example inputs ({sizes})")
        if dynamic:
            report["warnings"].append(dynamic)
        if source.path is not None and quantized:  # a user model: its examples are all we have
            report["warnings"].append("quantization calibrated on the model's example inputs")
        return [example], [example]
    placeholders = [
        n.meta["val"]
        for n in source.program.graph.nodes
        if n.op == "placeholder" and n.name in source.program.graph_signature.user_inputs
    ]
    generator = torch.Generator().manual_seed(0)
    example = tuple(torch.randn(v.shape, generator=generator) for v in placeholders)
    report["numerics"]["inputs"] = "random"
    if quantized:
        report["warnings"].append("no --calibration: quantization calibrated on random inputs")
    return [example], [example]


def _refuse_float64(source) -> None:
    """TOSA has no float64: such a model would lower with every op on the CPU, each op's
    CPU reason blaming the op rather than the dtype (an .onnx one ended in onnxruntime's
    RuntimeException, which has no double GRU kernel)."""
    if source.kind not in ("onnx", "torch"):
        return
    if source.kind == "onnx":
        from onnx import TensorProto

        doubles = [
            i.name
            for i in source.program.graph.input
            if i.type.tensor_type.elem_type == TensorProto.DOUBLE
        ]
        fix = "convert the model to float32"
    else:
        import torch

        doubles = [
            node.name
            for node in source.program.graph.nodes
            if node.op == "placeholder"
            and getattr(node.meta.get("val"), "dtype", None) == torch.float64
        ]
        fix = "export the model in float32 (model.float())"
    if doubles:
        raise LoweringError(
            f"{source.path or source.name}: '{doubles[0]}' is float64, which TOSA has no "
            f"type for; {fix}"
        )


def _hardware_numerics(result, report: dict[str, Any]) -> None:
    """Ethos-U55/U65 programs with int16 operations: what the TOSA reference model's figure
    rests on for them (runtime/ethos_u55_int16.py, docs/precision.md "What the Ethos-U55
    int16 figures rest on"), and a warning where it is not established."""
    if not report["target"].startswith(("ethos-u55", "ethos-u65")):
        return
    from recurrent_lowering.runtime import ethos_u55_int16

    npz_files = sorted(result.vela.output_dir.rglob("*_vela.npz"))
    hardware = ethos_u55_int16.rests_on(npz_files, result.tosa_files)
    if hardware is None:
        return
    report["numerics"]["hardware"] = hardware
    unknown = hardware["operations"][ethos_u55_int16.NOT_MODELLED]
    if unknown:
        report["warnings"].append(
            f"{unknown} NPU operations of forms whose Ethos-U numerics are not modelled "
            "(runtime/ethos_u55_int16.py): the SQNR is the TOSA reference model's, not shown "
            "to be the NPU's"
        )
    if not hardware["accumulator_fits"]:
        report["warnings"].append(
            f"an int16 convolution needs {hardware['accumulator_bits']} accumulator bits for "
            f"its worst-case input; the NPU has {ethos_u55_int16.ACCUMULATOR_BITS}: the "
            "SQNR assumes inputs that do not reach it"
        )


def _vela_figures(result, report: dict[str, Any]) -> None:
    summary = result.vela.summary
    report["vela"].update(
        cycles=int(summary.cycles),
        inference_time_s=float(summary.inference_time_s),
        sram_bytes=int(summary.sram_used_bytes),
        flash_bytes=int(summary.off_chip_flash_used_bytes + summary.on_chip_flash_used_bytes),
        dram_bytes=int(summary.dram_used_bytes),
        system_config=result.system_config,
        memory_mode=result.memory_mode,
        mac_utilisation=summary.mac_utilisation,
        delegates=result.vela_delegates,
    )
    if result.vela_delegates > 1:
        report["warnings"].append(
            f"{result.vela_delegates} NPU delegates with CPU ops between them: Vela's figures "
            "are summed over the delegates and leave the CPU ops out; --tosa_output and "
            "--vela_summary hold the first delegate's"
        )


def arm_options(options, target: str):
    """The flags as the Arm adapter's Options (checked there: options.check)."""
    from recurrent_lowering.backends.executorch_arm.options import Options

    return Options(
        target,
        quantization=options.quantization,
        cycle_budget=None if options.cycle_budget is None else options.cycle_budget / 100,
        min_sqnr=options.min_sqnr,
        emission=options.emission,
        recurrent_weight_bits=options.recurrent_weight_bits,
        keep_recurrent_on_cpu=options.keep_recurrent_on_cpu,
        system_config=options.system_config,
        memory_mode=options.memory_mode,
    )


_FLAGS = (  # Options fields that are //tools:lower flags of the same name
    "quantization",
    "cycle_budget",
    "min_sqnr",
    "emission",
    "recurrent_weight_bits",
    "keep_recurrent_on_cpu",
    "system_config",
    "memory_mode",
)


def _as_flags(message: str) -> str:
    """An OptionError's message with the options it names written as the flags."""
    return re.sub(rf"\b({'|'.join(_FLAGS)})\b", r"--\1", message)


def _auto_report(result) -> dict:
    """What auto chose per region, with int8's cycles: the measured cycles scaled by the
    cost model's int8/chosen ratio (the model's own figures are under estimated_cycles)."""
    choice = result.precision
    auto = choice.report()
    if result.vela is not None and choice.why is None:
        measured = result.vela.summary.cycles
        ratio = choice.int8_estimate / choice.estimates[choice.name]
        auto.update(cycles=measured, int8_cycles_estimate=round(measured * ratio))
    return auto


def _report_cpu_reasons(options, result, report: dict[str, Any]) -> None:
    """ops.cpu_reasons from the partitioner's view of the nodes it left on the CPU, and a
    warning naming the recurrent layers among them."""
    from recurrent_lowering.backends.executorch_arm.partition import cpu_reasons

    report["ops"]["cpu_reasons"].update(result.cpu_reasons)
    layers = result.recurrent_on_cpu
    if layers:
        named = ", ".join(f"{layer} ({count} ops)" for layer, count in sorted(layers.items()))
        report["warnings"].append(
            f"recurrent layers not wholly on the NPU: {named}; their steps cross the delegate "
            "boundary (see the CPU reasons)"
        )
    if options.keep_recurrent_on_cpu and not result.cpu_reasons.get(cpu_reasons.KEPT_ON_CPU):
        report["warnings"].append(
            "--keep_recurrent_on_cpu: no recurrent layer found in the program"
        )


def lower(source, options, staging, output, report, progress) -> None:
    with console.stdout_to_stderr():
        _lower(source, options, staging, output, report, progress)


def closed_loops(result, module, samples, state, reference=None):
    """(fp32 outputs, TOSA reference model outputs, and `reference`'s when given), each a list
    per output of the samples' values stacked: each run in its own closed loop when the model
    is a stream (streams.py), else sample by sample. The fp32 and TOSA outputs are those
    auto's verification ran on the same samples, when it did (flow.lower)."""
    from recurrent_lowering.backends.executorch_arm.precision import accuracy

    runs = [accuracy.of_module(module), accuracy.of_lowered(result)]
    runs += [reference] if reference is not None else []
    evaluation = accuracy.Evaluation(samples, state)
    done, verified = {}, result.verified  # what auto's verification ran (flow.lower)
    if verified and verified.evaluation.samples is samples and verified.evaluation.state == state:
        done = {0: verified.fp32, 1: verified.tosa}
    return [done.get(k) or accuracy.outputs(run, evaluation) for k, run in enumerate(runs)]


def _lower(source, options, staging, output, report, progress) -> None:
    import torch

    from recurrent_lowering.backends.executorch_arm import flow
    from recurrent_lowering.backends.executorch_arm.options import OptionError, check
    from recurrent_lowering.backends.executorch_arm.precision import accuracy
    from recurrent_lowering.runtime import arm_numerics

    # What the imports made lives as long as the process: the collector's full passes need
    # not walk it each time (about 450,000 objects; madmom's BGRU on ethos-u85-256, gen-2
    # collections 3.4 -> 2.1 s), nor touch its pages in the forked children (forked.py).
    gc.freeze()
    try:
        arm = check(arm_options(options, report["target"]))
    except OptionError as e:
        raise LoweringError(_as_flags(str(e))) from e
    onnx = None
    _refuse_float64(source)
    if source.kind == "onnx":
        from recurrent_lowering.backends.onnx.input_sizes import input_specs

        from . import onnx_route

        specs = input_specs(source.program)
        onnx = onnx_route.prepare(
            source,
            options,
            calibration.load_samples(options.calibration, specs),
            calibration.load_samples(options.evaluation, specs),
            report,
            progress,
        )
        if options.recurrent_weight_bits != 8 and not onnx.carried:
            raise LoweringError(  # rewritten nodes reach the Arm flow as plain MatMuls
                "--recurrent_weight_bits: every recurrent node of this model is rewritten "
                "into plain ops (report: recurrent_nodes.unrolled), whose recurrent weights "
                "are not told apart"
            )
        module, calibrate, measure = onnx.module, onnx.calibration, onnx.evaluation
        output_names = onnx.output_names
    elif source.kind == "torch":
        from recurrent_lowering.backends.executorch_arm.recurrent_ops import cell_chains

        report["ops"]["recurrent_layers"] = cell_chains.layers(source.program.graph)
        module = _module(source)
        calibrate, measure = _inputs(source, options, report)
        if options.calibration:  # on a copy: a state buffer written in place stays as loaded
            eager = copy.deepcopy(module)
            with torch.no_grad():
                calibration.accepted(
                    lambda sample: eager(*sample), calibrate + measure, calibration.TORCH_EAGER
                )
        names = [spec[0] for spec in calibration.torch_input_specs(source)]
        report["numerics"]["input_shapes"] = {n: list(t.shape) for n, t in zip(names, calibrate[0])}
        output_names = _output_names(source)
    else:
        raise LoweringError(f"{source.path}: {report['target']} cannot take a {source.kind} model")
    example = calibrate[0]
    state = []
    if options.stream:
        with torch.no_grad():
            state = streams.pairs([t.numpy() for t in example], accuracy.flat(module(*example)))
    if state:
        input_names = list(report["numerics"]["input_shapes"])
        report["numerics"]["stream"] = [
            [input_names[i], output_names[j] if j < len(output_names) else f"output {j}"]
            for i, j in state
        ]
        if len(calibrate) > 1:  # states from the fp32 stream, not each sample's own
            taken, _ = streams.fed_back(accuracy.of_module(module), calibrate, state)
            calibrate = [tuple(torch.as_tensor(np.asarray(a)) for a in x) for x in taken]
    report["numerics"]["samples"] = {"calibration": len(calibrate), "evaluation": len(measure)}
    work = tempfile.mkdtemp(prefix="lower-")
    try:
        try:
            result = flow.lower(
                module,
                example,
                arm,
                work,
                calibration_inputs=calibrate,
                progress=progress,
                evaluation=accuracy.Evaluation(measure, state),
            )
        except arm_numerics.NumericsError as e:
            raise LoweringError(str(e)) from e
        except Exception as e:  # Vela refusing a configuration: its own message says why
            if not type(e).__module__.startswith("ethosu."):
                raise
            raise LoweringError(
                f"Vela ({options.system_config or 'default system config'}, "
                f"{options.memory_mode or 'default memory mode'}): {e}"
            ) from e
        staging.path_for(output).write_bytes(result.pte)
        _report_lowering(options, result, report, output_names)
        if options.tosa_output is not None and result.tosa_files:
            shutil.copyfile(result.tosa_files[0], staging.path_for(options.tosa_output))
        if result.vela is not None:
            _vela_figures(result, report)
            _hardware_numerics(result, report)
            if options.vela_summary is not None:
                csvs = sorted(result.vela.output_dir.rglob("*summary*.csv"))
                shutil.copyfile(csvs[0], staging.path_for(options.vela_summary))
        with progress.stage("numerics on the TOSA reference model"):
            try:
                runs = closed_loops(
                    result, module, measure, state, onnx.reference if onnx else None
                )
            except arm_numerics.NumericsError as e:
                report["warnings"].append(f"numerics not checked: {e}")
                return
        reference = runs[0]
        tosa = [np.reshape(t, np.shape(r)) for t, r in zip(runs[1], reference)]
        where = "TOSA reference model"
        if result.program_module is not None:  # CPU ops around or between the delegates
            where = "delegates on the TOSA reference model, CPU ops in torch eager,"
        vs_torch = compare(reference, tosa)
        floats = {np.dtype(r.dtype) for r in reference if np.dtype(r.dtype).kind == "f"}
        precision = "fp16" if floats == {np.dtype(np.float16)} else "fp32"  # an argmax aside
        report["numerics"].update(reference=f"{where} vs {precision} torch eager", **vs_torch)
        report["numerics"]["reference_precision"] = precision
        if onnx is not None and onnx.reference is not None:
            reference = [np.reshape(r, np.shape(t)) for r, t in zip(runs[2], tosa)]
            report["numerics"].update(
                reference=f"TOSA reference model vs {onnx.reference_name} ({precision})",
                vs_torch_module=vs_torch,
                **compare(reference, tosa),
            )
        measured = sqnr_per_output(reference, tosa)
        equal = equal_per_output(reference, tosa)
        if len(reference) > 1 or any(e is not None for e in equal):
            report["numerics"]["sqnr_db_per_output"] = measured
            report["numerics"]["outputs"] = output_names[: len(reference)]
        if any(e is not None for e in equal):
            report["numerics"]["equal_per_output"] = equal
        judged = judged_sqnr_per_output(reference, tosa)  # as auto's predictions judge them
        _check_prediction(result.precision, judged, output_names, report)
        png = plot_error_per_timestep(
            [r[0] for r in reference], [t[0] for t in tosa], report["model"]
        )
        if png is not None:
            plot_path = output.with_suffix(".error.png")
            staging.path_for(plot_path).write_bytes(png)
            report["numerics"]["plot"] = str(plot_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# A measurement this far below auto's prediction is reported: the simulation is PT2E's float
# q/dq, not the target's integer arithmetic (int16 tables, rescales), and a stream's closed
# loop amplifies the difference (docs/results/real_model_accuracy.md).
PREDICTION_GAP_DB = 3.0


def _check_prediction(choice, measured: list, output_names: list, report: dict) -> None:
    """A warning when the TOSA reference model measures an output of the chosen program
    under the accuracy target and PREDICTION_GAP_DB or more below what auto's simulation
    predicted for it (a gap above the target changes nothing the user asked for)."""
    predicted = (choice.predicted.get(choice.name) if choice is not None else None) or []
    if choice is None or choice.fallback or len(predicted) != len(measured):
        return
    gaps = [
        (p - m, k)
        for k, (p, m) in enumerate(zip(predicted, measured))
        if p - m >= PREDICTION_GAP_DB and (choice.min_sqnr is None or m < choice.min_sqnr)
    ]
    if not gaps:
        return
    _, k = max(gaps)
    name = output_names[k] if k < len(output_names) else f"output {k}"
    report["warnings"].append(
        f"--quantization auto: '{name}' measures {measured[k]:.1f} dB on the TOSA reference "
        f"model, {predicted[k] - measured[k]:.1f} dB below the {predicted[k]:.1f} dB its "
        "simulation predicted"
    )


def _output_names(source) -> list:
    """A torch model's outputs have no names: their positions."""
    outputs = source.program.graph.output_node().args[0]
    return [f"output {k}" for k in range(len(outputs))]


def _report_lowering(options, result, report, output_names) -> None:
    """What the lowering did: auto's choice, the narrowed weights, op counts, CPU reasons."""
    choice = result.precision
    if choice is not None and choice.fallback:
        again = "; lowered again in int8" if "measured" in choice.fallback else "; int8"
        report["warnings"].append(f"--quantization auto: {choice.fallback}{again}")
    if choice is not None and choice.refit:  # lowered twice, the first kept
        report["warnings"].append(f"--quantization auto: {choice.refit}")
    if choice is not None and choice.widened:
        again = "" if "kept" in choice.widened else f"; lowered again in {choice.name}"
        report["warnings"].append(f"--quantization auto: {choice.widened}{again}")
    if choice is not None and choice.short:
        scores = choice.predicted[choice.name]
        k = scores.index(min(scores))
        name = output_names[k] if k < len(output_names) else f"output {k}"
        report["warnings"].append(
            f"--quantization auto: no candidate reaches {choice.min_sqnr:g} dB on every "
            f"output; {choice.name}, the most accurate, is predicted at {scores[k]:.1f} dB on "
            f"'{name}'"
        )
    bits = options.recurrent_weight_bits
    if bits != 8 and not result.narrowed:
        report["warnings"].append(
            f"--recurrent_weight_bits {bits}: the model has no recurrent weights to narrow"
        )
    if result.quantized:
        report["quantization"].update(
            activations=options.quantization,
            recurrent_weight_bits=options.recurrent_weight_bits,
        )
        if choice is not None:
            report["quantization"]["auto"] = _auto_report(result)
    report["ops"].update(delegated=result.edge_nodes, cpu=result.cpu_nodes)
    if not result.edge_nodes:
        report["warnings"].append(f"nothing was delegated to {report['target']}")
    report["ops"]["tosa"] = result.tosa_ops
    _report_cpu_reasons(options, result, report)
