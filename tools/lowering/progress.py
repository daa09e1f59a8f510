"""Stage timing for the report and what the user sees while a lowering runs.

Each stage is timed into `report["time"]["stages"]` and announced with one line on the
terminal when it ends. On an interactive terminal the running stage is shown as it starts
and countable work (calibration samples, numerics runs) gets a tqdm bar, cleared when done.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, Iterator

from .console import Terminal


class Progress:
    def __init__(self, report: dict[str, Any], terminal: Terminal):
        self.report = report
        self.terminal = terminal
        self._start = time.perf_counter()

    def _write(self, text: str) -> None:
        self.terminal.err.write(text)
        self.terminal.err.flush()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.terminal.interactive:
            self._write(f"\r\033[K  {name} ...")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.terminal.interactive:
                self._write("\r\033[K")
        self.record(name, time.perf_counter() - t0)

    def record(self, name: str, seconds: float) -> None:
        """A stage timed elsewhere (the Arm flow times its own)."""
        stages = self.report["time"]["stages"]
        stages[name] = round(stages.get(name, 0.0) + seconds, 3)
        self._write(f"  {name:<48} {seconds:7.1f} s\n")

    def steps(self, items: Iterable, description: str, total: int | None = None) -> Iterable:
        """`items`, with a progress bar on an interactive terminal when there are several."""
        total = total if total is not None else _length(items)
        if not self.terminal.interactive or (total is not None and total < 2):
            return items
        from tqdm import tqdm

        return tqdm(
            items, desc=f"  {description}", total=total, file=self.terminal.err, leave=False
        )

    def finish(self) -> None:
        self.report["time"]["total_s"] = round(time.perf_counter() - self._start, 3)


def _length(items: Iterable) -> int | None:
    try:
        return len(items)  # type: ignore[arg-type]
    except TypeError:
        return None
