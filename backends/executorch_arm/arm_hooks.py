"""ExecuTorch's Arm quantizers and partitioners, with our recurrent decomposition plugged in.

Public subclasses only; nothing in ExecuTorch is patched:

  Recurrent{TOSA,EthosU}Quantizer.transform_for_annotation
      decomposes recurrent ops (DecomposeRecurrentPass, TFA mode) before ExecuTorch's
      annotation pipeline, so the quantizer annotates our elementary ops and ExecuTorch's
      DecomposeGru/Lstm/RnnPass find nothing left to do (INT flows);
  Recurrent{TOSA,EthosU}Partitioner.transform_for_pre_decomposition
      (the hook `to_edge_transform_and_lower` calls before the core-ATen decompositions)
      runs `decompose_recurrent` first, so torch's own GRU/LSTM decomposition never runs
      (FP flows, or any program that still holds a recurrent op).

With `plan.keep_recurrent_on_cpu` the partitioners reject every node of a recurrent layer
(fallback.KeepRecurrentOnCpu) and let `to_edge` decompose the layer's `aten.linear`s into
portable ops (ops_to_not_decompose would otherwise keep them whole for the delegate), so the
layer runs in ExecuTorch's portable CPU runtime. After partitioning, `cpu_reasons` counts why
each node left outside a delegate is there.

`create_quantizer` / `create_partitioner` mirror `executorch.backends.arm.util._factory`;
both take the target's ArmPlan (plan.py: the form of the layers, the recurrent product,
the bit widths).
"""

from __future__ import annotations

import collections

from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
from executorch.backends.arm.quantizer import EthosUQuantizer, TOSAQuantizer
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
from torch.export import ExportedProgram
from torch.fx import GraphModule

from recurrent_lowering.passes.spec import SpecError

from . import fallback, precision_regions, weight_precision
from .arm_passes import DecomposeRecurrentPass
from .decompose import decompose_recurrent
from .loop import op as loop_op
from .loop import tosa as loop_tosa  # noqa: F401  (registers the loop node's TOSA)
from .loop.quantization import annotate_loops
from .plan import ArmPlan, quantization_config
from .recurrent_quantization import RecurrentStateQuantizer, clip_by_range


def target_of(compile_spec) -> str:
    """The target a compile spec is for: an Ethos-U accelerator or a TOSA spec string."""
    if isinstance(compile_spec, EthosUCompileSpec):
        return compile_spec.target
    return str(compile_spec.tosa_spec)


class _QuantizerHook:
    plan: ArmPlan
    narrowed = 0  # after annotate: unrolled products and loop-form steps narrowed

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        plan = self.plan
        DecomposeRecurrentPass(tfa_pass=True, strategy=plan.layer_strategy, products=plan.products)(
            model
        )
        return super().transform_for_annotation(model)

    def annotate(self, model: GraphModule) -> GraphModule:
        model = super().annotate(model)
        plan = self.plan
        config = self.global_config
        if plan.recurrent_activations is not None and config is not None:
            config = quantization_config(plan.recurrent_activations)  # (set_module_type's)
        step_config = quantization_config("int16") if plan.state_bits == 16 else None
        bits = plan.recurrent_weight_bits
        narrow = bits < 8 and config is not None
        unrolled = 0
        if narrow:
            unrolled = weight_precision.narrow_per_step_weights(model.graph, config, bits)
            step_config = weight_precision.narrow(step_config or config, bits)
        loops = annotate_loops(model.graph, config, step_config)
        clip_by_range(model.graph)
        if plan.recurrent_activations not in (None, plan.activations) and config is not None:
            precision_regions.fold_boundaries(model.graph)
        if narrow:  # every loop's step holds only per-step weights
            self.narrowed = unrolled + loops
        return model


class _PartitionerHook:
    plan: ArmPlan

    def __init__(self, compile_spec, plan: ArmPlan, additional_checks=None):
        checks = list(additional_checks or ())
        if plan.keep_recurrent_on_cpu:
            checks.append(fallback.KeepRecurrentOnCpu())
        super().__init__(compile_spec, checks or None)
        self.plan = plan
        self.keep_recurrent_on_cpu = plan.keep_recurrent_on_cpu
        self.cpu_reasons = None  # collections.Counter after partition()
        self.boundaries = None  # tag -> fallback.Boundary after partition()
        self.recurrent_on_cpu = collections.Counter()  # layer -> ops not delegated

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram):
        plan = self.plan
        ep = decompose_recurrent(exported_program, plan.layer_strategy, plan.products)
        return super().transform_for_pre_decomposition(ep)

    def ops_to_not_decompose(self, ep):
        ops, keep_whole = super().ops_to_not_decompose(ep)
        if not self.keep_recurrent_on_cpu or keep_whole is None:
            return ops, keep_whole

        def filter_fn(node):  # a CPU node kept whole would have no portable kernel
            return fallback.recurrent_layer_of(node) is None and keep_whole(node)

        return ops, filter_fn

    def partition(self, exported_program: ExportedProgram):
        result = super().partition(exported_program)
        graph = result.tagged_exported_program.graph
        self.cpu_reasons = fallback.cpu_reasons(
            graph, self.keep_recurrent_on_cpu, str(self.tosa_spec)
        )
        self.boundaries = fallback.delegate_boundaries(graph)
        if not self.keep_recurrent_on_cpu:
            self.recurrent_on_cpu = fallback.recurrent_on_cpu(graph)
        _check_loops_delegated(graph)
        return result


def _check_loops_delegated(graph) -> None:
    """A loop node left outside a delegate would reach the CPU runtime, which has no kernel
    for it: refuse here, naming the layer, rather than write a .pte that cannot run."""
    for node in graph.find_nodes(op="call_function", target=loop_op.OP):
        if "delegation_tag" not in node.meta:
            raise SpecError(
                fallback.recurrent_layer_of(node) or node.name,
                "emission",
                "the loop form of this recurrent layer was not delegated (an op of its step is "
                "not supported on this target); lower it with the unrolled emission",
            )


class RecurrentTOSAQuantizer(_QuantizerHook, TOSAQuantizer):
    """TOSAQuantizer that decomposes GRU/LSTM/RNN with recurrent_lowering first."""


class RecurrentEthosUQuantizer(_QuantizerHook, EthosUQuantizer):
    """EthosUQuantizer that decomposes GRU/LSTM/RNN with recurrent_lowering first."""


class RecurrentTOSAPartitioner(_PartitionerHook, TOSAPartitioner):
    """TOSAPartitioner that decomposes GRU/LSTM/RNN with recurrent_lowering before to_edge."""


class RecurrentEthosUPartitioner(_PartitionerHook, EthosUPartitioner):
    """EthosUPartitioner that decomposes GRU/LSTM/RNN with recurrent_lowering before to_edge."""


def _plan_for(compile_spec, plan):
    return plan if plan is not None else ArmPlan(target_of(compile_spec))


def create_quantizer(compile_spec, plan: ArmPlan = None):
    """An Arm quantizer that decomposes recurrent layers per `plan` (default: the target's
    defaults) first."""
    if isinstance(compile_spec, TosaCompileSpec):
        quantizer = RecurrentTOSAQuantizer(compile_spec)
    elif isinstance(compile_spec, EthosUCompileSpec):
        quantizer = RecurrentEthosUQuantizer(compile_spec)
    else:
        raise ValueError(f"no recurrent-lowering quantizer for {type(compile_spec).__name__}")
    quantizer.plan = _plan_for(compile_spec, plan)
    recurrent = quantizer.plan.recurrent_activations
    if recurrent is not None:  # the recurrent layers' region in its own precision
        config = quantization_config(recurrent)
        for module_type in fallback.RECURRENT_MODULES:
            quantizer.set_module_type(module_type, config)
    return quantizer


def create_partitioner(compile_spec, plan: ArmPlan = None, additional_checks=None):
    """An Arm partitioner that decomposes recurrent layers per `plan` before to_edge and,
    with `plan.keep_recurrent_on_cpu`, leaves them on the CPU."""
    if isinstance(compile_spec, TosaCompileSpec):
        cls = RecurrentTOSAPartitioner
    elif isinstance(compile_spec, EthosUCompileSpec):
        cls = RecurrentEthosUPartitioner
    else:
        raise ValueError(f"no recurrent-lowering partitioner for {type(compile_spec).__name__}")
    return cls(compile_spec, _plan_for(compile_spec, plan), additional_checks)


def quantizer_factory(plan: ArmPlan = None, share_state: bool = True):
    """A `quantizer_factory(compile_spec)` for flow.lower: our quantizer per `plan`, with
    each final state sharing its initial state's quantization (RecurrentStateQuantizer)
    or, with `plan.keep_recurrent_on_cpu`, the recurrent layers left in float."""

    def create(compile_spec) -> RecurrentStateQuantizer:
        base = create_quantizer(compile_spec, plan)
        keep = base.plan.keep_recurrent_on_cpu
        return RecurrentStateQuantizer(base, keep, share_state)

    return create
