"""Target tunings: named passes over a program, each optional, chosen by a target's Plan.

split_projections       one input projection per direction instead of one for both,
                        sliced: an NPU compiler copies a column slice (Vela does,
                        docs/arm_loop_form.md), a CPU takes the slice as a view.
split_products          one recurrent product per activation group (GRU [r|z] and n,
                        LSTM [i|f|o] and g) instead of one for all gates, sliced:
                        onnxruntime fuses a Gemm with the activation after it, so there two
                        products cost less than one product and a split; an NPU streams
                        each product's weights, so there fewer, larger products win.

Both are one rewrite: a `linear` whose every reader takes a column block of it
(slice of the last axis) becomes one linear per block, each with its rows of the weight
and bias.

row_views               a sequence's steps as row blocks of its 2-D [T*B, X] view (one
                        reshape and one split), Y as one concatenation of the steps' rows
                        and a reshape: no per-step reshape in the graph (both adapters);
                        at batch 1, Y's directions [T, D, 1, H] as one concatenation on
                        the last axis and a reshape (Vela copies an outer-axis one a row
                        at a time).
loop_rows               a loop reads the rows of the sequence it steps through in place
                        (`first`, no sliced copy after a peeled step) and through the same
                        [T*B, G] view as the peeled step's row: Vela copies a reshape whose
                        input has other readers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .graph import (
    Body,
    LoopAttrs,
    Node,
    RecurrenceAttrs,
    linear_operands,
    reachable,
    rebuild,
)
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
    if node.op != "linear" or node.attrs.role is None or not wanted(node.attrs.role):
        return False
    users = readers.get(id(node), [])
    return bool(users) and all(
        u.op == "slice" and u.attrs.axis in (-1, len(node.shape or ()) - 1) for u in users
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
    if w.op == "external" and isinstance(w.attrs.value, Node):
        outer = w.attrs.value
        rows = outer.graph.slice(outer, 0, start, end)
        return None if rows.is_const(0) else g.external(rows, rows.shape)
    rows = g.slice(w, 0, start, end)
    return None if rows.is_const(0) else rows


def _split_hook(readers: dict, wanted):
    def hook(node: Node, args, new):
        if node.op != "slice" or not _splittable(node.args[0], readers, wanted):
            return None
        if args[0].op != "linear":  # the rebuilt product folded away
            return None
        product, g = args[0], node.graph
        _, w, b = linear_operands(product)
        start, end = node.attrs.start, node.attrs.end
        role = product.attrs.role.sliced(start, end)
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

    def hook(node: Node, args, new):
        if node.op != "recurrence":
            return None
        r: Recurrence = node.attrs.recurrence
        if id(r) not in done:
            done[id(r)] = dataclasses.replace(r, step=fn(r.step))
        return node.graph.node("recurrence", args, RecurrenceAttrs(done[id(r)]), node.shape)

    return program.replace(rebuild(program.outputs, hook))


def _static(shape, *dims) -> bool:
    return shape is not None and all(isinstance(shape[d], int) for d in dims)


def row_views(program: RecurrentProgram, static_batch: bool) -> RecurrentProgram:
    """Steps as rows of a 2-D view; `static_batch`: only where the batch size is known (a
    target whose views take no run-time size)."""
    batch = (1,) if static_batch else ()

    def hook(node: Node, args, new):
        g = node.graph
        if node.op == "piece" and node.args[0].op == "unstack":
            unstack = node.args[0]
            axis, n, source = unstack.attrs.axis, unstack.attrs.n, unstack.args[0]
            if axis != 0 or n == 1 or len(source.shape or ()) != 3:
                return None
            if not _static(source.shape, 0, 2, *batch):
                return None
            T, B, G = source.shape
            rows = g.reshape(new(source), [T * B if static_batch else -1, G])
            return g.split(rows, 0, n)[node.attrs.index]
        if node.op == "stack" and node.attrs.axis == 0 and len(node.args) > 1:
            shape = _one_shape(node.args)
            if shape is None or len(shape) != 2 or not _static(shape, 1, *(0,) * static_batch):
                return None
            B, H = shape
            return g.reshape(g.concat(list(args), 0), [len(args), B if static_batch else -1, H])
        if node.op == "stack" and len(node.args) > 1:
            return _stack_as_columns(g, node, list(args))
        return None

    return program.replace(rebuild(program.outputs, hook))


def _one_shape(nodes):
    """The shape all `nodes` share, or None."""
    shapes = {n.shape for n in nodes}
    return next(iter(shapes)) if len(shapes) == 1 else None


def _stack_as_columns(g, node: Node, args: list):
    """A stack on an inner axis a ([T, B, O] directions into Y [T, D, B, O]) whose values
    have size 1 on every axis from a to the last, as a concatenation along the last axis
    and a reshape: the same memory order. Vela copies a concatenation on an outer axis one
    row at a time, one on the last axis in one go (docs/onnx_to_ethos_u.md)."""
    shape = _one_shape(node.args)
    if shape is None or None in shape:
        return None
    a = node.attrs.axis % (len(shape) + 1)
    if a == len(shape) or any(d != 1 for d in shape[a:-1]):
        return None
    return g.reshape(g.concat(args, -1), [*shape[:a], len(args), *shape[a:]])


def loop_rows(program: RecurrentProgram) -> RecurrentProgram:
    readers = _readers(program.outputs)
    plans: dict = {}  # id(loop) -> (first, steps, source, batch or None)
    rows: dict = {}  # id(squeeze of a peeled row) -> (source, t, batch)
    for node in reachable([o for o in program.outputs if o is not None]):
        if node.op != "loop" or len(node.args) != node.attrs.loop.body.num_carried + 1:
            continue
        loop, xs = node.attrs.loop, node.args[-1]
        first, steps, source = 0, None, xs
        if xs.op == "slice" and xs.attrs.axis == 0 and readers.get(id(xs)) == [node]:
            start, end = xs.attrs.start, xs.attrs.end
            dim = _dim0(xs.args[0])
            if dim is not None and 0 <= start < end <= dim:
                first, steps, source = start, end - start, xs.args[0]
        reader = xs if source is not xs else node  # what reads source for the loop
        batch = _row_view(source, reader, readers)
        if batch is not None:
            for squeeze in _peeled_rows(source, reader, readers):
                rows[id(squeeze)] = (source, squeeze.args[0].attrs.start, batch)
        if (first, steps, batch) != (loop.first, loop.steps, None):
            plans[id(node)] = (first, steps, source, batch)

    def view(g, source: Node, new):
        T, B, G = source.shape
        return g.reshape(new(source), [T * B, G])

    def hook(node: Node, args, new):
        g = node.graph
        if node.op == "loop" and id(node) in plans:
            first, steps, source, batch = plans[id(node)]
            xs = view(g, source, new) if batch is not None else new(source)
            loop = dataclasses.replace(
                node.attrs.loop, first=first, steps=steps, rows_per_step=batch
            )
            return g.node("loop", (*args[:-1], xs), LoopAttrs(loop), None)
        if node.op == "squeeze" and id(node) in rows:
            source, t, batch = rows[id(node)]
            return g.slice(view(g, source, new), 0, t * batch, (t + 1) * batch)
        return None

    return program.replace(rebuild(program.outputs, hook))


def _dim0(node: Node):
    return None if node.shape is None else node.shape[0]


def _row_view(source: Node, loop: Node, readers: dict):
    """B when the loop (`loop`: its reader of source) can read `source` [T, B, G] as its
    [T*B, G] view: a computed value of static shape whose other readers only take one row
    of it (a peeled step)."""
    if source.op in ("input", "external") or not _static(source.shape, 0, 1, 2):
        return None
    if len(source.shape) != 3:
        return None
    others = [u for u in readers.get(id(source), []) if u is not loop]
    if len(_peeled_rows(source, loop, readers)) != len(others):
        return None
    return source.shape[1]


def _peeled_rows(source: Node, loop: Node, readers: dict) -> list:
    """The squeeze(slice(source, 0, t, t + 1), 0) readers of source: rows read outside."""
    out = []
    for u in readers.get(id(source), []):
        if u is loop or u.op != "slice" or u.attrs.axis != 0 or u.attrs.end - u.attrs.start != 1:
            continue
        users = readers.get(id(u), [])
        if len(users) == 1 and users[0].op == "squeeze" and users[0].attrs.axis == 0:
            out.append(users[0])
    return out


def merge_slices(program: RecurrentProgram) -> RecurrentProgram:
    """Slices cutting one value along one axis into disjoint pieces become pieces of one
    split (the gate blocks of a step's recurrent product, [r|z] into r and z): a runtime
    that pays per node (onnxruntime: about a quarter of a microsecond) runs one. In loop
    bodies too."""
    return _map_loop_bodies(program, _merge_slices)


def fuse_linear_add(program: RecurrentProgram) -> RecurrentProgram:
    """A linear without bias whose only reader adds a value of its [M, N] shape (or one
    that broadcasts to it) takes that value as its bias: x_t + h R^T in one Gemm. In loop
    bodies too."""
    return _map_loop_bodies(program, _fuse_linear_add)


def _merge_slices(outputs: list, graph) -> list:
    readers = _readers(outputs)
    pieces: dict = {}  # id(slice) -> (source, axis, sizes, index)
    for source in reachable([o for o in outputs if o is not None]):
        groups: dict = {}
        for u in readers.get(id(source), []):
            if u.op == "slice" and source.shape is not None:
                axis = u.attrs.axis % len(source.shape)
                groups.setdefault(axis, []).append(u)
        for axis, slices in groups.items():
            dim = source.shape[axis]
            if dim is None or len(slices) < 2:
                continue
            spans = sorted(
                (*slice(u.attrs.start, u.attrs.end).indices(dim)[:2], id(u)) for u in slices
            )
            if any(a[1] > b[0] or a[0] >= a[1] for a, b in zip(spans, spans[1:])):
                continue  # overlapping (or empty) pieces
            if spans[-1][0] >= spans[-1][1]:
                continue
            sizes, index, pos = [], {}, 0
            for lo, hi, key in spans + [(dim, dim, None)]:
                if lo > pos:
                    sizes.append(lo - pos)  # a gap nothing reads
                if key is not None:
                    index[key] = len(sizes)
                    sizes.append(hi - lo)
                pos = hi
            for u in slices:
                pieces[id(u)] = (source, axis, tuple(sizes), index[id(u)])

    def hook(node: Node, args, new):
        if node.op == "slice" and id(node) in pieces:
            source, axis, sizes, k = pieces[id(node)]
            return node.graph.split(new(source), axis, sizes)[k]
        return None

    return rebuild(outputs, hook, graph=graph)


def _broadcasts_to(shape, target) -> bool:
    """`shape` broadcasts one way to a rank-2 `target` (unknown dims match only as such)."""
    if shape is None or target is None or len(target) != 2 or len(shape) > 2:
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def _fuse_linear_add(outputs: list, graph) -> list:
    readers = _readers(outputs)

    def fusable(node, other) -> bool:
        return (
            node.op == "linear"
            and node.attrs.bias is None  # no bias yet
            and len(node.shape or ()) == 2
            and readers.get(id(node)) is not None
            and len(readers[id(node)]) == 1
            and _broadcasts_to(other.shape, node.shape)
        )

    def hook(node: Node, args, new):
        if node.op != "add":
            return None
        for k in (0, 1):
            product, other = node.args[k], node.args[1 - k]
            if fusable(product, other) and args[k].op == "linear":
                rebuilt = args[k]
                x, w, _ = linear_operands(rebuilt)
                return node.graph.linear(x, w, args[1 - k], rebuilt.attrs.role)
        return None

    return rebuild(outputs, hook, graph=graph)


def _map_loop_bodies(program: RecurrentProgram, fn) -> RecurrentProgram:
    """`fn(outputs, graph) -> outputs` applied to the program and to every loop's body."""
    done: dict = {}

    def body_of(loop):
        if id(loop) not in done:
            body = loop.body
            outputs = fn(body.outputs, body.graph)
            done[id(loop)] = dataclasses.replace(
                loop, body=Body(body.graph, body.inputs, outputs, body.num_carried)
            )
        return done[id(loop)]

    def hook(node: Node, args, new):
        if node.op == "loop":
            return node.graph.node("loop", args, LoopAttrs(body_of(node.attrs.loop)), None)
        return None

    outputs = rebuild(program.outputs, hook)
    return program.replace(fn(outputs, program.graph))
