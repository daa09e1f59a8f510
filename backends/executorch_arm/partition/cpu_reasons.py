"""Which nodes stay on the CPU, and why: recurrent layers kept off the NPU, and their reasons.

A recurrent layer kept on the CPU is still decomposed by our core (ExecuTorch's portable
runtime has no `aten::gru` kernel), so it is recognised by what the fx builder tagged every
emitted node with (emission.origin), which `to_edge`'s decompositions carry over.

  KeepRecurrentOnCpu       an operator-support check for the partitioner's `additional_checks`:
                           rejects nodes of recurrent layers;
  StatePartsOnCpu          another: rejects a packed state's reads and assembly;
  cpu_reasons              why each node left outside a delegate is there, counted per reason;
  recurrent_on_cpu         per recurrent layer, how many of its ops ended outside a delegate;
  delegate_boundaries      per delegate, the quantization of the values entering and leaving it
                           (the q/dq nodes left on the CPU), so a mixed program's delegate can be
                           run alone on the TOSA reference model with float inputs.
"""

from __future__ import annotations

import collections
from typing import Mapping

import torch
from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase

from recurrent_lowering.runtime.delegate_run import Boundary, BoundaryValue

from ..edge_io import quant_params
from ..emission.origin import layer_of
from ..quantization.state_parts import is_state_part

KEPT_ON_CPU = "recurrent layer kept on CPU (--keep_recurrent_on_cpu)"
QDQ_AT_BOUNDARY = "q/dq at delegate boundary"
QDQ_ON_CPU = "q/dq around CPU ops"
STATE_PARTS = "a packed stream state's slices and concatenation (each part at its own scale)"
PASS_THROUGH = "moves of a delegate's input to its outputs (Vela takes no output that is an input)"
PASS_THROUGH_KEY = "recurrent_lowering_pass_through"  # node.meta: partitioner untagged it


class KeepRecurrentOnCpu(OperatorSupportBase):
    """Negative support check: nodes computing a recurrent layer are not delegated."""

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
        return layer_of(node) is None


class StatePartsOnCpu(OperatorSupportBase):
    """Negative support check: a packed state's reads and assembly stay on the CPU in float
    (quantization.state_parts), where each part is quantized on its own."""

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
        return not is_state_part(node)


def _is_qdq(node: Node) -> bool:
    name = str(node.target)
    return "quantize_per_tensor" in name or "quantize_per_channel" in name


def _op_name(node: Node) -> str:
    name = str(getattr(node.target, "__name__", node.target))
    return name.replace("aten.", "").replace("dim_order_ops.", "")


def cpu_reasons(
    graph: torch.fx.Graph, keep_recurrent_on_cpu: bool, target: str
) -> collections.Counter:
    """Reason -> count for the call_function nodes of a tagged edge graph that carry no
    `delegation_tag` (so run on the CPU). getitem nodes are bookkeeping and not counted."""
    reasons: collections.Counter = collections.Counter()
    for node in graph.nodes:
        if node.op != "call_function" or "delegation_tag" in node.meta:
            continue
        if _op_name(node) == "getitem":
            continue
        if _is_qdq(node):
            neighbours = [*node.all_input_nodes, *node.users]
            at_boundary = any("delegation_tag" in n.meta for n in neighbours)
            reason = QDQ_AT_BOUNDARY if at_boundary else QDQ_ON_CPU
        elif keep_recurrent_on_cpu and layer_of(node) is not None:
            reason = KEPT_ON_CPU
        elif is_state_part(node):
            reason = STATE_PARTS
        elif node.meta.get(PASS_THROUGH_KEY):
            reason = PASS_THROUGH
        else:
            reason = f"{_op_name(node)} not supported on {target}"
        reasons[reason] += 1
    return reasons


def recurrent_on_cpu(graph: torch.fx.Graph) -> collections.Counter:
    """Recurrent layer -> count of its ops (q/dq and getitem aside) that carry no
    `delegation_tag`: a layer the NPU cannot run whole, which the user did not ask to keep
    on the CPU, is worth a warning (its steps then cross the delegate boundary)."""
    layers: collections.Counter = collections.Counter()
    for node in graph.nodes:
        if node.op != "call_function" or "delegation_tag" in node.meta:
            continue
        if _op_name(node) == "getitem" or _is_qdq(node):
            continue
        layer = layer_of(node)
        if layer is not None:
            layers[layer] += 1
    return layers


def _shape(node: Node) -> tuple:
    return tuple(int(d) for d in node.meta["val"].shape)


def delegate_boundaries(graph: torch.fx.Graph) -> dict:
    """tag -> Boundary of a tagged edge graph (after partitioning, before lowering)."""
    boundaries: dict = {}
    for node in graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag is None or node.op != "call_function":
            continue
        b = boundaries.setdefault(tag, Boundary([], []))
        for producer in node.all_input_nodes:
            if producer.meta.get("delegation_tag") == tag:
                continue
            if any(v.name == producer.name for v in b.inputs):
                continue
            quant = (
                quant_params(producer) if "quantize_per_tensor" in str(producer.target) else None
            )
            b.inputs.append(BoundaryValue(producer.name, _shape(producer), quant))
        outside = [u for u in node.users if u.meta.get("delegation_tag") != tag]
        if outside:
            dq = [u for u in outside if "dequantize_per_tensor" in str(u.target)]
            quant = quant_params(dq[0]) if dq and len(dq) == len(outside) else None
            b.outputs.append(BoundaryValue(node.name, _shape(node), quant))
    return boundaries
