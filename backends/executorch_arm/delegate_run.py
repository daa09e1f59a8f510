"""Run one delegate of a mixed CPU/NPU program alone, on the TOSA reference model.

A program with a recurrent layer kept on the CPU and the rest delegated cannot run in one
piece here: the host runtime has no Ethos-U backend, and the TOSA reference model runs only the
delegate. So its numerics are checked split: the CPU part as a CPU-only .pte in ExecuTorch's
host runtime (runtime.executorch_host), the delegate's dumped .tosa here, fed the CPU part's
float outputs through the boundary's quantize parameters (fallback.delegate_boundaries, read
from the q/dq nodes the partitioner left on the CPU) and dequantized the same way.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import numpy as np

from recurrent_lowering.runtime import tosa_flatbuffer, tosa_reference

from .fallback import Boundary, match_by_shape


def run_delegate(
    tosa_file: pathlib.Path, boundary: Boundary, inputs: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """Float outputs of the delegate `tosa_file` for float `inputs` (one per boundary input,
    matched by shape), in the TOSA graph's output order."""
    in_infos, out_infos = tosa_flatbuffer.graph_io(tosa_flatbuffer.load_bytes(tosa_file))
    by_shape = {tuple(np.shape(a)): a for a in inputs}
    if len(by_shape) != len(inputs):
        raise ValueError("inputs share a shape: cannot match them to the delegate's inputs")
    ins = match_by_shape(boundary.inputs, [i.shape for i in in_infos])
    outs = match_by_shape(boundary.outputs, [o.shape for o in out_infos])
    arrays = [by_shape[tuple(v.shape)] for v in ins]
    return tosa_reference.run(
        tosa_file,
        arrays,
        input_quant=[v.quant for v in ins],
        output_quant=[v.quant for v in outs],
    )
