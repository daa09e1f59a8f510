"""The loop form in ONNX: a loop node of the program written as one `Scan`.

The body is the program's loop body, translated by an inner OnnxBuilder (outer values stay
visible: ONNX outer scope). Around it, what a Scan needs or runs faster with: a body output
that is also a carried state is computed outside from two stacked step values (a body
output listed twice is wrong in onnxruntime), a scan input the body only cuts with one
Split is cut once outside instead, and (`unpack_loop_weights`) a one-row product's
constant weight reaches the body through Optional -> OptionalGetElement, which onnxruntime
does not prepack (docs/onnx.md, "Tuned for onnxruntime").
"""

from __future__ import annotations

import onnx
from onnx import helper

from recurrent_lowering.passes.translate import translate_body


class ScanWriter:
    """OnnxBuilder's `loop`."""

    # --- loops ----------------------------------------------------------------------------------
    def loop(self, loop, carried, xs, outer, used=None) -> tuple[list, list]:
        if self.opset < 9:
            raise NotImplementedError("Scan with scan_input_directions needs opset 9")
        if loop.initial_in_ys or loop.first or loop.steps is not None or loop.rows_per_step:
            raise NotImplementedError("loop rows")  # not a capability of this builder
        body, reverse = loop.body, loop.reverse
        carried, xs = list(carried), list(xs)
        inner = type(self)(
            self.names.new(f"{self.prefix}/scan_body"),
            self.float_dtype,
            self.opset,
            self.names,
            self.pool,
            self.linear_mode,
            self.unpack_loop_weights,
        )
        inner.types = dict(self.types)  # outer values stay visible (outer scope)
        graph_inputs = []
        carried_in = []
        for v in carried:
            name = self.names.new(f"{inner.prefix}/state_in")
            inner.declare(name, self.elem_type(v), self.shape(v))
            carried_in.append(name)
            graph_inputs.append(_value_info(name, self.elem_type(v), self.shape(v)))
        slices_in = []
        for v in xs:
            shape = self.shape(v)
            name = self.names.new(f"{inner.prefix}/x_in")
            inner.declare(name, self.elem_type(v), None if shape is None else shape[1:])
            slices_in.append(name)
            graph_inputs.append(_value_info(name, self.elem_type(v), inner.shape(name)))
        new_carried, ys = translate_body(body, inner, [*carried_in, *slices_in], outer)
        new_carried, ys = list(new_carried), list(ys)
        if len(new_carried) != len(carried):
            raise ValueError("scan body must return as many carried values as it received")
        produced = {o for n in inner.nodes for o in n.output}
        body_outputs, seen = [], set()
        for v in new_carried:
            if v not in produced or v in seen:
                v = inner._node("Identity", [v], inner.elem_type(v), inner.shape(v))
            seen.add(v)
            body_outputs.append(v)
        # A step output that is also a carried state would need an Identity (a body output
        # listed twice is wrong in onnxruntime); when it is an elementwise op of two step
        # values, the loop outputs those two and the op runs once on the stacked results.
        recombine = {}  # index in ys -> the op recomputing it outside the loop
        for j, v in enumerate(ys):
            pair = _recombinable(inner, v, seen, set(ys)) if v in seen else None
            if pair is not None:
                recombine[j] = pair[0]
                body_outputs += pair[1:]
                seen.update(pair[1:])
                continue
            if v not in produced or v in seen:
                v = inner._node("Identity", [v], inner.elem_type(v), inner.shape(v))
            seen.add(v)
            body_outputs.append(v)
        body_nodes = inner.nodes
        steps = None
        if xs and self.shape(xs[0]) is not None:
            steps = self.shape(xs[0])[0]
        body_nodes, xs, slices_in = self._hoist_input_splits(
            inner, body_nodes, xs, slices_in, set(body_outputs)
        )
        if self.unpack_loop_weights and self.opset >= 15:
            self._unpacked_loop_weights(inner, body_nodes)
        graph_inputs = graph_inputs[: len(carried)] + [
            _value_info(v, inner.elem_type(v), inner.shape(v)) for v in slices_in
        ]
        graph_outputs = [_value_info(v, inner.elem_type(v), inner.shape(v)) for v in body_outputs]
        graph = helper.make_graph(
            body_nodes, self.names.new(f"{inner.prefix}/graph"), graph_inputs, graph_outputs
        )
        n_ys = len(body_outputs) - len(new_carried)
        attrs = {"body": graph, "num_scan_inputs": len(xs)}
        if reverse and xs:
            attrs["scan_input_directions"] = [1] * len(xs)
        if reverse and n_ys:
            attrs["scan_output_directions"] = [1] * n_ys
        outputs = [self.names.new(f"{self.prefix}/Scan") for _ in body_outputs]
        self.nodes.append(
            helper.make_node(
                "Scan",
                carried + xs,
                outputs,
                name=self.names.new(f"{self.prefix}/Scan_node"),
                **attrs,
            )
        )
        for v, out in zip(body_outputs, outputs):
            s = inner.shape(v)
            if out in outputs[len(new_carried) :]:
                s = None if s is None else (steps,) + s
            self.types[out] = (inner.elem_type(v), s)
        stacked, k = [], len(new_carried)
        for j in range(len(ys)):
            if j in recombine:
                stacked.append(self._binary(recombine[j], outputs[k], outputs[k + 1]))
                k += 2
            else:
                stacked.append(outputs[k])
                k += 1
        return outputs[: len(new_carried)], stacked

    def _unpacked_loop_weights(self, inner, body_nodes) -> None:
        """Feed each constant weight (input B) of the body's one-row Gemm/MatMul nodes (a
        static batch of 1) through Optional -> OptionalGetElement, once per loop, before
        the Scan.

        onnxruntime prepacks a constant B, and for a one-row product (a batch-1 recurrent
        step) its packed kernel is slower than its plain GEMV: 18-21 against 14-15 us for
        [1,256]x[256,768] (docs/onnx.md). It folds only tensors, so a weight that passes
        through an optional value is no longer a constant to it and is not packed; the two
        nodes run once per inference. Other runtimes see an identity.
        """
        unpacked: dict = {}
        for node in body_nodes:
            if node.op_type not in ("Gemm", "MatMul") or node.input[1] not in self.pool:
                continue
            rows = inner.shape(node.input[0])
            if rows is None or any(d != 1 for d in rows[:-1]):
                continue  # more rows or unknown: packed is faster (batch 8: 1.07x vs 1.34x)
            weight = node.input[1]
            if weight not in unpacked:
                optional = self._node("Optional", [weight], None, None)
                unpacked[weight] = self._node(
                    "OptionalGetElement", [optional], *inner.types[weight]
                )
            node.input[1] = unpacked[weight]

    def _hoist_input_splits(self, inner, body_nodes, xs, slices_in, body_outputs: set):
        """A scan input the body only cuts with one Split (the cell's x_t into its gate
        groups) is cut once outside the loop instead, and its pieces become the scan
        inputs: one node per step less."""
        xs, slices_in = list(xs), list(slices_in)
        readers: dict = {}
        for n in body_nodes:
            for i in _inputs_of([n]):
                readers.setdefault(i, []).append(n)
        outer_rank_known = [self.shape(x) is not None for x in xs]
        new_xs, new_slices, dropped = [], [], set()
        for x, inner_x, known in zip(xs, slices_in, outer_rank_known):
            users = readers.get(inner_x, [])
            split = users[0] if len(users) == 1 else None
            if (
                split is None
                or not known
                or split.op_type != "Split"
                or split.input[0] != inner_x
                or inner_x in split.input[1:]
                or not body_outputs.isdisjoint(split.output)
                or any(inner.shape(o) is None for o in split.output if o in readers)
            ):
                new_xs.append(x)
                new_slices.append(inner_x)
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
            axis = attrs.get("axis", 0)
            attrs["axis"] = axis + 1 if axis >= 0 else axis  # the outer value has time first
            pieces = [self.names.new(f"{self.prefix}/Split") for _ in split.output]
            self.nodes.append(
                helper.make_node(
                    "Split",
                    [x] + list(split.input[1:]),
                    pieces,
                    name=self.names.new(f"{self.prefix}/Split_node"),
                    **attrs,
                )
            )
            steps = self.shape(x)[0]
            for piece, inner_piece in zip(pieces, split.output):
                if inner_piece not in readers:
                    continue  # a gap no step reads
                shape = inner.shape(inner_piece)
                self.types[piece] = (self.elem_type(x), (steps,) + shape)
                new_xs.append(piece)
                new_slices.append(inner_piece)
            dropped.add(id(split))
        if not dropped:
            return body_nodes, xs, slices_in
        return [n for n in body_nodes if id(n) not in dropped], new_xs, new_slices


def _recombinable(inner, v, taken: set, ys: set):
    """(op, a, b) when v = op(a, b) is elementwise over two values the step computes, of
    equal rank and not otherwise loop outputs: then stacking a and b over time and
    applying op once gives exactly the stacked v."""
    node = next((n for n in inner.nodes if v in n.output), None)
    if node is None or node.op_type not in ("Add", "Sub", "Mul", "Div"):
        return None
    a, b = node.input
    produced = {o for n in inner.nodes for o in n.output}
    sa, sb = inner.shape(a), inner.shape(b)
    if (
        a == b
        or {a, b} & (taken | ys)
        or not {a, b} <= produced
        or sa is None
        or sb is None
        or len(sa) != len(sb)
    ):
        return None
    return node.op_type, a, b


def _inputs_of(nodes) -> set:
    """Every value the nodes read, including from inside their subgraphs (outer scope)."""
    used = set()
    for n in nodes:
        used.update(n.input)
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []) + list(a.graphs):
                used |= _inputs_of(g.node) | {o.name for o in g.output}
    return used


def _value_info(name, elem_type, shape):
    if elem_type is None:
        raise ValueError(f"element type of {name!r} is unknown")
    return helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))
