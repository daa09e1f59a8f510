"""A candidate's accuracy before it is lowered: its PT2E-converted module (quantize and
dequantize around every value, what the lowering then hands ExecuTorch) run in torch on the
evaluation samples, against the float module.

The converted module follows the TOSA reference model's figures closely (silero-vad int8 on
ethos-u55-128, 400 frames of held-out speech: speech probability -10.9 dB simulated, -10.4
measured; docs/precision.md), in seconds instead of a lowering. A stream (runtime.streams)
runs in its own closed loop, the converted module fed its own state, as the device is.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
import torch

from recurrent_lowering.runtime import arm_numerics
from recurrent_lowering.runtime.streams import fed_back, stacked

from ..loop.op import run_graph


@dataclasses.dataclass
class Evaluation:
    """Samples to measure on (tuples of tensors in the program's input order) and, for a
    stream, the (input index, output index) pairs whose outputs feed the next sample."""

    samples: Sequence
    state: Sequence = ()


def flat(out) -> list:
    """A module's outputs, flat in a lowered program's order, as numpy arrays."""
    return [o.detach().numpy() for o in arm_numerics.flat_outputs(out)]


def outputs(run: Callable, evaluation: Evaluation, until: Callable = None) -> list:
    """`run(inputs) -> outputs` over the samples (closed loop for a stream), each output's
    values stacked over the samples (those up to where `until(sample, outputs)` is true,
    when given)."""
    _, produced = fed_back(run, evaluation.samples, list(evaluation.state), until)
    return stacked(produced)


def of_module(module, converted: bool = False, tosa_spec=None, step_of=None) -> Callable:
    """A float module, or a converted one (its loop nodes through their step programs), as
    `run(inputs) -> outputs`; a converted module's weights are dequantized once, and its
    loops run the quantized step their lowering for `tosa_spec` will lower (loop.step), or
    the step `step_of(node)` gives."""
    constants: dict = {}
    if step_of is None and converted and tosa_spec is not None:
        from ..loop import step

        def step_of(node):
            return step.simulated(node, tosa_spec)

    def run(inputs):
        tensors = [torch.as_tensor(np.asarray(a)) for a in inputs]
        with torch.no_grad():
            if converted:
                return flat(
                    run_graph(module, *tensors, record=False, constants=constants, step_of=step_of)
                )
            return flat(module(*tensors))

    return run


def of_lowered(result) -> Callable:
    """A lowering's (flow.LoweringResult) program on the TOSA reference model, as
    `run(inputs) -> outputs` (runtime.arm_numerics; nothing runs an Ethos-U command stream)."""

    def run(inputs):
        return arm_numerics.run(result, [torch.as_tensor(np.asarray(a)) for a in inputs])

    return run
