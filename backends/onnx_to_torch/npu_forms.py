"""Modules onnx2torch writes that the Arm backend would leave on the CPU or mis-quantize,
replaced by equivalent ones it lowers to the NPU.

ExecuTorch 1.5.1 refuses grouped transposed convolutions with per-channel weights ("Grouped
transpose convolutions with per-channel weight quantization are not supported"): GTCRN's
decoder has depthwise ones (stride 1, dilated) and one with 2 groups and stride 2.
- A stride-1 ConvTranspose is the convolution with the kernel flipped and each group's in
  and out channels swapped, padded dilation * (kernel - 1) - padding: a (depthwise)
  convolution, which every Ethos-U runs.
- Another grouped one becomes one ConvTranspose per group and a concatenation.
- A BatchNorm after a grouped ConvTranspose becomes an explicit affine: the PT2E quantizer
  folds BatchNorm into the convolution before it, and torch's fold gets a grouped transposed
  weight's layout wrong (GTCRN: "size of tensor a (8) must match the size of tensor b (16)").
"""

from __future__ import annotations

import torch
from torch import nn

from recurrent_lowering.backends.executorch_arm.quantization import transposed

_TRANSPOSED = nn.modules.conv._ConvTransposeNd
_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


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


def _as_conv(t: nn.Module):
    """The convolution a stride-1 transposed one equals, or None."""
    k = t.kernel_size
    padding = transposed.convolution_padding(k, t.stride, t.padding, t.output_padding, t.dilation)
    if padding is None or t.padding_mode != "zeros":
        return None
    groups, (cin, cout_g) = t.groups, t.weight.shape[:2]
    w = transposed.convolution_weight(t.weight.detach(), groups)
    conv = _CONV[len(k)](
        cin,
        groups * cout_g,
        k,
        padding=padding,
        dilation=t.dilation,
        groups=groups,
        bias=t.bias is not None,
    )
    conv.weight = nn.Parameter(w.contiguous())
    if t.bias is not None:
        conv.bias = nn.Parameter(t.bias.detach().clone())
    return conv.eval()


class PerGroup(nn.Module):
    """A grouped ConvTranspose as one ConvTranspose per group, concatenated."""

    def __init__(self, t: nn.Module):
        super().__init__()
        groups, cin = t.groups, t.weight.shape[0]
        cout = t.weight.shape[1] * groups
        self.parts = nn.ModuleList()
        for g in range(groups):
            part = type(t)(
                cin // groups,
                cout // groups,
                t.kernel_size,
                stride=t.stride,
                padding=t.padding,
                output_padding=t.output_padding,
                dilation=t.dilation,
                bias=t.bias is not None,
            )
            rows = slice(g * cin // groups, (g + 1) * cin // groups)
            part.weight = nn.Parameter(t.weight.detach()[rows].clone())
            if t.bias is not None:
                cols = slice(g * cout // groups, (g + 1) * cout // groups)
                part.bias = nn.Parameter(t.bias.detach()[cols].clone())
            self.parts.append(part.eval())

    def forward(self, x):
        xs = torch.chunk(x, len(self.parts), dim=1)
        return torch.cat([p(xi) for p, xi in zip(self.parts, xs)], dim=1)


def apply(gm: torch.fx.GraphModule) -> dict:
    """Replace the modules above in `gm`; {what: how many}."""
    counts = {
        "ConvTranspose (stride 1) -> Conv": 0,
        "BatchNorm after grouped ConvTranspose": 0,
        "grouped ConvTranspose -> per group": 0,
    }
    modules = [(n, gm.get_submodule(n.target)) for n in gm.graph.nodes if n.op == "call_module"]
    for node, module in modules:
        if isinstance(module, _TRANSPOSED) and module.groups > 1:
            conv = _as_conv(module)
            if conv is not None:
                gm.add_submodule(node.target, conv)
                counts["ConvTranspose (stride 1) -> Conv"] += 1
    counts["BatchNorm after grouped ConvTranspose"] = _unfuse_grouped_transposed_bn(gm)
    for node, module in modules:
        module = gm.get_submodule(node.target)
        if isinstance(module, _TRANSPOSED) and module.groups > 1:
            gm.add_submodule(node.target, PerGroup(module))
            counts["grouped ConvTranspose -> per group"] += 1
    return counts
