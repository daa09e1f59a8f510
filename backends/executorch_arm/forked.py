"""A function run over jobs in a forked child while this process does other work.

The lowering runs torch on one thread (threads.py), so on this 2-core machine a second
process is the second core. Forked, the child has everything this process has (the loop
step programs, their calibration and quantized steps) without pickling any of it; only
each job's result comes back, pickled. A job the child could not do (it raised, died or hung)
has no result: the caller does it here, so a result is the same whoever computed it and an
error is raised where the caller expects it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from typing import Callable, Sequence

import torch

_DEADLINE_S = 900.0  # a child this late is stuck (a lock held at fork): do the rest here
_UNWIND_S = 5.0  # how long a stopped child may take to unwind before it is killed
_in_child = False


def cores() -> int:
    """The cores this process may use; 1 in a child (which forks no further)."""
    return 1 if _in_child else len(os.sched_getaffinity(0))


class _Unclaimed:
    """The jobs [front, back) nobody has started, shared with the child: it takes from the
    front, this process from the back while it waits."""

    def __init__(self, context, n: int):
        self.bounds = context.Array("i", [0, n])

    def take(self, front: bool):
        with self.bounds.get_lock():
            first, end = self.bounds[0], self.bounds[1]
            if first >= end:
                return None
            if front:
                self.bounds[0] = first + 1
                return first
            self.bounds[1] = end - 1
            return end - 1


def _attempt(fn: Callable, job):
    try:
        return fn(job)
    except Exception:  # the caller does the job again and raises it where it expects it
        return None


def _own_progress_lock() -> None:
    """tqdm's write lock holds a semaphore shared across fork (a multiprocessing RLock),
    and torch.fx creates a tqdm on every interpreter run: a child stopped mid-job
    (close()) while holding it left this process hung on the lock for good. The child
    takes a lock of its own (tqdm's public set_lock), which it can hold when it dies."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _unwind(signum, frame):
    """SIGTERM in the child: unwind, so the locks it shares with the parent (the unclaimed
    jobs' bounds) are released by their `with` blocks, not left held by a dead process."""
    raise SystemExit(0)


def _serve(fn: Callable, jobs: Sequence, unclaimed: _Unclaimed, conn) -> None:
    global _in_child
    _in_child = True
    _own_progress_lock()
    signal.signal(signal.SIGTERM, _unwind)
    torch.set_num_threads(1)
    while (i := unclaimed.take(front=True)) is not None:
        conn.send((i, _attempt(fn, jobs[i])))
    conn.close()


class Forked:
    """`fn(job)` for each of `jobs`, in order, in a forked child started at once;
    `result(i)` waits for job i's (None when nobody could do it), doing the child's last
    unstarted jobs here meanwhile: all of them while it waits, or, when the jobs are
    `speculative` (the caller may not ask for every one), the last alone, so that this
    process is not busy with a job nobody asks for when the result it waits for comes.
    close() when done."""

    def __init__(self, fn: Callable, jobs: Sequence, speculative: bool = False):
        context = multiprocessing.get_context("fork")
        self.fn, self.jobs, self.speculative = fn, list(jobs), speculative
        self.unclaimed = _Unclaimed(context, len(self.jobs))
        receive, send = context.Pipe(duplex=False)
        sys.stdout.flush()  # else the child flushes a copy of what is buffered
        sys.stderr.flush()
        self.process = context.Process(
            target=_serve, args=(fn, self.jobs, self.unclaimed, send), daemon=True
        )
        self.process.start()
        send.close()
        self.conn = receive
        self.results: dict = {}
        self.took = False  # whether this process has done one of the jobs
        self.started = time.monotonic()

    def result(self, i: int):
        while i not in self.results and self.conn is not None:
            if not self.conn.poll(0) and not (self.speculative and self.took):
                j = self.unclaimed.take(front=False)
                if j is not None:  # the child has not started it: done here meanwhile
                    self.results[j] = _attempt(self.fn, self.jobs[j])
                    self.took = True
                    continue
            if self.conn.poll(1.0):
                try:
                    k, value = self.conn.recv()
                except (EOFError, OSError):
                    self.close()
                    break
                self.results[k] = value
            elif not self.process.is_alive() or time.monotonic() - self.started > _DEADLINE_S:
                self.close()
        return self.results.get(i)

    def close(self) -> None:
        """Stop the child (it may still be doing jobs nobody asks for) and reap it."""
        if self.conn is None:
            return
        if self.process.is_alive():
            self.process.terminate()  # unwinds at its next bytecode (_unwind)
            self.process.join(_UNWIND_S)
            if self.process.is_alive():  # inside a long native call: it holds no shared lock
                self.process.kill()
        self.process.join()
        self.conn.close()
        self.conn = None
