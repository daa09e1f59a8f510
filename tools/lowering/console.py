"""The terminal belongs to the user; everything other libraries print goes to a log file.

ExecuTorch, torch, torchao, absl, Vela and the TOSA reference model write to stdout and
stderr from Python (logging, warnings, print) and from C++ (printf). Only moving the
process's file descriptors 1 and 2 catches all of it, so `captured` points both at the log
for the duration of a run and hands back the original terminal as a `Terminal`, where the
CLI writes its stage lines, progress bars and report.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import sys
from typing import IO, Iterator


@dataclasses.dataclass
class Terminal:
    """Where the user reads: `out` for the report, `err` for stage lines and errors."""

    out: IO[str]
    err: IO[str]

    @property
    def interactive(self) -> bool:
        return self.err.isatty()


def _flush_all() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C++ writers buffer in libc


@contextlib.contextmanager
def captured(log_path: os.PathLike | str | None) -> Iterator[Terminal]:
    """Within the block, fds 1 and 2 write to `log_path`; the Terminal writes where they
    wrote before. `log_path` None captures nothing (--verbose)."""
    if log_path is None:
        yield Terminal(sys.stdout, sys.stderr)
        return
    _flush_all()
    saved = os.dup(1), os.dup(2)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    terminal = Terminal(
        os.fdopen(os.dup(saved[0]), "w", buffering=1), os.fdopen(os.dup(saved[1]), "w", buffering=1)
    )
    try:
        yield terminal
    finally:
        _flush_all()
        terminal.out.close()
        terminal.err.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within the block, fd 1 writes where fd 2 does. Vela prints its whole report to stdout
    from inside ExecuTorch's Ethos-U backend, and the TOSA reference model prints there too;
    the CLI's stdout is the report alone."""
    _flush_all()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        _flush_all()
        os.dup2(saved, 1)
        os.close(saved)


def tail(path: os.PathLike | str, lines: int, limit: int | None = None) -> list[str]:
    """The last `lines` non-empty lines of a text file's first `limit` bytes (no file: none),
    or none if they hold a traceback a library logged: that stays in the file."""
    try:
        with open(path, "rb") as f:
            text = f.read(limit if limit is not None else -1).decode(errors="replace")
    except OSError:
        return []
    last = [line for line in text.splitlines() if line.strip()][-lines:]
    return [] if any(_TRACEBACK.search(line) for line in last) else last


_TRACEBACK = re.compile(r'Traceback \(most recent call last\)|File ".*", line \d+')
