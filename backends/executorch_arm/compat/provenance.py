"""Keep torch.fx provenance records from taking over ExecuTorch's Arm backend pipeline.

Each retrace of a graph records in every new node where it came from, `node.meta
["from_node"]`: a NodeSource holding a deep copy of the old node's record. Records grow as
passes rewrite and merge nodes, and the Arm backend retraces a few hundred times (its
permute propagation once per moved permute), so the copies come to cost as much as the
passes. GTCRN (3,000 edge nodes) to ethos-u85-256 in int8, `partition and lower`: 370 s as
ExecuTorch runs it (permute propagation 169 s), 258 s with this module's drops (103 s), 253 s
dropping before every pass, 260 s never copying (each pass timed; another
lowering ran beside the first).

Nothing on our path reads the records (ExecuTorch's Arm debug dump does; we do not ask for
it). `insertions` gives, for ExecuTorch's pass-insertion hook, a pass that drops them
before each of a dozen passes spread through the backend pipeline.
"""

from __future__ import annotations

from typing import Set, Type

from executorch.backends.arm._passes import arm_pass_manager as apm
from executorch.backends.arm._passes.arm_pass import ArmPass
from executorch.exir.pass_base import ExportPass
from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

# Passes of ArmPassManager's TOSA pipeline (INT and FP, every spec) the drop runs before:
# its first, then every dozen passes or so, and each retrace-heavy one.
ANCHORS = (
    apm.NormalizeDelegateIOLayoutPass,
    apm.FoldAndAnnotateQParamsPass,
    apm.DecomposeSqrtPass,
    apm.DecomposeGroupedConvPass,
    apm.ReplaceScalarWithTensorByProfilePass,
    apm.DecomposeDivTensorModePass,
    apm.ComputeConstantOpsAOTPass,
    apm.RemoveNoopPass,
    apm.PropagateViewCopyPermuteDownPass,
    apm.PropagateViewCopyPermuteUpPass,
    apm.ExirToTosaPass,
)


class DropProvenancePass(ArmPass):
    """Delete every node's `from_node` record; no retrace."""

    _passes_required_after: Set[Type[ExportPass]] = set()

    def call(self, graph_module: GraphModule) -> PassResult:
        for module in graph_module.modules():
            if isinstance(module, GraphModule):
                for node in module.graph.nodes:
                    node.meta.pop("from_node", None)
        return PassResult(graph_module, False)


def insertions() -> list:
    """(anchor, [the drop]) for each anchor."""
    drop = DropProvenancePass()
    return [(anchor, [drop]) for anchor in ANCHORS]
