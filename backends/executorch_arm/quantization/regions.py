"""Where int16 recurrent layers meet an int8 rest: rescale after the data moves, not before.

With `ArmPlan.recurrent_activations` the Arm quantizer gives the recurrent layers' nodes
their own config (set_module_type), and every edge between the two precisions becomes a
dequantize-quantize pair: a TOSA RESCALE of the whole tensor, which Vela charges about 2 to
4 cycles an element on Ethos-U55 (crnn, ethos-u55-128: 16,152 cycles for the GRU's
7,840-element input, 13,032 for its 3,136-element output; the whole model is 824,563).
The Arm quantizer annotates the data-movement ops after a layer (permute, select, slice,
view) with the rest's int8, so the rescale covers the layer's whole output even when only
its last step is read. After annotation they keep the layer's int16 instead, and the
rescale lands on the first compute op, whose input is often smaller (crnn's head: 64
elements). The input side stays a rescale: ExecuTorch 1.5.1's passes model a product's
output dtype on its input's, so a product cannot read int8 and write int16.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec

from ..emission.origin import layer_of
from ..precision.cost_model import MOVES

_Q_KEY = "quantization_annotation"
aten = torch.ops.aten

# Ops that move values without arithmetic (TOSA lowers them without a rescale): the cost
# model's, and the selects and slices that read part of a layer's output.
_MOVES = MOVES | {aten.select.int, aten.slice.Tensor}
_FLAG = "recurrent_precision_kept"  # a move kept in its recurrent layer's int16


def _inside(node) -> bool:
    return isinstance(node, Node) and layer_of(node) is not None


def _is_int16(node: Node) -> bool:
    if node.meta.get(_FLAG):
        return True
    annotation = node.meta.get(_Q_KEY)
    spec = getattr(annotation, "output_qspec", None)
    return _inside(node) and getattr(spec, "dtype", None) == torch.int16


def _narrows(annotation, data: Node) -> bool:
    """Whether the annotation quantizes `data` to fewer than 16 bits on the way in."""
    dtype = getattr(annotation.input_qspec_map[data], "dtype", None)
    return dtype is not None and dtype != torch.int16


def fold_boundaries(graph: Graph) -> int:
    """Keep int16 through the data-movement ops after a recurrent layer; returns how many."""
    folded = 0
    for node in graph.nodes:
        annotation = node.meta.get(_Q_KEY)
        if annotation is None or node.op != "call_function":
            continue
        data = node.args[0] if node.args else None
        if not isinstance(data, Node) or data not in annotation.input_qspec_map:
            continue
        if node.target in _MOVES and _is_int16(data) and _narrows(annotation, data):
            node.meta[_Q_KEY] = QuantizationAnnotation(
                input_qspec_map={data: SharedQuantizationSpec(data)},
                output_qspec=SharedQuantizationSpec(data),
                _annotated=True,
            )
            node.meta[_FLAG] = True
            folded += 1
    return folded
