"""An int16 clip quantized to its own range, so the clamp is the identity (compat.clamp_table
drops it)."""

from __future__ import annotations

import torch
from torch.fx import Node
from torchao.quantization.pt2e.quantizer import (
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    SharedQuantizationSpec,
)

_Q_KEY = "quantization_annotation"


def clip_by_range(graph: torch.fx.Graph) -> None:
    """An int16 symmetric clamp (ONNX clip) whose input is read by it alone: that input
    quantized to exactly [-clip, clip], so saturation clips and the clamp is the identity
    (clamp_table drops it). A clamp left in an int16 program keeps the sigmoid/tanh TABLE
    after it from fusing into the add before it (Vela), and an int16 TABLE cannot take the
    clamp in (it interpolates between entries 128 codes apart)."""
    for clamp in graph.find_nodes(op="call_function", target=torch.ops.aten.clamp.default):
        source, lo, hi = (list(clamp.args) + [None, None])[:3]
        annotation = source.meta.get(_Q_KEY) if isinstance(source, Node) else None
        if annotation is None or len(source.users) != 1 or _Q_KEY not in clamp.meta:
            continue
        output = annotation.output_qspec
        if not (isinstance(hi, (int, float)) and hi > 0 and lo == -hi):
            continue
        if not isinstance(output, QuantizationSpec) or output.dtype != torch.int16:
            continue  # int8 (clamp_table folds it), or a range shared with another value
        qmax = torch.iinfo(torch.int16).max
        fixed = FixedQParamsQuantizationSpec(
            dtype=torch.int16,
            scale=float(hi) / qmax,
            zero_point=0,
            quant_min=-qmax,
            quant_max=qmax,
            qscheme=torch.per_tensor_symmetric,
        )
        annotation.output_qspec = fixed
        clamp.meta[_Q_KEY].input_qspec_map[source] = fixed
        for user in clamp.users:  # the activation reads the clamp's quantization as is
            user_annotation = user.meta.get(_Q_KEY)
            if user_annotation is not None and clamp in user_annotation.input_qspec_map:
                user_annotation.input_qspec_map[clamp] = SharedQuantizationSpec(clamp)
