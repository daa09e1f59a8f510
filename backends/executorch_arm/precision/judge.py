"""How accurate auto's candidates are: before lowering, simulated (`predict`, the converted
module in torch, precision.accuracy); after, measured (`measure`, the lowered program on the
TOSA reference model). Both against the float module on the same evaluation samples, a
stream in its own closed loop, in dB per output (precision.candidates decides with them)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from recurrent_lowering.runtime.metrics import sqnr_per_output

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


class Judge:
    """`predict(plan)` simulates the plan's converted module, made by `convert(plan) ->
    (converted module, quantizer)` and kept in `quantized[key(plan)]` for its lowering;
    `measure(result)` runs a lowering (flow.LoweringResult) on the TOSA reference model and
    keeps what it ran in `result.verified`. `ahead(plans)` simulates plans that may be
    asked for next in a forked child (forked.py: the lowering runs torch on one thread, the
    child is the second core) until close(); a plan the child simulated has its scores but
    no converted module here: its lowering converts it again, the same calibration on the
    same samples, so the same program."""

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

    def ahead(self, plans) -> None:
        self.close()
        if cores() < 2 or not plans:
            return
        self.reference()  # once, before the fork: both processes have it
        try:
            self._child = Forked(self._simulate, plans, speculative=True)
        except OSError:  # no process to be had: each plan is simulated here when asked
            return
        self._ahead = [self.key(plan) for plan in plans]

    def close(self) -> None:
        """Stop the child of `ahead` (its jobs nobody asked for are dropped)."""
        if self._child is not None:
            self._child.close()
        self._child, self._ahead = None, []

    def predict(self, plan) -> list:
        key = self.key(plan)
        if self._child is not None and key in self._ahead:
            scores = self._child.result(self._ahead.index(key))
            if scores is not None:  # else the child failed it: simulated here, as ever
                return scores
        return self._simulate(plan)

    def _simulate(self, plan) -> list:
        converted, quantizer = self.quantized[self.key(plan)] = self.convert(plan)
        run = accuracy.of_module(converted, converted=True, tosa_spec=quantizer.tosa_spec)
        simulated = accuracy.outputs(run, self.evaluation)
        return sqnr_per_output(self.reference(), simulated)

    def measure(self, result) -> list:
        tosa = accuracy.outputs(accuracy.of_lowered(result), self.evaluation)
        result.verified = Verified(self.evaluation, self.reference(), tosa)
        return sqnr_per_output(result.verified.fp32, tosa)
