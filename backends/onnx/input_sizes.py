"""Sizes for an ONNX model's dynamic input dimensions, from what the graph itself fixes.

A model exported with dynamic axes says nothing about the sizes it takes, yet its weights
often do: a recurrent node's W fixes the feature size of its X, a MatMul or Gemm by a
constant matrix the last axis of its input, a Conv's W the channels of its input. Each
dynamic input dimension gets a symbol; symbolic shape inference (onnxruntime's, which
follows Shape -> Gather -> Concat -> Reshape arithmetic, else onnx's) carries the symbols
to those nodes, and each node binds the symbols it sees: features to the weight's size,
a recurrent node's batch axis to 1 and its time axis to the caller's `time_steps`.
Integer inputs get a value the graph suggests: the constant they are compared with
(`Equal(sr, 16000)`), or the full length when they are a recurrent node's sequence_lens.
What no node fixes stays open (None): the caller chooses.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional

import numpy as np
import onnx

from .constants import Scope
from .reader import is_recurrent


@dataclasses.dataclass(frozen=True)
class Bound:
    """One input dimension's size and why (for the report)."""

    size: int
    why: str


@dataclasses.dataclass
class InputSizes:
    """dims[input][axis]: a Bound, or None where the graph fixes nothing (dynamic axes
    only; static ones are not listed). values[input]: a suggested value for an integer
    input, with why."""

    dims: dict
    values: dict


def _graphs_of(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _user_inputs(model: onnx.ModelProto) -> list:
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def _with_symbols(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """A copy whose dynamic input dimensions all carry a symbol (dim_param), and
    symbol -> [(input, axis)]. Dimensions that share a dim_param share the symbol."""
    named = onnx.ModelProto()
    named.CopyFrom(model)
    symbols: dict = {}
    for value in _user_inputs(named):
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            if not dim.dim_param:
                dim.dim_param = f"{value.name}[{axis}]"
            symbols.setdefault(dim.dim_param, []).append((value.name, axis))
    return named, symbols


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """Symbolic shape inference: onnxruntime's where it copes with the model (it does not
    with every If), else onnx's with data propagation, else the model as declared."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # noqa: BLE001 - its failures are asserts and KeyErrors alike
        pass
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - an invalid model is refused later, with a reason
        return model


def _dims(value: onnx.ValueInfoProto) -> Optional[list]:
    """[int | str | None] per axis, or None when the rank is unknown."""
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


class _Binder:
    def __init__(self, symbols: dict, time_steps: int):
        self.symbols = symbols
        self.time_steps = time_steps
        self.bound: dict = {}  # symbol -> Bound; the first binding wins
        self.values: dict = {}  # integer input -> Bound
        self.aliases: dict = {}  # symbol in the inferred model -> input symbols it stands for

    def bind(self, dim, size: int, why: str) -> None:
        for symbol in self.aliases.get(dim, ()) if isinstance(dim, str) else ():
            self.bound.setdefault(symbol, Bound(int(size), why))

    def follow(self, inferred_inputs) -> None:
        """What inference made of each input symbol: merged into another symbol (an alias)
        or resolved to a size, which binds it."""
        self.aliases = {symbol: [symbol] for symbol in self.symbols}
        for value in inferred_inputs:
            for axis, dim in enumerate(_dims(value) or []):
                for symbol, places in self.symbols.items():
                    if (value.name, axis) not in places or dim == symbol:
                        continue
                    if isinstance(dim, int):
                        self.bind(symbol, dim, "fixed by the graph, per shape inference")
                    elif dim:
                        self.aliases.setdefault(dim, []).append(symbol)


def _label(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}(->{next((o for o in node.output if o), '?')})"


def _walk(graph: onnx.GraphProto, scope: Scope, shapes: dict, binder: _Binder, inputs) -> None:
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims = _dims(value)
        if dims is not None:
            shapes.setdefault(value.name, dims)

    def shape(name: str) -> Optional[list]:
        return shapes.get(name) if name else None

    def constant_shape(name: str) -> Optional[tuple]:
        value = scope.value(name) if name else None
        return None if value is None else np.shape(value)

    for node in graph.node:
        label = _label(node)
        if is_recurrent(node):
            _recurrent(node, label, shape, constant_shape, binder, inputs)
        elif node.op_type == "MatMul" and len(node.input) == 2:
            a, b = shape(node.input[0]), constant_shape(node.input[1])
            if a and b is not None and len(b) == 2:
                binder.bind(a[-1], b[0], f"the rows of {label}'s constant matrix")
        elif node.op_type == "Gemm" and len(node.input) >= 2:
            attrs = {a.name: a.i for a in node.attribute}
            a, b = shape(node.input[0]), constant_shape(node.input[1])
            if a and len(a) == 2 and b is not None and len(b) == 2:
                k = b[1] if attrs.get("transB", 0) else b[0]
                binder.bind(a[0 if attrs.get("transA", 0) else 1], k, f"{label}'s constant B")
        elif node.op_type == "Conv" and len(node.input) >= 2:
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            x, w = shape(node.input[0]), constant_shape(node.input[1])
            if x and len(x) > 1 and w is not None and len(w) > 1:
                binder.bind(x[1], w[1] * group, f"the input channels of {label}'s W")
        elif node.op_type == "Equal" and len(node.input) == 2:
            for this, other in (node.input, node.input[::-1]):
                constant = scope.value(other)
                if this in inputs and constant is not None and np.size(constant) == 1:
                    why = f"the value {label} compares it with"
                    binder.values.setdefault(this, Bound(int(np.ravel(constant)[0]), why))
        for sub in _graphs_of(node):
            _walk(sub, scope.child(sub), shapes, binder, inputs)


def _recurrent(node, label, shape, constant_shape, binder: _Binder, inputs) -> None:
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    time_axis, batch_axis = (1, 0) if layout else (0, 1)
    x, w = shape(node.input[0]), constant_shape(node.input[1] if len(node.input) > 1 else "")
    if x and len(x) == 3:
        if w is not None and len(w) == 3:
            binder.bind(x[2], w[2], f"the input size of {label}'s W")
        binder.bind(x[batch_axis], 1, f"the batch axis of {label}")
        binder.bind(x[time_axis], binder.time_steps, f"the time axis of {label}")
    for index in (5, 6):  # initial_h, initial_c: [directions, batch, H] (layout 1: batch first)
        state = shape(node.input[index] if len(node.input) > index else "")
        if state and len(state) == 3:
            binder.bind(state[0 if layout else 1], 1, f"the batch axis of {label}")
    lengths = node.input[4] if len(node.input) > 4 else ""
    if lengths in inputs:
        steps = x[time_axis] if x and len(x) == 3 else None
        size = steps if isinstance(steps, int) else binder.time_steps
        binder.values.setdefault(lengths, Bound(size, f"the full length of {label}"))


def infer(model: onnx.ModelProto, time_steps: int) -> InputSizes:
    """What `model`'s graph fixes of its dynamic input dimensions and integer inputs."""
    named, symbols = _with_symbols(model)
    inferred = _inferred(named)
    binder = _Binder(symbols, time_steps)
    binder.follow(inferred.graph.input)
    inputs = {v.name for v in _user_inputs(model)}
    root = Scope(inferred.graph, inferred.opset_import)
    _walk(inferred.graph, root, {}, binder, inputs)
    dims: dict = {}
    for symbol, places in symbols.items():
        for name, axis in places:
            dims.setdefault(name, {})[axis] = binder.bound.get(symbol)
    return InputSizes(dims, binder.values)
