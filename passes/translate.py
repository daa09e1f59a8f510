"""Writing a program through an adapter's Builder: one builder call per node kind.

Nodes are written in dependency order from the outputs, each once; scalar constants once
per value; an activation by its native op where the builder has one, else composed from
primitives (activations.py). A `loop` is handed to the builder with its body as data: the
builder makes an inner builder for the body and translates the body with `translate_body`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import activations
from .builder import Builder, Value
from .graph import Body, Node, linear_operands, reachable


class _Translator:
    def __init__(self, builder: Builder, bindings: dict, outer: Optional[dict] = None):
        self.b, self.bindings, self.outer = builder, bindings, outer or {}
        self.values: dict = {}  # id(node) -> builder value (lists for multi-output nodes)
        self._scalars: dict = {}
        self._used: dict = {}  # id(loop node) -> indices of the results something reads

    def scalar(self, v: float) -> Value:
        key = float(v)
        if key not in self._scalars:
            self._scalars[key] = self.b.constant(np.array(v, self.b.dtype))
        return self._scalars[key]

    def run(self, outputs: Sequence) -> list:
        order = reachable([o for o in outputs if o is not None])
        for node in order:
            if node.op == "result" and node.args[0].op == "loop":
                self._used.setdefault(id(node.args[0]), set()).add(node.attrs.index)
        for node in order:
            if id(node) not in self.values:
                self.values[id(node)] = self._write(node)
        return [None if o is None else self.values[id(o)] for o in outputs]

    def _write(self, node: Node):
        b, op, at = self.b, node.op, node.attrs
        args = [self.values[id(a)] for a in node.args]
        if op == "input":
            return self.bindings[at.name]
        if op == "external":
            v = at.value
            return self.outer[id(v)] if isinstance(v, Node) else v
        if op == "const":
            a, role = at.array, at.role
            if a.ndim == 0 and a.dtype.kind == "f" and role is None:
                return self.scalar(float(a))
            return b.constant(a, "" if role is None else str(role))
        if op in ("add", "sub", "mul", "less", "where"):
            return getattr(b, op)(*args)
        if op == "neg":
            return b.mul(args[0], self.scalar(-1.0))
        if op == "clamp":
            return b.clamp(args[0], *at)
        if op == "act":
            return activations.apply(b, at.act, args[0], const=self.scalar)
        if op == "linear":
            return b.linear(*linear_operands(node, args), role=at.role)
        if op in ("slice", "squeeze", "unsqueeze", "transpose", "reshape", "unstack", "split"):
            return getattr(b, op)(args[0], *at)
        if op in ("concat", "stack"):
            return getattr(b, op)(args, *at)
        if op == "positions":
            return b.positions(args[0])
        if op == "zeros_like_rows":
            return b.zeros_like_rows(args[0], at.width)
        if op in ("piece", "result"):
            return args[0][at.index]
        if op == "loop":
            loop = at.loop
            n = loop.body.num_carried
            outer = {id(v): self._outer(v) for v in _externals(loop.body)}
            used = frozenset(self._used.get(id(node), ()))
            carried, ys = b.loop(loop, args[:n], args[n:], outer, used)
            return [*carried, *ys]
        raise AssertionError(f"no translation for a {op} node")

    def _outer(self, node: Node) -> Value:
        """A node of the enclosing program a loop body reads (a runtime weight)."""
        if id(node) not in self.values:
            self.run([node])
        return self.values[id(node)]


def _externals(body: Body) -> list:
    return [
        n.attrs.value
        for n in reachable(body.outputs)
        if n.op == "external" and isinstance(n.attrs.value, Node)
    ]


def translate(builder: Builder, outputs: Sequence, bindings: dict) -> list:
    """The builder values of `outputs` (nodes; None stays None); `bindings` gives the
    builder value of each `input` node by name."""
    return _Translator(builder, bindings).run(outputs)


def translate_body(
    body: Body, builder: Builder, leaves: Sequence, outer: dict
) -> tuple[list, list]:
    """A loop body written through `builder` (the loop's inner builder): `leaves` are the
    builder values of body.inputs, `outer` the values of the enclosing program's nodes
    the body reads. Returns (new carried values, per-step outputs)."""
    bindings = {leaf.attrs.name: v for leaf, v in zip(body.inputs, leaves)}
    out = _Translator(builder, bindings, outer).run(body.outputs)
    return out[: body.num_carried], out[body.num_carried :]
