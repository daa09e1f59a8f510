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

With `keep_recurrent_on_cpu=True` the partitioners reject every node of a recurrent layer
(fallback.KeepRecurrentOnCpu) and let `to_edge` decompose the layer's `aten.linear`s into
portable ops (ops_to_not_decompose would otherwise keep them whole for the delegate), so the
layer runs in ExecuTorch's portable CPU runtime. After partitioning, `cpu_reasons` counts why
each node left outside a delegate is there.

`create_quantizer` / `create_partitioner` mirror `executorch.backends.arm.util._factory`;
both take an `Emission` (how the recurrent steps are written), which `emission_options`
chooses per target: on Ethos-U85 the recurrent product as a MATMUL with R on the left
(Vela runs a per-step CONV at about 12 MACs/cycle there, the MATMUL at about 20); on U55,
where R streams from flash, the CONV form is 2.3x faster than MATMUL.
"""

from __future__ import annotations

from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
from executorch.backends.arm.quantizer import EthosUQuantizer, TOSAQuantizer
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
from torch.export import ExportedProgram
from torch.fx import GraphModule

from recurrent_lowering.passes.spec import SpecError

from . import fallback, scan_op, scan_tosa, weight_precision  # noqa: F401  (scan_tosa registers)
from .arm_passes import DecomposeRecurrentPass
from .decompose import decompose_recurrent
from .fx_builder import PLAIN, Emission
from .scan_quantization import annotate_scans


def emission_options(target: str, recurrent_weight_bits: int = 8) -> Emission:
    """The emission that gives the fewest Vela cycles on `target` (a TOSA spec string or an
    Ethos-U accelerator such as "ethos-u85-256"); see docs/results/arm_benchmark.md. Recurrent
    weights of fewer than 8 bits need the CONV form (a MATMUL's R is an int8 feature map)."""
    matmul = target.lower().startswith("ethos-u85") and recurrent_weight_bits == 8
    return Emission(recurrent_product="matmul" if matmul else "linear")


STRATEGIES = ("auto", "unrolled", "scan")


def strategy_for(requested: str, keep_recurrent_on_cpu: bool = False) -> str:
    """The strategy for a request ("auto", "unrolled" or "scan"). "auto" is resolved per
    layer by decompose.resolve_strategy (unrolled at small T, the loop form beyond), except
    that layers kept on the CPU are always unrolled: the CPU runtime has portable kernels for
    elementary ops only, not for the scan node."""
    if requested not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {requested!r}")
    if keep_recurrent_on_cpu:
        if requested == "scan":
            raise ValueError("recurrent layers kept on the CPU need the unrolled form")
        return "unrolled"
    return requested


class _QuantizerHook:
    strategy = "auto"
    emission = PLAIN
    state_bits = 8  # 16: loop-form steps keep int16 state and gate arithmetic (int8 around)
    recurrent_weight_bits = 8  # < 8: per-step weights narrowed (weight_precision)
    narrowed = 0  # after annotate: unrolled products and loop-form steps narrowed

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        DecomposeRecurrentPass(tfa_pass=True, strategy=self.strategy, emission=self.emission)(model)
        return super().transform_for_annotation(model)

    def annotate(self, model: GraphModule) -> GraphModule:
        model = super().annotate(model)
        step_config = None
        if self.state_bits == 16:
            from executorch.backends.arm.quantizer import arm_quantizer

            step_config = arm_quantizer.get_symmetric_a16w8_quantization_config(is_per_channel=True)
        narrow = self.recurrent_weight_bits < 8 and self.global_config is not None
        unrolled = 0
        if narrow:
            bits = self.recurrent_weight_bits
            unrolled = weight_precision.narrow_per_step_weights(
                model.graph, self.global_config, bits
            )
            step_config = weight_precision.narrow(step_config or self.global_config, bits)
        scans = annotate_scans(model.graph, self.global_config, step_config)
        if narrow:  # every scan's step holds only per-step weights
            self.narrowed = unrolled + scans
        return model


class _PartitionerHook:
    strategy = "auto"
    emission = PLAIN

    def __init__(self, compile_spec, additional_checks=None, keep_recurrent_on_cpu=False):
        checks = list(additional_checks or ())
        if keep_recurrent_on_cpu:
            checks.append(fallback.KeepRecurrentOnCpu())
        super().__init__(compile_spec, checks or None)
        self.keep_recurrent_on_cpu = keep_recurrent_on_cpu
        self.cpu_reasons = None  # collections.Counter after partition()
        self.boundaries = None  # tag -> fallback.Boundary after partition()

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram):
        ep = decompose_recurrent(exported_program, self.strategy, self.emission)
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
        _check_scans_delegated(graph)
        return result


def _check_scans_delegated(graph) -> None:
    """A scan node left outside a delegate would reach the CPU runtime, which has no kernel
    for it: refuse here, naming the layer, rather than write a .pte that cannot run."""
    for node in graph.find_nodes(op="call_function", target=scan_op.OP):
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


def create_quantizer(
    compile_spec,
    emission: Emission = PLAIN,
    strategy: str = "auto",
    state_bits: int = 8,
    recurrent_weight_bits: int = 8,
):
    if isinstance(compile_spec, TosaCompileSpec):
        quantizer = RecurrentTOSAQuantizer(compile_spec)
    elif isinstance(compile_spec, EthosUCompileSpec):
        quantizer = RecurrentEthosUQuantizer(compile_spec)
    else:
        raise ValueError(f"no recurrent-lowering quantizer for {type(compile_spec).__name__}")
    if state_bits not in (8, 16):
        raise ValueError(f"state_bits must be 8 or 16, got {state_bits}")
    quantizer.emission, quantizer.strategy, quantizer.state_bits = emission, strategy, state_bits
    quantizer.recurrent_weight_bits = weight_precision.check_bits(recurrent_weight_bits)
    return quantizer


def create_partitioner(
    compile_spec,
    additional_checks=None,
    keep_recurrent_on_cpu=False,
    emission: Emission = PLAIN,
    strategy: str = "auto",
):
    if isinstance(compile_spec, TosaCompileSpec):
        cls = RecurrentTOSAPartitioner
    elif isinstance(compile_spec, EthosUCompileSpec):
        cls = RecurrentEthosUPartitioner
    else:
        raise ValueError(f"no recurrent-lowering partitioner for {type(compile_spec).__name__}")
    partitioner = cls(compile_spec, additional_checks, keep_recurrent_on_cpu)
    partitioner.emission = emission
    partitioner.strategy = strategy_for(strategy, keep_recurrent_on_cpu)
    return partitioner
