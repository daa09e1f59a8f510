"""Work in a forked child (forked.py): loop.prefetch's child lowers the loop steps while the
main graph lowers, the program the same bytes as when this process lowers them, and a
child that dies costs only the time (the step is lowered here)."""

from __future__ import annotations

import os

import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.loop import prefetch
from recurrent_lowering.tests.executorch_arm.sequence_output import SequenceOutput


def _lower(tmp_path, name):
    torch.manual_seed(0)
    model = SequenceOutput(torch.nn.GRU(8, 16, batch_first=True)).eval()
    calibration = [(torch.randn(1, 16, 8),) for _ in range(2)]
    return flow.lower(
        model,
        calibration[0],
        "ethos-u85-256",
        tmp_path / name,
        calibration_inputs=calibration,
        quantization="int8",
    )


def _spy(monkeypatch) -> list:
    children: list = []
    start = prefetch.start

    def spied(*args):
        child = start(*args)
        children.append(child)
        return child

    monkeypatch.setattr(prefetch, "start", spied)
    return children


def test_the_child_lowers_the_step_and_the_program_is_the_same(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(prefetch, "start", lambda *args: None)
        here = _lower(tmp_path, "here")
    children = _spy(monkeypatch)
    forked = _lower(tmp_path, "forked")
    assert len(forked.loop_programs) == 1
    (child,) = children
    assert child is not None and child.conn is None  # closed after the lowering
    assert list(child.results) == [0] and child.results[0] is not None  # the child's step
    assert forked.pte == here.pte


def test_a_child_that_dies_leaves_the_step_to_this_process(tmp_path, monkeypatch):
    here = _lower(tmp_path, "here")
    monkeypatch.setattr(prefetch, "_lower", lambda job: os._exit(3))
    children = _spy(monkeypatch)
    died = _lower(tmp_path, "died")
    (child,) = children
    assert child.results == {} and child.process.exitcode == 3
    assert died.pte == here.pte
