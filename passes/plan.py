"""A target's lowering plan: how each recurrence is emitted and which tunings run.

Adapters describe a target once, as a Plan; `lower` applies it to a program.
`Plan.emission_of` is where the emission of a layer stack is decided, for every adapter:
`emission` "unrolled" writes every step, "loop" one loop node per layer direction, "auto"
unrolls a stack of at most `auto_unroll_max_steps` steps (T x layers x directions) and
loops beyond, where a loop lowers several times faster at about the same cost
(docs/arm_loop_form.md), and unrolls what the target's loop cannot take (`loop_takes`).
`lower` runs `passes(plan)`, the pipeline as a list.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

from . import tunings
from .loop import loop
from .program import RecurrentProgram
from .spec import RecurrentSpec, SpecError
from .unroll import unroll
from .verify import VerifyError, verify

FORMS = ("unrolled", "loop")  # what a recurrence becomes
EMISSIONS = ("auto", *FORMS)  # what a caller asks for


@dataclasses.dataclass(frozen=True)
class Plan:
    emission: str = "unrolled"
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
        if self.emission not in EMISSIONS:
            raise ValueError(f"emission must be one of {EMISSIONS}, got {self.emission!r}")

    def emission_of(self, spec: RecurrentSpec) -> str:
        """ "unrolled" or "loop": how the stack `spec` is emitted. An explicit "loop" the
        target's loop cannot take is refused, naming the layer and why."""
        why = self.loop_takes(spec)
        if self.emission == "loop" and why is not None:
            raise SpecError(spec.name, "emission", f"the loop form cannot take {why}")
        if self.emission != "auto":
            return self.emission
        if spec.seq_len is None and why is not None:
            raise SpecError(
                spec.name,
                "seq_len",
                f"a dynamic sequence length needs the loop form, which cannot take {why}",
            )
        if spec.seq_len is None or why is not None:
            return "loop" if spec.seq_len is None else "unrolled"
        if self.auto_unroll_max_steps is None:
            return "unrolled"
        steps = spec.seq_len * spec.num_layers * spec.num_directions
        return "unrolled" if steps <= self.auto_unroll_max_steps else "loop"


Pass = Callable[[RecurrentProgram], RecurrentProgram]


def passes(plan: Plan, spec: RecurrentSpec) -> list:
    """The passes `plan` runs on the program of `spec`, in order."""
    emitted = plan.emission_of(spec)
    steps = [
        plan.split_products and tunings.split_products,
        plan.split_projections and tunings.split_projections,
        unroll
        if emitted == "unrolled"
        else functools.partial(loop, initial_in_ys=plan.loop_initial_in_ys),
        plan.row_views
        and functools.partial(tunings.row_views, static_batch=plan.row_views == "static"),
        plan.loop_rows and tunings.loop_rows,
        plan.merge_slices and tunings.merge_slices,
        plan.fuse_linear_add and tunings.fuse_linear_add,
    ]
    return [step for step in steps if step]


def lower(program: RecurrentProgram, plan: Plan) -> RecurrentProgram:
    """`program` with its recurrences emitted and the plan's tunings applied, verified after
    every pass."""
    verify(program.outputs, program.graph)
    for step in passes(plan, program.spec):
        program = step(program)
        try:
            verify(program.outputs, program.graph)
        except VerifyError as e:
            name = getattr(step, "__name__", getattr(step, "func", step))
            raise VerifyError(f"after the pass {name}: {e}") from e
    return program
