"""How accurate auto's candidates are: before lowering, simulated (`predict`, the converted
module in torch, precision.accuracy); after, measured (`measure`, the lowered program on the
TOSA reference model). Both against the float module on the same evaluation samples, a
stream in its own closed loop, in dB per output (precision.candidates decides with them)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from recurrent_lowering.runtime.metrics import sqnr_per_output

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
    keeps what it ran in `result.verified`."""

    def __init__(self, module, convert: Callable, evaluation: accuracy.Evaluation, key):
        self.module, self.convert, self.evaluation, self.key = module, convert, evaluation, key
        self.quantized: dict = {}  # key(plan) -> (converted module, quantizer)
        self._reference: list = []

    def reference(self) -> list:
        if not self._reference:
            run = accuracy.of_module(self.module)
            self._reference.extend(accuracy.outputs(run, self.evaluation))
        return self._reference

    def predict(self, plan) -> list:
        converted, quantizer = self.quantized[self.key(plan)] = self.convert(plan)
        run = accuracy.of_module(converted, converted=True, tosa_spec=quantizer.tosa_spec)
        simulated = accuracy.outputs(run, self.evaluation)
        return sqnr_per_output(self.reference(), simulated)

    def measure(self, result) -> list:
        tosa = accuracy.outputs(accuracy.of_lowered(result), self.evaluation)
        result.verified = Verified(self.evaluation, self.reference(), tosa)
        return sqnr_per_output(result.verified.fp32, tosa)
