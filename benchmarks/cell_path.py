"""An LSTM loop step's cell-state path left unquantized: what a wider cell state than the
step's activations would give (stream_attribution --float_cell).

In a loop step every value has one scale for all timesteps, and an LSTM's c can span
hundreds while the cells that matter sit within a few units of zero (madmom's BLSTM:
saturated cells integrate). The path is c itself, each product and sum it enters (the
peepholes, f * c, the update), and those sums' other terms (i * g, the gates' sums before
their peephole terms): the values an int32 cell state would carry up to the tables."""

from __future__ import annotations

import copy

import torch
from torch.fx import GraphModule, Node

_QD = torch.ops.quantized_decomposed
_ARITHMETIC = ("mul", "add", "sub")


def _dequantized(n: Node) -> list:
    """The dequantize nodes reading `n`'s quantize nodes."""
    return [
        d
        for q in n.users
        if q.target == _QD.quantize_per_tensor.default
        for d in q.users
        if d.target == _QD.dequantize_per_tensor.default
    ]


def _arithmetic(n: Node) -> bool:
    return n.op == "call_function" and any(a in str(n.target) for a in _ARITHMETIC)


def _source(n) -> "Node | None":
    """The value a dequantize node gives back (its quantize node's input)."""
    if isinstance(n, Node) and n.target == _QD.dequantize_per_tensor.default:
        q = n.args[0]
        if isinstance(q, Node) and q.target == _QD.quantize_per_tensor.default:
            return q.args[0]
    return None


def path(step: GraphModule, num_states: int) -> list:
    """The cell-state path's nodes of a converted step (empty unless it has a c state)."""
    if num_states != 2:
        return []
    c = list(step.graph.find_nodes(op="placeholder"))[1]
    products = [u for d in _dequantized(c) for u in d.users if _arithmetic(u)]
    sums = [u for p in products for d in _dequantized(p) for u in d.users if _arithmetic(u)]
    terms = [_source(a) for s in sums for a in s.args]
    chosen = [c, *products, *sums, *(t for t in terms if t is not None)]
    return list(dict.fromkeys(chosen))


def unquantized(step: GraphModule, num_states: int) -> GraphModule:
    """A copy of the converted `step` whose cell-state path skips its quantize/dequantize."""
    step = copy.deepcopy(step)
    for n in path(step, num_states):
        for d in _dequantized(n):
            d.replace_all_uses_with(n)
    step.graph.eliminate_dead_code()
    step.recompile()
    return step
