"""A magnitude sqrt(a*a + b*b), or sqrt(a*a + b*b + e), in int16, computed over two ranges.

A spectrum's magnitude (silero-vad's STFT) squares values whose range spans decades: in
int16, the sum of squares keeps its small values to a few codes, and the square root, a
513-entry TABLE over the sum's range, interpolates linearly where sqrt is steepest. The
quiet bins of silence and noise, which carry a VAD's decision, are the ones lost: on
silero-vad, the sum quantized symmetrically (TOSA's int16 has no zero point) alone costs
8 dB on the fed-back state (docs/results/real_model_accuracy.md).

So the magnitude is computed as sqrt(max(s, t)) + sqrt(min(s, t)) - sqrt(t), with t a
fraction (`FINE`) of the sum's largest value in calibration: the first square root reads
the sum as before, clamped below at t, where its table is fine; the second reads the sum
recomputed from the squares of its terms clamped to [-√t, √t], saturated at t by a
quantization to [-t, t] (clip.clip_by_range: a symmetric clamp whose input it alone
reads; so are the squares and the second root, ranges no calibration floor coarsens),
so small sums get codes about 1 / FINE times finer, and its own table over [0, t]. Six
more elementwise ops and a table, on the spectrum's size, not the model's.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

FINE = 1 / 256  # t, as a share of the sum's largest calibrated value (see split)
_ABOVE = "recurrent_lowering_magnitude_above"  # max(s, t): its readers take its range
_Q_KEY = "quantization_annotation"

_aten = torch.ops.aten


def _square_of(node) -> Node | None:
    """x when `node` is x * x."""
    if isinstance(node, Node) and node.target == _aten.mul.Tensor:
        a, b = node.args[:2]
        if a is b and isinstance(a, Node):
            return a
    return None


def _plain_add(node) -> bool:
    """`node` is a + b (no alpha)."""
    return (
        isinstance(node, Node)
        and node.target == _aten.add.Tensor
        and len(node.args) == 2
        and not node.kwargs
    )


def _sum_of_squares(node) -> bool:
    return _plain_add(node) and all(_square_of(s) is not None for s in node.args)


def _offset(node) -> float | None:
    """The value of a scalar constant (a number, or a one-element tensor attribute)."""
    if isinstance(node, (int, float)):
        return float(node)
    if isinstance(node, Node) and node.op == "get_attr":
        value = node.graph.owning_module
        for part in node.target.split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value)
    return None


def _terms(root: Node):
    """(sum of squares, offset node or None) under a magnitude `root`: sqrt(a*a + b*b), or
    sqrt(a*a + b*b + e) with e a constant >= 0 (GTCRN's 1e-12), else None."""
    total = root.args[0]
    if not (_plain_add(total) and len(total.users) == 1):
        return None
    if _sum_of_squares(total):
        return total, None
    inner, offset = total.args
    value = _offset(offset)
    if _sum_of_squares(inner) and len(inner.users) == 1 and value is not None and value >= 0:
        return inner, offset
    return None


def _found(graph: torch.fx.Graph) -> dict:
    """Magnitude root -> its `_terms`."""
    roots = graph.find_nodes(op="call_function", target=_aten.sqrt.default)
    return {root: terms for root in roots if (terms := _terms(root)) is not None}


def magnitudes(graph: torch.fx.Graph) -> list[Node]:
    """The sqrt nodes of sums of two squares (plus a constant offset) read by the sqrt
    alone."""
    return list(_found(graph))


def _largest(model: GraphModule, values: list[Node], samples: Sequence) -> dict:
    highest = {v: 0.0 for v in values}

    class Seen(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n in highest:
                highest[n] = max(highest[n], float(out.max()))
            return out

    with torch.no_grad():
        for sample in samples:
            Seen(model).run(*sample)
    return highest


def split(model: GraphModule, samples: Sequence) -> int:
    """Each magnitude of `model` over two ranges, t from its float values on `samples`;
    how many. The coarse root reads the sum on [-top, top] (top its largest value), where
    its table's 513 entries are 128 codes apart: t = top / 256 sits on the first entry
    above 0, so max(s, t) never reads the step from 0, which interpolates sqrt worst (t
    inside it loses most of what the split gains), and the fine table covers the 256
    times smaller range below."""
    roots = _found(model.graph)
    if not roots or not samples:
        return 0
    highest = _largest(model, [r.args[0] for r in roots], samples)
    graph, count = model.graph, 0
    for root, (squared, offset) in roots.items():
        total = root.args[0]
        t = highest[total] * FINE
        if not t > 0:
            continue

        def op(target, args, like: Node, root=root) -> Node:  # the sqrt's module, like's value
            node = graph.call_function(target, tuple(args))
            node.meta.update({k: v for k, v in root.meta.items() if k != "val"})
            node.meta["val"] = like.meta["val"]
            return node

        def within(node: Node, bound: float) -> Node:  # its range [-bound, bound] (clip.py)
            return op(_aten.clamp.default, (node, -bound, bound), node)

        with graph.inserting_before(root):
            squares = []
            for square in squared.args:  # clamp(x, -√t, √t)²: min(x², t), not x * x again,
                x = _square_of(square)  # which the lowering would merge with the first
                small = op(_aten.clamp.default, (x, -math.sqrt(t), math.sqrt(t)), x)
                squares.append(within(op(_aten.mul.Tensor, (small, small), square), t))
            below = within(op(_aten.add.Tensor, squares, squared), t)  # min(s, t)
            if offset is not None:  # min(min(s, t) + e, t) = min(s + e, t), e >= 0
                below = within(op(_aten.add.Tensor, (below, offset), total), t)
            low = within(op(_aten.sqrt.default, (below,), root), math.sqrt(t))
            top = highest[total]  # the coarse root's input on [-top, top]: t is 512 codes
            above = op(_aten.clamp.default, (within(total, top), t), total)  # up, 4 table steps
            above.meta[_ABOVE] = True
            high = op(_aten.sqrt.default, (above,), root)
            both = op(_aten.add.Tensor, (high, low), root)
            out = op(_aten.sub.Tensor, (both, math.sqrt(t)), root)
        root.replace_all_uses_with(out)
        graph.erase_node(root)
        count += 1
    graph.lint()
    model.recompile()
    return count


def share_above(graph: torch.fx.Graph) -> None:
    """After annotation: the coarse root reads max(s, t) in the range it is computed in,
    [-top, top], not one observed on its input (a clamp's output shares its input's range,
    which clip.clip_by_range fixed; the root's own observer would see [t, top] and move t
    into its table's first, linearly interpolated step)."""
    for above in graph.nodes:
        if not above.meta.get(_ABOVE):
            continue
        for user in above.users:
            annotation = user.meta.get(_Q_KEY)
            if annotation is not None and above in annotation.input_qspec_map:
                annotation.input_qspec_map[above] = SharedQuantizationSpec(above)
