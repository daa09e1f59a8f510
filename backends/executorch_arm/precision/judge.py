"""How accurate auto's candidates are: before lowering, simulated (`predict`, the converted
module in torch, precision.accuracy); after, measured (`measure`, the lowered program on the
TOSA reference model). Both against the float module on the same evaluation samples, a
stream in its own closed loop, in dB per output (precision.candidates decides with them); an
integer output beside floating ones reads inf (metrics.judged)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from recurrent_lowering.runtime import metrics
from recurrent_lowering.runtime.metrics import judged, judged_sqnr_per_output

from ..forked import Forked, cores
from . import accuracy


@dataclasses.dataclass(frozen=True)
class Verified:
    """What auto's verification ran: the float module's and the TOSA reference model's
    outputs on `evaluation`, each stacked over its samples (accuracy.outputs), so a caller
    measuring on the same samples need not run them again."""

    evaluation: accuracy.Evaluation
    fp32: list
    tosa: list


class Bound(list):
    """A simulation stopped once a candidate was certain to miss its target: per output, an
    upper bound of its SQNR in dB (the reference's energy over all `of` samples against the
    error over the first `seen`; the error only grows with more samples)."""

    def __init__(self, bounds, seen: int, of: int):
        super().__init__(bounds)
        self.seen, self.of = seen, of


def _certain_miss(reference: list, at_least: float, record: list) -> Callable:
    """`until(sample, outputs)` for accuracy.outputs: true once some output's SQNR bound
    over the samples so far (Bound) is under `at_least`; the bounds go into `record`."""
    signal = [float(np.sum(np.square(r.astype(np.float64)))) for r in reference]
    noise = [0.0] * len(reference)
    judging = judged(reference)

    def until(k: int, outputs) -> bool:
        for o, (r, a) in enumerate(zip(reference, outputs)):
            error = np.ravel(r[k]).astype(np.float64) - np.ravel(np.asarray(a))
            noise[o] += float(np.sum(np.square(error)))
        record[:] = [metrics.db(s, n) if j else np.inf for s, n, j in zip(signal, noise, judging)]
        return min(record) < at_least

    return until


class Judge:
    """`predict(plan)` simulates the plan's converted module, made by `convert(plan) ->
    (converted module, quantizer)` and kept in `quantized[key(plan)]` for its lowering
    (and a second simulation of it, which runs the same conversion);
    `measure(result)` runs a lowering (flow.LoweringResult) on the TOSA reference model and
    keeps what it ran in `result.verified`. `predict(plan, at_least)` may stop the
    simulation once some output is certain to miss `at_least` dB, and returns a Bound then
    (for a caller to whom a miss is a miss whatever its figure). `ahead(jobs)` simulates
    (plan, at_least) jobs that may be asked for next in a forked child (forked.py: the
    lowering runs torch on one thread, the child is the second core) until close(); a plan
    the child simulated has its scores but no converted module here: its lowering converts
    it again, the same calibration on the same samples, so the same program."""

    def __init__(self, module, convert: Callable, evaluation: accuracy.Evaluation, key):
        self.module, self.convert, self.evaluation, self.key = module, convert, evaluation, key
        self.quantized: dict = {}  # key(plan) -> (converted module, quantizer)
        self._reference: list = []
        self._child: Optional[Forked] = None
        self._ahead: list = []  # key(plan) of the child's jobs, in its order

    def reference(self) -> list:
        if not self._reference:
            run = accuracy.of_module(self.module)
            self._reference.extend(accuracy.outputs(run, self.evaluation))
        return self._reference

    def ahead(self, jobs) -> None:
        self.close()
        if cores() < 2 or not jobs:
            return
        self.reference()  # once, before the fork: both processes have it
        try:
            self._child = Forked(self._job, jobs, speculative=True)
        except OSError:  # no process to be had: each plan is simulated here when asked
            return
        self._ahead = [self.key(plan) for plan, _ in jobs]

    def close(self) -> None:
        """Stop the child of `ahead` (its jobs nobody asked for are dropped)."""
        if self._child is not None:
            self._child.close()
        self._child, self._ahead = None, []

    def predict(self, plan, at_least: Optional[float] = None) -> list:
        key = self.key(plan)
        if self._child is not None and key in self._ahead:
            scores = self._child.result(self._ahead.index(key))
            # None: the child failed it; a Bound: not enough for a caller wanting figures
            if scores is not None and (at_least is not None or not isinstance(scores, Bound)):
                return scores
        return self._simulate(plan, at_least)

    def _job(self, job) -> list:
        return self._simulate(*job)

    def _simulate(self, plan, at_least: Optional[float] = None) -> list:
        key = self.key(plan)
        if key not in self.quantized:  # a plan simulated again runs the same conversion
            self.quantized[key] = self.convert(plan)
        converted, quantizer = self.quantized[key]
        run = accuracy.of_module(converted, converted=True, tosa_spec=quantizer.tosa_spec)
        reference, bounds = self.reference(), []
        until = None if at_least is None else _certain_miss(reference, at_least, bounds)
        simulated = accuracy.outputs(run, self.evaluation, until)
        seen, of = len(simulated[0]), len(reference[0])
        if seen < of:
            return Bound(bounds, seen, of)
        return judged_sqnr_per_output(reference, simulated)

    def measure(self, result) -> list:
        tosa = accuracy.outputs(accuracy.of_lowered(result), self.evaluation)
        result.verified = Verified(self.evaluation, self.reference(), tosa)
        return judged_sqnr_per_output(result.verified.fp32, tosa)
