"""Weights in two int8 parts: about 15-bit weights on an NPU whose weights are 8-bit.

Ethos-U's weights are int8 in every precision (int16 is a16w8), and on streams that feed
their state back 8-bit weights alone cap the state (silero-vad's at 24.5 dB, madmom's BGRU's
main output at 16.6 dB with every activation in float; docs/results/real_model_accuracy.md).
A product with weight W becomes two products of the same input, summed:

    W = hi + lo,  hi = s * round(W / s)  (s = max|W| / qmax per output channel)

with qmax the quantizer's own weight range (127: ExecuTorch's symmetric int8 weights), so
`hi` lies on the very grid the Arm quantizer's per-channel min-max observer gives W and
quantizes exactly; `lo`, at most s / 2 per channel, gets its own grid 254 times finer or more.
What is left of a weight's error is lo's rounding, under 1/508 of W's step. The cost is a
second product of the same shape (its MACs and its weight bytes) and an ADD.

Applied before annotation (quantizer.transform_for_annotation, and a loop's step in
loop.step), to every linear and convolution whose weight is a constant of the graph. A
recurrent step's MATMUL on Ethos-U85 (plan.step_product) reads R as a feature map, in int16
already, and stays whole.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten
_PRODUCTS = (aten.linear.default, aten.conv1d.default, aten.conv2d.default)


def parts(weight: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo): hi on the per-output-channel grid max|W| / qmax, lo = W - hi."""
    flat = weight.detach().reshape(weight.shape[0], -1)
    scale = flat.abs().amax(dim=1) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scale = scale.reshape(-1, *([1] * (weight.dim() - 1)))
    hi = torch.round(weight.detach() / scale) * scale
    return hi, weight.detach() - hi


def constant(gm: GraphModule, node) -> "torch.Tensor | None":
    """The tensor a get_attr `node` of `gm` reads; None for anything else."""
    if not isinstance(node, Node) or node.op != "get_attr":
        return None
    value = gm
    for name in node.target.split("."):
        value = getattr(value, name, None)
    return value if isinstance(value, torch.Tensor) else None


def _attr(gm: GraphModule, like: Node, name: str, value: torch.Tensor) -> Node:
    gm.register_buffer(name, value.contiguous())
    node = gm.graph.get_attr(name)
    node.meta.update(like.meta)  # shape and dtype are W's (the annotators read "val")
    return node


def split(gm: GraphModule, qmax: int, skip=lambda node: False) -> int:
    """Every linear and conv1d/conv2d of `gm` with a constant weight, but those `skip`
    names, as the sum of its hi and lo products (the bias with hi's), hi on the grid of
    symmetric weights in [-qmax, qmax]; returns how many.
    Products of weights that are exact on their grid already (lo all zero) stay whole."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _PRODUCTS or skip(node):
            continue
        weight_node = node.args[1]
        weight = constant(gm, weight_node)
        if weight is None or not weight.is_floating_point():
            continue
        hi, lo = parts(weight, qmax)
        if not torch.any(lo):
            continue
        rest = list(node.args[2:])
        graph = gm.graph
        with graph.inserting_before(node):
            hi_w = _attr(gm, weight_node, f"_weight_hi_{count}_{node.name}", hi)
            lo_w = _attr(gm, weight_node, f"_weight_lo_{count}_{node.name}", lo)
            first = graph.call_function(node.target, (node.args[0], hi_w, *rest), node.kwargs)
            if rest:
                rest[0] = None  # the bias once, with hi
            second = graph.call_function(node.target, (node.args[0], lo_w, *rest), node.kwargs)
            total = graph.call_function(aten.add.Tensor, (first, second))
        for made in (first, second, total):
            made.meta.update(node.meta)
        node.replace_all_uses_with(total)
        graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
