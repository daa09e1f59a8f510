"""An int16 sigmoid or tanh reads its input at a scale no coarser than its table can follow.

ExecuTorch makes an int16 sigmoid or tanh a TOSA TABLE of 513 entries over the input's whole
quantized range, 128 codes apart, interpolated linearly. On a wide range the entries are far
apart and the interpolation is wrong where the function curves: DTLN's first LSTM reads its
gates over +-685 (entries 2.7 apart) and loses 7 dB of its mask on the TOSA reference model
(docs/results/real_model_accuracy.md). Both functions are flat at the int16 output's 2^-12
well inside +-8 (tanh) and +-16 (sigmoid), so the input's scale is capped at 2^-12 and 2^-11
(those ranges, as powers of two): wider values saturate where the function already has. A
narrower calibrated range keeps its own scale, so a program whose ranges lie within the caps
is unchanged.

An input the activation alone reads (a gate's pre-activation) is observed with the cap. A
value with other readers (an LSTM's cell state, also the next state) or a range shared
with another value (a loop step's c, in its state input's group) keeps its range, and the
tanh's edge is requantized to 2^-12, which is the int16 observers' floor: where the
value's range is within +-8 its scale is 2^-12 already and the pair folds away.
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node
from torchao.quantization.pt2e.quantizer import FixedQParamsQuantizationSpec, QuantizationSpec

from ..compat.histogram_observer import capped, int16_histogram

_Q_KEY = "quantization_annotation"

MAX_SCALE = {torch.ops.aten.sigmoid.default: 2.0**-11, torch.ops.aten.tanh.default: 2.0**-12}


def cap_table_inputs(graph: Graph) -> int:
    """Cap the int16 input scale of every sigmoid/tanh (see above); how many."""
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in MAX_SCALE or _Q_KEY not in node.meta:
            continue
        source, inputs = node.args[0], node.meta[_Q_KEY].input_qspec_map
        edge = inputs.get(source) if isinstance(source, Node) else None
        if not int16_histogram(edge):
            continue  # int8, or a fixed or shared range
        max_scale = MAX_SCALE[node.target]
        producer = source.meta.get(_Q_KEY)
        spec = getattr(producer, "output_qspec", None)
        if len(source.users) == 1 and int16_histogram(spec) and _shares(edge, spec):
            producer.output_qspec = capped(spec, max_scale)
            inputs[source] = producer.output_qspec
        elif edge.observer_or_fake_quant_ctr.p.keywords.get("eps") == max_scale:
            inputs[source] = _fixed(edge, max_scale)  # other readers, or a shared range
        else:
            continue
        count += 1
    return count


def _fixed(spec, scale: float) -> FixedQParamsQuantizationSpec:
    """The edge requantized to `scale`: where the value's own scale is `scale` too (its
    range within the cap, the observer's floor), the pair folds away."""
    return FixedQParamsQuantizationSpec(
        dtype=spec.dtype,
        scale=scale,
        zero_point=0,
        quant_min=spec.quant_min,
        quant_max=spec.quant_max,
        qscheme=torch.per_tensor_symmetric,
    )


def _shares(edge, output) -> bool:
    """PT2E's implicit sharing: an input edge whose spec has the producer output's dtype,
    bounds and scheme uses the producer's observer."""
    attributes = ("dtype", "quant_min", "quant_max", "qscheme", "ch_axis", "is_dynamic")
    return isinstance(edge, QuantizationSpec) and all(
        getattr(edge, a) == getattr(output, a) for a in attributes
    )
