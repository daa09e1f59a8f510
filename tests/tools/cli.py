"""Runs `//tools:lower` as users do: a separate process, a working directory, an exit code."""

from __future__ import annotations

import os
import subprocess
import sys


def run_lower(args: list[str], cwd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), BUILD_WORKING_DIRECTORY=cwd)
    return subprocess.run(
        [sys.executable, "-m", "recurrent_lowering.tools.lower", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
