"""A streaming model's state: the final state shares its initial state's quantization.

A streaming recurrent model takes its hidden state in (h0) and returns the next one (h_n); the
caller feeds h_n back as h0 at the next frame. If h0 and h_n carry different quantization
parameters, every frame requantizes the state (round to another grid) and the error drifts.
`state_pairs` finds, before the recurrent ops are decomposed, which program input is a layer's
initial state and which output its final one; `share_states` then puts both in one
quantization group (one observer sees both, during calibration), so dequantize(h_n) fed back
quantizes to exactly the same integers. The group is joined where h_n's sharing ends, not at
h_n's producer: that producer may be tied to its inputs by the Arm quantizer (a concat of
several layers' states, whose TOSA CONCAT does not rescale), a tie that must hold.

The loop form's step does the same for its own states (loop.step), with the step's inputs and
outputs paired by position.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node
from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

from ..recurrent_ops.aten import LAYER_OPS, SEQUENCE_OPS

_Q_KEY = "quantization_annotation"

# Ops that move values without arithmetic: between a program's state input and the layer
# that reads it, or between the layer's final state and the program output (a layout=1
# state is permuted both ways).
_MOVES = {
    torch.ops.aten.permute.default,
    torch.ops.aten.view.default,
    torch.ops.aten.reshape.default,
    torch.ops.aten.squeeze.dims,
    torch.ops.aten.squeeze.dim,
    torch.ops.aten.unsqueeze.default,
    torch.ops.aten.transpose.int,
    torch.ops.aten.clone.default,
    torch.ops.aten.contiguous.default,
}


def _through_moves_back(node):
    while isinstance(node, Node) and node.op == "call_function" and node.target in _MOVES:
        node = node.args[0]
    return node


def _through_moves_forward(node) -> list:
    """`node` and the single-reader chain of moves after it."""
    chain = [node]
    while len(node.users) == 1:
        (user,) = node.users
        if user.op != "call_function" or user.target not in _MOVES:
            break
        chain.append(user)
        node = user
    return chain


def state_pairs(graph: torch.fx.Graph) -> list[tuple[str, int]]:
    """(initial state placeholder name, program output index of the final state) for each
    state (h, and c of an LSTM) of a recurrent op that is a program input and whose final value
    is a program output, either directly or through moves (a layout=1 state's permutes)."""
    outputs = list(graph.output_node().args[0])
    pairs = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in LAYER_OPS:  # (x, initial_h, initial_c, ...)
            states = [node.args[1], node.args[2]]
        elif node.target in SEQUENCE_OPS:  # (input, hx, ...): hx is [h, c] for an LSTM
            hx = node.args[1]
            states = hx if isinstance(hx, (list, tuple)) else [hx]
        else:
            continue
        for k, state in enumerate(states):
            state = _through_moves_back(state)
            if not (isinstance(state, Node) and state.op == "placeholder"):
                continue
            for user in node.users:
                if user.target is operator.getitem and user.args[1] == k + 1:
                    final = _through_moves_forward(user)
                    pairs += [(state.name, i) for i, o in enumerate(outputs) if o in final]
    return pairs


def root_holder(node: Node):
    """Where the quantization `node`'s output shares ends: the node or input edge whose
    annotation holds a spec of its own, following SharedQuantizationSpec pointers (a view's
    to its input, a concat's output to its first input edge). Returns (holder, set), where
    set(spec) replaces the holder's spec; None if `node` is not annotated."""
    annotation = node.meta.get(_Q_KEY)
    if annotation is None or annotation.output_qspec is None:
        return None
    holder, spec = node, annotation.output_qspec
    for _ in range(1000):  # a chain of pointers; the Arm quantizer's are short
        if not isinstance(spec, SharedQuantizationSpec):
            break
        holder = spec.edge_or_node
        if isinstance(holder, Node):
            spec = holder.meta[_Q_KEY].output_qspec
        else:
            arg, user = holder
            spec = user.meta[_Q_KEY].input_qspec_map[arg]
    if isinstance(holder, Node):
        return holder, lambda new: setattr(holder.meta[_Q_KEY], "output_qspec", new)
    arg, user = holder
    return holder, lambda new: user.meta[_Q_KEY].input_qspec_map.__setitem__(arg, new)


def share_states(graph: torch.fx.Graph, pairs: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """Each final state's quantization group takes its initial state's spec: the value the
    group's sharing ends at (`root_holder`) is annotated as sharing h0's. Returns the
    (h0, h_n producer) pairs shared."""
    placeholders = {n.name: n for n in graph.find_nodes(op="placeholder")}
    outputs = list(graph.output_node().args[0])
    shared = []
    for h0_name, index in pairs:
        h0, h_n = placeholders.get(h0_name), outputs[index]
        observed = h0 is not None and getattr(h0.meta.get(_Q_KEY), "output_qspec", None)
        if not observed or not isinstance(h_n, Node):
            continue  # not quantized (e.g. left in float, or only after a move): nothing to share
        found = root_holder(h_n)
        if found is None:
            continue
        holder, set_spec = found
        if isinstance(holder, Node) and holder.op == "placeholder" and holder is not h0:
            # another state's input already holds the group (a bidirectional layer's final
            # states leave through one concat): h0 joins it, the earlier of the two in the
            # graph, which PT2E needs of what a spec points to
            h0.meta[_Q_KEY].output_qspec = SharedQuantizationSpec(holder)
        elif holder is not h0:
            set_spec(SharedQuantizationSpec(h0))
        shared.append((h0.name, h_n.name))
    return shared
