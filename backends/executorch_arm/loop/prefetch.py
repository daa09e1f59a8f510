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

import multiprocessing
import os
import sys
import time
from typing import Optional

import torch

from . import step as loop_step
from .op import OP, program_of

_DEADLINE_S = 600.0  # a child this late is stuck (a lock held at fork): lower here instead


class _Child:
    """The forked process and the templates it has sent so far, by job index."""

    def __init__(self, process, conn):
        self.process, self.conn = process, conn
        self.results: dict = {}
        self.started = time.monotonic()

    def result(self, index: int):
        while index not in self.results and self.conn is not None:
            if self.conn.poll(1.0):
                try:
                    k, template = self.conn.recv()
                except (EOFError, OSError):
                    self.close()
                    break
                self.results[k] = template
            elif not self.process.is_alive() or time.monotonic() - self.started > _DEADLINE_S:
                self.close()
        return self.results.get(index)

    def close(self) -> None:
        """Stop the child (it may still be lowering steps nobody asked for)."""
        if self.conn is None:
            return
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()
        self.conn.close()
        self.conn = None


class _Promise:
    """program.templates' entry for a step the child is lowering (loop.step.template)."""

    def __init__(self, child: _Child, index: int):
        self.child, self.index = child, index

    def result(self):
        return self.child.result(self.index)


def _lower_all(jobs: list, conn) -> None:
    torch.set_num_threads(1)
    for i, (program, tosa_spec, quantized, pins) in enumerate(jobs):
        try:
            template = loop_step.lower(program, tosa_spec, quantized, pins)
        except Exception:  # the parent lowers it again and reports the error properly
            template = None
        conn.send((i, template))
    conn.close()


def start(graph_module, tosa_spec) -> Optional[_Child]:
    """Fork a child lowering the steps of `graph_module`'s loop nodes (a converted module,
    as lowering takes it) for `tosa_spec`, unless already lowered; None when there is nothing
    to lower or no second core. close() the result when the lowering is done."""
    if len(os.sched_getaffinity(0)) < 2 or not hasattr(graph_module, "graph"):
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
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    sys.stdout.flush()  # else the child flushes a copy of what is buffered
    sys.stderr.flush()
    process = context.Process(target=_lower_all, args=(jobs, send), daemon=True)
    process.start()
    send.close()
    child = _Child(process, receive)
    for i, ((program, *_), key) in enumerate(zip(jobs, keys)):
        program.templates[key] = _Promise(child, i)
    return child
