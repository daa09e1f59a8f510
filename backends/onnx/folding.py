"""Constant folding for the values a recurrent node needs as weights.

Exporters rarely hand W/R/B over as plain initializers: silero-vad slices, concatenates
and unsqueezes outer-scope Constant nodes inside an If branch. A value counts as constant
when it is an initializer or Constant output of its graph or an enclosing one, or the
output of a deterministic node whose inputs are all constant; such nodes are evaluated
with `onnx.reference`, one at a time, and memoised.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

# Ops whose outputs are not a function of their inputs alone.
_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
}


class Scope:
    """Constants visible in one graph: its own plus those of every enclosing graph."""

    def __init__(self, graph: onnx.GraphProto, opset_imports, parent: Optional["Scope"] = None):
        self.parent = parent
        self.opset_imports = list(opset_imports)
        self.initializers = {t.name: t for t in graph.initializer}
        self.inputs = {i.name for i in graph.input}
        self.producers = {o: n for n in graph.node for o in n.output if o}
        self._cache: dict = {}

    def child(self, graph: onnx.GraphProto) -> "Scope":
        return Scope(graph, self.opset_imports, self)

    def value(self, name: str) -> Optional[np.ndarray]:
        """The constant value of `name`, or None if it is computed at run time."""
        if name in self._cache:
            return self._cache[name]
        result = self._fold(name)
        self._cache[name] = result
        return result

    def _fold(self, name: str) -> Optional[np.ndarray]:
        if name in self.initializers:
            # An initializer also listed as a graph input is an overridable default; like
            # the exporters that write every weight this way, treat it as the weight.
            return numpy_helper.to_array(self.initializers[name])
        if name in self.inputs:
            return None
        node = self.producers.get(name)
        if node is None:
            return self.parent.value(name) if self.parent is not None else None
        if node.op_type in _NONDETERMINISTIC or node.domain not in ("", "ai.onnx"):
            return None
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            return None
        feeds = {}
        for i in node.input:
            if not i:
                continue
            v = self.value(i)
            if v is None:
                return None
            feeds[i] = v
        try:
            outputs = _evaluate(node, feeds, self.opset_imports)
        except Exception:  # noqa: BLE001 - anything the reference cannot fold is run-time
            return None
        for out, v in zip(node.output, outputs):
            if out:
                self._cache[out] = np.asarray(v)
        return self._cache.get(name)


def _evaluate(node: onnx.NodeProto, feeds: dict, opset_imports) -> list:
    inputs = [
        helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.asarray(v).shape
        )
        for n, v in feeds.items()
    ]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=opset_imports)
    return ReferenceEvaluator(model).run(None, feeds)
