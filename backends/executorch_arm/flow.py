"""Take a torch module through ExecuTorch 1.5.1's Arm flow and measure what comes out.

torch.export -> (INT targets: PT2E quantization with the Arm quantizer, symmetric per-channel,
calibrated on the given inputs) -> to_edge_transform_and_lower with the TOSA or Ethos-U
partitioner -> .pte bytes. The TOSA flatbuffer of every delegate is dumped to a directory
(compile spec `dump_intermediate_artifacts_to`), so the result can be run on the TOSA reference
model (numerics vs fp32 torch eager) and through Vela (Ethos-U cycle estimates).

`decomposition` picks who decomposes GRU/LSTM/RNN: "ours" (the default: arm_hooks' quantizer
and partitioner, which run recurrent_lowering's passes in ExecuTorch's slots, with the
recurrent product chosen per target by its ArmPlan) or "executorch" (ExecuTorch 1.5.1's
own DecomposeGru/Lstm/RnnPass: the baseline we benchmark against).

torch 2.13: `ExportedProgram.module()` must be called with `check_guards=False`, otherwise a
`_guards_fn` call_module node makes ExecuTorch's recurrent decomposition passes fail.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import pathlib
import tempfile
import time
from typing import Optional, Sequence

import numpy as np
import torch

from recurrent_lowering.runtime import tosa_flatbuffer, tosa_reference, vela
from recurrent_lowering.runtime.metrics import sqnr_db

from . import clamp_table, permute_propagation, precision, provenance
from .edge_io import io_mapping, target_name
from .loop.op import EDGE_NAME as LOOP_EDGE_NAME
from .loop.op import program_of, run_graph


class FlowError(RuntimeError):
    """A lowering result does not support the requested operation; the message says why."""


@dataclasses.dataclass
class LoweringResult:
    """What one lowering produced, with its costs. Times are wall seconds per stage."""

    target: str
    quantized: bool
    pte: bytes
    artifact_dir: pathlib.Path
    tosa_files: list  # list[pathlib.Path], one per delegate
    times: dict  # stage -> seconds: (precision,) quantize, export, lower, to_executorch, vela
    edge_nodes: int  # call_function nodes of the edge graphs handed to the backend(s)
    cpu_nodes: int  # call_function nodes left outside any delegate (q/dq included)
    num_delegates: int
    tosa_ops: int  # operators over all dumped .tosa files, CONST/CONST_SHAPE included
    tosa_compute_ops: int  # the same without CONST/CONST_SHAPE
    tosa_op_counts: collections.Counter
    # Mapping program I/O <-> the single delegate's I/O, when the program is fully delegated:
    input_map: Optional[list] = None  # delegate input k <- program input index
    output_map: Optional[list] = None  # program output i <- delegate output index
    input_quant: Optional[list] = None  # QuantParams | None per delegate input
    output_quant: Optional[list] = None  # QuantParams | None per delegate output
    vela: Optional[vela.VelaResult] = None  # our Vela re-run, with the per-layer table
    vela_delegates: int = 0  # delegates compiled by that run (figures summed: vela.combined)
    executorch_vela: Optional[vela.VelaSummary] = None  # the summary ExecuTorch's own Vela wrote
    system_config: Optional[str] = None
    memory_mode: Optional[str] = None
    # The lowered edge program as a module, kept when the program is not one delegate fed by
    # the program inputs (CPU ops around or between delegates): check_numerics runs it.
    program_module: Optional[torch.nn.Module] = None
    loop_programs: list = dataclasses.field(default_factory=list)  # loop.op.StepProgram each
    precision: Optional[object] = None  # precision.Choice when activations="auto" chose


@dataclasses.dataclass(frozen=True)
class Numerics:
    """TOSA reference model outputs vs fp32 torch eager, over all outputs together."""

    max_abs_err: float
    sqnr_db: float
    reference: list  # torch eager outputs (np.ndarray)
    tosa: list  # TOSA reference model outputs, dequantized (np.ndarray)


class _Silent:
    """The progress `lower` reports to when the caller gives none."""

    @contextlib.contextmanager
    def stage(self, name: str):
        yield

    def steps(self, items, description: str, total=None):
        return items


@contextlib.contextmanager
def _timed(times: dict, key: str, progress, label: str):
    """Times the block into times[key] and reports it to `progress` as stage `label`."""
    t0 = time.perf_counter()
    with progress.stage(label):
        yield
    times[key] = time.perf_counter() - t0


@contextlib.contextmanager
def _vela_quiet():
    """ExecuTorch runs Vela with --verbose-all when its Ethos-U backend logs at INFO (absl's
    default): a million lines and 6 of 43 s on a 45,000-op program, none of which we read."""
    logger = logging.getLogger("executorch.backends.arm.ethosu.backend")
    level = logger.level
    logger.setLevel(max(logging.WARNING, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        logger.setLevel(level)


def _module_of(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    try:
        return ep.module(check_guards=False)
    except TypeError:  # torch without the check_guards argument
        return ep.module()


def _eval(module: torch.nn.Module) -> torch.nn.Module:
    """Eval mode; an exported program's module (from a .pt2) refuses .eval() and needs none."""
    try:
        return module.eval()
    except NotImplementedError:
        return module


def compile_spec(target: str, artifact_dir: pathlib.Path, system_config, memory_mode):
    if target.startswith("TOSA"):
        from executorch.backends.arm.tosa import TosaSpecification
        from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

        spec = TosaCompileSpec(TosaSpecification.create_from_string(target))
    elif target.startswith("ethos-u"):
        from executorch.backends.arm.ethosu import EthosUCompileSpec

        # --verbose-performance: ExecuTorch's own Vela run writes the per-layer table too,
        # which is then our estimate (own_vela) instead of a second Vela run.
        spec = EthosUCompileSpec(
            target,
            system_config=system_config,
            memory_mode=memory_mode,
            extra_flags=["--verbose-performance"],
        )
    else:
        raise ValueError(f"unknown target {target!r}; expected TOSA-1.0+FP/INT or ethos-uXX-NNN")
    spec.dump_intermediate_artifacts_to(str(artifact_dir))
    return spec


def quantize(
    module,
    example_inputs,
    compile_spec,
    calibration_inputs=None,
    quantizer_factory=None,
    activations: str = "int8",
    progress=None,
):
    """PT2E quantization with the Arm quantizer for `compile_spec` (int8 per-channel weights;
    int8 activations, or int16 with `activations="int16"`, ExecuTorch's a16w8 config).

    `quantizer_factory(compile_spec)` replaces ExecuTorch's `create_quantizer` (e.g. with
    backends.executorch_arm.arm_hooks.create_quantizer, which decomposes with our passes).
    """
    from executorch.backends.arm.util._factory import create_quantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from .plan import quantization_config

    config = quantization_config(activations)
    graph_module = _module_of(torch.export.export(module, example_inputs))
    quantizer = (quantizer_factory or create_quantizer)(compile_spec)
    quantizer.set_global(config)
    prepared = prepare_pt2e(graph_module, quantizer)
    samples = calibration_inputs or [example_inputs]
    for sample in (progress or _Silent()).steps(samples, "calibration samples"):
        run_graph(prepared, *sample)  # loop nodes record their steps' inputs
    return convert_pt2e(prepared)


def _count_call_functions(graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function")


DECOMPOSITIONS = ("ours", "executorch")


def factories(decomposition: str, plan, quantizer_factory=None, partitioner_factory=None):
    """(quantizer factory, partitioner factory) for `decomposition` and an ArmPlan,
    explicit ones kept."""
    if decomposition == "executorch":
        from executorch.backends.arm.util._factory import create_partitioner, create_quantizer

        if plan.recurrent_weight_bits != 8:
            raise ValueError("recurrent_weight_bits applies to decomposition='ours'")
        return quantizer_factory or create_quantizer, partitioner_factory or create_partitioner
    if decomposition != "ours":
        raise ValueError(
            f"unknown decomposition {decomposition!r}; expected one of {DECOMPOSITIONS}"
        )
    from . import arm_hooks

    return (
        quantizer_factory or (lambda spec: arm_hooks.create_quantizer(spec, plan)),
        partitioner_factory or (lambda spec: arm_hooks.create_partitioner(spec, plan)),
    )


@torch.no_grad()  # a state buffer written in place would otherwise fail in to_executorch
def lower(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    target: str,
    artifact_dir: "str | pathlib.Path | None" = None,
    calibration_inputs: Optional[Sequence[Sequence[torch.Tensor]]] = None,
    quantize_model: Optional[bool] = None,
    system_config: Optional[str] = None,
    memory_mode: Optional[str] = None,
    run_vela: bool = True,
    quantizer_factory=None,
    partitioner_factory=None,
    decomposition: str = "ours",
    activations: str = "auto",
    strategy: str = "auto",
    state_bits: int = 8,
    recurrent_weight_bits: int = 8,
    progress=None,
    plan=None,
    cycle_budget: Optional[float] = None,
) -> LoweringResult:
    """Lower `module` for `target` ("TOSA-1.0+FP", "TOSA-1.0+INT" or "ethos-u55-128", ...).

    INT and Ethos-U targets are quantized unless `quantize_model=False`. For Ethos-U targets
    `result.vela` (when `run_vela`) is Vela's per-layer estimate: ExecuTorch's own Vela run's
    for one delegate, else Vela re-run on each dumped TOSA (same accelerator, system config
    and memory mode as the compile spec), combined. `quantizer_factory` and
    `partitioner_factory` (called with the compile spec) replace ExecuTorch's defaults, which is
    where our own decomposition plugs in; `decomposition` ("ours" or "executorch") picks the
    defaults for the factories not given. `activations="int16"` quantizes activations to
    int16 (weights stay int8), "int8" to int8; "auto" (the default) picks int16 for the
    recurrent layers, the rest, both or neither, whichever is most accurate within
    `cycle_budget` (default 0.03) of int8's cycles by precision.py's model of Vela
    (int8 on TOSA targets, with 4-bit weights or an int16 state, and where the quantizer is
    not ours: `decomposition="executorch"` or a `quantizer_factory`); `result.precision`
    says what it chose. `strategy` writes recurrent
    layers "unrolled" (one set of ops per step), as a "loop" (one node per layer direction,
    its step lowered once and copied per step into the TOSA: loop.op, loop.tosa) or "auto"
    (unrolled for short sequences, plan.py). `state_bits=16` keeps the
    loop form's steps (state and gate arithmetic) in int16 while the rest stays int8.
    `recurrent_weight_bits` < 8 quantizes the weights every step reads (R, an LSTM's
    projection) to that many bits, in the CONV form (weight_precision; 4 bits: TOSA INT4,
    which a TOSA target must name, e.g. "TOSA-1.0+INT+int4"). These options make an ArmPlan
    (checked there), or `plan` gives one. `progress` (an object with `stage(label)`, a
    context manager, and `steps(items, description)`) hears of each stage.
    """
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    from .plan import ArmPlan

    provenance.install()
    clamp_table.install()
    permute_propagation.install()
    times: dict = {}
    progress = progress or _Silent()
    choice = None
    if plan is None:
        recurrent_activations = None
        if activations == "auto":
            activations = "int8"
            ours = decomposition == "ours" and quantizer_factory is None  # else theirs decides
            quantizing = quantize_model is not False and ours
            if (
                quantizing
                and state_bits == 8
                and precision.fixed_reason(target, recurrent_weight_bits, False) is None
            ):
                with _timed(times, "precision", progress, "choose the precision per region"):
                    choice = precision.choose_for(
                        _eval(module), example_inputs, target, cycle_budget
                    )
                activations, recurrent_activations = choice.rest, choice.recurrent
        plan = ArmPlan(
            target,
            strategy,
            activations,
            state_bits,
            recurrent_weight_bits,
            recurrent_activations=recurrent_activations,
        )
    if choice is not None and choice.name != "int8":
        return _lower_choice(choice, times, locals())
    quantizer_factory, partitioner_factory = factories(
        decomposition, plan, quantizer_factory, partitioner_factory
    )

    example_inputs = tuple(example_inputs)
    is_ethos = target.startswith("ethos-u")
    quantized = ("+INT" in target or is_ethos) if quantize_model is None else quantize_model
    out_dir = pathlib.Path(artifact_dir or tempfile.mkdtemp(prefix="et_arm_"))
    if is_ethos and " " in str(out_dir.resolve()):  # ExecuTorch splits Vela's argv on spaces
        raise ValueError(f"artifact_dir {str(out_dir)!r} has a space, which Vela cannot take")
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [*out_dir.glob("*.tosa"), *out_dir.glob("output/out_*.csv")]
    for old in stale:  # a previous run's dumps would be counted again
        old.unlink()
    if is_ethos:
        default_system, default_memory = vela.default_config(target)
        system_config = system_config or default_system
        memory_mode = memory_mode or default_memory
    spec = compile_spec(target, out_dir, system_config, memory_mode)
    module = _eval(module)
    if quantized:
        with _timed(times, "quantize", progress, "quantize (calibrate, convert)"):
            module = quantize(
                module,
                example_inputs,
                spec,
                calibration_inputs,
                quantizer_factory,
                plan.activations,
                progress,
            )
    with _timed(times, "export", progress, "export"):
        exported = torch.export.export(module, example_inputs)
    with _timed(times, "lower", progress, f"partition and lower to {target}"), _vela_quiet():
        edge = to_edge_transform_and_lower(
            exported,
            partitioner=[partitioner_factory(spec)],
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    edge_program = edge.exported_program()
    graph_module = edge_program.graph_module
    lowered = [m for name, m in graph_module.named_children() if name.startswith("lowered_module")]
    edge_nodes = sum(_count_call_functions(m.original_module.graph) for m in lowered)
    loop_programs = [
        program_of(n)
        for m in lowered
        for n in m.original_module.graph.nodes
        if n.op == "call_function" and target_name(n) == LOOP_EDGE_NAME
    ]
    cpu_nodes = sum(
        1
        for n in graph_module.graph.nodes
        if n.op == "call_function"
        and "call_delegate" not in target_name(n)
        and target_name(n) != "getitem"
    )
    # The TOSA backend writes output_<tag>_<spec>.tosa; ExecuTorch's Vela step adds out.tosa.
    tosa_files = sorted(out_dir.glob("output*.tosa"))
    counts: collections.Counter = collections.Counter()
    for f in tosa_files:
        counts.update(tosa_flatbuffer.op_counts(f))
    mapping = io_mapping(graph_module.graph, list(edge_program.graph_signature.user_inputs))
    # to_executorch rewrites the edge graph in place (memory planning): analyse it first.
    program_module = None
    if mapping is None and lowered:
        program_module = edge_program.module(check_guards=False)  # a copy of the graph
    _drop_artifact_path(lowered)
    with _timed(times, "to_executorch", progress, "write the .pte (to_executorch)"):
        pte = edge.to_executorch().buffer
    result = LoweringResult(
        target=target,
        quantized=quantized,
        pte=bytes(pte),
        artifact_dir=out_dir,
        tosa_files=tosa_files,
        times=times,
        edge_nodes=edge_nodes,
        cpu_nodes=cpu_nodes,
        num_delegates=len(lowered),
        tosa_ops=sum(counts.values()),
        tosa_compute_ops=sum(
            n for op, n in counts.items() if op not in tosa_flatbuffer.CONSTANT_OPS
        ),
        tosa_op_counts=counts,
        system_config=system_config,
        memory_mode=memory_mode,
        program_module=program_module,
        loop_programs=loop_programs,
        precision=choice,  # (int8, when auto chose it)
    )
    if mapping is not None:
        result.input_map, result.output_map, result.input_quant, result.output_quant = mapping
    own = sorted((out_dir / "output").glob(f"out_summary_{system_config}.csv"))
    if own:  # ExecuTorch's Vela call writes this when dumping artifacts
        result.executorch_vela = vela.parse_summary_csv(own[0])
    if is_ethos and run_vela and tosa_files:
        with _timed(times, "vela", progress, "Vela performance estimate"):
            result.vela = own_vela(out_dir / "output", result.executorch_vela, len(tosa_files))
            if result.vela is None:  # one Vela run per delegate (each overwrote the last's)
                runs = [
                    vela.run_vela(f, target, system_config, memory_mode, out_dir / "vela" / f.stem)
                    for f in progress.steps(tosa_files, "Vela runs")
                ]
                result.vela = vela.combined(runs, out_dir / "vela")
            result.vela_delegates = len(tosa_files)
    return result


def own_vela(output_dir: pathlib.Path, summary: Optional[vela.VelaSummary], delegates: int):
    """The estimate ExecuTorch's own Vela run wrote for a one-delegate program (`summary`,
    already read, and the per-layer table beside it; Vela takes 37 s on a 45,000-op loop
    form: not run twice), or None: several delegates (each run overwrote the files), no
    summary or no per-layer table."""
    per_layer = output_dir / "out_per-layer.csv"
    if delegates != 1 or summary is None or not per_layer.exists():
        return None
    return vela.VelaResult(summary, vela.parse_per_layer_csv(per_layer), output_dir, log="")


def _lower_choice(choice, times: dict, args: dict) -> LoweringResult:
    """Lower auto's int16 `choice` (args: lower's, with its plan); lower again in int8 if
    Vela refuses it or measures it beyond the budget by more than the model's error."""
    keep = ("module", "example_inputs", "target", "artifact_dir", "calibration_inputs")
    keep += ("quantize_model", "system_config", "memory_mode", "run_vela", "decomposition")
    keep += ("strategy", "state_bits", "recurrent_weight_bits", "progress")
    common = {k: args[k] for k in keep}
    try:
        result = lower(**common, plan=args["plan"])
    except Exception as e:  # int8 is the answer to whatever int16 hit
        fell_back = precision.did_not_lower(choice, e)
    else:
        measured = result.vela.summary.cycles if result.vela is not None else None
        fell_back = precision.over_budget(choice, measured)
        if fell_back is None:
            result.precision = choice
            result.times = {**times, **result.times}
            return result
    fallback = lower(**common, activations="int8")
    fallback.precision = fell_back
    fallback.times = {**times, **fallback.times}
    return fallback


def _drop_artifact_path(lowered_modules) -> None:
    """The dump directory is where this run wrote its debug files, not part of the program:
    left in the compile specs, the .pte would embed it (a fresh temporary name each run)."""
    from executorch.backends.arm.common.arm_compile_spec import ArmCompileSpec

    for module in lowered_modules:
        module._compile_specs = [
            spec for spec in module.compile_specs if spec.key != ArmCompileSpec._DEBUG_ARTIFACT_KEY
        ]


def _flat_outputs(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    flat = []
    for o in out:
        flat.extend(_flat_outputs(o))
    return flat


def check_numerics(
    result: LoweringResult, module: torch.nn.Module, inputs: Sequence[torch.Tensor]
) -> Numerics:
    """Run the dumped .tosa on the TOSA reference model and compare with fp32 torch eager.

    A program that is one delegate runs as that .tosa alone. Any other (CPU ops around or
    between delegates) runs whole, each delegate on the TOSA reference model and the CPU
    ops in torch eager (delegate_run.run_program)."""
    with torch.no_grad():
        reference = [t.detach().numpy() for t in _flat_outputs(_eval(module)(*inputs))]
    if result.input_map is not None and len(result.tosa_files) == 1:
        arrays = [inputs[i].detach().numpy() for i in result.input_map]
        delegate_out = tosa_reference.run(
            result.tosa_files[0],
            arrays,
            input_quant=result.input_quant,
            output_quant=result.output_quant,
        )
        outputs = [np.asarray(delegate_out[j], dtype=np.float32) for j in result.output_map]
    elif result.program_module is not None:
        from .delegate_run import run_program

        try:
            outputs = run_program(result.program_module, result.tosa_files, inputs)
        except ValueError as e:
            raise FlowError(f"{result.target}: {e}") from e
        outputs = [np.asarray(o, dtype=np.float32) for o in outputs]
    else:
        raise FlowError(f"{result.target}: the program has no delegate to check")
    if len(outputs) != len(reference):
        raise FlowError(f"{len(outputs)} delegate outputs vs {len(reference)} eager outputs")
    ref_flat = np.concatenate([r.reshape(-1) for r in reference])
    out_flat = np.concatenate([o.reshape(r.shape).reshape(-1) for o, r in zip(outputs, reference)])
    return Numerics(
        max_abs_err=float(np.max(np.abs(ref_flat - out_flat))),
        sqnr_db=sqnr_db(ref_flat, out_flat),
        reference=reference,
        tosa=outputs,
    )
