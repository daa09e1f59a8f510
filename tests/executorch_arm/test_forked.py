"""Work in a forked child (forked.py): loop.prefetch's child lowers the loop steps while the
main graph lowers, and precision.judge's simulates auto's wider candidates while this
process simulates its choice; the program the same bytes as when this process does it all,
and a child that dies costs only the time (the step is lowered here)."""

from __future__ import annotations

import os
import time

import torch

from recurrent_lowering.backends.executorch_arm import flow, forked
from recurrent_lowering.backends.executorch_arm.loop import prefetch
from recurrent_lowering.backends.executorch_arm.precision import judge
from recurrent_lowering.tests.executorch_arm.sequence_output import SequenceOutput


def test_both_processes_do_the_jobs_and_one_the_child_failed_is_left_to_the_caller():
    parent = os.getpid()

    def job(x):
        if x == 1 and os.getpid() != parent:
            raise ValueError("the child fails job 1")
        time.sleep(0.3)
        return x * x, os.getpid() == parent

    child = forked.Forked(job, range(10))
    try:
        got = [child.result(i) for i in range(10)]
    finally:
        child.close()
    assert got[1] is None  # the child's failure: the caller does it again
    done = [g for i, g in enumerate(got) if i != 1]
    assert [g[0] for g in done] == [x * x for x in range(10) if x != 1]
    here = [g[1] for g in done]
    assert any(here) and not all(here)  # the parent took the last jobs while it waited


def test_a_caller_waiting_on_speculative_jobs_does_one_of_them_meanwhile():
    """precision.judge's jobs are candidates auto may never ask for: while it waits for the
    child's first, this process does the last (the one a miss asks for) and no more, then
    or later."""
    parent = os.getpid()

    def job(x):
        time.sleep(2.0 if x == 0 else 0.2)
        return os.getpid() == parent

    for speculative, here in ((True, {3}), (False, {1, 2, 3})):
        child = forked.Forked(job, range(4), speculative=speculative)
        try:
            assert child.result(0) is False  # the child's
            assert {j for j, by_parent in child.results.items() if by_parent} == here
            if speculative:
                assert child.result(2) is False and child.results[3] is True
        finally:
            child.close()


def _lower(tmp_path, name, quantization="int8", **options):
    torch.manual_seed(0)
    model = SequenceOutput(torch.nn.GRU(8, 16, batch_first=True)).eval()
    calibration = [(torch.randn(1, 16, 8),) for _ in range(2)]
    return flow.lower(
        model,
        calibration[0],
        "ethos-u85-256",
        tmp_path / name,
        calibration_inputs=calibration,
        quantization=quantization,
        **options,
    )


def _spy(monkeypatch, module=prefetch) -> list:
    children: list = []

    class Spied(forked.Forked):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            children.append(self)

    monkeypatch.setattr(module, "Forked", Spied)
    return children


def test_the_child_lowers_the_step_and_the_program_is_the_same(tmp_path, monkeypatch):
    """auto: the chosen candidate's step lowered by the child while the main graph
    lowers, its template taken by the visitor."""
    with monkeypatch.context() as m:
        m.setattr(prefetch, "start", lambda *args: None)
        here = _lower(tmp_path, "here", "auto")
    children = _spy(monkeypatch)
    lowered = _lower(tmp_path, "forked", "auto")
    assert len(lowered.loop_programs) == 1
    assert children and all(child.conn is None for child in children)  # all stopped
    received = [r for child in children for r in child.results.values()]
    assert received and all(r is not None for r in received)
    assert lowered.pte == here.pte


def test_a_child_that_dies_leaves_the_step_to_this_process(tmp_path, monkeypatch):
    here = _lower(tmp_path, "here")
    monkeypatch.setattr(prefetch, "_lower", lambda job: os._exit(3))
    children = _spy(monkeypatch)
    died = _lower(tmp_path, "died")
    (child,) = children
    assert child.process.exitcode == 3
    assert died.pte == here.pte


def test_the_child_simulates_the_wider_candidates_and_the_program_is_the_same(
    tmp_path, monkeypatch
):
    """auto on ethos-u85-256 chooses int8 for cycles; a 60 dB target it misses makes it
    simulate the wider candidates, which the child does meanwhile: the same predictions,
    the same choice, the same bytes (the chosen plan converted again for its lowering)."""
    with monkeypatch.context() as m:
        m.setattr(judge, "cores", lambda: 1)
        here = _lower(tmp_path, "here", "auto", min_sqnr=60.0)
    children = _spy(monkeypatch, judge)
    lowered = _lower(tmp_path, "forked", "auto", min_sqnr=60.0)
    (child,) = children
    assert child.conn is None  # stopped once auto chose
    assert any(r is not None for r in child.results.values())
    assert lowered.plan.precision.predicted == here.plan.precision.predicted
    assert len(lowered.plan.precision.predicted) > 1
    assert lowered.plan.precision.name == here.plan.precision.name != "int8"
    assert lowered.pte == here.pte


def _stop_a_child_inside(hold) -> float:
    """Forks a speculative child whose job runs `hold(inside)` (which sets the event
    `inside` once it holds what it holds, then waits), stops it there: close()'s seconds."""
    import multiprocessing

    inside = multiprocessing.get_context("fork").Event()
    child = forked.Forked(lambda _: hold(inside), [0], speculative=True)
    try:
        assert inside.wait(30)
    finally:
        started = time.monotonic()
        child.close()
    return time.monotonic() - started


def test_a_child_stopped_holding_the_progress_lock_leaves_this_process_free():
    """torch.fx creates a tqdm on every interpreter run, under tqdm's lock, a semaphore
    shared across fork. A speculative child stopped by close() while holding it left the
    parent waiting on it for good (a CLI call hung in export). Here the child holds
    tqdm's lock when it is stopped; the parent's lock must still be free."""
    from tqdm import tqdm
    from tqdm.std import TqdmDefaultWriteLock

    tqdm.get_lock()  # the parent's lock exists before the fork, as in a lowering

    def hold(inside):
        tqdm.get_lock().acquire()
        inside.set()
        time.sleep(60)

    _stop_a_child_inside(hold)
    assert TqdmDefaultWriteLock.mp_lock.acquire(timeout=5)
    TqdmDefaultWriteLock.mp_lock.release()


def test_a_stopped_child_releases_the_locks_it_shares_with_this_process():
    """close() stops a busy child with SIGTERM, which it unwinds: a lock shared with the
    parent (as the unclaimed jobs' bounds are) and held in a `with` block is released."""
    import multiprocessing

    shared = multiprocessing.get_context("fork").Lock()

    def hold(inside):
        with shared:
            inside.set()
            time.sleep(60)

    assert _stop_a_child_inside(hold) < forked._UNWIND_S  # unwound, not killed
    assert shared.acquire(timeout=5)
    shared.release()
