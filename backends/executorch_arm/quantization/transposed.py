"""A transposed convolution of stride 1 as the convolution it is, so that it takes an int16
region's precision where the target runs transposed convolutions in int8 only.

Vela refuses ExecuTorch's int16 TRANSPOSE_CONV2D on ethos-u55/u65 (plan.INT8_ONLY), which
keeps each transposed convolution an int8 island in an int16 program. With stride 1 it is
an ordinary convolution:

    conv_transpose(x, W, padding p, dilation d, groups g)
        = conv(x, W', padding d * (k - 1) - p, dilation d, groups g)

W' being each group's W with its input and output channels swapped and its kernel flipped
(exact in real arithmetic; onnx_to_torch/npu_forms.py makes grouped ones so for every
target, ExecuTorch refusing them grouped). GTCRN's decoder holds six such of groups 1,
1x1 ones whose outputs its attention reads, and two of stride 2, which stay int8.
Applied before annotation (quantizer.transform_for_annotation) when the plan has modules
the target runs in int8 only; the rewritten node leaves the transposed module out of its
module stack, so the quantizer's set_module_type for that module no longer takes it.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .weight_parts import constant

aten = torch.ops.aten
_AS_CONVOLUTION = {
    aten.conv_transpose1d.default: aten.conv1d.default,
    aten.conv_transpose2d.input: aten.conv2d.default,
}
_DEFAULTS = {
    "bias": None,
    "stride": 1,
    "padding": 0,
    "output_padding": 0,
    "groups": 1,
    "dilation": 1,
}


def _arguments(node: Node) -> dict:
    names = ("input", "weight", *_DEFAULTS)
    values = dict(_DEFAULTS, **dict(zip(names, node.args)), **node.kwargs)
    return values


def _per_axis(value, axes: int) -> list:
    return (
        list(value) * (axes // len(value)) if isinstance(value, (list, tuple)) else [value] * axes
    )


def convolution_weight(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """A transposed convolution's weight [C_in, C_out / g, *k] as its convolution's
    [C_out, C_in / g, *k]: per group, channels swapped, the kernel flipped."""
    c_in, c_out_g, *kernel = weight.shape
    grouped = weight.reshape(groups, c_in // groups, c_out_g, *kernel).transpose(1, 2)
    flipped = grouped.flip(dims=tuple(range(3, 3 + len(kernel))))
    return flipped.reshape(groups * c_out_g, c_in // groups, *kernel).contiguous()


def _padding(node: Node) -> "list | None":
    """The convolution's padding for a transposed convolution of stride 1 (no output
    padding, none of its padding beyond the kernel's reach); None for any other."""
    if node.op != "call_function" or node.target not in _AS_CONVOLUTION:
        return None
    a = _arguments(node)
    val = a["weight"].meta.get("val") if isinstance(a["weight"], Node) else None
    if val is None:
        return None
    axes = len(val.shape) - 2
    keys = ("stride", "padding", "output_padding", "dilation")
    return convolution_padding(tuple(val.shape[2:]), **{k: _per_axis(a[k], axes) for k in keys})


def convolution_padding(kernel, stride, padding, output_padding, dilation) -> "list | None":
    """The padding of the convolution a transposed one equals, d * (k - 1) - p per axis;
    None unless it has stride 1, no output padding and no padding beyond the kernel's
    reach (a crop)."""
    padding = [d * (k - 1) - p for d, k, p in zip(dilation, kernel, padding)]
    if any(s != 1 for s in stride) or any(output_padding) or min(padding) < 0:
        return None
    return padding


def takes(node: Node) -> bool:
    """Whether `node` is a transposed convolution this module rewrites as a convolution."""
    return _padding(node) is not None


def as_convolutions(gm: GraphModule, module_types) -> int:
    """Every transposed convolution of stride 1 with a constant weight as a convolution,
    dropped from the stack of `module_types` (the plan's int8-only modules); how many."""
    dropped = {t.__module__ + "." + t.__qualname__ for t in module_types}
    count = 0
    for node in list(gm.graph.nodes):
        padding = _padding(node)
        if padding is None:
            continue
        a = _arguments(node)
        weight = constant(gm, a["weight"])
        if weight is None:
            continue
        axes = len(padding)
        name = f"_transposed_as_conv_{count}_{node.name}"
        gm.register_buffer(name, convolution_weight(weight.detach(), a["groups"]))
        graph = gm.graph
        with graph.inserting_before(node):
            new_weight = graph.get_attr(name)
            new_weight.meta.update(a["weight"].meta)
            new_weight.meta["val"] = a["weight"].meta["val"].new_empty(getattr(gm, name).shape)
            conv = graph.call_function(
                _AS_CONVOLUTION[node.target],
                (a["input"], new_weight, a["bias"], [1] * axes, padding,
                 _per_axis(a["dilation"], axes), a["groups"]),
            )  # fmt: skip
        conv.meta.update(node.meta)
        stack = node.meta.get("nn_module_stack", {})
        conv.meta["nn_module_stack"] = {k: v for k, v in stack.items() if v[1] not in dropped}
        node.replace_all_uses_with(conv)
        graph.erase_node(node)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return count
