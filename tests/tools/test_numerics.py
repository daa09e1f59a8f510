"""An integer output (a class index) is reported by its share of equal elements, and the
overall figures are the floating outputs' alone: an index's SQNR weighs a flip by how far
apart the two classes' numbers happen to be."""

from __future__ import annotations

import numpy as np
import pytest

from recurrent_lowering.runtime.metrics import equal_per_output, sqnr_db
from recurrent_lowering.tools.lowering import numerics, report

LOGITS = np.array([[0.5, -1.0, 2.0], [1.5, 0.2, -0.3]])
NOISY = LOGITS + 0.01
CLASSES, FLIPPED = np.array([2, 0, 1, 1]), np.array([2, 0, 1, 0])


def test_equal_share_of_integer_outputs_only():
    assert equal_per_output([LOGITS, CLASSES], [NOISY, FLIPPED]) == [None, 0.75]


def test_overall_figures_leave_integer_outputs_out():
    figures = numerics.compare([LOGITS, CLASSES], [NOISY, FLIPPED])
    assert figures["max_abs_err"] == pytest.approx(0.01)
    assert figures["sqnr_db"] == sqnr_db(LOGITS, NOISY)
    alone = numerics.compare([CLASSES], [FLIPPED])  # no floating output: the indices
    assert alone["max_abs_err"] == 1.0


def test_summary_names_the_share():
    rep = report.empty("TOSA-1.0+INT", "m")
    rep["numerics"].update(
        reference="r",
        inputs="generated",
        max_abs_err=0.01,
        sqnr_db=40.0,
        sqnr_db_per_output=[40.0, 1.2],
        outputs=["logits", "cls"],
        equal_per_output=[None, 0.75],
    )
    assert "(per output: logits: 40 dB, cls: equal on 75%)" in report.summary(rep)
