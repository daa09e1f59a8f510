"""Target tunings: named passes over a program, each optional, chosen by a target's Plan.

split_projections       one input projection per direction instead of one for both,
                        sliced: an NPU compiler copies a column slice (Vela: 6,832 cycles
                        per direction of bigru2 on U85), a CPU takes the slice as a view.
split_products          one recurrent product per activation group (GRU [r|z] and n,
                        LSTM [i|f|o] and g) instead of one for all gates, sliced:
                        onnxruntime fuses a Gemm with the activation after it, so there two
                        products cost less than one product and a split; an NPU streams
                        each product's weights, so there fewer, larger products win.

Both are one rewrite: a `linear` whose every reader takes a column block of it
(slice of the last axis) becomes one linear per block, each with its rows of the weight
and bias.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .graph import Body, Node, reachable, rebuild
from .program import Recurrence, RecurrentProgram
from .roles import WeightKind


def split_projections(program: RecurrentProgram) -> RecurrentProgram:
    return _split_linears(program, lambda role: role.kind is WeightKind.INPUT)


def split_products(program: RecurrentProgram) -> RecurrentProgram:
    """In every recurrence's step graph."""
    return _map_steps(program, lambda body: _split_in(body, lambda role: role.per_step))


def _readers(outputs: list) -> dict:
    readers: dict = {}
    for node in reachable([o for o in outputs if o is not None]):
        for a in node.args:
            readers.setdefault(id(a), []).append(node)
    return readers


def _splittable(node: Node, readers: dict, wanted) -> bool:
    if node.op != "linear" or node.attrs[2] is None or not wanted(node.attrs[2]):
        return False
    users = readers.get(id(node), [])
    return bool(users) and all(
        u.op == "slice" and u.attrs[0] in (-1, len(node.shape or ()) - 1) for u in users
    )


def _rows(g, w, start: int, end: int, bias: bool = False):
    """Rows [start, end) of a weight: a numpy constant, a node of `g`, or an external leaf
    of a loop body standing for a node of the enclosing program (sliced there, once). A
    bias whose rows are zero is None."""
    if w is None:
        return None
    if not isinstance(w, Node):
        rows = np.ascontiguousarray(w[start:end])
        return rows if np.any(rows) or not bias else None
    if w.op == "external" and isinstance(w.attrs[0], Node):
        outer = w.attrs[0]
        rows = outer.graph.slice(outer, 0, start, end)
        return None if rows.is_const(0) else g.external(rows, rows.shape)
    rows = g.slice(w, 0, start, end)
    return None if rows.is_const(0) else rows


def _split_hook(readers: dict, wanted):
    def hook(node: Node, args):
        if node.op != "slice" or not _splittable(node.args[0], readers, wanted):
            return None
        if args[0].op != "linear":  # the rebuilt product folded away
            return None
        product, g = args[0], node.graph
        rest = iter(product.args[1:])
        w, b = (next(rest) if isinstance(a, str) else a for a in product.attrs[:2])
        _, start, end = node.attrs
        role = product.attrs[2].sliced(start, end)
        if role.direction is None:  # a projection shared by both directions: its halves
            rows = w.shape[0] if w.shape is not None else None
            role = dataclasses.replace(role, direction="fwd" if start < rows // 2 else "rev")
        weight, bias = _rows(g, w, start, end), _rows(g, b, start, end, bias=True)
        return g.linear(product.args[0], weight, bias, role)

    return hook


def _split_linears(program: RecurrentProgram, wanted) -> RecurrentProgram:
    readers = _readers(program.outputs)
    return program.replace(rebuild(program.outputs, _split_hook(readers, wanted)))


def _split_in(body: Body, wanted) -> Body:
    readers = _readers(body.outputs)
    outputs = rebuild(body.outputs, _split_hook(readers, wanted), graph=body.graph)
    return Body(body.graph, body.inputs, outputs, body.num_carried)


def _map_steps(program: RecurrentProgram, fn) -> RecurrentProgram:
    """`fn` applied to the step graph of every recurrence."""
    done: dict = {}

    def hook(node: Node, args):
        if node.op != "recurrence":
            return None
        r: Recurrence = node.attrs[0]
        if id(r) not in done:
            done[id(r)] = dataclasses.replace(r, step=fn(r.step))
        return node.graph._node("recurrence", args, (done[id(r)],), node.shape)

    return program.replace(rebuild(program.outputs, hook))
