"""An ONNX model without recurrent nodes as a torch module that torch.export can trace.

This is the bridge of the ONNX -> Ethos-U route (docs/onnx_to_ethos_u.md): `rewrite_model`
(emission "unrolled") leaves only elementary ops, onnx2torch turns them into a
torch.fx.GraphModule, and ExecuTorch's Arm flow takes it from there.

onnx2torch is used as installed (1.5.15, without torchvision); what its converter registry
gets added lives in compat/. What is added here, each because the raw conversion cannot be
exported or lowers badly:

- Its Slice, Split(13), Squeeze/Unsqueeze(13), Reshape, Pad, Gather, ScatterND and Pow
  modules take their indices (or exponent) as tensors and read them with `.numpy()`/`.tolist()` (or
  index with them) in `forward`, which torch.export cannot trace. When those tensors are
  constants (initializers or Constant nodes, as in every graph our rewrite emits) the
  modules are replaced by ones holding Python ints; Pow(x, 2) becomes x * x.
  Values computed only from constants and static input shapes (the Shape -> Gather ->
  Concat -> Expand chains exporters write for zero initial states) are folded first.
- Identity becomes `clone()`, a copy the Arm backend would carry; such nodes are dropped.
- Grouped ConvTransposes, which the Arm backend leaves on the CPU, become convolutions or
  one per group (npu_forms).
- MatMul by a constant matrix (and its bias Add) becomes nn.Linear, which the Arm
  quantizer quantizes per output channel.
- Recurrent nodes become nn.GRU/LSTM/RNN or the layer op (recurrent_modules), and the
  converters onnx2torch lacks are added to its registry (compat).
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from torch import nn

from recurrent_lowering.backends.onnx.input_sizes import input_specs
from recurrent_lowering.backends.onnx.reader import is_recurrent

from . import npu_forms, static_modules
from . import recurrent_modules as torch_recurrent
from .compat import onnx2torch

_CONTROL_FLOW = ("Scan", "Loop", "If")


class ToTorchError(ValueError):
    """The ONNX model cannot become an exportable torch module; the message names the node."""


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
        if kind == "OnnxCopyIdentity":
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            replaced[kind] = replaced.get(kind, 0) + 1
            continue
        if kind == "OnnxScatterND":  # only the indices need be constant
            indices, ok = _constant(gm, node.args[1])
            if ok:
                gm.add_submodule(node.target, static_modules.StaticScatterND(indices.numpy()))
                node.args = (node.args[0], node.args[2])
                replaced[kind] = replaced.get(kind, 0) + 1
            continue
        if kind not in static_modules.STATIC:
            continue
        constants = [_constant(gm, a) for a in node.args[1:]]
        if not all(ok for _, ok in constants):
            continue  # a data-dependent index: left as is, torch.export will name the node
        static = static_modules.STATIC[kind](
            gm.get_submodule(node.target), *[v for v, _ in constants]
        )
        if static is None:
            continue
        gm.add_submodule(node.target, static)
        node.args = node.args[:1]
        replaced[kind] = replaced.get(kind, 0) + 1
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
                f"{label}: rewrite recurrent nodes first (rewrite_model(emission='unrolled'))"
            )
        if node.op_type in _CONTROL_FLOW:
            raise ToTorchError(  # --emission shapes our rewrite's loops, not a model's own
                f"{label}: control flow has no static graph for an NPU program; unroll it in "
                "the model before lowering (--emission shapes only the recurrent nodes)"
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


def _unproduced_outputs_through_identity(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx2torch finds a graph output only among node outputs (KeyError otherwise): an
    output that is an initializer (a folded Constant) or a graph input passed straight
    through gets an Identity under a new name. The torch module returns its outputs in
    order, so the name is not seen past conversion."""
    produced = {name for node in model.graph.node for name in node.output}
    unproduced = [k for k, o in enumerate(model.graph.output) if o.name not in produced]
    if not unproduced:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    taken = (
        produced | {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    )
    for k in unproduced:
        output = copy.graph.output[k]
        name = f"{output.name}__graph_output"
        while name in taken:
            name += "_"
        taken.add(name)
        copy.graph.node.append(onnx.helper.make_node("Identity", [output.name], [name]))
        output.name = name
    return copy


def onnx_to_torch(model: onnx.ModelProto, recurrent: dict | None = None) -> torch.fx.GraphModule:
    """`model` (no Scan/Loop/If, and no GRU/LSTM/RNN but those in `recurrent`) as an
    eval-mode fx GraphModule whose forward takes the graph inputs (initializers excluded) in
    order and returns the graph outputs (a tuple when there are several).

    `recurrent`: torch_recurrent.key(node outputs) -> the node as read, for the recurrent
    nodes torch's own modules express (`torch_recurrent.expressible`): they become those."""
    recurrent = recurrent or {}
    _check_convertible(model, recurrent)
    model, recurrent = _graph_outputs_through_identity(model, recurrent)
    model = _unproduced_outputs_through_identity(model)
    converter = onnx2torch()
    try:
        with torch_recurrent.nodes(recurrent):
            gm = converter.convert(model)
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
    replaced.update(npu_forms.apply(gm))
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
