"""A sum read in slices by sigmoids or tanhs is summed slice by slice.

A recurrent cell written as plain ops (torch.onnx's LSTMCell, a hand-written cell in a .pt2)
adds its two products once and splits the sum into gates: `split(x @ W + h @ R)`, then a
sigmoid or tanh of each part. Vela runs such a table after a slice as an operation of its
own, where after an elementwise op it fuses the table into that op. Summing each slice
(`x @ W[k] + h @ R[k]`, the slices taken from the products) gives every table the sum it
fuses with, as the core's cells are written. An LSTMCell stream (16 -> 32), int16 on
ethos-u55-128: 20,328 -> 11,608 cycles (Vela's estimate), the same SQNR.

Exact in real arithmetic; each slice's sum is observed on its own, so its scale fits its
own range. Applied before annotation (quantizer.transform_for_annotation) where every
reader of the sum is a slice (else the whole sum would still be computed) and some slice
is read by a sigmoid or tanh. Where the plan's product form is "matmul" (Ethos-U85,
plan.ArmPlan.products), a one-row product read in slices only (a cell's, cut into gates
before or, above, after its sum) is written as the core's cells write theirs, mm(W, x^T)
(emission/fx_builder.py): Vela runs a MATMUL there where it would run a linear as a
CONV2D.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from ..emission.fx_builder import PLAIN, ProductForm
from ..emission.fx_constants import fake_mode_of

_aten = torch.ops.aten
_SUMS = (_aten.add.Tensor, _aten.sub.Tensor)
_TABLES = (_aten.sigmoid.default, _aten.tanh.default)
_SPLITS = (_aten.split.Tensor, _aten.split_with_sizes.default, _aten.chunk.default)
_ARGS = {  # the argument names after the tensor, with their defaults
    _aten.slice.Tensor: (("dim", "start", "end", "step"), (0, None, None, 1)),
    _aten.split.Tensor: (("split_size", "dim"), (None, 0)),
    _aten.split_with_sizes.default: (("split_sizes", "dim"), (None, 0)),
    _aten.chunk.default: (("chunks", "dim"), (None, 0)),
}


def _view_args(view: Node) -> list:
    """A slice's (dim, start, end, step) or a split's (sizes, dim), defaults filled in."""
    args, kw = list(view.args[1:]), view.kwargs
    names, defaults = _ARGS[view.target]
    return [
        args[i] if i < len(args) else kw.get(name, default)
        for i, (name, default) in enumerate(zip(names, defaults))
    ]


def _dim(view: Node) -> int:
    """The dimension a slice or split cuts."""
    args = _view_args(view)
    return args[0] if view.target == _aten.slice.Tensor else args[1]


def _parts(view: Node) -> list[Node] | None:
    """The tensors a slice or split gives (its getitems for a split), or None."""
    if view.target == _aten.slice.Tensor:
        return [view]
    if view.target in _SPLITS and all(u.target is operator.getitem for u in view.users):
        return list(view.users)
    return None


def _reads_table(parts: list[Node]) -> bool:
    return any(u.target in _TABLES for p in parts for u in p.users)


def _candidate(node: Node) -> bool:
    if node.op != "call_function" or node.target not in _SUMS or node.kwargs.get("alpha", 1) != 1:
        return False
    if not isinstance(node.meta.get("val"), torch.Tensor) or not node.users:
        return False
    views = list(node.users)
    if any(v.op != "call_function" or v.args[0] is not node for v in views):
        return False
    parts = [_parts(v) for v in views]
    return all(p is not None for p in parts) and any(_reads_table(p) for p in parts)


def _operand_dim(operand, dim: int, rank: int, length: int):
    """The dimension of `operand` the sum's `dim` cuts, or None where it broadcasts
    (a scalar, a missing dimension, or one of size 1 against a longer one)."""
    val = operand.meta.get("val") if isinstance(operand, Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    own = dim - (rank - val.dim())
    if own < 0 or (val.shape[own] == 1 and length != 1):
        return None
    return own


def _cut_product(node: Node) -> bool:
    """A linear of a one-row x by a constant weight, read in slices only (a cell's
    product cut into gates)."""
    if node.op != "call_function" or node.target != _aten.linear.default or not node.users:
        return False
    if any(u.op != "call_function" or _parts(u) is None for u in node.users):
        return False
    x, w = node.args[:2]
    x_val = x.meta.get("val") if isinstance(x, Node) else None
    if not isinstance(x_val, torch.Tensor) or any(d != 1 for d in x_val.shape[:-1]):
        return False
    return isinstance(w, Node) and w.op == "get_attr"


def split(model: GraphModule, products: ProductForm = PLAIN) -> int:
    """Sum every such sum slice by slice, then write the products read in slices in
    `products`' form (see above); how many sums."""
    graph = model.graph
    sums = [n for n in graph.nodes if _candidate(n)]
    matmul = products.recurrent_product == "matmul"
    if not sums and not (matmul and any(_cut_product(n) for n in graph.nodes)):
        return 0
    fake = fake_mode_of(graph)

    def op(target, args, like: Node) -> Node:
        node = graph.call_function(target, tuple(args), {})
        node.meta.update({k: v for k, v in like.meta.items() if k != "val"})
        with fake:
            node.meta["val"] = target(*[a.meta["val"] if isinstance(a, Node) else a for a in args])
        return node

    def as_matmul(linear: Node) -> Node:  # x W^T = (W x^T)^T; with one row both are views
        x, w, bias = (*linear.args, None)[:3]
        shape = list(linear.meta["val"].shape)
        with graph.inserting_before(linear):
            column = op(_aten.view.default, (x, [x.meta["val"].shape[-1], 1]), linear)
            y = op(_aten.view.default, (op(_aten.mm.default, (w, column), linear), shape), linear)
            if bias is not None:
                y = op(_aten.add.Tensor, (y, bias), linear)
        linear.replace_all_uses_with(y)
        graph.erase_node(linear)
        return y

    for total in sums:
        rank, (a, b) = total.meta["val"].dim(), total.args[:2]
        for view in list(total.users):
            dim = _dim(view) % rank
            length = total.meta["val"].shape[dim]
            parts = _parts(view)
            with graph.inserting_before(view):
                cut = {}
                for operand in (a, b):
                    own = _operand_dim(operand, dim, rank, length)
                    if own is None:
                        cut[id(operand)] = [operand] * len(parts)
                        continue
                    args = _view_args(view)
                    args[0 if view.target == _aten.slice.Tensor else 1] = own
                    args = [operand, *args]
                    piece = op(view.target, args, view)
                    if view.target == _aten.slice.Tensor:
                        cut[id(operand)] = [piece]
                    else:
                        cut[id(operand)] = [
                            op(operator.getitem, (piece, p.args[1]), p) for p in parts
                        ]
            for k, part in enumerate(parts):
                with graph.inserting_after(part):
                    summed = op(total.target, (cut[id(a)][k], cut[id(b)][k]), total)
                part.replace_all_uses_with(summed)
                if part is not view:
                    graph.erase_node(part)
            graph.erase_node(view)
        graph.erase_node(total)
    for product in [n for n in graph.nodes if matmul and _cut_product(n)]:
        as_matmul(product)
    graph.lint()
    model.recompile()
    return len(sums)
