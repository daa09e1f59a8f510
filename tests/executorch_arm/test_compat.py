"""compat: what the adapter changes in ExecuTorch is there only while one of our lowerings
runs. ExecuTorch's own flow run after ours in one process writes the same TOSA as in a
process that never ran ours; the library versions compat was written against are checked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from recurrent_lowering.backends.executorch_arm import compat
from recurrent_lowering.backends.executorch_arm.compat import pass_insertions

_PROBE = textwrap.dedent(
    """
    import hashlib, sys, tempfile
    import torch
    from recurrent_lowering.backends.executorch_arm import flow
    from recurrent_lowering.backends.executorch_arm.compat import pass_insertions
    from recurrent_lowering.examples import models

    class Clipped(torch.nn.Module):  # compat.clamp_table would fold the clamp into the TABLE
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(8, 16)

        def forward(self, x):
            return torch.sigmoid(torch.clamp(self.a(x), -1.0, 1.5))

    if sys.argv[1] == "ours first":
        module, inputs = models.build("tiny_gru")
        flow.lower(module, inputs, "TOSA-1.0+INT", tempfile.mkdtemp())
        print("registered after ours", pass_insertions.registered())
    x = 3 * torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    theirs = flow.lower(
        Clipped().eval(), (x,), "TOSA-1.0+INT", tempfile.mkdtemp(), decomposition="executorch"
    )
    print("CLAMP", theirs.tosa_op_counts.get("CLAMP", 0))
    print("sha256", hashlib.sha256(theirs.tosa_files[0].read_bytes()).hexdigest())
    """
)


def _run(order: str) -> list:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, order], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [
        line
        for line in done.stdout.splitlines()
        if line.split(" ")[0] in ("registered", "CLAMP", "sha256")
    ]


def test_executorchs_own_flow_after_ours_is_as_in_a_fresh_process():
    after_ours = _run("ours first")
    fresh = _run("theirs only")
    assert after_ours[0] == "registered after ours {}"
    assert after_ours[1:] == fresh
    assert fresh[0] == "CLAMP 1"  # ExecuTorch's own program keeps its clamp


def test_insertions_are_removed_even_when_the_lowering_fails():
    before = pass_insertions.registered()
    with pytest.raises(RuntimeError, match="boom"):
        with compat.lowering():
            assert pass_insertions.registered() != before
            raise RuntimeError("boom")
    assert pass_insertions.registered() == before


def test_another_version_is_refused(monkeypatch):
    compat.check_versions()  # the pinned environment
    monkeypatch.setitem(compat.VERSIONS, "executorch", "0.0.1")
    with pytest.raises(compat.CompatError, match="executorch 1.5.1 is installed"):
        compat.check_versions()
