"""TOSA and Ethos-U targets: ExecuTorch's Arm flow, Vela's estimate, TOSA reference numerics."""

from __future__ import annotations

import collections
import shutil
import tempfile
from typing import Any

import numpy as np

from . import calibration, console
from .errors import LoweringError
from .numerics import sqnr_per_output
from .plot import plot_error_per_timestep


def _module(source):
    """The torch module to lower: the bundled example itself, or a loaded .pt2 unlifted by
    the adapter (a module the Arm flow can `.eval()` and re-export)."""
    from recurrent_lowering.backends.executorch_arm.decompose import as_module

    return source.eager if source.eager is not None else as_module(source.program)


def _inputs(source, options, report) -> tuple[tuple, list[tuple]]:
    """(example inputs, calibration samples). Calibration comes from --calibration, else
    the model's own example inputs, else random inputs (with a warning in the report)."""
    import torch

    specs = calibration.torch_input_specs(source)
    arrays = calibration.load_checked(options.calibration, specs)
    if arrays is not None:
        report["numerics"]["inputs"] = "--calibration"
        example = tuple(torch.from_numpy(np.asarray(a, dtype=np.float32)) for a in arrays)
        return example, [example]
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
        return example, [example]
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
    return example, [example]


def _refuse_float64(source) -> None:
    """TOSA has no float64: such a model would lower with every op on the CPU, each op's
    CPU reason blaming the op rather than the dtype."""
    import torch

    for node in source.program.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and getattr(value, "dtype", None) == torch.float64:
            raise LoweringError(
                f"{source.path or source.name}: '{node.name}' is float64, which TOSA has no "
                "type for; export the model in float32 (model.float())"
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


def _precision(options, target: str, module, example, report):
    """--quantization auto's precision per region (a precision.Choice), or None where the
    activations are the user's choice or plain int8; the report says which and why."""
    from recurrent_lowering.backends.executorch_arm import precision

    if options.quantization != "auto":
        if options.cycle_budget != 3.0:
            raise LoweringError("--cycle_budget applies to --quantization auto")
        return None
    if target == "TOSA-1.0+FP":
        return None
    reason = precision.fixed_reason(
        target, options.recurrent_weight_bits, options.keep_recurrent_on_cpu
    )
    if reason is None:
        try:
            return precision.choose_for(module, example, target, options.cycle_budget / 100)
        except precision.CostModelError as e:
            reason = str(e)
    report["quantization"]["auto"] = {"choice": "int8", "why": reason}
    return None


def _plan(options, target: str, choice=None):
    """The ArmPlan for the options: checked there, once; a combination the target cannot
    take is the user's error. --quantization int16 needs the TOSA int16 extension and
    4-bit recurrent weights the int4 one, which every Ethos-U compile spec has and
    TOSA-1.0+INT gets added."""
    from recurrent_lowering.backends.executorch_arm.plan import ArmPlan, PlanError, tosa_target

    if target == "TOSA-1.0+FP":
        for flag, value, default in (
            ("--quantization", options.quantization, "auto"),
            ("--recurrent_weight_bits", options.recurrent_weight_bits, 8),
        ):
            if value != default:
                raise LoweringError(f"{flag} {value} applies to INT targets, not TOSA-1.0+FP")
    state_bits = 16 if options.quantization == "int16_state" else 8
    activations = "int16" if options.quantization == "int16" else "int8"
    recurrent = None
    if choice is not None:
        activations = choice.rest
        recurrent = choice.recurrent if choice.recurrent != choice.rest else None
    bits = options.recurrent_weight_bits
    widest = "int16" if "int16" in (activations, recurrent) else "int8"
    try:
        return ArmPlan(
            tosa_target(target, widest, state_bits, bits),
            strategy=options.strategy,
            activations=activations,
            state_bits=state_bits,
            recurrent_weight_bits=bits,
            keep_recurrent_on_cpu=options.keep_recurrent_on_cpu,
            recurrent_activations=recurrent,
        )
    except PlanError as e:
        raise LoweringError(str(e)) from e


def _auto_report(choice, result) -> dict:
    """What auto chose per region, with int8's cycles: the measured cycles scaled by the
    cost model's int8/chosen ratio (the model's own figures are under estimated_cycles)."""
    auto = choice.report()
    if result.vela is not None:
        measured = result.vela.summary.cycles
        ratio = choice.int8_estimate / choice.estimates[choice.name]
        auto.update(cycles=measured, int8_cycles_estimate=round(measured * ratio))
    return auto


def _vela_options(options, target: str) -> dict:
    """system_config / memory_mode for flow.lower, checked against Vela's vela.ini."""
    from recurrent_lowering.runtime import vela

    chosen = {"system_config": options.system_config, "memory_mode": options.memory_mode}
    if not any(chosen.values()):
        return {}
    if not target.startswith("ethos-u"):
        raise LoweringError(f"--system_config and --memory_mode are Vela's: not for {target}")
    for (key, value), known in zip(chosen.items(), vela.config_names()):
        if value is not None and value not in known:
            raise LoweringError(f"--{key} {value}: Vela knows {', '.join(known)}")
    family = target.split("-")[1].upper()  # "ethos-u55-128" -> "U55"
    system = chosen["system_config"]
    if system is not None and f"_{family}_" not in system:
        raise LoweringError(f"--system_config {system} is not a system config for {target}")
    return chosen


def _arm_factories(plan):
    """(quantizer factory, partitioner factory, partitioners and quantizers created) for
    flow.lower: our decomposition per the plan; the hidden state output shares the state
    input's quantization, or with --keep_recurrent_on_cpu recurrent layers stay in float
    and the partitioner leaves them on the CPU."""
    from recurrent_lowering.backends.executorch_arm import arm_hooks

    partitioners, quantizers = [], []

    def partitioner_factory(spec):
        partitioners.append(arm_hooks.create_partitioner(spec, plan))
        return partitioners[-1]

    def quantizer_factory(spec):
        quantizer = arm_hooks.quantizer_factory(plan)(spec)
        quantizers.append(quantizer.base)
        return quantizer

    return quantizer_factory, partitioner_factory, partitioners, quantizers


def _report_cpu_reasons(options, partitioners, result, report: dict[str, Any]) -> None:
    """ops.cpu_reasons from the partitioner's view of the nodes it left on the CPU, and a
    warning naming the recurrent layers among them."""
    from recurrent_lowering.backends.executorch_arm import fallback

    reasons = report["ops"]["cpu_reasons"]
    for partitioner in partitioners:
        for reason, count in (partitioner.cpu_reasons or {}).items():
            reasons[reason] = reasons.get(reason, 0) + count
    unexplained = result.cpu_nodes - sum(reasons.values())
    if unexplained:
        reasons["left on the CPU after partitioning (unclassified)"] = unexplained
    layers = collections.Counter()
    for partitioner in partitioners:
        layers.update(getattr(partitioner, "recurrent_on_cpu", None) or {})
    if layers:
        named = ", ".join(f"{layer} ({count} ops)" for layer, count in sorted(layers.items()))
        report["warnings"].append(
            f"recurrent layers not wholly on the NPU: {named}; their steps cross the delegate "
            "boundary (see the CPU reasons)"
        )
    if options.keep_recurrent_on_cpu and not reasons.get(fallback.KEPT_ON_CPU):
        report["warnings"].append(
            "--keep_recurrent_on_cpu: no node of an nn.GRU/LSTM/RNN module found in the program "
            "(recurrent layers are recognised by their torch module)"
        )


def lower(source, options, staging, output, report, progress) -> None:
    with console.stdout_to_stderr():
        _lower(source, options, staging, output, report, progress)


def _lower(source, options, staging, output, report, progress) -> None:
    from recurrent_lowering.backends.executorch_arm import flow, precision

    onnx = None
    if source.kind == "onnx":
        from recurrent_lowering.backends.onnx.input_sizes import input_specs

        from . import onnx_route

        arrays = calibration.load_checked(options.calibration, input_specs(source.program))
        onnx = onnx_route.prepare(source, options, arrays, report, progress)
        if options.recurrent_weight_bits != 8 and not onnx.carried:
            raise LoweringError(  # rewritten nodes reach the Arm flow as plain MatMuls
                "--recurrent_weight_bits: every recurrent node of this model is rewritten "
                "into plain ops (report: recurrent_nodes.unrolled), whose recurrent weights "
                "are not told apart"
            )
        module, example = onnx.module, onnx.example
        samples = [example]
    elif source.kind == "torch":
        from recurrent_lowering.backends.executorch_arm import decompose

        report["ops"]["recurrent_layers"] = decompose.recurrent_layers(source.program.graph)
        _refuse_float64(source)
        module = _module(source)
        example, samples = _inputs(source, options, report)
        names = [spec[0] for spec in calibration.torch_input_specs(source)]
        report["numerics"]["input_shapes"] = {n: list(t.shape) for n, t in zip(names, example)}
    else:
        raise LoweringError(f"{source.path}: {report['target']} cannot take a {source.kind} model")
    work = tempfile.mkdtemp(prefix="lower-")
    try:
        choice = _precision(options, report["target"], module, example, report)
        vela_options = _vela_options(options, report["target"])

        def attempt(choice):
            plan = _plan(options, report["target"], choice)
            quantizer_factory, partitioner_factory, partitioners, quantizers = _arm_factories(plan)
            result = flow.lower(
                module,
                example,
                plan.target,
                artifact_dir=work,
                calibration_inputs=samples,
                quantizer_factory=quantizer_factory,
                partitioner_factory=partitioner_factory,
                plan=plan,
                progress=progress,
                **vela_options,
            )
            return result, partitioners, quantizers

        try:
            try:
                result, partitioners, quantizers = attempt(choice)
            except Exception as e:  # auto's int16 choice that does not lower: int8 does
                if choice is None or choice.name == "int8":
                    raise
                choice = precision.did_not_lower(choice, e)
                report["warnings"].append(f"--quantization auto: {choice.fallback}; int8")
                result, partitioners, quantizers = attempt(choice)
            measured = result.vela.summary.cycles if result.vela is not None else None
            over = precision.over_budget(choice, measured) if choice is not None else None
            if over is not None:
                choice = over
                report["warnings"].append(
                    f"--quantization auto: {choice.fallback}; lowered again in int8"
                )
                result, partitioners, quantizers = attempt(choice)
        except flow.FlowError as e:
            raise LoweringError(str(e)) from e
        except Exception as e:  # Vela refusing a configuration: its own message says why
            if not type(e).__module__.startswith("ethosu."):
                raise
            raise LoweringError(
                f"Vela ({options.system_config or 'default system config'}, "
                f"{options.memory_mode or 'default memory mode'}): {e}"
            ) from e
        staging.path_for(output).write_bytes(result.pte)
        bits = options.recurrent_weight_bits
        if bits != 8 and not sum(q.narrowed for q in quantizers):
            report["warnings"].append(
                f"--recurrent_weight_bits {bits}: the model has no recurrent weights to narrow"
            )
        if result.quantized:
            report["quantization"].update(
                activations=options.quantization,
                recurrent_weight_bits=options.recurrent_weight_bits,
            )
            if choice is not None:
                report["quantization"]["auto"] = _auto_report(choice, result)
        report["ops"].update(delegated=result.edge_nodes, cpu=result.cpu_nodes)
        if not result.edge_nodes:
            report["warnings"].append(f"nothing was delegated to {report['target']}")
        report["ops"]["tosa"] = result.tosa_ops
        _report_cpu_reasons(options, partitioners, result, report)
        if options.tosa_output is not None and result.tosa_files:
            shutil.copyfile(result.tosa_files[0], staging.path_for(options.tosa_output))
        if result.vela is not None:
            _vela_figures(result, report)
            if options.vela_summary is not None:
                csvs = sorted(result.vela.output_dir.rglob("*summary*.csv"))
                shutil.copyfile(csvs[0], staging.path_for(options.vela_summary))
        with progress.stage("numerics on the TOSA reference model"):
            try:
                numerics = flow.check_numerics(result, module, example)
            except flow.FlowError as e:
                report["warnings"].append(f"numerics not checked: {e}")
                return
        reference, tosa = numerics.reference, numerics.tosa
        where = "TOSA reference model"
        if result.program_module is not None:  # CPU ops around or between the delegates
            where = "delegates on the TOSA reference model, CPU ops in torch eager,"
        report["numerics"].update(
            reference=f"{where} vs fp32 torch eager",
            max_abs_err=numerics.max_abs_err,
            sqnr_db=numerics.sqnr_db,
        )
        if onnx is not None and onnx.reference is not None:
            vs_ort = onnx_route.compare_with_reference(onnx, numerics.tosa)
            reference, tosa = vs_ort.pop("reference_outputs"), vs_ort.pop("tosa_outputs")
            report["numerics"].update(
                reference=f"TOSA reference model vs {onnx.reference_name}",
                vs_torch_module={"max_abs_err": numerics.max_abs_err, "sqnr_db": numerics.sqnr_db},
                **vs_ort,
            )
        if len(reference) > 1:
            report["numerics"]["sqnr_db_per_output"] = sqnr_per_output(reference, tosa)
        png = plot_error_per_timestep(reference, tosa, report["model"])
        if png is not None:
            plot_path = output.with_suffix(".error.png")
            staging.path_for(plot_path).write_bytes(png)
            report["numerics"]["plot"] = str(plot_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
