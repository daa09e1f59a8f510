"""A target's lowering plan: which form each recurrence takes and which tunings run.

Adapters (and the CLI) describe a target once, as a Plan; `lower` applies it to a
program. `strategy` "unrolled" writes every step, "loop" one loop node per layer
direction, "auto" unrolls a stack of at most `auto_unroll_max_steps` steps (T x layers x
directions) and loops beyond, where a loop lowers several times faster at about the same
cost (docs/arm_loop_form.md), and unrolls what the loop form cannot take (`loop_takes`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from . import tunings
from .loop import loop
from .program import RecurrentProgram
from .spec import RecurrentSpec
from .unroll import unroll

FORMS = ("unrolled", "loop")  # what a recurrence becomes
STRATEGIES = ("auto", *FORMS)


@dataclasses.dataclass(frozen=True)
class Plan:
    strategy: str = "unrolled"
    auto_unroll_max_steps: Optional[int] = None  # None: "auto" unrolls every static length
    split_projections: bool = False
    split_products: bool = False
    loop_initial_in_ys: bool = False  # the loop's ys may start with its initial h
    row_views: Optional[str] = None  # "static" (batch size known) | "any" | None
    loop_rows: bool = False  # loops read rows in place, through the row view
    merge_slices: bool = False  # disjoint slices of one value: one split
    fuse_linear_add: bool = False  # add(linear(x, W), v): v as the linear's bias
    # spec -> why the loop form cannot take it (None: it can), for "auto"
    loop_takes: Callable[[RecurrentSpec], Optional[str]] = lambda spec: None

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")

    def form(self, spec: RecurrentSpec) -> str:
        """ "unrolled" or "loop" for a stack."""
        if self.strategy != "auto":
            return self.strategy
        if spec.seq_len is None or self.loop_takes(spec) is not None:
            return "loop" if spec.seq_len is None else "unrolled"
        if self.auto_unroll_max_steps is None:
            return "unrolled"
        steps = spec.seq_len * spec.num_layers * spec.num_directions
        return "unrolled" if steps <= self.auto_unroll_max_steps else "loop"


def lower(program: RecurrentProgram, plan: Plan) -> RecurrentProgram:
    """`program` with its recurrences in the plan's form and the plan's tunings applied."""
    if plan.split_products:
        program = tunings.split_products(program)
    if plan.split_projections:
        program = tunings.split_projections(program)
    if plan.form(program.spec) == "unrolled":
        program = unroll(program)
    else:
        program = loop(program, initial_in_ys=plan.loop_initial_in_ys)
    if plan.row_views:
        program = tunings.row_views(program, static_batch=plan.row_views == "static")
    if plan.loop_rows:
        program = tunings.loop_rows(program)
    if plan.merge_slices:
        program = tunings.merge_slices(program)
    if plan.fuse_linear_add:
        program = tunings.fuse_linear_add(program)
    return program
