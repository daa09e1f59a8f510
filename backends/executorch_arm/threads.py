"""torch on one intra-op thread while we lower and calibrate.

A lowering's tensors are small (a step's 1x400 gates); split over 2 threads on a 2-core
machine with another process busy, every op waits for a descheduled thread: NSNet2's
ethos-u85-256 lowering took 45 to 97 s on 2 threads and 34 s on one, the same .pte bytes;
a histc over 400 values 3-12 ms against 0.01-0.04 ms.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread():
    """torch on one intra-op thread inside, the count restored after (also a decorator)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
