"""A stream's packed state: each part at its own scale, the packing on the CPU in float.

Streaming models often pack several states into one tensor: DTLN the h and c of its two
LSTMs in [1, 2, 128, 2], silero-vad its LSTM's h and c in [2, 1, 128]. Quantized as one
input, the tensor has one scale, set by its widest part: DTLN's first c (+-234) gives a
step of 0.0071 to all four, so its h (|h| <= 1) keeps fewer than 300 codes. Its int16 mask
on held-out speech (TOSA reference model against fp32, ethos-u55-128): 23.4 dB with one
scale, 32.3 with a scale per part, at 375,088 cycles instead of 397,052.

Where a stream state input is read only through slices and selects (and moves) and its
output assembled only by concatenations (and moves), `split` leaves those ops unannotated,
so they run on the CPU in float, and quantizes each part where its slicing ends, with an
observer of its own; each part's final value (what the assembly reads) shares the
quantization of its initial value at the same place in the tensor, as `states.share_states`
does for a whole state. The program keeps its inputs and outputs. A state packed any other
way (read by anything but slices and moves, or an output part at a place no input part
reads) keeps one scale, as does one read by a loop-form layer (T > 8), whose step pairs its
state input and output in one quantization of its own.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
from torch.fx import Graph, Node
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec

from recurrent_lowering.runtime import streams

from ..emission import origin
from ..loop import op as loop_op
from .inputs import io_shapes
from .states import root_holder

_Q_KEY = "quantization_annotation"
aten = torch.ops.aten

_SAME = {aten.alias.default, aten.clone.default, aten.contiguous.default}
_RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_SQUEEZES = {aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default}
_READS = (
    _SAME | _RESHAPES | _SQUEEZES | {aten.slice.Tensor, aten.select.int, aten.unsqueeze.default}
)
_JOINS = (
    _SAME | _RESHAPES | _SQUEEZES | {aten.cat.default, aten.stack.default, aten.unsqueeze.default}
)

# A value's place in the packed tensor: (dims, box). dims[i] is the packed tensor's axis of
# the value's axis i, None for an axis of size 1 the value added; box[a] the (start, stop)
# the value covers on the packed axis a.


def _shape(node) -> tuple:
    return tuple(int(d) for d in node.meta["val"].shape)


def _axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _reshaped(dims: list, before: tuple, after: tuple) -> Optional[list]:
    """dims after a reshape that only adds or drops axes of size 1, else None."""
    if [s for s in before if s != 1] != [s for s in after if s != 1]:
        return None
    kept = iter([d for d, s in zip(dims, before) if s != 1])
    return [next(kept) if s != 1 else None for s in after]


def _read(node: Node, dims: list, box: list) -> Optional[tuple]:
    """The place of `node`, a read of a value at (dims, box); None if not a plain read."""
    shape, t = _shape(node.args[0]), node.target
    dims, box = list(dims), list(box)
    if node.kwargs:
        return None
    if t in _SAME:
        return dims, box
    if t in _RESHAPES:
        dims = _reshaped(dims, shape, _shape(node))
        return None if dims is None else (dims, box)
    if t in _SQUEEZES:
        axes = node.args[1] if len(node.args) > 1 else range(len(shape))
        axes = {_axis(a, len(shape)) for a in ([axes] if isinstance(axes, int) else axes)}
        return [d for i, d in enumerate(dims) if not (i in axes and shape[i] == 1)], box
    if t == aten.unsqueeze.default:
        dims.insert(_axis(node.args[1], len(shape) + 1), None)
        return dims, box
    if t == aten.select.int:
        a = _axis(node.args[1], len(shape))
        start = node.args[2] + shape[a] if node.args[2] < 0 else node.args[2]
        stop = start + 1
    else:  # slice(x, dim=0, start=None, end=None, step=1)
        a, start, stop, step = (list(node.args[1:]) + [0, None, None, 1][len(node.args) - 1 :])[:4]
        if step != 1:
            return None
        a = _axis(a, len(shape))
        start, stop, _ = slice(start, stop).indices(shape[a])
    if dims[a] is not None:
        b0 = box[dims[a]][0]
        box[dims[a]] = (b0 + start, b0 + max(stop, start))
    elif (start, stop) != (0, 1):
        return None
    if t == aten.select.int:
        del dims[a]
    return dims, box


def _joined(node: Node, dims: list, box: list) -> Optional[list]:
    """[(input node, its place)] for `node`, a join at (dims, box); None if not a plain join."""
    t, shape = node.target, _shape(node)
    if t in (aten.cat.default, aten.stack.default):
        parts = node.args[0]
        a = _axis(node.args[1] if len(node.args) > 1 else 0, len(shape))
        if dims[a] is None:
            return None
        out, offset = [], box[dims[a]][0]
        for part in parts:
            stacked = t == aten.stack.default  # each part unsqueezed at `a`, then a cat
            size = 1 if stacked else _shape(part)[a]
            part_box = list(box)
            part_box[dims[a]] = (offset, offset + size)
            part_dims = [d for i, d in enumerate(dims) if i != a] if stacked else list(dims)
            out.append((part, (part_dims, part_box)))
            offset += size
        return out
    source = node.args[0]
    before = _shape(source)
    if t in _SAME:
        return [(source, (list(dims), list(box)))]
    if t in _RESHAPES or t in _SQUEEZES or t == aten.unsqueeze.default:
        back = _reshaped(dims, shape, before)  # each adds or drops axes of size 1 only
        return None if back is None else [(source, (back, list(box)))]
    return None


def _whole(shape: tuple) -> tuple:
    return list(range(len(shape))), [(0, s) for s in shape]


def _key(place: tuple) -> tuple:
    return tuple(place[1])


def _elements(place: tuple) -> int:
    return math.prod(b - a for a, b in place[1])


def _input_parts(placeholder: Node) -> Optional[tuple]:
    """(the nodes to leave in float, {part node: place}) of a state input, or None."""
    places, order = {placeholder: _whole(_shape(placeholder))}, [placeholder]
    for node in order:  # the tree of plain reads from the input
        for user in node.users:
            if user.op == "call_function" and user.target in _READS and user.args[0] is node:
                place = _read(user, *places[node])
                if place is not None:
                    places[user] = place
                    order.append(user)
    narrows = {n for n in order[1:] if _elements(places[n]) < _elements(places[n.args[0]])}

    def below(node):  # node and every read after it
        out = [node]
        for user in node.users:
            if user in places:
                out += below(user)
        return out

    floating = [n for n in order if any(m in narrows for m in below(n)[1:])]
    parts = [n for n in order[1:] if n not in floating and n.args[0] in floating]
    if placeholder not in floating or not parts:
        return None
    for node in floating:  # a float value read by anything but the reads: no
        if any(u not in places for u in node.users):
            return None
    return floating, {n: places[n] for n in parts}


def _feeds_loop(node: Node) -> bool:
    """Whether `node` reaches a loop-form node through moves: a loop's step pairs its state
    input with its output by position, in one quantization (loop.step), which a part's own
    observer outside it would split."""
    return any(
        u.target == loop_op.OP or (u.target in _READS and _feeds_loop(u)) for u in node.users
    )


def _output_parts(graph: Graph, index: int) -> Optional[tuple]:
    """(the nodes to leave in float, {part: place}) of a state output, or None. The float
    nodes are the concatenations and the moves after them; a part is what a concatenation
    reads (a move before one stays with its producer on the NPU: ExecuTorch fuses equal
    moves, and the producer's other readers may read the same one)."""
    root = graph.output_node().args[0][index]
    if not isinstance(root, Node):
        return None
    places, children, order = {root: _whole(_shape(root))}, {}, [root]
    for node in order:  # the tree of plain joins into the output
        joined = None
        if node.op == "call_function" and node.target in _JOINS:
            joined = _joined(node, *places[node])
        children[node] = [n for n, _ in joined or []]
        for child, place in joined or []:
            if child in places:
                return None  # read twice
            places[child] = place
            order.append(child)

    def concatenates(node):
        return node.target in (aten.cat.default, aten.stack.default) or any(
            concatenates(c) for c in children[node]
        )

    floating = [n for n in order if children[n] and concatenates(n)]
    parts = {c: places[c] for n in floating for c in children[n] if c not in floating}
    if root not in floating:
        return None
    for node in floating:  # the assembly feeds the output only
        if any(u not in floating and u.op != "output" for u in node.users):
            return None
    return floating, parts


@dataclasses.dataclass
class Split:
    """A packed state `split` marked: its parts' readers' first nodes, by place."""

    state: Node
    output: Node  # what the program returns for the state
    firsts: dict  # place -> the first part node read there, which holds its observer
    finals: dict  # part the assembly reads -> its place


def split(graph: Graph, spec) -> list[Split]:
    """Before the Arm quantizer annotates: leave each packed stream state's reads and
    assembly in float and give its parts `spec`, one observer per place (module doc); the
    Arm annotator skips what is annotated, so no concatenation ties the parts again."""
    if spec is None:  # no quantization to split
        return []
    placeholders = list(graph.find_nodes(op="placeholder"))
    pairs = streams.pairs_of_shapes(*io_shapes(graph, placeholders))
    position = {n: k for k, n in enumerate(graph.nodes)}
    done = []
    for i, j in pairs:
        state = placeholders[i]
        reads, joins = _input_parts(state), _output_parts(graph, j)
        if not reads or not joins:
            continue
        (floating_in, inputs), (floating_out, finals) = reads, joins
        if any(_feeds_loop(n) for n in inputs):
            continue  # the loop form's steps keep the state's one scale
        by_place = {}
        for node, place in inputs.items():
            by_place.setdefault(_key(place), []).append(node)
        if {_key(p) for p in finals.values()} != set(by_place):
            continue
        firsts = {key: min(nodes, key=position.get) for key, nodes in by_place.items()}
        for node in floating_in + floating_out:
            if node is not state:  # (the Arm quantizer annotates program inputs anyway)
                node.meta[_Q_KEY] = QuantizationAnnotation(_annotated=True)  # float
                origin.tag(node, state_part=True)
        for node, place in inputs.items():  # computed in float, quantized at its output
            first = firsts[_key(place)]
            own = spec if node is first else SharedQuantizationSpec(first)
            node.meta[_Q_KEY] = QuantizationAnnotation(output_qspec=own, _annotated=True)
            origin.tag(node, state_part=True)
        root = graph.output_node().args[0][j]
        done.append(Split(state, root, firsts, finals))
    return done


def tie(graph: Graph, splits: list[Split]) -> None:
    """After annotation: each part's final value in its initial value's group, the state
    input and the assembled output left in float."""
    annotation = graph.output_node().meta.get(_Q_KEY)
    for done in splits:  # the Arm quantizer annotates every program input and output
        if _Q_KEY in done.state.meta:
            done.state.meta[_Q_KEY].output_qspec = None
        if annotation is not None:
            annotation.input_qspec_map.pop(done.output, None)
        for final, place in done.finals.items():
            found, first = root_holder(final), done.firsts[_key(place)]
            if found is not None and found[0] is not first:
                found[1](SharedQuantizationSpec(first))


def is_state_part(node: Node) -> bool:
    """Whether `node` reads or assembles a packed state's parts on the CPU (`split`)."""
    return bool(origin.field(node, "state_part"))
