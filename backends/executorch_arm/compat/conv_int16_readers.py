"""On Ethos-U55/U65 an int16 convolution's accumulator has one reader: its int16 output.

ExecuTorch 1.5.1's RewriteConvPass reads an a16w8 convolution's INT48 accumulator once per
kind of consumer: a RESCALE to its int16 output and, for consumers that take int32 (the
int32 rescale before a MUL or ADD), a RESCALE straight to INT32 (the two scales combined,
or through a permute the convolution's alone). Vela 5.1.0 runs such a convolution on U55
only when one RESCALE reads it, fused as its output: with two readers ("y * y + y") it
stops, "Non-passthrough operation (Conv2D) could not run on NPU" (GTCRN's rest in int16);
ethos-u85 takes it (tests/executorch_arm/test_conv_int16_readers.py).

On a U55 subset, a convolution with more than one reader is given the form of any other
int16 producer: one RESCALE to int16, and each int32 consumer's own int16 -> int32 rescale
after it. `RecordInt32ReadersPass` (before RewriteConvPass) keeps each int32 consumer's
scales, which RewriteConvPass overwrites with the combined ones; `OneReaderPass` (after it)
rebuilds the form. Elsewhere both do nothing.
"""

from __future__ import annotations

from typing import Set, Type

import torch
from executorch.backends.arm._passes import arm_pass_manager as apm
from executorch.backends.arm._passes.arm_pass import ArmPass
from executorch.backends.arm._passes.arm_pass_utils import create_node
from executorch.backends.arm.tosa.mapping import TosaSpecialDtype
from executorch.backends.arm.tosa.specification import get_context_spec
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult

from .edge_ops import edge

_RESCALE = exir_ops.backend.tosa.RESCALE.default
_CONVS = {
    exir_ops.backend.tosa.CONV2D.default,
    exir_ops.backend.tosa.DEPTHWISE_CONV2D.default,
    exir_ops.backend.tosa.TRANSPOSE_CONV2D.default,
    exir_ops.backend.tosa.CONV3D.default,
}
_KEY = "recurrent_lowering_int32_reader"  # (scales, input zero point) before the rewrite


def _u55() -> bool:
    return get_context_spec().is_U55_subset


def _is_rescale_to(node: Node, dtype) -> bool:
    return node.op == "call_function" and node.target == _RESCALE and node.args[1] is dtype


def _reads_int16(conv: Node) -> bool:
    x = conv.args[0]
    return isinstance(x, Node) and getattr(x.meta.get("val"), "dtype", None) == torch.int16


class RecordInt32ReadersPass(ArmPass):
    """Before RewriteConvPass: note the scales of each int32 rescale reading an int16
    convolution, directly or through one permute; no retrace."""

    _passes_required_after: Set[Type[ExportPass]] = set()

    def call(self, graph_module: GraphModule) -> PassResult:
        if not _u55():
            return PassResult(graph_module, False)
        for conv in graph_module.graph.find_nodes(
            op="call_function", target=edge.aten.convolution.default
        ):
            if not _reads_int16(conv):
                continue
            readers = list(conv.users)
            readers += [
                u for p in conv.users if p.target == edge.aten.permute_copy.default for u in p.users
            ]
            for reader in readers:
                if _is_rescale_to(reader, torch.int32):
                    reader.meta[_KEY] = (list(reader.args[2]), reader.args[3])
        return PassResult(graph_module, False)


class OneReaderPass(ArmPass):
    """After RewriteConvPass: an int16 convolution read by several RESCALEs gets one, to
    int16, and each int32 reader becomes that value's own rescale to int32."""

    _passes_required_after: Set[Type[ExportPass]] = set()

    def call(self, graph_module: GraphModule) -> PassResult:
        if not _u55():
            return PassResult(graph_module, False)
        modified = False
        for node in list(graph_module.graph.nodes):
            if node.op == "call_function" and node.target in _CONVS:
                modified |= self._one_reader(graph_module, node)
        if not modified:
            return PassResult(graph_module, False)
        graph_module.recompile()
        return super().call(graph_module)  # retrace: the readers' types and values

    def _one_reader(self, graph_module: GraphModule, conv: Node) -> bool:
        if conv.meta.get(TosaSpecialDtype.meta_key()) != TosaSpecialDtype.INT48:
            return False
        readers = [r for r in conv.users if r.target == _RESCALE]
        if len(readers) < 2 or len(readers) != len(conv.users):
            return False
        narrow = next((r for r in readers if r.args[1] is torch.int16), None)
        scales = _conv_scales(readers, narrow)
        if scales is None:
            return False  # nothing to rebuild the int16 output from: left as it is
        zero_point = narrow.args[4] if narrow is not None else 0
        if narrow is None:
            with graph_module.graph.inserting_after(conv):
                narrow = create_node(
                    graph_module.graph, _RESCALE, (conv, torch.int16, scales, 0, 0), from_node=conv
                )
            narrow.meta.pop(TosaSpecialDtype.meta_key(), None)  # the conv's INT48, copied
            narrow.meta["val"] = _RESCALE(conv.meta["val"], torch.int16, scales, 0, 0)
        for reader in readers:
            if reader is narrow:
                continue
            recorded = reader.meta.get(_KEY)
            if recorded is not None:  # a direct int32 reader: its own scales, from int16
                user_scales, _ = recorded
                reader.args = (narrow, torch.int32, user_scales, zero_point, reader.args[4])
            else:  # a widened branch (into a permute): the int16 output itself
                reader.replace_all_uses_with(narrow)
                graph_module.graph.erase_node(reader)
        return True


def _conv_scales(readers: list, narrow) -> "list | None":
    """The convolution's own output scales: its int16 rescale's, a widened branch's (the
    same), or a direct int32 reader's combined scales over the reader's own."""
    if narrow is not None:
        return list(narrow.args[2])
    for reader in readers:
        recorded = reader.meta.get(_KEY)
        if recorded is None:
            return list(reader.args[2])  # widened: the convolution's scales
    for reader in readers:
        user_scales, _ = reader.meta[_KEY]
        combined = list(reader.args[2])
        if len(user_scales) == 1:
            return [c / user_scales[0] for c in combined]
    return None


def insertions() -> list:
    """(anchor, [pass]): the record before RewriteConvPass, the rebuild right after it."""
    return [
        (apm.RewriteConvPass, [RecordInt32ReadersPass()]),
        (apm.RewriteMXFPConv2dPass, [OneReaderPass()]),
    ]
