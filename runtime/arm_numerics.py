"""An Arm lowering's numerics: its TOSA on the TOSA reference model against fp32 torch eager.

Nothing here executes an Ethos-U command stream: the figure is the TOSA reference model's
on the flatbuffers given to Vela. A program that is one delegate fed by the program inputs
runs as that .tosa alone; any other (CPU ops around or between delegates) runs whole, each
delegate on the TOSA reference model and the CPU ops in torch eager (delegate_run).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch
from torch.utils import _pytree as pytree

from . import tosa_reference
from .metrics import sqnr_db


class NumericsError(RuntimeError):
    """A lowering result cannot be run as asked; the message says why."""


@dataclasses.dataclass(frozen=True)
class Numerics:
    """TOSA reference model outputs vs fp32 torch eager, over all outputs together."""

    max_abs_err: float
    sqnr_db: float
    reference: list  # torch eager outputs (np.ndarray)
    tosa: list  # TOSA reference model outputs, dequantized (np.ndarray)


def flat_outputs(out) -> list:
    """A module's output tensors in torch.export's order (pytree leaves: a dict's values in
    its keys' order, nested tuples and lists), as a lowered program returns them."""
    return [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]


def run(result, inputs: Sequence[torch.Tensor]) -> list:
    """The lowered program's float outputs for `inputs` (flow.LoweringResult `result`)."""
    if result.input_map is not None and len(result.tosa_files) == 1:
        arrays = [inputs[i].detach().numpy() for i in result.input_map]
        delegate_out = tosa_reference.run(
            result.tosa_files[0],
            arrays,
            input_quant=result.input_quant,
            output_quant=result.output_quant,
        )
        outputs = [delegate_out[j] for j in result.output_map]
    elif result.program_module is not None:
        from .delegate_run import run_program

        try:
            outputs = run_program(result.program_module, result.tosa_files, inputs)
        except ValueError as e:
            raise NumericsError(f"{result.target}: {e}") from e
    else:
        raise NumericsError(f"{result.target}: the program has no delegate to check")
    return [np.asarray(o, dtype=np.float32) for o in outputs]


def check(result, module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Numerics:
    """Run the lowered program on the TOSA reference model and compare with `module` in
    fp32 torch eager on the same inputs."""
    with torch.no_grad():
        try:
            module = module.eval()
        except NotImplementedError:  # an exported program's module needs no eval()
            pass
        reference = [t.detach().numpy() for t in flat_outputs(module(*inputs))]
    outputs = run(result, inputs)
    if len(outputs) != len(reference):
        raise NumericsError(f"{len(outputs)} delegate outputs vs {len(reference)} eager outputs")
    ref_flat = np.concatenate([r.reshape(-1) for r in reference])
    out_flat = np.concatenate([o.reshape(r.shape).reshape(-1) for o, r in zip(outputs, reference)])
    return Numerics(
        max_abs_err=float(np.max(np.abs(ref_flat - out_flat))),
        sqnr_db=sqnr_db(ref_flat, out_flat),
        reference=reference,
        tosa=outputs,
    )
