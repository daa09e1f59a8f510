"""TOSA for `recurrent_lowering::loop`: the step template written once per timestep.

`register()` adds two classes to ExecuTorch's public registries (compat.lowering calls it
before our first lowering; they concern our loop op alone): `register_tosa_support_check`
lets the Arm partitioners delegate the loop node and `register_node_visitor` writes its
TOSA. ExecuTorch's passes see one node per layer direction;
the visitor lowers the step once (loop.step) and instantiates it T times:

    xs [T, B, G] -> RESHAPE [T*B, G] (none when xs is that view) -> (RESCALE to the step's
        x scale) -> SLICE rows per step
    h0 -> (RESCALE to the step's h scale) -> step 0 -> step 1 -> ... (states flow unrescaled)
    (h0 and) every step's h -> CONCAT [T*B, H] (+ c_n) -> RESCALE to the node's output scale
        -> RESHAPE

The rescales run once per layer, not per step; on a float TOSA profile there are none, and
on an integer one the step takes the projection's and Y's scales where its own precision
allows (loop.step pins), so only h0's (one row) may be left.

Vela copies a value that has several readers when one of them is a RESHAPE (the step's h
into the MATMUL's column) or a CONCAT (Y): 250 cycles each on U85 per step. So each looped
step writes its h more than once, each by its own copy of the few ops that compute it
(TosaTemplate.tail: one fused NPU op, about 32 cycles): one read only by Y's CONCAT, one per
RESHAPE of h in the next step, and the original for the rest.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional

import numpy as np
import torch
import tosa_serializer as ts
from executorch.backends.arm.operator_support.tosa_supported_operators import (
    SupportedTOSAOperatorCheck,
    register_tosa_support_check,
)
from executorch.backends.arm.operators.node_visitor import NodeVisitor, register_node_visitor
from executorch.backends.arm.tosa.mapping import TosaArg

from recurrent_lowering.runtime.quantization import QuantParams

from ..compat.edge_ops import edge
from . import op as loop_op
from . import step as loop_step
from .tosa_template import RowView

_EDGE_OP = edge.recurrent_lowering.loop.default


class LoopSupported(SupportedTOSAOperatorCheck):
    """The loop node is delegated whenever its step is (checked when the step is lowered)."""

    targets = [_EDGE_OP]

    def is_node_tosa_supported(self, node, tosa_spec) -> bool:
        return True


def _multiplier_shift(scale: float) -> tuple[int, int]:
    """RESCALE's 32-bit multiplier and right shift for `scale` (TOSA precision scaling)."""
    mantissa, exponent = math.frexp(scale)
    multiplier = round(mantissa * (1 << 31))
    if multiplier == 1 << 31:
        multiplier //= 2
        exponent += 1
    shift = 31 - exponent
    if not 2 <= shift <= 62:
        raise ValueError(f"rescale factor {scale} out of TOSA's range")
    return multiplier, shift


def _quant(q) -> Optional[QuantParams]:
    """QuantParams from ExecuTorch's folded QuantArgs (or one of ours)."""
    if q is None or isinstance(q, QuantParams):
        return q
    dtype = {torch.int8: "int8", torch.int16: "int16"}[q.dtype]
    return QuantParams(float(q.scale), int(q.zp), int(q.qmin), int(q.qmax), dtype)


_DTYPES = {"int8": ts.DType.INT8, "int16": ts.DType.INT16}


def _dtype_of(q, default):
    return _DTYPES[q.dtype] if q is not None else default


class _Writer:
    """Names and writes the few glue operators around the step copies."""

    def __init__(self, graph, prefix: str):
        self.graph, self.prefix, self.n = graph, prefix, 0

    def name(self, what: str) -> str:
        self.n += 1
        return f"{self.prefix}_{what}_{self.n}"

    def tensor(self, what: str, shape, dtype) -> str:
        name = self.name(what)
        self.graph.currRegion.currBasicBlock.addTensor(name, [int(d) for d in shape], dtype)
        return name

    def shape(self, values) -> str:
        name = self.name("shape")
        self.graph.addConst([len(values)], ts.DType.SHAPE, [int(v) for v in values], name=name)
        return name

    def op(self, op, inputs, outputs, attr=None):
        if attr is None:
            attr = ts.TosaSerializerAttribute()
        self.graph.addOperator(op, inputs, outputs, attr)

    def reshape(self, x: str, shape, dtype, out: Optional[str] = None) -> str:
        out = out or self.tensor("reshape", shape, dtype)
        attr = ts.TosaSerializerAttribute()
        attr.ReshapeAttribute()
        self.op(ts.Op.RESHAPE, [x, self.shape(shape)], [out], attr)
        return out

    def slice_rows(self, x: str, start: int, rows: int, width: int, dtype) -> str:
        out = self.tensor("step_in", (rows, width), dtype)
        attr = ts.TosaSerializerAttribute()
        attr.SliceAttribute()
        self.op(ts.Op.SLICE, [x, self.shape([start, 0]), self.shape([rows, width])], [out], attr)
        return out

    def concat(self, xs: list, axis: int, shape, dtype) -> str:
        if len(xs) == 1:
            return xs[0]
        out = self.tensor("concat", shape, dtype)
        attr = ts.TosaSerializerAttribute()
        attr.ConcatAttribute(axis)
        self.op(ts.Op.CONCAT, xs, [out], attr)
        return out

    def rescale(self, x: str, shape, dtype, q_in: QuantParams, q_out: QuantParams) -> str:
        """x requantized from q_in to q_out (or x itself when they are equal); the element
        type follows the qparams (int8 <-> int16 when the step keeps int16 state)."""
        if q_in is None or q_out is None or q_in == q_out:
            return x
        d_in, dtype = _DTYPES[q_in.dtype], _DTYPES[q_out.dtype]
        out = self.tensor("rescale", shape, dtype)
        multiplier, shift = _multiplier_shift(q_in.scale / q_out.scale)
        consts = []
        for what, d, v in (
            ("mult", ts.DType.INT32, multiplier),
            ("shift", ts.DType.INT8, shift),
            ("in_zp", d_in, q_in.zero_point),
            ("out_zp", dtype, q_out.zero_point),
        ):
            name = self.name(what)
            self.graph.addConst([1], d, np.asarray([v]), name=name)
            consts.append(name)
        attr = ts.TosaSerializerAttribute()
        attr.RescaleAttribute(
            scale32=True,
            rounding_mode=ts.RoundingMode.SINGLE_ROUND,
            per_channel=False,
            input_unsigned=False,
            output_unsigned=False,
        )
        self.op(ts.Op.RESCALE, [x, *consts], [out], attr)
        return out


class LoopVisitor(NodeVisitor):
    target = loop_op.EDGE_NAME

    def define_node(self, node, tosa_graph: Any, inputs: List[TosaArg], output: TosaArg) -> None:
        program, loop = loop_op.program_of(node), loop_op.LoopArgs.of(node)
        in_q = {k: _quant(v) for k, v in node.meta.get("input_qparams", {}).items()}
        out_q = _quant(node.meta.get("output_qparams", {}).get(0))
        n = program.num_states
        pins = loop_step.pins(program, loop, in_q.get(0), in_q.get(1), out_q)
        tpl = loop_step.template(program, self.tosa_spec, bool(in_q), pins)
        loops = [m for m in node.graph.nodes if m.target == node.target]
        tag = f"rl{loops.index(node)}"  # short names: the serializer's lookups are linear
        w = _Writer(tosa_graph, tag)
        xs, states0 = inputs[0], [a for a in inputs[1:3] if a.name]
        rows, width = int(states0[0].shape[0]), int(xs.shape[-1])  # batch, gate width
        total = int(np.prod(xs.shape[:-1])) // rows  # the rows xs holds per batch row
        steps, first = loop.steps, loop.first
        dtype = xs.dtype

        def role_quant(role):  # the step's qparams for step input `role`
            return tpl.input_quant[tpl.input_roles.index(role)]

        x2d = xs.name if len(xs.shape) == 2 else w.reshape(xs.name, (total * rows, width), dtype)
        x2d = w.rescale(x2d, (total * rows, width), dtype, in_q.get(0), role_quant(n))
        dtype = _dtype_of(role_quant(n), dtype)  # the step's x_t type (int16 state: int16)
        states = [
            w.rescale(a.name, a.shape, a.dtype, in_q.get(1 + i), role_quant(i))
            for i, a in enumerate(states0)
        ]
        initial_h = states[0]  # in the step's h scale, as every step's h
        ys: list = [None] * steps
        order = range(steps - 1, -1, -1) if loop.reverse else range(steps)
        written: set = set()
        x_role = tpl.input_roles.index(n)
        view = tpl.tosa.only_sliced(x_role)  # the step slices x_t into gate blocks itself
        h_in, h_out = tpl.input_roles.index(0), tpl.output_roles.index(0)
        fan = bool(tpl.tosa.tail(h_out))  # h's readers get copies, not Vela's memory copies
        h_spec, private = tpl.tosa.outputs[h_out], None
        h_copies = 1 + len(tpl.tosa.reshape_readers(h_in))  # one for Y, one per RESHAPE
        for k, t in enumerate(order):
            row = (first + t) * rows
            x_t = RowView(x2d, row) if view else w.slice_rows(x2d, row, rows, width, dtype)
            step_inputs = [*states, x_t]
            outs = [w.tensor(f"t{t}_out", spec.shape, spec.dtype) for spec in tpl.tosa.outputs]
            copies = None
            if fan and k < steps - 1:  # h's readers in Y and in the next step
                copies = {
                    h_out: [
                        w.tensor(f"t{t}_h", h_spec.shape, h_spec.dtype) for _ in range(h_copies)
                    ]
                }
            tpl.tosa.instantiate(
                tosa_graph,
                f"{tag}t{t}_",
                [step_inputs[r] for r in tpl.input_roles],
                outs,
                f"{tag}_const_",
                written,
                copies=copies,
                private=private,
            )
            states = [outs[tpl.output_roles.index(i)] for i in range(n)]
            ys[t] = copies[h_out][0] if copies else states[0]
            private = {h_in: copies[h_out][1:]} if copies else None
        state_q = [tpl.output_quant[tpl.output_roles.index(i)] for i in range(n)]
        if loop.initial_in_ys:  # the given h is a row of Y too (a peeled first step's)
            if role_quant(0) != state_q[0]:  # loop.step shares them; checked, not assumed
                raise ValueError(f"{node.name}: the step's h input and output scales differ")
            ys = ys + [initial_h] if loop.reverse else [initial_h] + ys
        hidden = int(output.shape[-1])
        state_dtype = _dtype_of(state_q[0], output.dtype)
        y_rows = len(ys) * rows
        parts = [w.concat(ys, 0, (y_rows, hidden), state_dtype)]
        parts = [w.rescale(parts[0], (y_rows, hidden), state_dtype, state_q[0], out_q)]
        finals = range(1, n) if loop.final_c else ()
        for i in finals:  # c_n after Y
            parts.append(w.rescale(states[i], (rows, hidden), output.dtype, state_q[i], out_q))
        total = y_rows + len(finals) * rows
        y = w.concat(parts, 0, (total, hidden), output.dtype)
        w.reshape(y, output.shape, output.dtype, out=output.name)


_registered = False


def register() -> None:
    """The loop node's support check and TOSA visitor in ExecuTorch's registries, once."""
    global _registered
    if not _registered:
        register_tosa_support_check(LoopSupported)
        register_node_visitor(LoopVisitor)
        _registered = True
