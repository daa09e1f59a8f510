"""ExecuTorch's Ethos-U backend logger, quiet while we lower."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def vela_quiet():
    """ExecuTorch runs Vela with --verbose-all when its Ethos-U backend logs at INFO (absl's
    default): a million lines and 6 of 43 s on a 45,000-op program, none of which we read."""
    logger = logging.getLogger("executorch.backends.arm.ethosu.backend")
    level = logger.level
    logger.setLevel(max(logging.WARNING, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        logger.setLevel(level)
