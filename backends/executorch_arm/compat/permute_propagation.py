"""ExecuTorch's permute propagation with the shapes between its rounds updated in place.

ExecuTorch's Arm backend moves each permute and view through the elementwise ops around it
until they cancel (PropagateViewCopyPermuteDown/UpPass). After every round it retraces the
whole graph to refresh the shapes it reads (`meta["val"]`), and a round moves few nodes
when the graph is a long chain: GTCRN (3,500 edge nodes, ethos-u85-256, int8) took 83
retraces, 127 of the 187 s of its backend passes.

The passes here are ExecuTorch's, subclassed: the same rounds and decisions, but between
rounds only the nodes whose arguments or inputs changed get their fake value recomputed,
and the graph is retraced once at the end. Inserted before ExecuTorch's own two passes
(through its pass-insertion hook), they leave those a graph with nothing to move. The
program is the same (tests/executorch_arm/test_permute_propagation.py).
"""

from __future__ import annotations

import torch
from executorch.backends.arm._passes.arm_pass_manager import (
    PropagateViewCopyPermuteDownPass,
    PropagateViewCopyPermuteUpPass,
)
from executorch.backends.transforms.propagate_view_copy_permute_pass import (
    PropagateViewCopyPermutePass,
)
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch.fx import GraphModule, Node
from torch.fx.node import map_aggregate, map_arg
from torch.fx.passes.infra.pass_base import PassResult

from .edge_ops import edge

# ArmPass.call_operator keeps the old value of these when quantized (no fake kernel)
_NO_QUANTIZED_FAKE = {edge.aten.bmm.default, edge.aten.leaky_relu.default}


def _signature(node: Node):
    return (
        node.target,
        map_aggregate(node.args, lambda a: a),
        map_aggregate(node.kwargs, lambda a: a),
    )


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b


class _InPlaceRounds:
    """`_retrace` refreshes changed nodes' values in place; `call` retraces once at the end."""

    def call(self, graph_module: GraphModule) -> PassResult:
        self._signatures = {n: _signature(n) for n in graph_module.graph.nodes}
        result = super().call(graph_module)
        graph_module = result.graph_module
        if result.modified:  # the retrace ExecuTorch's pass ends with
            graph_module = PropagateViewCopyPermutePass._retrace(self, graph_module)
        return PassResult(graph_module, result.modified)

    def _retrace(self, graph_module: GraphModule) -> GraphModule:
        graph_module.graph.eliminate_dead_code()
        graph_module.graph.lint()
        try:
            self._refresh(graph_module)
        except Exception:  # a value this cannot recompute: the whole retrace
            graph_module = PropagateViewCopyPermutePass._retrace(self, graph_module)
            self._signatures = {n: _signature(n) for n in graph_module.graph.nodes}
        return graph_module

    def _refresh(self, graph_module: GraphModule) -> None:
        nodes = list(graph_module.graph.nodes)
        fake_mode = detect_fake_mode([n.meta.get("val") for n in nodes if n.op == "placeholder"])
        changed: set = set()
        with fake_mode, enable_python_dispatcher():
            for node in nodes:
                signature = _signature(node)
                if node.op != "call_function" or (
                    self._signatures.get(node) == signature
                    and not any(a in changed for a in node.all_input_nodes)
                ):
                    self._signatures[node] = signature
                    continue
                old = node.meta.get("val")
                new = self._value(node)
                node.meta["val"] = new
                self._signatures[node] = signature
                if not _same(old, new):
                    changed.add(node)

    @staticmethod
    def _value(node: Node):
        if node.target in _NO_QUANTIZED_FAKE and node.meta.get("input_qparams"):
            raise NotImplementedError(node.target)  # ArmPass keeps its old value: retrace
        args = map_arg(node.args, lambda n: n.meta["val"])
        kwargs = map_arg(node.kwargs, lambda n: n.meta["val"])
        return node.target(*args, **kwargs)


class InPlaceDownPass(_InPlaceRounds, PropagateViewCopyPermuteDownPass):
    pass


class InPlaceUpPass(_InPlaceRounds, PropagateViewCopyPermuteUpPass):
    pass


def insertions() -> list:
    """Each before ExecuTorch's own. They take the program they run on from the pass
    manager (its `exported_program` attribute is set for each call)."""
    return [
        (PropagateViewCopyPermuteDownPass, [InPlaceDownPass(None, None)]),
        (PropagateViewCopyPermuteUpPass, [InPlaceUpPass(None, None)]),
    ]
