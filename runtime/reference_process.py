"""The TOSA reference model in a process of its own, started fresh.

In the CLI's process, once auto has predicted its candidates, the reference model runs a
large graph several times slower than in a fresh process: GTCRN's int16 program for
ethos-u55-128 (13,305 operators, in 27 pieces), random inputs, 1.50-1.71 s a run of user
time there against 0.47-0.65 s in a fresh process and 0.58 s in one started at that point.
A child forked from the CLI's process is as slow; gc.collect, malloc_trim, one torch thread
and the CLI's imports do not change it (each measured); the cause is not pinned down beyond
the process state the predictions leave (DTLN's leave none measurable). So tosa_reference
`call`s its runs here: each goes to one worker this process starts with `python -m` on first
use and keeps, which imports the named module and calls the named function: the same
library on the same arrays, so the same outputs bit for bit (tests/runtime pin it). A
worker that cannot start or breaks leaves the calls to this process. A forked child starts
its own (pipes shared across a fork would interleave requests).
"""

from __future__ import annotations

import atexit
import importlib
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


def call(module: str, function: str, *args):
    """`module.function(*args)` (picklable arguments and result) in the worker, or in this
    process when there is none to be had; what it raises is raised here."""
    global _failed
    worker = _start()
    if worker is not None:
        try:
            pickle.dump((module, function, args), worker.stdin, protocol=5)
            worker.stdin.flush()
            done, value = pickle.load(worker.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            _failed = True
            worker.kill()
            worker.wait()  # reaped, not left a zombie until this process ends
        else:
            if done:
                return value
            raise value
    return getattr(importlib.import_module(module), function)(*args)


def _answer(module: str, function: str, args: tuple) -> bytes:
    try:
        return pickle.dumps((True, getattr(importlib.import_module(module), function)(*args)))
    except Exception as e:  # noqa: BLE001 - raised again in the caller
        try:
            return pickle.dumps((False, e))
        except Exception:  # noqa: BLE001 - an exception pickle cannot carry
            return pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))


def _serve() -> None:
    """The worker: pickled (module, function, args) on stdin, each answered on the stdout it
    started with, (True, result) or (False, the exception). What the libraries it calls
    print on stdout goes to stderr."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        answers.write(_answer(*request))
        answers.flush()


if __name__ == "__main__":
    _serve()
