"""Take a torch module through ExecuTorch 1.5.1's Arm flow: options in, one lowering out.

  lower(module, inputs, options)       check the options, make the plans to try
                                       (precision.candidates), hold auto's choice to the
                                       accuracy target on the evaluation samples
                                       (precision.candidates.reaching, each candidate
                                       simulated by precision.accuracy), lower the first
                                       that fits, verify it on the TOSA reference model
                                       (a miss lowers precision.candidates.widening's)
  lower_first(module, inputs, plans)   the plans in order: a plan that fails to lower, or
                                       that Vela measures over its budget, gives way to the
                                       next (precision.candidates.misfit), unless the next
                                       measures more still (precision.candidates.refit)
  lower_plan(module, inputs, plan)     one plan: torch.export -> (INT targets: PT2E
                                       quantization, calibrated on the given inputs) ->
                                       to_edge_transform_and_lower with our partitioner ->
                                       .pte bytes, with Vela's estimate for Ethos-U

The TOSA flatbuffer of every delegate is dumped to a directory (compile spec
`dump_intermediate_artifacts_to`), so the result can be run on the TOSA reference model
(runtime.arm_numerics) and through Vela. The command line (tools/lowering/npu.py) and the
Bazel rule, which runs it, call `lower` too: the same options give the same program.

`Options(decomposition="executorch")` lowers with ExecuTorch 1.5.1's own DecomposeGru/Lstm/
RnnPass and its own quantizer and partitioner: the baseline we benchmark against, run with
none of our extensions (compat).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import pathlib
import tempfile
import time
from typing import Optional, Sequence

import torch

from recurrent_lowering.runtime import tosa_flatbuffer, vela

from . import compat
from .compat import compile_specs, factory
from .compat.histogram_observer import calibrate
from .edge_io import io_mapping, target_name
from .exported import distinct, eval_mode, module_of, with_own_tensors
from .loop import prefetch
from .loop.op import EDGE_NAME as LOOP_EDGE_NAME
from .loop.op import program_of, run_graph
from .options import Options
from .partition import partitioner as our_partitioner
from .plan import ArmPlan, quantization_config
from .precision import accuracy
from .precision import candidates as precision
from .precision.judge import Judge, Verified
from .quantization import quantizer as our_quantizer
from .threads import one_thread


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
    plan: Optional[ArmPlan] = None  # the plan lowered (plan.precision: what auto weighed)
    # Mapping program I/O <-> the single delegate's I/O, when the program is fully delegated:
    input_map: Optional[list] = None  # delegate input k <- program input index
    output_map: Optional[list] = None  # program output i <- delegate output index
    input_quant: Optional[list] = None  # QuantParams | None per delegate input
    output_quant: Optional[list] = None  # QuantParams | None per delegate output
    vela: Optional[vela.VelaResult] = None  # Vela's per-layer estimate
    vela_delegates: int = 0  # delegates compiled by that run (figures summed: vela.combined)
    executorch_vela: Optional[vela.VelaSummary] = None  # the summary ExecuTorch's own Vela wrote
    system_config: Optional[str] = None
    memory_mode: Optional[str] = None
    # The lowered edge program as a module, kept when the program is not one delegate fed by
    # the program inputs (CPU ops around or between delegates): the numerics check runs it.
    program_module: Optional[torch.nn.Module] = None
    loop_programs: list = dataclasses.field(default_factory=list)  # loop.op.StepProgram each
    cpu_reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    recurrent_on_cpu: collections.Counter = dataclasses.field(
        default_factory=collections.Counter
    )  # layer -> ops of it left outside a delegate
    boundaries: dict = dataclasses.field(default_factory=dict)  # tag -> cpu_reasons.Boundary
    narrowed: int = 0  # products whose weights recurrent_weight_bits narrowed
    state_pairs: list = dataclasses.field(default_factory=list)  # (h0 input, h_n output index)
    verified: Optional[Verified] = None  # auto's verification, when it ran

    @property
    def precision(self):
        """What `quantization="auto"` chose (precision.cost_model.Choice), or None."""
        return self.plan.precision if self.plan is not None else None


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


def float_graph(module, example_inputs):
    """`module` exported, as a graph module with its own tensors: what `quantize` prepares."""
    return with_own_tensors(module_of(torch.export.export(module, example_inputs)))


def quantize(
    module, example_inputs, quantizer, calibration_inputs=None, progress=None, graph_module=None
):
    """PT2E quantization of `module` with `quantizer` (its configs set), calibrated on
    `calibration_inputs` (default: the example inputs). `graph_module`, when given, is
    `float_graph(module, example_inputs)` already, which prepare_pt2e rewrites in place."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if graph_module is None:
        graph_module = float_graph(module, example_inputs)
    samples = calibration_inputs or [example_inputs]
    quantizer.float_samples = samples
    prepared = prepare_pt2e(graph_module, quantizer)
    shown = (progress or _Silent()).steps(samples, "calibration samples")
    compiled: dict = {}  # run_graph's, kept across the samples

    def run(graph_module, *sample):  # loop nodes record their steps' inputs
        return run_graph(graph_module, *sample, constants=compiled)

    calibrate(prepared, shown, run)
    return convert_pt2e(prepared)


def _count_call_functions(graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function")


@one_thread()
def lower(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    options: "Options | str",
    artifact_dir: "str | pathlib.Path | None" = None,
    calibration_inputs: Optional[Sequence[Sequence[torch.Tensor]]] = None,
    progress=None,
    run_vela: bool = True,
    evaluation: Optional[accuracy.Evaluation] = None,
    verify: bool = True,
    **fields,
) -> LoweringResult:
    """Lower `module` as `options` say (an Options, or a target name with Options' fields as
    keywords: `lower(m, x, "ethos-u55-128", quantization="int8")`).

    INT and Ethos-U targets are quantized, calibrated on `calibration_inputs` (default: the
    example inputs). `quantization="auto"` holds its choice to `min_sqnr` on `evaluation`
    (default: the calibration samples, no state fed back), predicted by simulation and,
    when `verify`, measured on the TOSA reference model after lowering
    (`result.verified`), a miss lowering the next wider candidate. For Ethos-U targets
    `result.vela` (when `run_vela`) is Vela's per-layer estimate. `progress` (an object
    with `stage(label)`, a context manager, and `steps(items, description)`) hears of each
    stage. Raises options.OptionError for options
    the adapter cannot lower. Runs on one intra-op thread (threads.py)."""
    if isinstance(options, str):
        options = Options(options, **fields)
    elif fields:
        options = dataclasses.replace(options, **fields)
    progress = progress or _Silent()
    module, example_inputs = eval_mode(module), distinct(example_inputs)
    times: dict = {}
    with _timed(times, "precision", progress, "choose the precision per region"):
        plans = precision.candidates(options, module, tuple(example_inputs))
    weighed = plans[0].precision is not None and plans[0].precision.why is None
    if not weighed:
        times.pop("precision")
    judge = None
    if weighed:
        samples = evaluation or accuracy.Evaluation(calibration_inputs or [tuple(example_inputs)])
        with _timed(times, "accuracy", progress, "predict the candidates' accuracy"):
            convert = _converted(module, example_inputs, calibration_inputs)
            judge = Judge(module, convert, samples, _key)
            try:
                plans = precision.reaching(options, plans, judge.predict, judge.ahead)
            finally:
                judge.close()
    args = (artifact_dir, calibration_inputs, progress, run_vela)
    quantized, predict = (judge.quantized, judge.predict) if judge else (None, None)
    result = lower_first(module, example_inputs, plans, *args, quantized, predict)
    if judge is not None and verify:
        result = _verified(options, module, example_inputs, result, judge, args, times)
    result.times = {**times, **result.times}
    return result


def _key(plan: ArmPlan) -> ArmPlan:
    return dataclasses.replace(plan, precision=None)


def _converted(module, example_inputs, calibration_inputs):
    """`convert(plan) -> (converted module, quantizer)`: PT2E quantization of `module` as
    `plan` says, calibrated as its lowering would be (precision.judge's simulations). The
    module is exported once, here, before judge's child forks (it shares the graph), and
    each plan prepares a copy: torch.export of GTCRN is 3.2 s, the copy 0.09 s."""
    module, example_inputs = eval_mode(module), tuple(example_inputs)
    with compat.lowering():
        graph = float_graph(module, example_inputs)

    def convert(plan: ArmPlan):
        with tempfile.TemporaryDirectory() as scratch, compat.lowering():
            spec = compile_spec(plan.target, pathlib.Path(scratch), None, None)
            quantizer = our_quantizer.create(spec, plan)
            copied = copy.deepcopy(graph)
            converted = quantize(
                module, example_inputs, quantizer, calibration_inputs, graph_module=copied
            )
        return converted, quantizer

    return convert


def _verified(options, module, example_inputs, result, judge: Judge, args, times: dict):
    """`result` with auto's choice measured on the TOSA reference model; when that misses
    the target its simulation promised, the wider candidate precision.widening names is
    lowered too (into a subdirectory) and precision.settled keeps the better."""
    from recurrent_lowering.runtime.arm_numerics import NumericsError

    progress = args[2]
    try:
        with _timed(times, "verify", progress, "verify the choice on the TOSA reference model"):
            result.plan = precision.measured_as(result.plan, judge.measure(result))
    except NumericsError:  # nothing to run there (the CLI reports why)
        return result
    if not precision.missed(options, result.plan):
        return result
    with _timed(times, "widen", progress, "predict the wider candidates' accuracy"):
        wider = precision.widening(options, result.plan, judge.predict)
    if wider is None:
        return result
    again = pathlib.Path(result.artifact_dir) / f"widened_{wider.precision.name}"
    quantized = judge.quantized
    try:
        second = lower_plan(module, example_inputs, wider, again, *args[1:], quantized)
    except Exception as e:  # the first stands, its choice saying why
        result.plan = precision.unwidened(result.plan, wider, precision.did_not_lower(wider, e))
        return result
    try:
        name = wider.precision.name
        with _timed(
            times, f"verify ({name})", progress, f"verify {name} on the TOSA reference model"
        ):
            second.plan = precision.measured_as(second.plan, judge.measure(second))
    except NumericsError:
        return result
    plan = precision.settled(result.plan, second.plan)
    kept, other = (
        (second, result) if plan.precision.name == wider.precision.name else (result, second)
    )
    times.update({f"{k} ({other.precision.name})": t for k, t in other.times.items()})
    kept.plan = plan
    return kept


def lower_first(
    module,
    example_inputs,
    plans: Sequence[ArmPlan],
    artifact_dir=None,
    calibration_inputs=None,
    progress=None,
    run_vela: bool = True,
    quantized: Optional[dict] = None,
    predict=None,
) -> LoweringResult:
    """The first of `plans` that lowers and fits its budget (precision.candidates); the last
    is lowered whatever it measures, but a plan over its budget that the last then measures
    more cycles than the budget allows under is kept (precision.refit). A plan that gives
    way hands its reason to the next (`result.precision.fallback`). `predict` (auto's
    simulation) asks, of a plan over its budget, whether the next would still reach the
    accuracy target (precision.holds)."""
    plans, times = list(plans), {}
    args = (artifact_dir, calibration_inputs, progress, run_vela, quantized)
    over = None  # (result, cycles, times before it) of a plan Vela measured over its budget
    for k, plan in enumerate(plans):
        if k == len(plans) - 1:
            result = lower_plan(module, example_inputs, plan, *args)
            return _refit(over, result, times) if over is not None else _with(result, times)
        over = None
        try:
            result = lower_plan(module, example_inputs, plan, *args)
        except Exception as e:  # the next plan is the answer to whatever this one hit
            why = precision.did_not_lower(plan, e)
        else:
            measured = _cycles(result)
            why = precision.misfit(plan, measured)
            if why is not None and predict is not None:
                label = "predict the fallback's accuracy"
                with _timed(result.times, "fallback", progress or _Silent(), label):
                    plan = result.plan = precision.holds(result.plan, plans[k + 1], predict)
                why = precision.misfit(plan, measured)
            if why is None:
                return _with(result, times)
            over = (_set_aside(result), measured, dict(times))  # it may yet be kept (refit)
            times.update({f"{key} ({plan.precision.name})": t for key, t in result.times.items()})
        plans[k + 1] = precision.fell_back(plan, plans[k + 1], why)
    raise ValueError("no plan to lower")


def _set_aside(result):
    """`result` with its TOSA files and Vela's output copied into a subdirectory
    (`over_budget_<name>/`) of its artifact directory, which the next plan's lowering
    clears: its figures hold while that lowering runs, and if it is kept."""
    import shutil

    home = pathlib.Path(result.artifact_dir)
    aside = home / f"over_budget_{result.plan.precision.name}"
    aside.mkdir(exist_ok=True)
    tosa_files = []
    for f in result.tosa_files:
        tosa_files.append(aside / f.name)
        shutil.copy2(f, tosa_files[-1])
    vela_result = result.vela
    if vela_result is not None and pathlib.Path(vela_result.output_dir).is_dir():
        output = aside / pathlib.Path(vela_result.output_dir).name
        shutil.copytree(vela_result.output_dir, output, dirs_exist_ok=True)
        vela_result = dataclasses.replace(vela_result, output_dir=output)
    return dataclasses.replace(result, artifact_dir=aside, tosa_files=tosa_files, vela=vela_result)


def _cycles(result) -> Optional[int]:
    return result.vela.summary.cycles if result.vela is not None else None


def _with(result, times: dict):
    """`result` with the times of the plans lowered before it."""
    result.times = {**times, **result.times}
    return result


def _refit(over, fallback, times: dict):
    """Of a plan measured over its budget (`over`: its result, cycles and the times before
    it) and the fallback lowered after it, the first when the fallback measured so many
    cycles that it fits after all (precision.refit), else the fallback."""
    first, cycles, before = over
    kept = precision.refit(first.plan, cycles, _cycles(fallback))
    if kept is None:
        return _with(fallback, times)
    first.plan = kept
    name = fallback.plan.precision.name
    first.times = {**before, **first.times}
    first.times.update({f"{k} ({name})": t for k, t in fallback.times.items()})
    return first


@torch.no_grad()  # a state buffer written in place would otherwise fail in to_executorch
def lower_plan(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    plan: ArmPlan,
    artifact_dir: "str | pathlib.Path | None" = None,
    calibration_inputs: Optional[Sequence[Sequence[torch.Tensor]]] = None,
    progress=None,
    run_vela: bool = True,
    quantized: Optional[dict] = None,
) -> LoweringResult:
    """Lower `module` by one plan (see the module docstring); `quantized` may hold its
    converted module and quantizer already (precision.judge's)."""
    with compat.lowering() if plan.ours else contextlib.nullcontext():
        return _lower_plan(
            module,
            distinct(example_inputs),
            plan,
            artifact_dir,
            calibration_inputs,
            progress,
            run_vela,
            (quantized or {}).get(_key(plan)),
        )


def _lower_plan(
    module, example_inputs, plan, artifact_dir, calibration_inputs, progress, run_vela, converted
):
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    progress = progress or _Silent()
    times: dict = {}
    example_inputs = tuple(example_inputs)
    target, is_ethos = plan.target, plan.is_ethos_u
    out_dir = pathlib.Path(artifact_dir or tempfile.mkdtemp(prefix="et_arm_"))
    if is_ethos and " " in str(out_dir.resolve()):  # ExecuTorch splits Vela's argv on spaces
        raise ValueError(f"artifact_dir {str(out_dir)!r} has a space, which Vela cannot take")
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [*out_dir.glob("*.tosa"), *out_dir.glob("output/out_*.csv")]
    for old in stale:  # a previous run's dumps would be counted again
        old.unlink()
    system_config, memory_mode = plan.system_config, plan.memory_mode
    if is_ethos:
        default_system, default_memory = vela.default_config(target)
        system_config = system_config or default_system
        memory_mode = memory_mode or default_memory
    spec = compile_spec(target, out_dir, system_config, memory_mode)
    module = eval_mode(module)
    if plan.ours:
        quantizer = our_quantizer.create(spec, plan) if plan.quantize else None
        partitioner = our_partitioner.create(spec, plan)
    else:
        quantizer = factory.executorch_quantizer(spec) if plan.quantize else None
        if quantizer is not None:
            quantizer.set_global(quantization_config(plan.activations))
        partitioner = factory.executorch_partitioner(spec)
    if converted is not None:
        module, quantizer = converted
    elif quantizer is not None:
        with _timed(times, "quantize", progress, "quantize (calibrate, convert)"):
            module = quantize(module, example_inputs, quantizer, calibration_inputs, progress)
    with _timed(times, "export", progress, "export"):
        exported = torch.export.export(module, example_inputs)
    with _timed(times, "lower", progress, f"partition and lower to {target}"):
        steps = prefetch.start(exported.graph_module, spec.tosa_spec) if plan.ours else None
        try:
            edge = to_edge_transform_and_lower(
                exported,
                partitioner=[partitioner],
                compile_config=EdgeCompileConfig(_check_ir_validity=False),
            )
        finally:
            if steps is not None:
                steps.close()
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
    compile_specs.drop_artifact_path(lowered)
    with _timed(times, "to_executorch", progress, "write the .pte (to_executorch)"):
        pte = edge.to_executorch().buffer
    result = LoweringResult(
        target=target,
        quantized=plan.quantize,
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
        plan=plan,
        system_config=system_config,
        memory_mode=memory_mode,
        program_module=program_module,
        loop_programs=loop_programs,
        cpu_reasons=getattr(partitioner, "cpu_reasons", collections.Counter()),
        recurrent_on_cpu=getattr(partitioner, "recurrent_on_cpu", collections.Counter()),
        boundaries=getattr(partitioner, "boundaries", None) or {},
        narrowed=getattr(quantizer, "narrowed", 0),
        state_pairs=list(getattr(quantizer, "state_pairs", [])),
    )
    unexplained = cpu_nodes - sum(result.cpu_reasons.values())
    if plan.ours and unexplained:
        result.cpu_reasons["left on the CPU after partitioning (unclassified)"] += unexplained
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
