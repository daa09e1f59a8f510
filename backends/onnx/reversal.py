"""Explicit time reversals around a forward recurrent node, folded into direction="reverse".

Some exporters write a bidirectional layer as two forward nodes, the second between two
Slices that reverse the time axis (madmom: x -> Slice(step -1) -> Unsqueeze -> RNN -> Y ->
Squeeze -> Slice(step -1)). A forward node over reversed inputs, read back reversed, is the
reverse direction of the same node: Y[t] and Y_h agree step for step. Folded, the layer
keeps no reversal for a target to run (U55's TOSA profile has no REVERSE, so each would
split the program at a CPU op), and the loop form reads its steps backwards instead.

A reversal here is a Slice of one constant axis, step -1, from the last element
(start -1 or beyond the end) past the first (end at most -2**31), so the whole axis for
any length. The node folds when its X is such a reversal of the time axis (through an
Unsqueeze or not) and every reader of Y reverses it back (through a Squeeze or not);
sequence_lens must be absent, the node forward and at the top level of the graph.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import helper

from .folding import Scope
from .reader import is_recurrent, node_label

_PAST_FIRST = -(2**31)  # an end at or below this covers any axis length
_X, _Y, _SEQUENCE_LENS = 0, 0, 4


def _attribute(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _ints(scope: Scope, node: onnx.NodeProto, index: int) -> Optional[list]:
    if index >= len(node.input) or not node.input[index]:
        return None
    value = scope.value(node.input[index])
    return None if value is None else [int(v) for v in np.asarray(value).ravel()]


def _reversed_axis(scope: Scope, node: onnx.NodeProto) -> Optional[int]:
    """The axis a Slice reverses whole (opset 10 and later), or None."""
    if node.op_type != "Slice" or len(node.input) < 5:
        return None
    starts, ends, axes, steps = (_ints(scope, node, i) for i in (1, 2, 3, 4))
    if None in (starts, ends, axes, steps) or len(axes) != 1 or axes[0] < 0:
        return None
    if steps != [-1] or ends[0] > _PAST_FIRST or not (starts[0] == -1 or starts[0] >= 2**31 - 1):
        return None
    return axes[0]


def _axes(scope: Scope, node: onnx.NodeProto) -> Optional[list]:
    """Squeeze/Unsqueeze axes (an input from opset 13, an attribute before), non-negative."""
    axes = _ints(scope, node, 1) if len(node.input) > 1 else _attribute(node, "axes")
    if axes is None or any(a < 0 for a in axes):
        return None
    return sorted(axes)


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.scope = Scope(model.graph, model.opset_import)
        self.producer = {o: n for n in self.graph.node for o in n.output if o}
        self.readers: dict = {}
        for n in self.graph.node:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in self.graph.output}

    def only_reader(self, name: str, node) -> bool:
        return name not in self.outputs and self.readers.get(name, []) == [node]


def _input_reversal(g: _Graph, x: str, time_axis: int, node) -> Optional[tuple]:
    """(Slice, Unsqueeze or None) when X is the time reversal of the Slice's input."""
    unsqueeze = g.producer.get(x)
    axis = time_axis
    if unsqueeze is not None and unsqueeze.op_type == "Unsqueeze":
        axes = _axes(g.scope, unsqueeze)
        if axes is None or time_axis in axes or not g.only_reader(x, node):
            return None
        axis = time_axis - sum(a < time_axis for a in axes)  # the axis before unsqueezing
        source = unsqueeze.input[0]
    else:
        unsqueeze, source = None, x
    slice_ = g.producer.get(source)
    if slice_ is None or _reversed_axis(g.scope, slice_) != axis:
        return None
    return slice_, unsqueeze


def _output_reversals(g: _Graph, y: str, time_axis: int) -> Optional[list]:
    """The Slices that reverse Y back (through Squeezes that keep the time axis), or None
    if anything else reads Y."""
    if y in g.outputs:
        return None
    slices = []
    for reader in g.readers.get(y, []):
        axis, value = time_axis, y
        if reader.op_type == "Squeeze":
            axes = _axes(g.scope, reader)
            if axes is None or time_axis in axes or reader.output[0] in g.outputs:
                return None
            axis = time_axis - sum(a < time_axis for a in axes)
            value, readers = reader.output[0], g.readers.get(reader.output[0], [])
        else:
            readers = [reader]
        for r in readers:
            if r.input[0] != value or _reversed_axis(g.scope, r) != axis:
                return None
            slices.append(r)
    return slices


def fold_reversals(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list]:
    """(model with each foldable reversal pair folded, labels of the nodes now reverse).
    The input model is not modified."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = _Graph(out)
    folded, constants = [], set()
    for node in list(g.graph.node):
        if not is_recurrent(node) or _attribute(node, "direction", b"forward") != b"forward":
            continue
        if len(node.input) > _SEQUENCE_LENS and node.input[_SEQUENCE_LENS]:
            continue
        time_axis = 1 if _attribute(node, "layout", 0) == 1 else 0
        found = _input_reversal(g, node.input[_X], time_axis, node)
        y = node.output[_Y] if node.output else ""
        slices = _output_reversals(g, y, time_axis) if y else []
        if found is None or slices is None:
            continue
        slice_, unsqueeze = found
        constants.update(slice_.input[1:])
        constants.update(i for s in slices for i in s.input[1:])
        if unsqueeze is not None:
            unsqueeze.input[0] = slice_.input[0]
        else:
            node.input[_X] = slice_.input[0]
        _set_direction(node, b"reverse")
        for s in slices:  # Y (or its squeeze) read as it is: the Slice passes it through
            s.op_type = "Identity"
            del s.input[1:]
            s.ClearField("attribute")
        folded.append(node_label(node))
        g = _Graph(out)  # readers changed
    _drop_unread(out, constants)
    return out, folded


def _set_direction(node: onnx.NodeProto, direction: bytes) -> None:
    for a in node.attribute:
        if a.name == "direction":
            a.s = direction
            return
    node.attribute.append(helper.make_attribute("direction", direction))


def _drop_unread(model: onnx.ModelProto, constants: set) -> None:
    """Remove the input Slices nothing reads any more, and their bounds (`constants`) when
    they were initializers nothing else reads."""
    graph = model.graph
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for n in [n for n in graph.node if n.op_type == "Slice"]:
        if not any(o in read for o in n.output):
            graph.node.remove(n)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for t in [t for t in graph.initializer if t.name in constants and t.name not in read]:
        graph.initializer.remove(t)
