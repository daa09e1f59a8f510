"""ExecuTorch's Arm partitioners with our recurrent decomposition plugged in.

  Recurrent{TOSA,EthosU}Partitioner.transform_for_pre_decomposition
      (the hook `to_edge_transform_and_lower` calls before the core-ATen decompositions)
      decomposes recurrent ops with our core first, so torch's own GRU/LSTM decomposition
      never runs (FP flows, or any program that still holds a recurrent op).

With `plan.keep_recurrent_on_cpu` the partitioner rejects every node of a recurrent layer
(cpu_reasons.KeepRecurrentOnCpu) and lets `to_edge` decompose the layer's `aten.linear`s
into portable ops (ops_to_not_decompose would otherwise keep them whole for the delegate),
so the layer runs in ExecuTorch's portable CPU runtime. After partitioning, moves that
would hand a delegate's input on unchanged as one of its outputs are left on the CPU
(`_untag_pass_throughs`), and `cpu_reasons` counts why each node left outside a delegate
is there. Subclasses of ExecuTorch's public
partitioner classes; nothing in ExecuTorch is changed.
"""

from __future__ import annotations

import collections

from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
from torch.export import ExportedProgram

from recurrent_lowering.passes.spec import SpecError

from ..edge_io import quant_params, target_name
from ..emission.decompose import decompose_recurrent
from ..emission.origin import layer_of
from ..loop import op as loop_op
from ..plan import ArmPlan
from . import cpu_reasons


class _Hook:
    plan: ArmPlan

    def __init__(self, compile_spec, plan: ArmPlan):
        checks = [cpu_reasons.StatePartsOnCpu()]
        if plan.keep_recurrent_on_cpu:
            checks.append(cpu_reasons.KeepRecurrentOnCpu())
        super().__init__(compile_spec, checks)
        self.plan = plan
        self.cpu_reasons = collections.Counter()  # after partition()
        self.boundaries = None  # tag -> cpu_reasons.Boundary after partition()
        self.recurrent_on_cpu = collections.Counter()  # layer -> ops not delegated

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram):
        plan = self.plan
        ep = decompose_recurrent(exported_program, plan.core(), plan.products)
        return super().transform_for_pre_decomposition(ep)

    def ops_to_not_decompose(self, ep):
        ops, keep_whole = super().ops_to_not_decompose(ep)
        if not self.plan.keep_recurrent_on_cpu or keep_whole is None:
            return ops, keep_whole

        def filter_fn(node):  # a CPU node kept whole would have no portable kernel
            return layer_of(node) is None and keep_whole(node)

        return ops, filter_fn

    def partition(self, exported_program: ExportedProgram):
        result = super().partition(exported_program)
        graph = result.tagged_exported_program.graph
        _untag_pass_throughs(graph)
        keep = self.plan.keep_recurrent_on_cpu
        self.cpu_reasons = cpu_reasons.cpu_reasons(graph, keep, str(self.tosa_spec))
        self.boundaries = cpu_reasons.delegate_boundaries(graph)
        if not keep:
            self.recurrent_on_cpu = cpu_reasons.recurrent_on_cpu(graph)
        _check_loops_delegated(graph)
        return result


# Ops that hand a value on unchanged where their output's shape is their input's (not a
# permute: a square one transposes).
_SAME_SHAPE_MOVES = frozenset(
    {
        "alias_copy",
        "clone",
        "expand_copy",
        "squeeze_copy",
        "unsqueeze_copy",
        "view_copy",
    }
)
_Q, _DQ = "quantize_per_tensor", "dequantize_per_tensor"


def _op(node) -> str:
    """The op's name ("view_copy" of aten.view_copy.default), "" for no op call."""
    parts = target_name(node).split(".")
    return parts[-2] if node.op == "call_function" and len(parts) >= 2 else ""


def _untag_pass_throughs(graph) -> None:
    """Leave on the CPU what a delegate would hand from one of its inputs to its outputs
    unchanged (a GRU's output, expanded and viewed to its own shape for a matmul on the
    CPU): ExecuTorch's passes fold such a chain away, the delegate's output is then one of
    its inputs, and Vela refuses the graph ("Output tensor ... does not have any writers").
    Unchanged: shape moves to the same shape, and a quantize with the qparams of the
    dequantize before it (other qparams are a RESCALE, which stays)."""

    def tag(node):
        return node.meta.get("delegation_tag")

    held: dict = {}  # node -> the qparams its unchanged value is quantized with
    for node in graph.nodes:
        op = _op(node)
        if tag(node) is None or len(node.all_input_nodes) != 1:
            continue
        (source,) = node.all_input_nodes
        if op == _DQ and tag(source) != tag(node):
            held[node] = quant_params(node)
        elif source not in held:
            continue
        elif op == _DQ or (op == _Q and quant_params(node) == held[source]):
            held[node] = held[source]
        elif op in _SAME_SHAPE_MOVES and node.meta["val"].shape == source.meta["val"].shape:
            held[node] = held[source]
    for node in reversed(graph.nodes):  # users before what they read
        if node in held and all(tag(u) != tag(node) for u in node.users):
            del node.meta["delegation_tag"]
            node.meta[cpu_reasons.PASS_THROUGH_KEY] = True  # its CPU reason


def _check_loops_delegated(graph) -> None:
    """A loop node left outside a delegate would reach the CPU runtime, which has no kernel
    for it: refuse here, naming the layer, rather than write a .pte that cannot run."""
    for node in graph.nodes:
        if loop_op.is_loop(node) and "delegation_tag" not in node.meta:
            raise SpecError(
                layer_of(node) or node.name,
                "emission",
                "the loop form of this recurrent layer was not delegated (an op of its step is "
                "not supported on this target); lower it with the unrolled emission",
            )


class RecurrentTOSAPartitioner(_Hook, TOSAPartitioner):
    """TOSAPartitioner that decomposes GRU/LSTM/RNN with recurrent_lowering before to_edge."""


class RecurrentEthosUPartitioner(_Hook, EthosUPartitioner):
    """EthosUPartitioner that decomposes GRU/LSTM/RNN with recurrent_lowering before to_edge."""


def create(compile_spec, plan: ArmPlan):
    """Our Arm partitioner for `plan`."""
    if isinstance(compile_spec, TosaCompileSpec):
        return RecurrentTOSAPartitioner(compile_spec, plan)
    if isinstance(compile_spec, EthosUCompileSpec):
        return RecurrentEthosUPartitioner(compile_spec, plan)
    raise ValueError(f"no recurrent-lowering partitioner for {type(compile_spec).__name__}")
