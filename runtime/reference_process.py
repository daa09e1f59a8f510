"""The TOSA reference model in a process of its own, started fresh.

In the CLI's process, once auto has predicted its candidates, the reference model runs a
large graph several times slower than in a fresh process: GTCRN's int16 program for
ethos-u55-128 (13,305 operators, in 27 pieces), random inputs, 1.50-1.71 s a run of user
time there against 0.47-0.65 s in a fresh process and 0.58 s in one started at that point.
A child forked from the CLI's process is as slow; gc.collect, malloc_trim, one torch thread
and the CLI's imports do not change it (each measured); the cause is not pinned down beyond
the process state the predictions leave (DTLN's leave none measurable). So `outputs` sends
each run to one worker this process starts with `python -m` on first use and keeps: the
same library on the same arrays, so the same outputs bit for bit (tests/runtime pin it). A
worker that cannot start or breaks leaves the runs to this process. A forked child starts
its own (pipes shared across a fork would interleave requests).
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
from typing import Optional

_worker: Optional[subprocess.Popen] = None
_owner: Optional[int] = None  # the pid that started _worker
_failed = False


def _start() -> Optional[subprocess.Popen]:
    global _worker, _owner, _failed
    if _worker is not None and _owner == os.getpid() and _worker.poll() is None:
        return _worker
    if _failed:
        return None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        _worker = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
    except OSError:
        _failed = True
        return None
    _owner = os.getpid()
    atexit.register(_stop)
    return _worker


def _stop() -> None:
    global _worker
    if _worker is not None and _owner == os.getpid():
        _worker.stdin.close()
        _worker.wait()
    _worker = None


def outputs(source, arrays: list, precise_mode: bool, piece_ops: Optional[int]) -> list:
    """tosa_reference's raw outputs of graph `source` (bytes or a .tosa path) for `arrays`,
    computed by the worker (in this process if it is not to be had)."""
    from . import tosa_reference

    request = (source if isinstance(source, (bytes, bytearray)) else os.fspath(source), arrays)
    worker = _start()
    if worker is not None:
        try:
            pickle.dump((*request, precise_mode, piece_ops), worker.stdin, protocol=5)
            worker.stdin.flush()
            kind, value = pickle.load(worker.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            global _failed
            _failed = True
            worker.kill()
        else:
            if kind == "ok":
                return value
            raise (tosa_reference.TosaReferenceError if kind == "reference" else ValueError)(value)
    return tosa_reference.graph_outputs(*request, precise_mode, piece_ops)


def _serve() -> None:
    """The worker: requests on stdin, pickled (source, arrays, precise_mode, piece_ops);
    each answered on the stdout it started with ("ok", outputs) or (kind, message). What
    the reference model prints on stdout goes to stderr."""
    from . import tosa_reference

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            source, arrays, precise_mode, piece_ops = pickle.load(requests)
        except EOFError:
            return
        try:
            answer = ("ok", tosa_reference.graph_outputs(source, arrays, precise_mode, piece_ops))
        except tosa_reference.TosaReferenceError as e:
            answer = ("reference", str(e))
        except Exception as e:  # noqa: BLE001 - raised again in the caller, as ValueError
            answer = ("value", f"{type(e).__name__}: {e}")
        pickle.dump(answer, answers, protocol=5)
        answers.flush()


if __name__ == "__main__":
    _serve()
