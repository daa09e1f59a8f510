"""Passes inserted into ExecuTorch's Arm pass pipeline for the duration of a block.

ExecuTorch 1.5.1 offers `register_pass_insertions_before`, which every ArmPassManager built
afterwards in the process applies, and no way to take one back but clearing all. `installed`
registers ours, and on leaving restores the registry as it was, as ExecuTorch's own VGF
backend does around its lowerings (executorch/backends/arm/vgf/backend.py).
"""

from __future__ import annotations

import contextlib

from executorch.backends.arm._passes import arm_pass_manager as apm


def registered() -> dict:
    """The process-wide registry: target pass type -> (passes before, passes after)."""
    return {
        t: (list(i.before_passes), list(i.after_passes))
        for t, i in apm._registered_pass_insertions.items()
    }


@contextlib.contextmanager
def installed(insertions: list):
    """`insertions`: (target pass type, [passes to run before it]) each."""
    snapshot = registered()
    try:
        for target, passes in insertions:
            apm.register_pass_insertions_before(target, passes)
        yield
    finally:
        apm._registered_pass_insertions.clear()
        for t, (before, after) in snapshot.items():
            apm._registered_pass_insertions[t] = apm.PassInsertions(before, after)
