"""Everything the ONNX-to-torch bridge extends in onnx2torch, written against onnx2torch 1.5.15.

torchvision_stub.py  onnx2torch imports torchvision at import time (for two converters);
                     installing it would pull another torch build, so a stand-in is put in
                     sys.modules while onnx2torch is imported and taken out again after
`onnx2torch()`       the library, imported once, with converters added to its global
                     registry: the recurrent nodes' (recurrent_modules), versions that only
                     added element types reusing the previous converter
                     (_TYPE_ONLY_VERSIONS), Split-18 and ThresholdedRelu (missing, and
                     emitted by the rewrite), ScatterND-18 where it adds no reduction,
                     and the Reduce ops of opset 18 (axes an input, as ReduceSum's since
                     13) where the axes are constant: torch.onnx.export at opset 18.
                     They are added on the first conversion, not at import; a converter
                     onnx2torch already has for a version is kept.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math

import torch
from torch import nn

from .. import recurrent_modules
from . import torchvision_stub

VERSION = "1.5.15"  # the onnx2torch these additions are written against


def check_version() -> None:
    found = importlib.metadata.version("onnx2torch")
    if found != VERSION:
        raise RuntimeError(
            f"onnx2torch {found} is installed; recurrent_lowering's ONNX bridge extends "
            f"onnx2torch {VERSION} (backends/onnx_to_torch/compat) and needs that version"
        )


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


@functools.lru_cache(maxsize=None)
def onnx2torch():
    """onnx2torch, imported with the torchvision stand-in, its registry extended (once)."""
    check_version()
    with torchvision_stub.torchvision_stub():
        import onnx2torch
        from onnx2torch.node_converters import registry
    for op, versions in _TYPE_ONLY_VERSIONS.items():
        for version in versions:
            previous = registry.get_converter(op, version - 1)
            _register(registry, op, version, previous)
    _register(registry, "Split", 18, _convert_split18)
    _register(registry, "ScatterND", 18, _scatter_nd18(registry.get_converter("ScatterND", 16)))
    for op in _REDUCE_18:
        for version in (18, 20) if op in ("ReduceMax", "ReduceMin") else (18,):  # 20: bool
            _register(registry, op, version, _convert_reduce18)
    recurrent_modules.register(registry)
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


_REDUCE_18 = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
)


class _Unreduced(nn.Module):
    """A Reduce op with noop_with_empty_axes and no axes: its elementwise part alone (the
    onnx reference's: ReduceSumSquare squares, ReduceL1 and ReduceL2 take |x|, ReduceLogSum
    the log; the others are the identity)."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def forward(self, x):
        if self.op == "ReduceSumSquare":
            return x * x
        if self.op in ("ReduceL1", "ReduceL2"):
            return torch.abs(x)
        if self.op == "ReduceLogSum":
            return torch.log(x)
        return x


def _convert_reduce18(node, graph):
    """Opset 18 moved a Reduce op's axes from an attribute to an optional input (with
    noop_with_empty_axes): constant axes are the attribute onnx2torch's converter reads."""
    from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult, get_const_value

    axes = None
    if len(node.input_values) > 1 and node.input_values[1]:
        try:
            axes = [int(a) for a in get_const_value(node.input_values[1], graph).tolist()]
        except KeyError:
            what = f"{node.operation_type} with axes computed at run time"
            raise NotImplementedError(what) from None
    if not axes and node.attributes.get("noop_with_empty_axes", 0):
        module = _Unreduced(node.operation_type)
    else:
        keepdims = node.attributes.get("keepdims", 1)
        module = OnnxReduceStaticAxes(node.operation_type, axes or None, keepdims)
    mapping = OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values)
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping)


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
