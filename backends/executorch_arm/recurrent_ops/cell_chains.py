"""A sequence written as a loop of cell calls, read back as the layer it is.

    h = zeros(B, H)                              h0 = zeros(1, B, H)
    for t in range(T):                           y, h_n = aten.gru.input(x, h0, params, ...)
        h = cell(x[:, t], h)            ->       h_t      = select(y, 1, t)
        ys.append(h)                             stack(ys, 1) = y
    stack(ys, 1)

torch.export writes such a loop as T `aten.*_cell` ops. Read one by one, each is a one-step
layer: its own input product per step (a CONV2D each on Ethos-U where the layer hoists one
for all T steps) and its own observers, each seeing a single timestep of the calibration
(benchmarks/cell_chain.py measures both). `fuse` rewrites every chain into the sequence op
before the recurrent ops are read, so the rest of the adapter sees a layer.

A chain: T >= 2 cell ops of one kind on the same weight nodes, step t reading
x_t = select(X, d, t) (or unbind(X, d)[t], or split(X, 1, d)[t], narrow(X, d, t, 1) or
X[t:t+1] along d squeezed) of one 3-D X with d the time axis (0, or 1 batch-first) and
X.shape[d] == T, each step's state the previous step's result and nothing else reading an
intermediate cell state. Any reader of h_t other than the next step then
reads select(y, d, t); the last step's states are the layer's final states; a `stack` of
all h_t along d (or a `cat` of them unsqueezed at d) is y. Stacked loops fuse layer by
layer: a fused layer's h_t are selects of its y, which is what the next chain reads. A
second chain over the same X backward (t = T-1 .. 0), of the same cell kind and size on its
own weights, makes the layer bidirectional: each direction's h_t is its half of y at t, and
the two halves concatenated along the features are y.
"""

from __future__ import annotations

import operator
from typing import Callable, Optional

import torch
from torch.fx import Graph, Node
from torch.utils import _pytree as pytree

from ..emission.fx_builder import PROVENANCE_KEYS
from ..emission.fx_constants import fake_mode_of
from .aten import CELL_OPS, TARGET_OPS, is_zeros, layer_name, recurrent_layers

aten = torch.ops.aten

# cell op -> the sequence op computing it over time
SEQUENCE_OF = {
    aten.gru_cell.default: aten.gru.input,
    aten.lstm_cell.default: aten.lstm.input,
    aten.rnn_tanh_cell.default: aten.rnn_tanh.input,
    aten.rnn_relu_cell.default: aten.rnn_relu.input,
}
assert set(SEQUENCE_OF) == set(CELL_OPS)

_CALLS = "recurrent_lowering_cell_calls"  # on a fused op: (cell op, how many calls)


def _has_cells(graph: Graph) -> bool:
    return any(graph.find_nodes(op="call_function", target=t) for t in CELL_OPS)


def _is_lstm(cell: Node) -> bool:
    return cell.target is aten.lstm_cell.default


def _weights(cell: Node) -> tuple:
    """What identifies a cell's weights: (w_ih, w_hh, b_ih, b_hh), get_attrs by target."""
    args = list(cell.args[2:6]) + [None] * (6 - len(cell.args))
    return tuple(
        ("attr", n.target) if isinstance(n, Node) and n.op == "get_attr" else n for n in args
    )


def _outputs(cell: Node) -> Optional[tuple]:
    """(h, c) a cell's readers take (c None for GRU/RNN); None if an LSTM's result is read
    other than through one getitem per state."""
    if not _is_lstm(cell):
        return cell, None
    got: dict = {}
    for u in cell.users:
        if u.op != "call_function" or u.target is not operator.getitem or u.args[1] in got:
            return None
        got[u.args[1]] = u
    return got.get(0), got.get(1)


def _state(cell: Node) -> tuple:
    """(h, c) a cell reads (c None for GRU/RNN)."""
    hx = cell.args[1]
    return (hx[0], hx[1]) if _is_lstm(cell) else (hx, None)


def _dim(n: Node, position: int, default: int = 0):
    return n.args[position] if len(n.args) > position else n.kwargs.get("dim", default)


def _step_input(x: Node) -> Optional[tuple]:
    """(X, d, t) when x is time step t of a 3-D X along d in (0, 1), else None: select(X, d,
    t), unbind(X, d)[t], or X's t-th one-step piece along d squeezed (split, slice)."""
    if not isinstance(x, Node) or x.op != "call_function":
        return None
    if x.target is aten.select.int:
        source, dim, t = x.args
    elif x.target is operator.getitem and getattr(x.args[0], "target", None) is aten.unbind.int:
        source, dim, t = x.args[0].args[0], _dim(x.args[0], 1), x.args[1]
    elif x.target in (aten.squeeze.dim, aten.squeeze.dims):
        dims = x.args[1] if x.target is aten.squeeze.dim else list(x.args[1])
        piece, dims = x.args[0], dims if isinstance(dims, list) else [dims]
        if len(dims) != 1 or not isinstance(piece, Node):
            return None
        if piece.target is operator.getitem and piece.args[0].target is aten.split.Tensor:
            split = piece.args[0]
            if split.args[1] != 1:
                return None
            source, dim, t = split.args[0], _dim(split, 2), piece.args[1]
        elif piece.target is aten.slice.Tensor and len(piece.args) in (4, 5):
            source, dim, t, end = piece.args[:4]
            if end != t + 1 or piece.args[4:] not in ((), (1,)):
                return None
        elif piece.target is aten.narrow.default and piece.args[3] == 1:
            source, dim, t = piece.args[:3]
        else:
            return None
        if not isinstance(source, Node) or dims[0] % 3 != dim % 3:
            return None
    else:
        return None
    shape = source.meta["val"].shape
    if len(shape) != 3 or not isinstance(shape[dim], int):
        return None
    dim, t = dim % 3, t % shape[dim]
    return (source, dim, t) if dim in (0, 1) else None


def _next(cell: Node, allowed) -> Optional[Node]:
    """The one cell on the same weights that reads `cell`'s states, if exactly one does."""
    h, c = _outputs(cell) or (None, None)
    if h is None:
        return None
    readers = [
        u
        for u in h.users
        if u.op == "call_function"
        and u.target is cell.target
        and allowed(u)
        and _weights(u) == _weights(cell)
        and _state(u) == (h, c)
    ]
    if len(readers) != 1 or (c is not None and set(c.users) != set(readers)):
        return None
    return readers[0]


def _chain(first: Node, allowed, backward: bool = False) -> Optional[list[Node]]:
    """The chain starting at `first`, if it is one that fuses: over X's steps in order, or
    (`backward`) from the last to the first."""
    chain = [first]
    while (n := _next(chain[-1], allowed)) is not None:
        chain.append(n)
    steps = [_step_input(n.args[0]) for n in chain]
    if len(chain) < 2 or steps[0] is None:
        return None
    source, dim, _ = steps[0]
    times = range(len(chain))
    if steps != [(source, dim, len(chain) - 1 - t if backward else t) for t in times]:
        return None
    if source.meta["val"].shape[dim] != len(chain) or _outputs(chain[-1]) is None:
        return None
    return chain


def _backward_of(forward: list[Node], heads: list[Node], allowed) -> Optional[list[Node]]:
    """A chain over the same X backward, of the same cell kind and size on other weights,
    that makes `forward` a bidirectional layer; None if there is none."""
    x, dim, _ = _step_input(forward[0].args[0])
    for head in heads:
        if head.target is not forward[0].target or head in forward:
            continue
        chain = _chain(head, allowed, backward=True)
        if chain is None or _step_input(head.args[0])[:2] != (x, dim):
            continue
        shapes = [tuple(n.meta["val"].shape) for n in (forward[0].args[3], head.args[3])]
        biases = [[w is None for w in (n.args[4:6] + (None, None))[:2]] for n in (forward[0], head)]
        if shapes[0] == shapes[1] and biases[0] == biases[1]:
            return chain
    return None


def _call(graph: Graph, fake_mode, meta: dict, target, *args, **kwargs) -> Node:
    node = graph.call_function(target, args, kwargs)
    node.meta.update(meta)
    fake_args, fake_kwargs = pytree.tree_map_only(Node, lambda n: n.meta["val"], (args, kwargs))
    with fake_mode:
        node.meta["val"] = target(*fake_args, **fake_kwargs)
    return node


def _gathers(n: Node, hs: list, dim: int) -> bool:
    """Whether `n` is y: stack(hs, d), or cat of each h unsqueezed at d, along d."""
    if n.target not in (aten.stack.default, aten.cat.default) or _dim(n, 1) % 3 != dim:
        return False
    if n.target is aten.stack.default:
        return list(n.args[0]) == hs
    parts = list(n.args[0])
    return len(parts) == len(hs) and all(
        p.target is aten.unsqueeze.default and p.args[0] is h and p.args[1] % 3 == dim
        for p, h in zip(parts, hs)
    )


def _fuse(graph: Graph, chains: list, fake_mode) -> None:
    """Replace `chains` (a forward chain, and a backward one over the same X for a
    bidirectional layer) by one sequence op; readers of their states read its results."""
    first, lstm, dirs = chains[0][0], _is_lstm(chains[0][0]), len(chains)
    x, dim, _ = _step_input(first.args[0])
    outs = [[_outputs(n) for n in chain] for chain in chains]
    # h of direction j at each time step (a backward chain's first step is the last time)
    hs = [[h for h, _ in o] for o in outs]
    hs = [hs[0]] + [h[::-1] for h in hs[1:]]
    meta = {k: first.meta[k] for k in PROVENANCE_KEYS if k in first.meta}
    h_val = hs[0][0].meta["val"]
    hidden = int(h_val.shape[-1])
    weights = [w for chain in chains for w in chain[0].args[2:6] if w is not None]
    new: list[Node] = []

    def call(target, *args, **kwargs) -> Node:
        new.append(_call(graph, fake_mode, meta, target, *args, **kwargs))
        return new[-1]

    def initial(k: int) -> Node:  # [dirs, B, H]; all zeros stay a factory (absent)
        given = [_state(chain[0])[k] for chain in chains]
        shape = [dirs, *h_val.shape]
        if all(is_zeros(v, lambda n: None) for v in given) and all(
            isinstance(d, int) for d in shape
        ):
            return call(aten.zeros.default, shape, dtype=h_val.dtype)
        parts = [call(aten.zeros_like.default, hs[0][0]) if v is None else v for v in given]
        parts = [call(aten.unsqueeze.default, v, 0) for v in parts]
        return parts[0] if dirs == 1 else call(aten.cat.default, parts, 0)

    with graph.inserting_before(first):
        hx = [initial(0), initial(1)] if lstm else initial(0)
        op = SEQUENCE_OF[first.target]
        biased = len(weights) == 4 * dirs
        layer = call(op, x, hx, weights, biased, 1, 0.0, False, dirs == 2, dim == 1)
        layer.meta[_CALLS] = (first.target.__name__.split(".")[0], sum(map(len, chains)))
        y = call(operator.getitem, layer, 0)
        parts = (
            [y]
            if dirs == 1
            else [call(aten.slice.Tensor, y, 2, j * hidden, (j + 1) * hidden) for j in range(dirs)]
        )
        states = (1, 2) if lstm else (1,)
        finals = []  # [state][direction]
        for i in states:
            final = call(operator.getitem, layer, i)
            if dirs == 1:
                finals.append([call(aten.squeeze.dims, final, [0])])
            else:
                finals.append([call(aten.select.int, final, 0, j) for j in range(dirs)])
        steps = [[call(aten.select.int, p, dim, t) for t in range(len(chains[0]))] for p in parts]
    for j in range(dirs):
        readers = {u for u in hs[j][0].users} | {v for u in hs[j][0].users for v in u.users}
        for n in [u for u in readers if _gathers(u, hs[j], dim)]:
            pieces = [p for p in n.args[0] if p not in hs[j]]  # a cat's unsqueezes
            n.replace_all_uses_with(parts[j])
            graph.erase_node(n)
            for p in pieces:
                if not p.users:
                    graph.erase_node(p)
    if dirs == 2:  # y as its two directions concatenated
        for n in list(parts[0].users):
            if n.target is aten.cat.default and list(n.args[0]) == parts and _dim(n, 1) % 3 == 2:
                n.replace_all_uses_with(y)
                graph.erase_node(n)
    cells = {n for chain in chains for n in chain}
    for j, o in enumerate(outs):
        last_h, last_c = o[-1]
        if last_h is not None:  # the program's final state is the layer's (a stream's h_n)
            last_h.replace_all_uses_with(finals[0][j], delete_user_cb=lambda u: u.op == "output")
        if lstm and last_c is not None:
            last_c.replace_all_uses_with(finals[1][j])
    for j in range(dirs):  # the rest read y's steps (a next layer's x_t)
        for h, step in zip(hs[j], steps[j]):
            if h is not None:
                h.replace_all_uses_with(step, delete_user_cb=lambda u: u not in cells)
    read = {n.args[0] for n in cells}
    read |= {v for chain in chains for v in _state(chain[0]) if isinstance(v, Node)}
    read |= {w for n in cells for w in n.args[2:6] if isinstance(w, Node)} - set(weights)
    for chain in chains:
        for n in reversed(chain):
            for u in list(n.users):  # an LSTM's getitems, read by nothing else now
                graph.erase_node(u)
            graph.erase_node(n)
    for n in reversed(new):
        if not n.users and n is not layer:
            graph.erase_node(n)
    _erase_unused(graph, read)


def _erase_unused(graph: Graph, nodes: set) -> None:
    """The per-step inputs, zeros and duplicate get_attrs the chain read, and what only they
    read (a split's pieces, the split), once nothing reads them."""
    todo, erased = list(nodes), set()
    while todo:
        n = todo.pop()
        if n in erased or n.users or n.op not in ("call_function", "get_attr"):
            continue
        if n.op == "call_function" and n.is_impure():
            continue
        todo.extend(n.all_input_nodes)
        graph.erase_node(n)
        erased.add(n)


def fuse(graph: Graph, allowed: Callable[[Node], bool] = lambda n: True) -> int:
    """Rewrite every chain of cell ops in `graph` (those `allowed`) into one sequence op, in
    place; returns how many were fused."""
    if not _has_cells(graph):
        return 0
    fake_mode, fused = fake_mode_of(graph), 0
    while True:
        cells = [n for n in graph.nodes if n.op == "call_function" and n.target in CELL_OPS]
        has_previous = {m for n in cells if allowed(n) for m in [_next(n, allowed)] if m}
        heads = [n for n in cells if allowed(n) and n not in has_previous]
        chain = next((c for n in heads if (c := _chain(n, allowed))), None)
        if chain is None:
            return fused
        backward = _backward_of(chain, heads, allowed)
        _fuse(graph, [chain] if backward is None else [chain, backward], fake_mode)
        fused += 1


def layers(graph: Graph) -> list[str]:
    """`aten.recurrent_layers` as the adapter reads them, for reports: a chain of cell calls
    is one layer, 'module path: op (N cell op calls)'; `graph` is left as it is."""
    if not _has_cells(graph):
        return recurrent_layers(graph)
    copied = Graph()
    copied.output(copied.graph_copy(graph, {}))
    fuse(copied)
    out = []
    for n in copied.nodes:
        if n.op == "call_function" and n.target in TARGET_OPS:
            cells = n.meta.get(_CALLS)
            calls = f" ({cells[1]} {cells[0]} calls)" if cells else ""
            out.append(f"{layer_name(n)}: {n.target.__name__}{calls}")
    return out
