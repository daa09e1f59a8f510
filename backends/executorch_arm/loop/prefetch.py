"""Lower a program's loop steps in a second process while this one lowers the rest.

Each loop step goes through ExecuTorch's whole Arm flow (5-10 s for a ~50-node step on this
2-core machine), and the main graph's lowering reaches the loop's TOSA visitor only after
its own decompositions and passes. A child forked just before the main lowering (the
steps' keys read from the converted graph, loop.step.boundary) lowers the steps meanwhile
and sends back each one's template (its TOSA bytes and io mapping). The visitor asks
loop.step.template as ever: a promise left there waits for the child's result, the
waiting process lowering the child's last unstarted steps itself; if the child failed or
was stopped, the step is lowered in this process. Either way the template is the same
bytes, so the .pte is too. (Forking at each of auto's candidates' conversion too, to
overlap their simulation, was slower: the unchosen candidates' children slowed it.)
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

    def lost(self) -> bool:
        """Its child was closed before sending it (a later lowering forks another)."""
        return self.child.conn is None and self.index not in self.child.results


def _lower(job):
    return loop_step.lower(*job)


def start(graph_module, tosa_spec) -> Optional[Forked]:
    """A child forked to lower for `tosa_spec` the steps of `graph_module`'s loop nodes (a
    converted module, as lowering takes it) not yet lowered or promised; None when there
    are none or no second core. close() it once the lowering is done."""
    if cores() < 2 or not hasattr(graph_module, "graph"):
        return None
    jobs, keys = [], []
    for node in graph_module.graph.find_nodes(op="call_function", target=OP):
        program = program_of(node)
        quantized, pins = loop_step.boundary(node)
        key = loop_step.template_key(tosa_spec, quantized, pins)
        held = program.templates.get(key)
        taken = any(p is program and k == key for (p, *_), k in zip(jobs, keys))
        if (held is None or isinstance(held, _Promise) and held.lost()) and not taken:
            jobs.append((program, tosa_spec, quantized, pins))
            keys.append(key)
    if not jobs:
        return None
    try:
        child = Forked(_lower, jobs)
    except OSError:  # no process to be had (memory, limits): the visitor lowers them here
        return None
    for i, ((program, *_), key) in enumerate(zip(jobs, keys)):
        program.templates[key] = _Promise(child, i)
    return child
