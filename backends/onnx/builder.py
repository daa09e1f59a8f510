"""The core's Builder, writing ONNX NodeProtos.

Values are tensor names. The builder tracks each value's element type and shape (dims
may be None) so it can pick rank-specific ops (Gemm needs rank 2), type scan bodies, and
answer `static_dim`. Constants become initializers of the top-level graph, cast to the
graph's float dtype and shared by value, so scan bodies reference them from outer scope.
Op forms follow the model's opset (Slice/Squeeze/Unsqueeze/Clip changed signatures).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.passes.builder import POSITIONS, SCAN, SELECT, Builder, Value
from recurrent_lowering.passes.spec import Activation

from .scan import ScanWriter

FLOAT_TYPES = {
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
}

# Native ONNX ops for the core's activations, with the opset that introduced each.
_NATIVE_ACTIVATIONS = {
    "Relu": 6,
    "Tanh": 6,
    "Sigmoid": 6,
    "LeakyRelu": 6,
    "ThresholdedRelu": 10,
    "HardSigmoid": 6,
    "Elu": 6,
    "Softsign": 1,
    "Softplus": 1,
}


class Names:
    """Unique names across the whole model (nested graphs share one namespace)."""

    def __init__(self, taken: set):
        self.taken = taken
        self.counters: dict = {}

    def new(self, base: str) -> str:
        n = self.counters.get(base, 0)
        while True:
            name = f"{base}_{n}" if n else base
            n += 1
            if name not in self.taken:
                self.counters[base] = n
                self.taken.add(name)
                return name


class ConstantPool:
    """Initializers emitted for one rewrite, deduplicated by dtype, shape and bytes."""

    def __init__(self, names: Names, prefix: str):
        self.names = names
        self.prefix = prefix
        self.initializers: list = []
        self._by_value: dict = {}
        self._names: set = set()

    def get(self, array: np.ndarray, hint: str = "const") -> str:
        array = np.ascontiguousarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        name = self._by_value.get(key)
        if name is None:
            name = self.names.new(f"{self.prefix}/{hint or 'const'}")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._by_value[key] = name
            self._names.add(name)
        return name

    def __contains__(self, name: str) -> bool:
        return name in self._names


def _broadcast(shapes):
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = [d for d in dims if d is not None and d != 1]
        if known:
            out.append(known[0])
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


class OnnxBuilder(ScanWriter, Builder):
    """Emits into `self.nodes`; the rewrite splices them where the original node was.

    linear_mode: "gemm" uses Gemm for rank-2 inputs (one node for x @ W.T + b);
    "matmul" always uses MatMul (+ Add).
    unpack_loop_weights: a Scan body's constant product weights are read through
    Optional -> OptionalGetElement (opset 15+), see `_unpacked_loop_weights`.
    """

    capabilities = frozenset({SELECT, SCAN, POSITIONS})

    def __init__(
        self,
        prefix: str,
        float_dtype,
        opset: int,
        names: Names,
        pool: Optional[ConstantPool] = None,
        linear_mode: str = "gemm",
        unpack_loop_weights: bool = False,
    ):
        self.prefix = prefix
        self.float_dtype = np.dtype(float_dtype)
        if self.float_dtype not in FLOAT_TYPES:
            raise ValueError(f"unsupported float dtype {self.float_dtype}")
        self.float_type = FLOAT_TYPES[self.float_dtype]
        self.dtype = self.float_dtype  # the core's emitter reads `dtype` for its constants
        self.opset = opset
        self.names = names
        self.pool = pool or ConstantPool(names, prefix)
        self.linear_mode = linear_mode
        self.unpack_loop_weights = unpack_loop_weights
        self.nodes: list = []
        self.types: dict = {}  # value name -> (elem_type, shape tuple or None)
        self._transposes: dict = {}  # runtime weight -> its Transpose (MatMul form)
        self._transpose_of: dict = {}  # Transpose output -> (its input, perm)

    # --- bookkeeping ------------------------------------------------------------------------
    def declare(self, name: str, elem_type: int, shape) -> str:
        """Register an existing value (graph input, outer value) with its type and shape."""
        self.types[name] = (elem_type, None if shape is None else tuple(shape))
        return name

    def shape(self, value: Value):
        return self.types.get(value, (None, None))[1]

    def elem_type(self, value: Value):
        return self.types.get(value, (None, None))[0]

    def static_dim(self, value: Value, axis: int) -> Optional[int]:
        """The size of `axis` if known when emitting, else None."""
        shape = self.shape(value)
        if shape is None:
            return None
        return shape[axis]

    def _node(self, op: str, inputs, elem_type, shape, n_outputs=1, **attrs):
        outputs = [self.names.new(f"{self.prefix}/{op}") for _ in range(n_outputs)]
        node = helper.make_node(
            op, list(inputs), outputs, name=self.names.new(f"{self.prefix}/{op}_node"), **attrs
        )
        self.nodes.append(node)
        for out in outputs:
            self.types[out] = (elem_type, None if shape is None else tuple(shape))
        return outputs[0] if n_outputs == 1 else outputs

    def _float_or_int(self, array: np.ndarray) -> np.ndarray:
        array = np.asarray(array)
        if array.dtype.kind == "f":
            return array.astype(self.float_dtype)
        return array

    def _ints(self, values) -> str:
        return self.constant(np.asarray(values, dtype=np.int64), "axes")

    def _scalar(self, value: float) -> str:
        return self.constant(np.asarray(value, dtype=self.float_dtype), "scalar")

    def cast(self, x: Value, elem_type: int) -> Value:
        """Not part of the core's interface: the adapter's own type adjustments."""
        if self.elem_type(x) == elem_type:
            return x
        return self._node("Cast", [x], elem_type, self.shape(x), to=elem_type)

    # --- constants and linear algebra -------------------------------------------------------
    def constant(self, array: np.ndarray, name: str = "") -> Value:
        array = self._float_or_int(array)
        out = self.pool.get(array, name)
        elem = helper.np_dtype_to_tensor_dtype(array.dtype)
        self.types[out] = (elem, tuple(array.shape))
        return out

    def linear(self, x: Value, weight, bias=None, role=None) -> Value:
        """x @ weight.T + bias. Constant weights become initializers holding weight.T
        (named after its role); a runtime weight (a value) is read as it is, with
        Gemm's transB on rank-2 inputs, else through one Transpose shared by every step."""
        name = "" if role is None else str(role)
        runtime_w = isinstance(weight, str)
        runtime_b = isinstance(bias, str)
        shape = self.shape(x)
        w_shape = self.shape(weight) if runtime_w else np.shape(weight)
        out_rows = None if w_shape is None else w_shape[0]
        out_shape = None if shape is None else shape[:-1] + (out_rows,)
        elem = self.elem_type(x) or self.float_type
        gemm_ok = bias is not None or self.opset >= 11  # Gemm's C is optional from opset 11
        if self.linear_mode == "gemm" and gemm_ok and shape is not None and len(shape) == 2:
            if runtime_w:
                inputs, attrs = [x, weight], {"transB": 1}
            else:
                inputs, attrs = [x, self._weight_t(weight, name)], {}
            if bias is not None:
                inputs.append(bias if runtime_b else self.constant(bias, _hint(name, "bias")))
            return self._node("Gemm", inputs, elem, out_shape, **attrs)
        w_t = self._transposed(weight) if runtime_w else self._weight_t(weight, name)
        source = self._transpose_of.get(x)
        if (
            self.float_dtype == np.float16
            and source is not None
            and source[1][-1] == len(source[1]) - 1
        ):
            # onnxruntime (1.32) crashes creating a session for float16 Transpose -> MatMul:
            # the product is taken before the transpose (which keeps the last axis) instead
            product = self.linear(source[0], weight, bias, role)
            return self.transpose(product, source[1])
        y = self._node("MatMul", [x, w_t], elem, out_shape)
        if bias is not None:
            if not runtime_b:
                bias = np.asarray(bias)
                if shape is not None and len(shape) >= 3:
                    # A bias of x's rank keeps onnxruntime from fusing MatMul+Add into
                    # Reshape+Gemm+Reshape, one node more per step (measured slower).
                    bias = bias.reshape((1,) * (len(shape) - 1) + bias.shape)
                bias = self.constant(bias, _hint(name, "bias"))
            y = self._node("Add", [y, bias], elem, out_shape)
        return y

    def _weight_t(self, weight, name: str) -> str:
        weight = np.asarray(weight)
        return self.constant(np.ascontiguousarray(weight.T), name or "weight")

    def _transposed(self, weight: str) -> str:
        """weight.T of a runtime weight, made once (the first use's graph: outer scope)."""
        if weight not in self._transposes:
            self._transposes[weight] = self.transpose(weight, (1, 0))
        return self._transposes[weight]

    def _binary(self, op, a, b):
        elem = self.elem_type(a) or self.elem_type(b)
        return self._node(op, [a, b], elem, _broadcast([self.shape(a), self.shape(b)]))

    def _unary(self, op, x, **attrs):
        return self._node(op, [x], self.elem_type(x), self.shape(x), **attrs)

    def add(self, a, b):
        return self._binary("Add", a, b)

    def sub(self, a, b):
        return self._binary("Sub", a, b)

    def mul(self, a, b):
        return self._binary("Mul", a, b)

    def div(self, a, b):
        return self._binary("Div", a, b)

    def sigmoid(self, x):
        return self._unary("Sigmoid", x)

    def tanh(self, x):
        return self._unary("Tanh", x)

    def relu(self, x):
        return self._unary("Relu", x)

    def exp(self, x):
        return self._unary("Exp", x)

    def log(self, x):
        return self._unary("Log", x)

    def abs(self, x):
        return self._unary("Abs", x)

    def clamp(self, x, lo, hi):
        if lo is None and hi is None:
            return x
        # Clip-6 takes attributes; onnxruntime's Clip kernels before opset 12 are float32
        # only, and Max/Min broadcast a scalar only from opset 8.
        if self.opset < 11 and self.float_dtype == np.float32:
            bounds = {"min": lo, "max": hi}
            attrs = {k: float(v) for k, v in bounds.items() if v is not None}
            return self._node("Clip", [x], self.elem_type(x), self.shape(x), **attrs)
        if self.opset < 12 and self.float_dtype != np.float32:
            if self.opset < 8:
                raise NotImplementedError("clip of a non-float32 graph needs opset 8")
            if lo is not None:
                x = self._binary("Max", x, self._scalar(lo))
            if hi is not None:
                x = self._binary("Min", x, self._scalar(hi))
            return x
        inputs = [
            x,
            "" if lo is None else self._scalar(lo),
            "" if hi is None else self._scalar(hi),
        ]
        while inputs[-1] == "":
            inputs.pop()
        return self._node("Clip", inputs, self.elem_type(x), self.shape(x))

    def activation(self, act: Activation, x: Value) -> Optional[Value]:
        since = _NATIVE_ACTIVATIONS.get(act.name)
        if since is None or self.opset < since:
            return None
        if self.float_dtype != np.float32 and act.name not in ("Relu", "Tanh", "Sigmoid"):
            return None  # onnxruntime's CPU kernels for these exist for float32 only
        attrs = {}
        if act.alpha is not None:
            attrs["alpha"] = float(act.alpha)
        if act.beta is not None:
            attrs["beta"] = float(act.beta)
        return self._unary(act.name, x, **attrs)

    # --- shape ------------------------------------------------------------------------------
    def slice(self, x, axis, start, end):
        shape = self.shape(x)
        out = None
        if shape is not None:
            axis = axis % len(shape)
            dim = shape[axis]
            size = None  # unknown dim: the slice may be clamped
            if dim is not None:
                size = len(range(*slice(start, end).indices(dim)))
            out = shape[:axis] + (size,) + shape[axis + 1 :]
        if self.opset < 10:
            attrs = dict(axes=[axis], starts=[start], ends=[end])
            y = self._node("Slice", [x], self.elem_type(x), out, **attrs)
        else:
            inputs = [x, self._ints([start]), self._ints([end]), self._ints([axis])]
            y = self._node("Slice", inputs, self.elem_type(x), out)
        return y

    def _split_node(self, x, axis, sizes, outs):
        name = self.names.new(f"{self.prefix}/Split_node")
        if self.opset < 13:
            return helper.make_node("Split", [x], outs, name=name, axis=axis, split=sizes)
        return helper.make_node("Split", [x, self._ints(sizes)], outs, name=name, axis=axis)

    def concat(self, xs, axis):
        xs = list(xs)
        if len(xs) == 1:
            return xs[0]
        shapes = [self.shape(v) for v in xs]
        out = None
        if all(s is not None for s in shapes):
            rank = len(shapes[0])
            axis_n = axis % rank
            dims = [s[axis_n] for s in shapes]
            total = None if any(d is None for d in dims) else sum(dims)
            base = _broadcast(shapes)
            out = None if base is None else base[:axis_n] + (total,) + base[axis_n + 1 :]
        return self._node("Concat", xs, self.elem_type(xs[0]), out, axis=axis)

    def squeeze(self, x, axis):
        shape = self.shape(x)
        out = None
        if shape is not None:
            axis = axis % len(shape)
            out = shape[:axis] + shape[axis + 1 :]
        if self.opset < 13:
            return self._node("Squeeze", [x], self.elem_type(x), out, axes=[axis])
        return self._node("Squeeze", [x, self._ints([axis])], self.elem_type(x), out)

    def unsqueeze(self, x, axis):
        shape = self.shape(x)
        out = None
        if shape is not None:
            axis = axis % (len(shape) + 1)
            out = shape[:axis] + (1,) + shape[axis:]
        if self.opset < 13:
            return self._node("Unsqueeze", [x], self.elem_type(x), out, axes=[axis])
        return self._node("Unsqueeze", [x, self._ints([axis])], self.elem_type(x), out)

    def reshape(self, x, shape):
        dims = self.shape(x)
        out = tuple(None if d == -1 else d for d in shape)
        if dims is not None and -1 in shape and None not in dims:  # the -1 dim, computed
            known = int(np.prod([d for d in shape if d != -1]))
            out = tuple(int(np.prod(dims)) // known if d == -1 else d for d in shape)
        return self._reshape(x, list(shape), out)

    def split(self, x, axis, sizes):
        """One Split: equal pieces when `sizes` is a count (Split-18's num_outputs, or no
        sizes before), else those sizes."""
        if not isinstance(sizes, int):
            outs = [self.names.new(f"{self.prefix}/Split") for _ in sizes]
            self.nodes.append(self._split_node(x, axis, list(sizes), outs))
            shapes = [_resized(self.shape(x), axis, size) for size in sizes]
        else:
            outs = [self.names.new(f"{self.prefix}/Split") for _ in range(sizes)]
            name = self.names.new(f"{self.prefix}/Split_node")
            if self.opset >= 18:
                node = helper.make_node("Split", [x], outs, name=name, axis=axis, num_outputs=sizes)
            else:  # no sizes: equal parts, one per output
                node = helper.make_node("Split", [x], outs, name=name, axis=axis)
            self.nodes.append(node)
            dim = (self.shape(x) or (None,) * (axis + 1))[axis]
            piece = None if dim is None else dim // sizes
            shapes = [_resized(self.shape(x), axis, piece)] * sizes
        for out, shape in zip(outs, shapes):
            self.types[out] = (self.elem_type(x), shape)
        return outs

    def _reshape(self, x, target, out_shape):
        return self._node("Reshape", [x, self._ints(target)], self.elem_type(x), out_shape)

    def transpose(self, x, perm):
        shape = self.shape(x)
        out = None if shape is None else tuple(shape[p] for p in perm)
        y = self._node("Transpose", [x], self.elem_type(x), out, perm=list(perm))
        self._transpose_of[y] = (x, tuple(perm))
        return y

    def zeros_like_rows(self, like, width):
        """ConstantOfShape([batch of `like`, width]): exact zeros for a run-time batch."""
        if self.opset < 9:
            return super().zeros_like_rows(like, width)
        shape = self._node("Shape", [like], TensorProto.INT64, (2,))  # `like` is [B, X]
        dims = self.concat([self.slice(shape, 0, 0, 1), self._ints([width])], 0)
        value = numpy_helper.from_array(np.zeros(1, self.float_dtype), "value")
        batch = (self.shape(like) or (None,))[0]
        return self._node(
            "ConstantOfShape", [dims], self.elem_type(like), (batch, width), value=value
        )

    def positions(self, like):
        """Range(0, Shape(like)[0], 1): the steps of a loop over a run-time length."""
        if self.opset < 11:
            raise NotImplementedError("Range needs opset 11")
        shape = self._node("Shape", [like], TensorProto.INT64, (len(self.shape(like) or ()),))
        steps = self._node(
            "Gather", [shape, self.constant(np.asarray(0, np.int64))], TensorProto.INT64, ()
        )
        n = (self.shape(like) or (None,))[0]
        zero, one = (self.constant(np.asarray(v, np.int64)) for v in (0, 1))
        return self._node("Range", [zero, steps, one], TensorProto.INT64, (n,))

    # --- selection ----------------------------------------------------------------------------
    def less(self, a, b):
        floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
        if self.opset < 9 and self.elem_type(a) not in floats:  # Less-7 takes floats only
            a, b = (self.cast(v, TensorProto.FLOAT) for v in (a, b))  # steps, lengths < 2^24
        return self._node(
            "Less", [a, b], TensorProto.BOOL, _broadcast([self.shape(a), self.shape(b)])
        )

    def where(self, cond, a, b):
        shape = _broadcast([self.shape(cond), self.shape(a), self.shape(b)])
        elem = self.elem_type(a) or self.elem_type(b)
        if self.opset < 9:  # no Where yet: b + cond * (a - b), exact for finite a and b
            mask = self._node("Cast", [cond], elem, self.shape(cond), to=elem)
            return self._binary("Add", b, self._binary("Mul", mask, self._binary("Sub", a, b)))
        return self._node("Where", [cond, a, b], elem, shape)


def _resized(shape, axis: int, size):
    if shape is None:
        return None
    axis %= len(shape)
    return shape[:axis] + (size,) + shape[axis + 1 :]


def _hint(name: str, role: str) -> str:
    return f"{name}_{role}" if name else role


def graph_float_dtype(elem_type: int) -> np.dtype:
    for dtype, t in FLOAT_TYPES.items():
        if t == elem_type:
            return dtype
    raise ValueError(f"unsupported element type {onnx.TensorProto.DataType.Name(elem_type)}")
