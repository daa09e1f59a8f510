"""An ONNX model without recurrent nodes as a torch module that torch.export can trace.

This is the bridge of the ONNX -> Ethos-U route (docs/onnx_to_ethos_u.md): `rewrite_model`
(strategy "unrolled") leaves only elementary ops, onnx2torch turns them into a
torch.fx.GraphModule, and ExecuTorch's Arm flow takes it from there.

onnx2torch is used as installed (1.5.15, without torchvision) and is not patched. What
is added here, each because the raw conversion cannot be exported or lowers badly:

- Its Slice, Split(13), Squeeze/Unsqueeze(13), Reshape, Pad, Gather, ScatterND and Pow
  modules take their indices (or exponent) as tensors and read them with `.numpy()`/`.tolist()` (or
  index with them) in `forward`, which torch.export cannot trace. When those tensors are
  constants (initializers or Constant nodes, as in every graph our rewrite emits) the
  modules are replaced by ones holding Python ints; Pow(x, 2) becomes x * x.
  Values computed only from constants and static input shapes (the Shape -> Gather ->
  Concat -> Expand chains exporters write for zero initial states) are folded first.
- Identity becomes `clone()`, a copy the Arm backend would carry; such nodes are dropped.
- BatchNorm after a grouped ConvTranspose becomes an explicit affine: torch's conv-BN fold,
  which the PT2E quantizer applies, mishandles that weight layout.
- MatMul by a constant matrix (and its bias Add) becomes nn.Linear, which the Arm
  quantizer quantizes per output channel.
- The registry stops at opset 17 for several ops. Versions that only added element types
  (listed in `_TYPE_ONLY_VERSIONS`) reuse the previous converter; Split-18 and
  ThresholdedRelu (missing altogether, and emitted by the rewrite) get their own, and
  ScatterND-18 reuses ScatterND-16's where it adds no reduction.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import onnx
import torch
from torch import nn

from recurrent_lowering.backends.onnx.input_sizes import input_specs
from recurrent_lowering.backends.onnx.reader import is_recurrent

from . import recurrent_modules as torch_recurrent
from .torchvision_stub import torchvision_stub

# (op, version) whose change over the previous version only added element types
# (float8/int4/bfloat16...) that nothing here produces: the older converter is exact.
_TYPE_ONLY_VERSIONS = {
    "Cast": (19, 21, 23),
    "Constant": (19, 21, 23),
    "Identity": (19, 21, 23),
    "Reshape": (19, 21, 23),
    "Shape": (19, 21, 23),
    "Flatten": (21, 23),
    "Transpose": (21, 23),
    "Squeeze": (23,),
    "Unsqueeze": (21, 23),
    "Elu": (22,),
    "HardSigmoid": (22,),
    "Softplus": (22,),
    "Softsign": (22,),
}
_CONTROL_FLOW = ("Scan", "Loop", "If")


class ToTorchError(ValueError):
    """The ONNX model cannot become an exportable torch module; the message names the node."""


@functools.lru_cache(maxsize=None)
def _onnx2torch():
    """onnx2torch, imported with the torchvision stand-in, its registry extended."""
    with torchvision_stub():
        import onnx2torch
        from onnx2torch.node_converters import registry
    for op, versions in _TYPE_ONLY_VERSIONS.items():
        for version in versions:
            previous = registry.get_converter(op, version - 1)
            _register(registry, op, version, previous)
    _register(registry, "Split", 18, _convert_split18)
    _register(registry, "ScatterND", 18, _scatter_nd18(registry.get_converter("ScatterND", 16)))
    torch_recurrent.register(registry)
    for version in (10, 22):  # the rewrite emits it for the ThresholdedRelu activation
        _register(registry, "ThresholdedRelu", version, _convert_thresholded_relu)
    return onnx2torch


def _register(registry, op: str, version: int, converter) -> None:
    try:
        registry.add_converter(operation_type=op, version=version)(converter)
    except ValueError:  # already registered: a newer onnx2torch has its own
        pass


class _SplitChunks(nn.Module):
    """Split-18 with `num_outputs`: chunks of ceil(dim / n), the last one smaller."""

    def __init__(self, num_outputs: int, axis: int):
        super().__init__()
        self.num_outputs, self.axis = num_outputs, axis

    def forward(self, x):
        return torch.split(x, math.ceil(x.shape[self.axis] / self.num_outputs), dim=self.axis)


def _convert_split18(node, graph):
    from onnx2torch.node_converters.split import OnnxSplit13
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    axis = node.attributes.get("axis", 0)
    outputs = len(node.output_values)
    has_sizes = len(node.input_values) > 1 and node.input_values[1]
    module = (
        OnnxSplit13(num_splits=outputs, axis=axis) if has_sizes else _SplitChunks(outputs, axis)
    )
    return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))


def _scatter_nd18(convert16):
    """ScatterND-18 only added the max and min reductions: the same without them."""

    def convert(node, graph):
        reduction = node.attributes.get("reduction", "none")
        if reduction in ("max", "min"):
            raise NotImplementedError(f"ScatterND with reduction {reduction!r}")
        return convert16(node, graph)

    return convert


class ThresholdedRelu(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return torch.where(x > self.alpha, x, torch.zeros_like(x))


def _convert_thresholded_relu(node, graph):
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    module = ThresholdedRelu(float(node.attributes.get("alpha", 1.0)))
    return OperationConverterResult(torch_module=module, onnx_mapping=onnx_mapping_from_node(node))


# Replacements holding Python ints (ONNX semantics: negative axes count from the back,
# out-of-range slice bounds clamp, as Python slices do).


class StaticSlice(nn.Module):
    def __init__(self, specs: list):  # [(axis, start, end, step)]
        super().__init__()
        self.specs = specs

    def forward(self, x):
        for axis, start, end, step in self.specs:
            axis %= x.dim()
            lead = (slice(None),) * axis
            if step > 0:
                x = x[lead + (slice(start, end, step),)]
                continue
            picked = range(x.shape[axis])[slice(start, end, step)]
            first = x.shape[axis] - 1 - picked.start if len(picked) else 0
            x = x.flip(axis)[lead + (slice(first, first + len(picked) * -step, -step),)]
        return x


class StaticSplit(nn.Module):
    def __init__(self, sizes: list, axis: int):
        super().__init__()
        self.sizes, self.axis = sizes, axis

    def forward(self, x):
        return torch.split(x, self.sizes, dim=self.axis)


class StaticSqueeze(nn.Module):
    def __init__(self, axes: list):
        super().__init__()
        self.axes = axes

    def forward(self, x):
        if not self.axes:
            return x.squeeze()
        for axis in sorted((a % x.dim() for a in self.axes), reverse=True):
            x = x.squeeze(axis)
        return x


class StaticUnsqueeze(nn.Module):
    def __init__(self, axes: list):
        super().__init__()
        self.axes = axes

    def forward(self, x):
        rank = x.dim() + len(self.axes)
        for axis in sorted(a % rank for a in self.axes):
            x = x.unsqueeze(axis)
        return x


class StaticReshape(nn.Module):
    def __init__(self, shape: list):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(self.shape)])


class StaticExpand(nn.Module):
    def __init__(self, shape: list):
        super().__init__()
        self.shape = shape

    def forward(self, x):  # ONNX Expand broadcasts both ways
        return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(self.shape)))


class StaticPad(nn.Module):
    """Pad with constant pads. torch pads reflect/edge only over the last 1-3 dims of a
    tensor with one or two leading dims more (silero-vad's STFT reflects a 2-D [1, N]):
    the dims before the first padded one are flattened into that batch and restored."""

    def __init__(self, pads: list, mode: str, value: float):
        super().__init__()
        rank = len(pads) // 2
        padded = [a for a in range(rank) if pads[a] or pads[rank + a]] or [rank - 1]
        self.first = padded[0] if mode != "constant" else 0
        trailing = range(rank - 1, self.first - 1, -1)  # torch lists the last dim first
        self.pads = [p for a in trailing for p in (pads[a], pads[rank + a])]
        self.mode, self.value = mode, value

    def forward(self, x):
        if self.mode == "constant":
            return nn.functional.pad(x, self.pads, value=self.value)
        lead = x.shape[: self.first]
        y = x.reshape(1, -1, *x.shape[self.first :])
        y = nn.functional.pad(y, self.pads, mode=self.mode)
        return y.reshape(*lead, *y.shape[2:])


class StaticGather(nn.Module):
    """Gather with constant indices: a select or a narrow (what silero-vad's state reads
    are) where the indices allow, index_select otherwise; onnx2torch indexes with the
    tensor, which torch.export turns into a data-dependent `.item()`."""

    def __init__(self, indices: np.ndarray, axis: int):
        super().__init__()
        self.axis, self.shape = axis, list(indices.shape)
        self.flat = [int(i) for i in indices.reshape(-1)]

    def forward(self, x):
        axis = self.axis % x.dim()
        flat = [i % x.shape[axis] for i in self.flat]
        if not self.shape:
            return x.select(axis, flat[0])
        if len(self.shape) == 1 and flat == list(range(flat[0], flat[0] + len(flat))):
            return x.narrow(axis, flat[0], len(flat))
        index = torch.tensor(flat, dtype=torch.int64, device=x.device)
        y = x.index_select(axis, index)
        return y.reshape(*x.shape[:axis], *self.shape, *x.shape[axis + 1 :])


class Square(nn.Module):
    """Pow(x, 2) as x * x: U55 has no pow (an STFT's power spectrum would leave the NPU)."""

    def forward(self, x):
        return x * x


class StaticScatterND(nn.Module):
    """ScatterND with constant indices (streaming models' cache writes). Indices that
    enumerate a block (contiguous ranges, row-major) become slices and a concatenation,
    which the NPU runs; others an index_put with constant indices. onnx2torch reads the
    indices with `.tolist()` in `forward`, which torch.export cannot trace."""

    def __init__(self, indices: np.ndarray):
        super().__init__()
        self.depth = int(indices.shape[-1])
        flat = indices.reshape(-1, self.depth).astype(np.int64)
        self.points = [[int(i) for i in column] for column in flat.T]
        self.block = _block_of(flat, indices.shape[:-1])  # [(start, size)] per indexed dim

    def forward(self, data, updates):
        if self.block is None:
            points = [
                torch.tensor([i % data.shape[d] for i in column], dtype=torch.int64)
                for d, column in enumerate(self.points)
            ]
            values = updates.reshape(-1, *data.shape[self.depth :])
            return data.index_put(tuple(points), values)
        sizes = [size for _, size in self.block]
        return _replace_block(
            data, updates.reshape(*sizes, *data.shape[self.depth :]), self.block, 0
        )


def _block_of(flat: np.ndarray, grid: tuple):
    """[(start, size)] per indexed dim if `flat` lists a block in row-major order."""
    if flat.size == 0 or (flat < 0).any():
        return None
    starts, stops = flat.min(axis=0), flat.max(axis=0) + 1
    ranges = [np.arange(a, b) for a, b in zip(starts, stops)]
    mesh = np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1).reshape(-1, flat.shape[1])
    if mesh.shape != flat.shape or not (mesh == flat).all():
        return None
    return [(int(a), int(b - a)) for a, b in zip(starts, stops)]


def _replace_block(data, block, where: list, dim: int):
    """`data` with the block at `where` (from `dim` on) replaced by `block`."""
    if dim == len(where):
        return block
    start, size = where[dim]
    inner = _replace_block(data.narrow(dim, start, size), block, where, dim + 1)
    parts = [data.narrow(dim, 0, start), inner]
    parts.append(data.narrow(dim, start + size, data.shape[dim] - start - size))
    return torch.cat([p for p in parts if p.shape[dim] > 0], dim)


def _static_pad(module, pads, value=None):
    value = 0.0 if value is None else float(value.reshape(-1)[0])
    static = StaticPad(_ints(pads), module.mode, value)
    return None if static.mode != "constant" and len(static.pads) > 6 else static  # 3 dims


def _ints(value) -> list:
    return [int(v) for v in value.reshape(-1).tolist()]


def _static_slice(module, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    return StaticSlice(list(zip(axes, starts, ends, steps)))


def _static_split(module, sizes=None):
    return None if sizes is None else StaticSplit(_ints(sizes), module.axis)


_STATIC = {
    "OnnxSlice": _static_slice,
    "OnnxSplit13": _static_split,
    "OnnxSqueezeDynamicAxes": lambda module, axes=None: StaticSqueeze(
        [] if axes is None else _ints(axes)
    ),
    "OnnxUnsqueezeDynamicAxes": lambda module, axes: StaticUnsqueeze(_ints(axes)),
    "OnnxReshape": lambda module, shape: StaticReshape(_ints(shape)),
    "OnnxExpand": lambda module, shape: StaticExpand(_ints(shape)),
    "OnnxPadDynamic": _static_pad,
    "OnnxGather": lambda module, indices: StaticGather(indices.numpy(), module._axis),
    "OnnxPow": lambda module, exponent: (
        Square() if exponent.numel() == 1 and exponent == 2 else None
    ),
}


def _constant(gm: torch.fx.GraphModule, arg):
    """The tensor behind an fx argument if it is a constant (initializer or Constant node)."""
    if arg is None:
        return None, True
    if not isinstance(arg, torch.fx.Node):
        return arg, True
    if arg.op == "get_attr":
        owner, _, name = arg.target.rpartition(".")
        return getattr(gm.get_submodule(owner) if owner else gm, name), True
    if arg.op == "call_module":
        module = gm.get_submodule(arg.target)
        if type(module).__name__ == "OnnxConstant" and isinstance(module.value, torch.Tensor):
            return module.value, True
    return None, False


def _fold_constants(gm: torch.fx.GraphModule, model: onnx.ModelProto) -> int:
    """Evaluate what only depends on constants and static input shapes (Shape -> Gather
    -> Concat -> Expand chains of exported models) and store the results as initializers.
    Returns how many values were folded; nothing happens unless the input shapes are static."""
    if any(d is None for _, shape, _ in input_specs(model) for d in shape):
        return 0
    fixed = set()
    for node in gm.graph.nodes:
        inputs = node.all_input_nodes
        if node.op == "get_attr":
            fixed.add(node)
        elif node.op == "call_module" and type(gm.get_submodule(node.target)).__name__ in (
            "OnnxShape",
            "OnnxConstant",
        ):
            fixed.add(node)
        elif node.op in ("call_module", "call_function") and inputs:
            if all(i in fixed for i in inputs):
                fixed.add(node)
    boundary = [
        n
        for n in fixed
        if n.op != "get_attr" and any(u not in fixed or u.op == "output" for u in n.users)
    ]
    if not boundary:
        return 0
    values = {}

    class _Capture(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n in boundary:
                values[n] = result
            return result

    with torch.no_grad():
        _Capture(gm).run(*example_inputs(model))
    if not hasattr(gm, "initializers"):  # pruned: no initializer was read any more
        gm.add_submodule("initializers", torch.nn.Module())
    initializers = gm.get_submodule("initializers")
    folded = 0
    for node in boundary:
        if not isinstance(values.get(node), torch.Tensor):
            continue
        name = f"folded_{folded}"
        initializers.register_buffer(name, values[node].clone())
        with gm.graph.inserting_before(node):
            constant = gm.graph.get_attr(f"initializers.{name}")
        node.replace_all_uses_with(constant)
        folded += 1
    return folded


def _propagate_shapes(gm: torch.fx.GraphModule, model: onnx.ModelProto) -> None:
    """Output shapes in node.meta when the inputs are static (for the bias fold's rank)."""
    if all(d is not None for _, shape, _ in input_specs(model) for d in shape):
        from torch.fx.passes.shape_prop import ShapeProp

        try:
            with torch.no_grad():
                ShapeProp(gm).propagate(*example_inputs(model))
        except Exception:  # noqa: BLE001 - without shapes only rank-1 biases are folded
            for node in gm.graph.nodes:
                node.meta.pop("tensor_meta", None)


def _make_static(gm: torch.fx.GraphModule) -> dict:
    """Replace modules that read constant index tensors at run time; drop Identity copies.
    Returns {module class: count} of what was replaced, for tests and reports."""
    replaced: dict = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        kind = type(gm.get_submodule(node.target)).__name__
        if kind == "OnnxCopyIdentity" and node.args[0].op != "placeholder":
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            replaced[kind] = replaced.get(kind, 0) + 1
            continue
        if kind == "OnnxScatterND":  # only the indices need be constant
            indices, ok = _constant(gm, node.args[1])
            if ok:
                gm.add_submodule(node.target, StaticScatterND(indices.numpy()))
                node.args = (node.args[0], node.args[2])
                replaced[kind] = replaced.get(kind, 0) + 1
            continue
        if kind not in _STATIC:
            continue
        constants = [_constant(gm, a) for a in node.args[1:]]
        if not all(ok for _, ok in constants):
            continue  # a data-dependent index: left as is, torch.export will name the node
        static = _STATIC[kind](gm.get_submodule(node.target), *[v for v, _ in constants])
        if static is None:
            continue
        gm.add_submodule(node.target, static)
        node.args = node.args[:1]
        replaced[kind] = replaced.get(kind, 0) + 1
    return replaced


class ChannelAffine(nn.Module):
    """An eval-mode BatchNorm as x * scale + shift over dim 1."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        scale = bn.weight.detach() / torch.sqrt(bn.running_var + bn.eps)
        self.register_buffer("scale", scale)
        self.register_buffer("shift", bn.bias.detach() - bn.running_mean * scale)

    def forward(self, x):
        view = (1, -1) + (1,) * (x.dim() - 2)
        return x * self.scale.reshape(view) + self.shift.reshape(view)


def _unfuse_grouped_transposed_bn(gm: torch.fx.GraphModule) -> int:
    """BatchNorm after a grouped ConvTranspose becomes an explicit affine: the PT2E
    quantizer folds BatchNorm into the convolution before it, and torch's fold gets a
    grouped transposed weight's layout wrong (GTCRN: "size of tensor a (8) must match
    the size of tensor b (16)"). Returns how many were replaced."""
    replaced = 0
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        module = gm.get_submodule(node.target)
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            continue
        source = node.args[0]
        if not (isinstance(source, torch.fx.Node) and source.op == "call_module"):
            continue
        conv = gm.get_submodule(source.target)
        if isinstance(conv, nn.modules.conv._ConvTransposeNd) and conv.groups > 1:
            gm.add_submodule(node.target, ChannelAffine(module))
            replaced += 1
    return replaced


def _prune(gm: torch.fx.GraphModule) -> None:
    """Drop dead nodes, initializers nothing reads any more and unused submodules."""
    gm.graph.eliminate_dead_code()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    initializers = getattr(gm, "initializers", torch.nn.Module())
    for name in [n for n, _ in initializers.named_buffers(recurse=False)]:
        if f"initializers.{name}" not in used:
            delattr(initializers, name)
    gm.delete_all_unused_submodules()
    gm.recompile()


def _is_add(module) -> bool:
    return (
        type(module).__name__ == "OnnxBinaryMathOperation"
        and module.math_op_function is torch.add
        and module.broadcast is None
    )


def _matmul_to_linear(gm: torch.fx.GraphModule) -> int:
    """MatMul by a constant [K, N] matrix (and a following Add of a constant [N]-sized
    bias) becomes nn.Linear: the Arm quantizer then quantizes the weight per output
    channel and the bias as int32, instead of treating both as int8 activations."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        kind = type(gm.get_submodule(node.target)).__name__
        if kind == "OnnxGemm":
            count += _gemm_to_linear(gm, node)
            continue
        if kind != "OnnxMatMul":
            continue
        weight, ok = _constant(gm, node.args[1])
        if not ok or weight is None or weight.dim() != 2 or not weight.is_floating_point():
            continue
        linear = nn.Linear(weight.shape[0], weight.shape[1], bias=False, dtype=weight.dtype)
        linear.weight = nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)
        out = node
        (user,) = node.users if len(node.users) == 1 else (None,)
        if user is not None and user.op == "call_module" and _is_add(gm.get_submodule(user.target)):
            other = user.args[1] if user.args[0] is node else user.args[0]
            bias, ok = _constant(gm, other)
            meta = node.meta.get("tensor_meta")
            rank = len(meta.shape) if meta is not None else 1  # from _propagate_shapes
            if ok and bias is not None and bias.shape[-1:] == (weight.shape[1],):
                if bias.numel() == weight.shape[1] and bias.dim() <= rank:
                    linear.bias = nn.Parameter(bias.detach().reshape(-1), requires_grad=False)
                    out = user
        gm.add_submodule(node.target, linear)
        node.args = node.args[:1]
        if out is not node:
            user.replace_all_uses_with(node)
            gm.graph.erase_node(user)
        count += 1
    return count


def _gemm_to_linear(gm: torch.fx.GraphModule, node) -> int:
    """Gemm(A, constant B, C) -> Linear(A) + beta * C. onnx2torch makes nn.Linear itself
    only when C is a constant too; the rewrite's recurrent products add a computed C."""
    gemm = gm.get_submodule(node.target)
    weight, ok = _constant(gm, node.args[1])
    if gemm.trans_a or not ok or weight is None or weight.dim() != 2:
        return 0
    weight = (weight if gemm.trans_b else weight.t()) * gemm.alpha  # [out, in]
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach().contiguous(), requires_grad=False)
    gm.add_submodule(node.target, linear)
    addend = node.args[2] if len(node.args) > 2 else None
    node.args = node.args[:1]
    if addend is None:
        return 1
    last = node
    if gemm.beta != 1.0:
        with gm.graph.inserting_after(last):
            addend = last = gm.graph.call_function(torch.mul, (addend, gemm.beta))
    with gm.graph.inserting_after(last):
        total = gm.graph.call_function(torch.add, (node, addend))
    node.replace_all_uses_with(total, delete_user_cb=lambda user: user is not total)
    return 1


def _check_convertible(model: onnx.ModelProto, recurrent: dict) -> None:
    for node in model.graph.node:
        label = f"node {node.name or node.output[0]!r} ({node.op_type})"
        if is_recurrent(node):
            if torch_recurrent.key(node.output) in recurrent:
                continue
            raise ToTorchError(
                f"{label}: rewrite recurrent nodes first (rewrite_model(strategy='unrolled'))"
            )
        if node.op_type in _CONTROL_FLOW:
            raise ToTorchError(
                f"{label}: control flow has no static torch graph; rewrite with strategy='unrolled'"
            )


def _graph_outputs_through_identity(model: onnx.ModelProto, recurrent: dict):
    """onnx2torch makes a graph output that a multi-output node produces the node's whole
    tuple: (model, recurrent) where such outputs of the recurrent nodes pass through an
    Identity instead (dropped after conversion, like every Identity)."""
    graph_outputs = {o.name for o in model.graph.output}

    def affected(node) -> bool:
        return (
            is_recurrent(node)
            and torch_recurrent.key(node.output) in recurrent
            and len(node.output) > 1
            and bool(graph_outputs & set(node.output))
        )

    if not any(affected(n) for n in model.graph.node):
        return model, recurrent
    copy, recurrent = onnx.ModelProto(), dict(recurrent)
    copy.CopyFrom(model)
    nodes = []  # in order: each Identity right after its node, before any other reader
    for original in model.graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        nodes.append(node)
        if not affected(node):
            continue
        read = recurrent.pop(torch_recurrent.key(node.output))
        for k, name in enumerate(node.output):
            if name in graph_outputs:
                node.output[k] = f"{name}__node_output"
                nodes.append(onnx.helper.make_node("Identity", [node.output[k]], [name]))
        recurrent[torch_recurrent.key(node.output)] = read
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy, recurrent


def onnx_to_torch(model: onnx.ModelProto, recurrent: dict | None = None) -> torch.fx.GraphModule:
    """`model` (no Scan/Loop/If, and no GRU/LSTM/RNN but those in `recurrent`) as an
    eval-mode fx GraphModule whose forward takes the graph inputs (initializers excluded) in
    order and returns the graph outputs (a tuple when there are several).

    `recurrent`: torch_recurrent.key(node outputs) -> the node as read, for the recurrent
    nodes torch's own modules express (`torch_recurrent.expressible`): they become those."""
    recurrent = recurrent or {}
    _check_convertible(model, recurrent)
    model, recurrent = _graph_outputs_through_identity(model, recurrent)
    onnx2torch = _onnx2torch()
    try:
        with torch_recurrent.nodes(recurrent):
            gm = onnx2torch.convert(model)
    except NotImplementedError as e:
        raise ToTorchError(f"onnx2torch cannot convert this model: {e}") from e
    gm.eval()  # before any pass runs it: a BatchNorm in training mode updates its statistics
    replaced = _make_static(gm)
    _prune(gm)
    folded = _fold_constants(gm, model)
    if folded:  # indices computed from shapes are constants now
        _prune(gm)
        for kind, count in _make_static(gm).items():
            replaced[kind] = replaced.get(kind, 0) + count
    _prune(gm)
    _propagate_shapes(gm, model)
    replaced["MatMul/Gemm -> Linear"] = _matmul_to_linear(gm)
    replaced["BatchNorm after grouped ConvTranspose"] = _unfuse_grouped_transposed_bn(gm)
    _prune(gm)
    replaced["folded constants"] = folded
    gm.replaced_modules = replaced  # {onnx2torch class: count}, for tests and reports
    return gm.eval()


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> tuple:
    """Inputs for `model`'s static input shapes: floats uniform(-1, 1), integers 1."""
    rng = np.random.default_rng(seed)
    tensors = []
    for name, shape, dtype in input_specs(model):
        if any(d is None for d in shape):
            raise ToTorchError(f"input {name!r}: shape {shape} is not static")
        if np.issubdtype(dtype, np.floating):
            array = rng.uniform(-1, 1, size=shape).astype(dtype)
        else:
            array = np.ones(shape, dtype=dtype)
        tensors.append(torch.from_numpy(array))
    return tuple(tensors)
