"""ExecuTorch's Arm quantizers with our recurrent decomposition and quantization policies.

The quantization of a plan, in the order it runs:

  transform_for_annotation
    0. a loop of cell calls read back as the layer it computes (recurrent_ops.cell_chains),
       before any policy looks for recurrent ops;
    0a. where the target runs transposed convolutions in int8 only, those of stride 1 as
       the convolutions they are (transposed.py);
    0b. in int16, a magnitude sqrt(a*a + b*b) over three ranges (magnitude.py), from the
       float values on `float_samples`;
    0c. a sum read in slices by sigmoids or tanhs (a cell written as plain ops) summed
       slice by slice, so Vela fuses each table with its sum, its one-row products in the
       plan's product form (sliced_sums.py);
    1. recurrent ops become the core's elementary ops (emission.decompose, the plan's core
       plan and recurrent product; nodes the Arm quantizer leaves in float keep their op),
       so ExecuTorch's annotators see ops they know and its DecomposeGru/Lstm/RnnPass find
       nothing to do;
    1b. with the plan's weight_parts 2, every constant weight of a product in two int8
       parts (weight_parts.py; a loop's step likewise, in loop.step);
  annotate
    2. ExecuTorch's annotation: the plan's activations globally, the recurrent layers'
       precision on their modules (set_module_type), none with keep_recurrent_on_cpu;
       int8 on the modules the target runs in int8 only (ArmPlan.int8_only);
    3. weights every step reads narrowed to recurrent_weight_bits (weights.py);
    4. loop nodes annotated, their steps given their config (loop.quantization);
    5. an int16 clip quantized to its own range (clip.py), an int16 sigmoid/tanh's input
       at a scale its table follows (table_inputs.py), and a split magnitude's coarse root
       reading its input's (magnitude.py);
    6. int16 recurrent layers in an int8 rest: moves after a layer keep its int16
       (regions.py);
    7. recurrent layers kept on the CPU: no annotation inside them (float);
    8. a stream's packed state read and assembled on the CPU in float, each part at its
       own scale (state_parts.py: marked before step 2, so that no concatenation ties
       the parts); a streaming model's final states in their initial states' groups
       (states.py; the pairs found in step 1, before the ops are decomposed);
    9. every other int16 program input with headroom over its calibrated range (inputs.py).

Subclasses of ExecuTorch's public quantizer classes; nothing in ExecuTorch is changed.
"""

from __future__ import annotations

from executorch.backends.arm.constants import DISALLOW_TFA_META_KEY
from executorch.backends.arm.ethosu import EthosUCompileSpec
from executorch.backends.arm.quantizer import EthosUQuantizer, TOSAQuantizer
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from torch.fx import GraphModule

from ..emission.decompose import decompose_graph_module
from ..emission.origin import layer_of
from ..loop.quantization import annotate_loops
from ..plan import ArmPlan, quantization_config
from ..recurrent_ops import cell_chains
from ..recurrent_ops.aten import MODULE_TYPES
from . import (
    clip,
    inputs,
    magnitude,
    regions,
    sliced_sums,
    state_parts,
    states,
    table_inputs,
    transposed,
    weight_parts,
    weights,
)

_Q_KEY = "quantization_annotation"


class _Policies:
    plan: ArmPlan
    narrowed = 0  # after annotate: unrolled products and loop-form steps narrowed
    state_pairs: list = []  # (initial state input, final state output index), found in TFA
    float_samples: list = []  # calibration inputs, for ranges needed before annotation
    magnitudes = 0  # after TFA: magnitudes computed over three ranges
    as_convolutions = 0  # after TFA: transposed convolutions of stride 1 made convolutions
    sliced_sums = 0  # after TFA: sums read in slices by tables, summed slice by slice
    widened_inputs = 0  # after annotate: program inputs given headroom

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        plan = self.plan
        cell_chains.fuse(model.graph, self._allowed)
        if plan.int8_only:  # those of stride 1 are convolutions, in the region's precision
            self.as_convolutions = transposed.as_convolutions(model, plan.int8_only)
        if plan.activations == "int16":
            self.magnitudes = magnitude.split(model, self.float_samples)
        self.sliced_sums = sliced_sums.split(model, plan.products)
        share = self._shares_states()  # found while the recurrent ops are still whole
        self.state_pairs = states.state_pairs(model.graph) if share else []
        self.decompose(model)
        if plan.weight_parts == 2:  # not in float layers on the CPU
            qmax = self.global_config.weight.quant_max
            weight_parts.split(model, qmax, lambda n: plan.keep_recurrent_on_cpu and layer_of(n))
        return super().transform_for_annotation(model)

    def _shares_states(self) -> bool:
        """A stream's states keep one quantization in and out (not in float CPU layers)."""
        return self.plan.share_state and not self.plan.keep_recurrent_on_cpu

    def decompose(self, model: GraphModule) -> bool:
        """Step 1: recurrent ops into the core's elementary ops, but for nodes the Arm
        quantizer leaves in float; True if any."""
        return decompose_graph_module(
            model, self.plan.core(), allowed=self._allowed, products=self.plan.products
        )

    @staticmethod
    def _allowed(node) -> bool:
        """Not a node the Arm quantizer leaves in float (those keep their op)."""
        return not node.meta.get(DISALLOW_TFA_META_KEY, False)

    def annotate(self, model: GraphModule) -> GraphModule:
        plan, graph = self.plan, model.graph
        act = self.global_config.get_output_act_qspec() if self.global_config else None
        splits = state_parts.split(graph, act) if self._shares_states() else []
        model = super().annotate(model)
        config = self.global_config
        if plan.recurrent_activations is not None and config is not None:
            config = quantization_config(plan.recurrent_activations)  # (set_module_type's)
        step_config = quantization_config("int16") if plan.state_bits == 16 else None
        bits = plan.recurrent_weight_bits
        narrow = bits < 8 and config is not None
        unrolled = 0
        if narrow:
            unrolled = weights.narrow_per_step_weights(graph, config, bits)
            step_config = weights.narrow(step_config or config, bits)
        loops = annotate_loops(graph, config, step_config, plan.weight_parts)
        clip.clip_by_range(graph)
        table_inputs.cap_table_inputs(graph)
        magnitude.share_above(graph)
        if plan.recurrent_activations not in (None, plan.activations) and config is not None:
            regions.fold_boundaries(graph)
        if narrow:  # every loop's step holds only per-step weights
            self.narrowed = unrolled + loops
        if plan.keep_recurrent_on_cpu:
            _float_recurrent_layers(graph)
        state_parts.tie(graph, splits)
        states.share_states(graph, self.state_pairs)
        self.widened_inputs = inputs.widen_inputs(graph, {h0 for h0, _ in self.state_pairs})
        return model


def _float_recurrent_layers(graph) -> None:
    """Drop every annotation that would quantize a value inside a float recurrent layer: its
    own nodes (shape ops the shared-qspec pass reached), program inputs read only by it (x,
    h0) and program outputs it produces (h_n). The edges into delegated consumers keep theirs:
    that is the quantize at the delegate boundary."""
    for node in graph.nodes:
        if node.op == "call_function" and layer_of(node) is not None:
            node.meta.pop(_Q_KEY, None)
        elif node.op == "placeholder" and node.users:
            if all(layer_of(u) is not None for u in node.users):
                node.meta.pop(_Q_KEY, None)
        elif node.op == "output" and _Q_KEY in node.meta:
            inputs = node.meta[_Q_KEY].input_qspec_map
            for producer in list(inputs):
                if layer_of(producer) is not None:
                    del inputs[producer]


class RecurrentTOSAQuantizer(_Policies, TOSAQuantizer):
    """TOSAQuantizer that decomposes GRU/LSTM/RNN with recurrent_lowering first."""


class RecurrentEthosUQuantizer(_Policies, EthosUQuantizer):
    """EthosUQuantizer that decomposes GRU/LSTM/RNN with recurrent_lowering first."""


def create(compile_spec, plan: ArmPlan):
    """Our Arm quantizer for `plan`, its global config set."""
    if isinstance(compile_spec, TosaCompileSpec):
        quantizer = RecurrentTOSAQuantizer(compile_spec)
    elif isinstance(compile_spec, EthosUCompileSpec):
        quantizer = RecurrentEthosUQuantizer(compile_spec)
    else:
        raise ValueError(f"no recurrent-lowering quantizer for {type(compile_spec).__name__}")
    quantizer.plan = plan
    quantizer.set_global(quantization_config(plan.activations))
    for module_type in plan.int8_only:  # what the target runs in int8 only, in int16
        quantizer.set_module_type(module_type, quantization_config("int8"))
    recurrent = plan.recurrent_activations
    if plan.keep_recurrent_on_cpu:
        recurrent_config = None  # float, on the CPU
    elif recurrent is not None:  # the recurrent layers' region in its own precision
        recurrent_config = quantization_config(recurrent)
    else:
        return quantizer
    for module_type in MODULE_TYPES:
        quantizer.set_module_type(module_type, recurrent_config)
    return quantizer
