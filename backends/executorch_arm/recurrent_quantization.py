"""Quantization that suits recurrences, as a thin wrapper around ExecuTorch's Arm quantizer.

A streaming recurrent model takes its hidden state in (h0) and returns the next one (h_n); the
caller feeds h_n back as h0 at the next frame. If h0 and h_n carry different quantization
parameters, every frame requantizes the state (round to another grid) and the error drifts.
`RecurrentStateQuantizer` lets the Arm quantizer annotate as usual, then gives each h_n the
same quantization as its h0 (`SharedQuantizationSpec`: one observer sees both during
calibration), so dequantize(h_n) fed back quantizes to exactly the same integers.

With `keep_recurrent_on_cpu` it instead leaves recurrent layers in float: they run on the CPU
in fp32 (no state quantization at all), and only the delegated rest is quantized.

Use through `arm_hooks.quantizer_factory(...)`, which `flow.lower(quantizer_factory=...)`
accepts; the activation precision is the flow's (`flow.lower(activations="int16")` sets
ExecuTorch's a16w8 config through `set_global`, which this wrapper passes on unchanged).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import (
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

from . import fallback
from .decompose import LAYER_OPS, SEQUENCE_OPS

_Q_KEY = "quantization_annotation"


def state_pairs(graph: torch.fx.Graph) -> list[tuple[str, int]]:
    """(initial state placeholder name, program output index of the final state) for each
    state (h, and c of an LSTM) of a recurrent op that is a program input and whose final value
    is a program output."""
    outputs = list(graph.output_node().args[0])
    pairs = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in LAYER_OPS:  # (x, initial_h, initial_c, ...)
            states = [node.args[1], node.args[2]]
        elif node.target in SEQUENCE_OPS:  # (input, hx, ...): hx is [h, c] for an LSTM
            hx = node.args[1]
            states = hx if isinstance(hx, (list, tuple)) else [hx]
        else:
            continue
        for k, state in enumerate(states):
            if not (isinstance(state, Node) and state.op == "placeholder"):
                continue
            for user in node.users:
                if user.target is operator.getitem and user.args[1] == k + 1:
                    pairs += [(state.name, i) for i, o in enumerate(outputs) if o is user]
    return pairs


class RecurrentStateQuantizer(Quantizer):
    """Wraps an Arm quantizer: float recurrent layers on request, h_n shares h0's qparams."""

    def __init__(
        self,
        base: Quantizer,
        keep_recurrent_on_cpu: bool = False,
        share_state: bool = True,
    ):
        super().__init__()
        self.base = base
        self.keep_recurrent_on_cpu = keep_recurrent_on_cpu
        self.share_state = share_state
        self.pairs: list[tuple[str, int]] = []  # found by transform_for_annotation
        self.shared: list[tuple[str, str]] = []  # (h0, h_n producer) annotated as shared
        if keep_recurrent_on_cpu:  # (the base's ArmPlan unrolls such layers: plan.py)
            for module_type in fallback.RECURRENT_MODULES:
                base.set_module_type(module_type, None)

    def set_global(self, quantization_config):
        self.base.set_global(quantization_config)
        return self

    def set_io(self, quantization_config):
        self.base.set_io(quantization_config)
        return self

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        self.pairs = state_pairs(model.graph)  # before the recurrent ops are decomposed
        return self.base.transform_for_annotation(model)

    def annotate(self, model: GraphModule) -> GraphModule:
        model = self.base.annotate(model)
        if self.keep_recurrent_on_cpu:
            _float_recurrent_layers(model.graph)
        elif self.share_state:
            self.shared = _share_state(model.graph, self.pairs)
        return model

    def validate(self, model: GraphModule) -> None:
        self.base.validate(model)


def _float_recurrent_layers(graph: torch.fx.Graph) -> None:
    """Drop every annotation that would quantize a value inside a float recurrent layer: its
    own nodes (shape ops the shared-qspec pass reached), program inputs read only by it (x,
    h0) and program outputs it produces (h_n). The edges into delegated consumers keep theirs:
    that is the quantize at the delegate boundary."""
    for node in graph.nodes:
        if node.op == "call_function" and fallback.recurrent_layer_of(node) is not None:
            node.meta.pop(_Q_KEY, None)
        elif node.op == "placeholder" and node.users:
            if all(fallback.recurrent_layer_of(u) is not None for u in node.users):
                node.meta.pop(_Q_KEY, None)
        elif node.op == "output" and _Q_KEY in node.meta:
            inputs = node.meta[_Q_KEY].input_qspec_map
            for producer in list(inputs):
                if fallback.recurrent_layer_of(producer) is not None:
                    del inputs[producer]


# Ops whose output keeps their input's quantization (the Arm quantizer shares it): TOSA
# lowers them without a rescale, moving values (shape ops) or clamping them (relu, as a
# CLAMP at the zero point). A state output computed by one shares its qparams from the op
# before it.
_KEEPS_QPARAMS = {
    torch.ops.aten.permute.default,
    torch.ops.aten.view.default,
    torch.ops.aten.reshape.default,
    torch.ops.aten.squeeze.dims,
    torch.ops.aten.squeeze.dim,
    torch.ops.aten.unsqueeze.default,
    torch.ops.aten.transpose.int,
    torch.ops.aten.clone.default,
    torch.ops.aten.relu.default,
    torch.ops.aten.relu_.default,
    torch.ops.aten.hardtanh.default,
    torch.ops.aten.hardtanh_.default,
}


def _qparams_source(node):
    """The node whose quantization `node` has (skipping permutes, views, squeezes, relus)."""
    while isinstance(node, Node) and node.op == "call_function" and node.target in _KEEPS_QPARAMS:
        node = node.args[0]
    return node


def _share_state(graph: torch.fx.Graph, pairs: list[tuple[str, int]]) -> list[tuple[str, str]]:
    placeholders = {n.name: n for n in graph.find_nodes(op="placeholder")}
    outputs = list(graph.output_node().args[0])
    shared = []
    for h0_name, index in pairs:
        h0, h_n = placeholders.get(h0_name), _qparams_source(outputs[index])
        annotation = h_n.meta.get(_Q_KEY) if isinstance(h_n, Node) else None
        if h0 is None or annotation is None or _Q_KEY not in h0.meta:
            continue  # not quantized (e.g. left in float): nothing to share
        annotation.output_qspec = SharedQuantizationSpec(h0)
        shared.append((h0.name, h_n.name))
    return shared


def clip_by_range(graph: torch.fx.Graph) -> None:
    """An int16 symmetric clamp (ONNX clip) whose input is read by it alone: that input
    quantized to exactly [-clip, clip], so saturation clips and the clamp is the identity
    (clamp_table drops it). A clamp left in an int16 program keeps the sigmoid/tanh TABLE
    after it from fusing into the add before it (Vela), and an int16 TABLE cannot take the
    clamp in (it interpolates between entries 128 codes apart)."""
    for clamp in graph.find_nodes(op="call_function", target=torch.ops.aten.clamp.default):
        source, lo, hi = (list(clamp.args) + [None, None])[:3]
        annotation = source.meta.get(_Q_KEY) if isinstance(source, Node) else None
        if annotation is None or len(source.users) != 1 or _Q_KEY not in clamp.meta:
            continue
        output = annotation.output_qspec
        if not (isinstance(hi, (int, float)) and hi > 0 and lo == -hi):
            continue
        if not isinstance(output, QuantizationSpec) or output.dtype != torch.int16:
            continue  # int8 (clamp_table folds it), or a range shared with another value
        qmax = torch.iinfo(torch.int16).max
        fixed = FixedQParamsQuantizationSpec(
            dtype=torch.int16,
            scale=float(hi) / qmax,
            zero_point=0,
            quant_min=-qmax,
            quant_max=qmax,
            qscheme=torch.per_tensor_symmetric,
        )
        annotation.output_qspec = fixed
        clamp.meta[_Q_KEY].input_qspec_map[source] = fixed
        for user in clamp.users:  # the activation reads the clamp's quantization as is
            user_annotation = user.meta.get(_Q_KEY)
            if user_annotation is not None and clamp in user_annotation.input_qspec_map:
                user_annotation.input_qspec_map[clamp] = SharedQuantizationSpec(clamp)
