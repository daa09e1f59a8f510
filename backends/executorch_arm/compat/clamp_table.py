"""Fold an int8 clamp into the TOSA TABLE of the activation that reads it; drop an identity one.

ONNX `clip` puts a clamp before each gate activation. Vela fuses the clamp into the add
before it, and then the sigmoid/tanh TABLE no longer fuses and runs as an operation of its
own: a GRU with clip=3 costs 1.33x the plain GRU's cycles on ethos-u85-256 (int8, I=64,
H=128, T=50: Table 440 -> 53,808 cycles, docs/results/variant_ops.md).

ExecuTorch's quantizer gives a clamp its input's quantization, so in int8 it maps codes to
codes and table[clamp(code)] is one 256-entry table. ExecuTorch builds an int8 table over
the codes clamped to the input's [qmin, qmax] (InsertTableOpsPass.
generate_8bit_table_values), so narrowing the activation's input qmin/qmax to the clamp's
bounds, and reading the clamp's input directly, gives that table: the outputs are the
same integers, one operation fewer. An int16 table interpolates between 513 entries, where
a clamp is not exact: there the quantizer gives a symmetric clamp's input exactly the clip
range (recurrent_quantization.clip_by_range), and the clamp, then the identity, is dropped.
"""

from __future__ import annotations

from typing import Set, Type

import torch
from executorch.backends.arm._passes import arm_pass_manager as apm
from executorch.backends.arm._passes.arm_pass import ArmPass
from executorch.backends.arm._passes.insert_table_ops import TableOps
from executorch.exir.pass_base import ExportPass
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult

from .edge_ops import edge

_CLAMP = edge.aten.clamp.default


def _qargs(node: Node, key: str):
    qparams = node.meta.get(key, {})
    if len(qparams) != 1:
        return None
    (q,) = qparams.values()
    return None if q.per_channel else q


def _bounds(clamp: Node) -> tuple:
    """(lo, hi) of a clamp, codes after QuantizeClampArgumentsPass; None where unbounded."""
    lo, hi = (list(clamp.args[1:]) + [None, None])[:2]
    return lo, hi


class DropIdentityClampPass(ArmPass):
    """Bypass a quantized clamp whose bounds cover its codes' whole range: the identity
    (recurrent_quantization quantizes an int16 clip's input to the clip range)."""

    _passes_required_after: Set[Type[ExportPass]] = set()

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for clamp in list(graph_module.graph.find_nodes(op="call_function", target=_CLAMP)):
            q_in, q_out = _qargs(clamp, "input_qparams"), _qargs(clamp, "output_qparams")
            if q_in is None or q_in != q_out:
                continue
            lo, hi = _bounds(clamp)
            if (lo is None or int(lo) <= q_in.qmin) and (hi is None or int(hi) >= q_in.qmax):
                clamp.replace_all_uses_with(clamp.args[0])
                graph_module.graph.erase_node(clamp)
                modified = True
        if modified:
            graph_module.recompile()
        return PassResult(graph_module, modified)


class FoldClampIntoTablePass(ArmPass):
    """Bypass an int8 clamp whose one user becomes a TABLE; narrow that user's input range.

    Runs before InsertTableOpsPass, after QuantizeClampArgumentsPass has made the clamp's
    bounds codes."""

    _passes_required_after: Set[Type[ExportPass]] = set()

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for node in list(graph_module.graph.nodes):
            if node.op != "call_function" or node.target not in TableOps.unary_table_ops:
                continue
            clamp = node.args[0]
            if not isinstance(clamp, Node) or clamp.target != _CLAMP or len(clamp.users) != 1:
                continue
            q_act = _qargs(node, "input_qparams")
            q_in, q_out = _qargs(clamp, "input_qparams"), _qargs(clamp, "output_qparams")
            if q_act is None or q_act.dtype != torch.int8 or not q_act == q_in == q_out:
                continue  # not int8, or the clamp rescales
            lo, hi = _bounds(clamp)
            narrowed = q_act._replace(
                qmin=q_act.qmin if lo is None else max(q_act.qmin, int(lo)),
                qmax=q_act.qmax if hi is None else min(q_act.qmax, int(hi)),
            )
            node.meta["input_qparams"] = {0: narrowed}
            node.replace_input_with(clamp, clamp.args[0])
            graph_module.graph.erase_node(clamp)
            modified = True
        if modified:
            graph_module.recompile()
        return PassResult(graph_module, modified)


def insertions() -> list:
    """The fold and the identity drop, before ExecuTorch's InsertTableOpsPass."""
    return [(apm.InsertTableOpsPass, [DropIdentityClampPass(), FoldClampIntoTablePass()])]
