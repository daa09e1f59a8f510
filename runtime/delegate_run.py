"""Run a mixed CPU/NPU program's delegates on the TOSA reference model.

`run_program` runs a whole lowered edge program: its delegates on the TOSA reference model,
the rest in torch eager. `run_delegate` runs one delegate alone, as follows.

A program with a recurrent layer kept on the CPU and the rest delegated cannot run in one
piece here: the host runtime has no Ethos-U backend, and the TOSA reference model runs only the
delegate. So its numerics are checked split: the CPU part as a CPU-only .pte in ExecuTorch's
host runtime (runtime.executorch_host), the delegate's dumped .tosa here, fed the CPU part's
float outputs through the boundary's quantize parameters (the Arm adapter's
partition.cpu_reasons.delegate_boundaries, read
from the q/dq nodes the partitioner left on the CPU) and dequantized the same way.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional, Sequence

import numpy as np
import torch

from . import tosa_flatbuffer, tosa_reference
from .quantization import QuantParams


@dataclasses.dataclass(frozen=True)
class BoundaryValue:
    """A value crossing a delegate boundary: its shape and the CPU-side q/dq parameters
    (None for a float value)."""

    name: str
    shape: tuple
    quant: Optional[QuantParams]


@dataclasses.dataclass
class Boundary:
    inputs: list  # list[BoundaryValue], in first-use order
    outputs: list  # list[BoundaryValue], in graph order


def match_by_shape(values: list, shapes: list) -> list:
    """values (BoundaryValue) reordered to match `shapes` (a TOSA graph's I/O); refuses when
    two values share a shape, since then only names could tell them apart."""
    by_shape: dict = {}
    for v in values:
        by_shape.setdefault(tuple(v.shape), []).append(v)
    ordered = []
    for shape in shapes:
        candidates = by_shape.get(tuple(shape), [])
        if len(candidates) != 1:
            raise ValueError(f"{len(candidates)} boundary values of shape {shape}: ambiguous")
        ordered.append(candidates[0])
    return ordered


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


def delegation_tag(graph_module) -> str:
    """A delegate's own tag: its first computing node's. Its placeholders carry the tags
    of the nodes they were cut from, another delegate's where one feeds it directly."""
    for node in graph_module.graph.nodes:
        tag = node.meta.get("delegation_tag") if node.op != "placeholder" else None
        if tag:
            return tag
    return ""


def tosa_file_for(lowered, tosa_files: Sequence[pathlib.Path]) -> pathlib.Path:
    """The dumped .tosa of one lowered module: ExecuTorch's TOSA backend names it
    output_<delegation tag>_<TOSA spec>.tosa, the tag `delegation_tag`'s while we lower
    (backends/executorch_arm/compat/dump_names.py)."""
    tag = delegation_tag(lowered.original_module.graph_module)
    matches = [f for f in tosa_files if f.name.startswith(f"output_{tag}_")]
    if len(matches) != 1:
        names = [f.name for f in tosa_files]
        raise ValueError(f"delegate {tag!r}: expected one dumped .tosa among {names}")
    return matches[0]


class _TosaDelegates(torch.overrides.TorchFunctionMode):
    """Runs every executorch_call_delegate on the TOSA reference model, on the delegate's
    own boundary tensors (int8 when the partitioner left the boundary q/dq on the CPU)."""

    def __init__(self, tosa_files: Sequence[pathlib.Path]):
        super().__init__()
        self.tosa_files = list(tosa_files)
        self.ran = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch._higher_order_ops.executorch_call_delegate:
            lowered, inputs = args[0], args[1:]
            arrays = [t.detach().numpy() for t in inputs]
            outputs = tosa_reference.run(tosa_file_for(lowered, self.tosa_files), arrays)
            self.ran += 1
            return tuple(torch.from_numpy(np.ascontiguousarray(o)) for o in outputs)
        return func(*args, **(kwargs or {}))


def run_program(module, tosa_files: Sequence[pathlib.Path], inputs: Sequence) -> list:
    """Outputs of a lowered (edge) program with any number of delegates: each delegate's
    dumped .tosa on the TOSA reference model, the ops left on the CPU in torch eager (the
    edge dialect's ATen kernels, what ExecuTorch's portable kernels implement)."""
    mode = _TosaDelegates(tosa_files)
    with torch.no_grad(), mode:
        out = module(*inputs)
    if not mode.ran:
        raise ValueError("the program has no delegate to run on the TOSA reference model")
    flat = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o.detach().numpy() for o in flat]
