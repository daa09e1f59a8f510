"""Lower a program's loop steps in a second process while this one lowers the rest.

Each loop step goes through ExecuTorch's whole Arm flow (5-10 s for a ~50-node step on this
2-core machine), and the main graph's lowering reaches the loop's TOSA visitor only after
its own decompositions and passes. A child forked just before the main lowering lowers the
steps meanwhile, on the other core, and sends back each step's template (its TOSA bytes and
io mapping). The visitor asks loop.step.template as ever: a promise left there by `start`
waits for the child's result; if the child failed, or its key was not the one asked for,
the step is lowered in this process. Either way the template is the same bytes, so the
.pte is too.
"""

from __future__ import annotations

from typing import Optional

from ..forked import Forked, cores
from . import step as loop_step
from .op import OP, program_of


class _Promise:
    """program.templates' entry for a step the child is lowering (loop.step.template)."""

    def __init__(self, child: Forked, index: int):
        self.child, self.index = child, index

    def result(self):
        return self.child.result(self.index)


def _lower(job):
    return loop_step.lower(*job)


def start(graph_module, tosa_spec) -> Optional[Forked]:
    """Fork a child lowering the steps of `graph_module`'s loop nodes (a converted module,
    as lowering takes it) for `tosa_spec`, unless already lowered; None when there is nothing
    to lower or no second core. close() the result when the lowering is done."""
    if cores() < 2 or not hasattr(graph_module, "graph"):
        return None
    jobs, keys = [], []
    for node in graph_module.graph.find_nodes(op="call_function", target=OP):
        program = program_of(node)
        quantized, pins = loop_step.boundary(node)
        key = loop_step.template_key(tosa_spec, quantized, pins)
        if key not in program.templates:
            program.templates[key] = None  # taken: the promise replaces it below
            jobs.append((program, tosa_spec, quantized, pins))
            keys.append(key)
    if not jobs:
        return None
    child = Forked(_lower, jobs)
    for i, ((program, *_), key) in enumerate(zip(jobs, keys)):
        program.templates[key] = _Promise(child, i)
    return child
