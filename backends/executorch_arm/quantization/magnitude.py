"""A magnitude sqrt(a*a + b*b), or sqrt(a*a + b*b + e), in int16, computed over three ranges.

A spectrum's magnitude (silero-vad's STFT) squares values whose range spans decades: in
int16, the sum of squares keeps its small values to a few codes, and the square root, a
513-entry TABLE over the sum's range, interpolates linearly where sqrt is steepest. The
quiet bins of silence and noise, which carry a VAD's decision, are the ones lost: on
silero-vad, the sum quantized symmetrically (TOSA's int16 has no zero point) alone costs
8 dB on the fed-back state (docs/results/real_model_accuracy.md).

So the magnitude is computed over three ranges of the sum s, each 256 times narrower than
the one above: sqrt(max(s, t1)) + sqrt(clamp(s, t2, t1)) + sqrt(min(s, t2)) - sqrt(t1) -
sqrt(t2), t1 = top / 256 and t2 = top / 65536 (top: the sum's largest calibrated value).
The first root reads the sum as before, clamped below at t1, where its table is fine; each
narrower root reads the sum recomputed from the squares of its terms clamped to [-√t, √t],
saturated at its t by a quantization to [-t, t] (clip.clip_by_range: a symmetric clamp
whose input it alone reads; so are the squares and the roots, ranges no calibration floor
coarsens), so its codes are 256 times finer, and its own table. A table interpolates
sqrt worst on its first step from 0; with two ranges that step, top / 65536 wide, still
held the quietest bins (GTCRN's conv_cache: 26.6 dB simulated, 13.5 dB on the TOSA
reference model); with three it is 2^24 times narrower than top, and a root there is off
by about two codes of the magnitude's int16 output. Seven elementwise ops and a table per
range, on the spectrum's size, not the model's.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

FINE = 1 / 256  # each range's top, as a share of the next wider one's (see split)
BANDS = 3  # ranges of the sum (see split)
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
    """Each magnitude of `model` over BANDS ranges, from its float values on `samples`;
    how many. The coarse root reads the sum on [-top, top] (top its largest value), where
    its table's 513 entries are 128 codes apart: t1 = top / 256 sits on the first entry
    above 0, so max(s, t1) never reads the step from 0, which interpolates sqrt worst (t1
    inside it loses most of what the split gains). Each narrower range [t_k+1, t_k] is
    read on [-t_k, t_k] likewise, and the last, [0, t_n], keeps the step from 0, 256^n
    times narrower than top. In float, the roots add up to sqrt(s) itself: for s in one
    range, every other root sits at its bound and cancels against the constant."""
    roots = _found(model.graph)
    if not roots or not samples:
        return 0
    highest = _largest(model, [r.args[0] for r in roots], samples)
    graph, count = model.graph, 0
    for root, (squared, offset) in roots.items():
        total = root.args[0]
        top = highest[total]
        bounds = [top * FINE**k for k in range(1, BANDS)]  # t1 > t2 > ...
        if not bounds[-1] > 0:
            continue

        def op(target, args, like: Node, root=root) -> Node:  # the sqrt's module, like's value
            node = graph.call_function(target, tuple(args))
            node.meta.update({k: v for k, v in root.meta.items() if k != "val"})
            node.meta["val"] = like.meta["val"]
            return node

        def within(node: Node, bound: float) -> Node:  # its range [-bound, bound] (clip.py)
            return op(_aten.clamp.default, (node, -bound, bound), node)

        with graph.inserting_before(root):
            # the coarse root: max(s, t1) read on [-top, top], t1 on its first entry above 0
            above = op(_aten.clamp.default, (within(total, top), bounds[0]), total)
            above.meta[_ABOVE] = True
            out, roots_at = op(_aten.sqrt.default, (above,), root), 0.0
            for k, t in enumerate(bounds):
                squares = []
                for square in squared.args:  # clamp(x, -√t, √t)²: min(x², t), not x * x
                    x = _square_of(square)  # again, which the lowering would merge
                    small = op(_aten.clamp.default, (x, -math.sqrt(t), math.sqrt(t)), x)
                    squares.append(within(op(_aten.mul.Tensor, (small, small), square), t))
                band = within(op(_aten.add.Tensor, squares, squared), t)  # min(s, t)
                if offset is not None:  # min(min(s, t) + e, t) = min(s + e, t), e >= 0
                    band = within(op(_aten.add.Tensor, (band, offset), total), t)
                if k + 1 < len(bounds):  # clamp(s, t_k+1, t_k), read on [-t_k, t_k]
                    band = op(_aten.clamp.default, (band, bounds[k + 1]), band)
                    band.meta[_ABOVE] = True
                fine = within(op(_aten.sqrt.default, (band,), root), math.sqrt(t))
                out = op(_aten.add.Tensor, (out, fine), root)
                roots_at += math.sqrt(t)
            out = op(_aten.sub.Tensor, (out, roots_at), root)
        root.replace_all_uses_with(out)
        graph.erase_node(root)
        count += 1
    graph.lint()
    model.recompile()
    return count


def share_above(graph: torch.fx.Graph) -> None:
    """After annotation: a root over a range clamped from below, max(s, t1) or
    clamp(s, t2, t1), reads it in the range it is computed in, [-top, top] or [-t1, t1],
    not one observed on its input (a clamp's output shares its input's range, which
    clip.clip_by_range fixed; the root's own observer would see [t1, top] and move t1 into
    its table's first, linearly interpolated step)."""
    for above in graph.nodes:
        if not above.meta.get(_ABOVE):
            continue
        for user in above.users:
            annotation = user.meta.get(_Q_KEY)
            if annotation is not None and above in annotation.input_qspec_map:
                annotation.input_qspec_map[above] = SharedQuantizationSpec(above)
