"""`recurrent_lowering::scan`: a recurrent layer's time loop as a single graph node.

ExecuTorch's Arm passes cost about 40 ms per node, so an unrolled layer (T copies of the step)
spends its lowering time there. In the loop form the core writes the step once: FxBuilder.scan
traces the step into a small GraphModule (a `StepProgram`) and puts one `scan` node in the
program, so quantization, `to_edge` and the Arm passes see one node per layer direction. The
TOSA for the node is written by `scan_tosa` from the step lowered once and copied T times.

    scan(xs [T0, B, G] or its view [T0*B, G], h [B, H], c [B, H] or None, key) -> [T (+1), B, H]

The steps read rows first .. first + T - 1 of xs (the StepProgram's `first` and `steps`: the
loop can start after a peeled first step without a sliced copy of the projection). The
result holds h after every step in time order (the layer's Y, of which the last step, or
the first when reversed, is h_n; with `initial_in_ys` the given h too, as the first row or
the last when reversed), then c_n when the cell carries c and the program reads it
(FxBuilder.drop_unread_final_c). `key` names the
StepProgram in this process's registry: the node is a lowering-time form, never saved.

Eager calls (PT2E calibration runs the prepared model eagerly) record each step's float
inputs, which calibrate the step's own quantization: one set of scales for every timestep.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import torch
from torch.fx import GraphModule

_LIB = torch.library.Library("recurrent_lowering", "DEF")
_LIB.define("scan(Tensor xs, Tensor h, Tensor? c, int key) -> Tensor")

OP = torch.ops.recurrent_lowering.scan.default
EDGE_NAME = "recurrent_lowering.scan.default"  # the edge op's __name__ (node visitors' key)


@dataclasses.dataclass(eq=False)
class StepProgram:
    """One step of a layer direction: step(h, [c], x_t) -> (h', [c']), plus what the lowering
    learns about it (calibration samples, the quantization config, lowered templates)."""

    step: GraphModule
    num_states: int
    reverse: bool
    first: int  # the first row of xs the loop reads
    steps: int  # how many rows it reads
    initial_in_ys: bool = False  # the result also holds the initial h (Builder.scan)
    final_c: bool = True  # the result ends with c_n (dropped when nobody reads it)
    samples: list = dataclasses.field(default_factory=list)  # tuples of step inputs
    max_samples: int = 4096
    quant_config: Optional[object] = None  # the Arm QuantizationConfig the layer was given
    step_config: Optional[object] = None  # the step's own config (int16 state), else quant_config
    templates: dict = dataclasses.field(default_factory=dict)  # scan_tosa's cache

    def record(self, inputs: tuple) -> None:
        if len(self.samples) < self.max_samples:
            self.samples.append(tuple(t.detach().clone() for t in inputs))


_PROGRAMS: dict[int, StepProgram] = {}
_KEYS = itertools.count()


def register(program: StepProgram) -> int:
    key = next(_KEYS)
    _PROGRAMS[key] = program
    return key


def program(key: int) -> StepProgram:
    if key not in _PROGRAMS:
        raise KeyError(
            f"recurrent_lowering.scan: no step program {key} in this process (a scan node is "
            "a lowering-time form; lower the program in the process that decomposed it)"
        )
    return _PROGRAMS[key]


def run(p: StepProgram, xs: torch.Tensor, h: torch.Tensor, c: Optional[torch.Tensor]):
    """The scan's value: every step's h in time order, then c_n if the cell carries c."""
    states = [h] if c is None else [h, c]
    if xs.dim() == 2:  # the [T0*B, G] view of the projection
        xs = xs.reshape(-1, h.shape[0], xs.shape[-1])
    steps = range(p.steps)
    ys: list = [None] * p.steps
    for t in reversed(steps) if p.reverse else steps:
        inputs = (*states, xs[p.first + t])
        p.record(inputs)
        states = list(p.step(*inputs))  # the traced step returns its new states as a tuple
        ys[t] = states[0]
    if p.initial_in_ys:
        ys = ys + [h] if p.reverse else [h] + ys
    return torch.stack(ys + (states[1:] if p.final_c else []), 0)


@torch.library.impl(_LIB, "scan", "CompositeExplicitAutograd")
def _scan(xs, h, c, key):
    return run(program(key), xs, h, c)


@torch.library.register_fake("recurrent_lowering::scan")
def _scan_fake(xs, h, c, key):
    p = program(key)
    rows = p.steps + p.initial_in_ys + (c is not None and p.final_c)
    return h.new_empty((rows, *h.shape))
