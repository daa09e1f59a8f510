"""Recurrent weights at fewer bits than the rest of the model: a user's trade of accuracy
for NPU cycles and memory.

On Ethos-U55/U65 the recurrent product is a CONV whose weights Vela streams from flash at
every timestep, so their size bounds the recurrence (docs/results/arm_benchmark.md). Quantizing only
those weights (R and an LSTM's projection, the products every step reads) to a narrower
symmetric range lets Vela's weight encoder store them in fewer bytes: at 4 bits ExecuTorch
writes them as TOSA INT4 (its `[-7, 7]` int8 range), at 5-7 bits they stay int8 values that
compress better. The hoisted input projection, reading the whole sequence once, keeps the
model's precision.

The narrowing is a PT2E annotation: the loop form's step (whose only weights are the per-step
ones) gets a config with the narrow weight spec; in the unrolled form each linear whose
weight FxBuilder tagged as read every step (emission.origin) gets the narrow spec for that input.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx import Graph

from ..emission.origin import is_per_step_weight

_Q_KEY = "quantization_annotation"


def narrow(config, bits: int):
    """`config` (an Arm QuantizationConfig) with its weights in [-(2^(bits-1) - 1), ...]."""
    q = 2 ** (bits - 1) - 1
    weight = dataclasses.replace(config.weight, quant_min=-q, quant_max=q)
    return dataclasses.replace(config, weight=weight)


def narrow_per_step_weights(graph: Graph, config, bits: int) -> int:
    """Give every product with a per-step weight (unrolled form) the narrow weight spec of
    `config`; returns how many."""
    spec = narrow(config, bits).weight
    count = 0
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default):
        weight = node.args[1]
        annotation = node.meta.get(_Q_KEY)
        if annotation is None or not is_per_step_weight(weight):
            continue
        annotation.input_qspec_map[weight] = spec
        count += 1
    return count
