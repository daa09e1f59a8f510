"""An ONNX graph specialised to fixed input shapes and constant inputs.

An NPU program is static, yet exporters compute shapes at run time (Shape -> Gather ->
Concat -> Reshape chains; an STFT's Pad with computed bounds) and branch on inputs
(silero-vad's If on the sample rate). `onnx.shape_inference` does not follow values, so
a recurrent node behind such a chain keeps an unknown sequence length and the If stays.
Given the shapes (and the integer inputs) the calibration fixes, this folds, until
nothing changes: Shape and Size of statically shaped values, deterministic nodes whose
inputs are all constant (`folding.Scope`), and If nodes with a constant condition (their
branch inlined). What remains computes on the model's data only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .folding import Scope

_LARGEST_FOLD = 1 << 20  # elements: a folded value bigger than this stays computed
_ROUNDS = 32


def specialize(model: onnx.ModelProto, shapes: dict, constants: dict) -> onnx.ModelProto:
    """A copy of `model` whose inputs have `shapes` (name -> static shape) and whose
    inputs in `constants` (name -> array) are those constants, folded as above."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    _fix_inputs(graph, shapes, constants)
    for _ in range(_ROUNDS):
        del graph.value_info[:]
        try:
            inferred = onnx.shape_inference.infer_shapes(out, data_prop=True)
        except Exception:  # noqa: BLE001 - inference is a help here, not a requirement
            inferred = out
        if not _fold_once(graph, _static_shapes(inferred.graph), out.opset_import):
            break
    _drop_dead(graph)
    del graph.value_info[:]
    try:
        return onnx.shape_inference.infer_shapes(out, data_prop=True)
    except Exception:  # noqa: BLE001
        return out


def _fix_inputs(graph: onnx.GraphProto, shapes: dict, constants: dict) -> None:
    kept = []
    for value in graph.input:
        if value.name in constants:
            _set_initializer(graph, value.name, np.asarray(constants[value.name]))
            continue
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            if len(dims) != len(shapes[value.name]):
                raise ValueError(
                    f"input {value.name!r}: rank {len(dims)}, given shape {shapes[value.name]}"
                )
            for dim, size in zip(dims, shapes[value.name]):
                dim.Clear()
                dim.dim_value = int(size)
        kept.append(value)
    del graph.input[:]
    graph.input.extend(kept)


def _set_initializer(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    for k, t in enumerate(graph.initializer):
        if t.name == name:
            del graph.initializer[k]
            break
    graph.initializer.append(numpy_helper.from_array(value, name))


def _static_shapes(graph: onnx.GraphProto) -> dict:
    shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in tensor.shape.dim)
    for t in graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def _shape_of(node: onnx.NodeProto, shapes: dict):
    """The value of Shape(x) or Size(x) when x is statically shaped, else None."""
    shape = shapes.get(node.input[0])
    if shape is None:
        return None
    if node.op_type == "Size":
        return np.array(int(np.prod(shape)), dtype=np.int64)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[start:end], dtype=np.int64)


def _fold_once(graph: onnx.GraphProto, shapes: dict, opset_import) -> bool:
    """One pass over the nodes; True if anything was folded or inlined."""
    scope = Scope(graph, opset_import)
    nodes, changed = [], False
    for node in graph.node:
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
            value = _shape_of(node, shapes)
            if value is not None:
                _set_initializer(graph, node.output[0], value)
                changed = True
                continue
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            condition = scope.value(node.input[0])
            if condition is not None:
                nodes += _inline(graph, node, bool(np.asarray(condition).reshape(-1)[0]))
                changed = True
                continue
        if _foldable(node, scope):  # Constant nodes too: onnx2torch wants initializers
            for name in node.output:
                if name:
                    _set_initializer(graph, name, scope.value(name))
            changed = True
            continue
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def _foldable(node: onnx.NodeProto, scope: Scope) -> bool:
    values = [scope.value(name) for name in node.output if name]
    return bool(values) and all(v is not None and v.size <= _LARGEST_FOLD for v in values)


def _inline(graph: onnx.GraphProto, node: onnx.NodeProto, condition: bool) -> list:
    """The nodes of the branch `condition` selects, writing the If's outputs."""
    branch = next(
        a.g for a in node.attribute if a.name == ("then_branch" if condition else "else_branch")
    )
    graph.initializer.extend(branch.initializer)
    nodes = list(branch.node)
    for inner, outer in zip(branch.output, node.output):
        if outer:
            nodes.append(helper.make_node("Identity", [inner.name], [outer]))
    return nodes


def _used_names(graph: onnx.GraphProto) -> set:
    """Every value name a node of `graph` or of a subgraph reads."""
    used = set()
    for node in graph.node:
        used.update(node.input)
        for a in node.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                used |= _used_names(g)
                used.update(o.name for o in g.output)
    return used


def _drop_dead(graph: onnx.GraphProto) -> None:
    """Nodes and initializers nothing reads any more."""
    outputs = {o.name for o in graph.output}
    while True:
        used = _used_names(graph) | outputs
        live = [n for n in graph.node if any(o in used for o in n.output if o)]
        if len(live) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(live)
    used = _used_names(graph) | outputs
    initializers = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
