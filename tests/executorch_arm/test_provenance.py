"""compat.provenance: with the drop inserted, torch.fx's provenance record stays small
through ExecuTorch's Arm backend pipeline, and the lowered program is the same."""

from __future__ import annotations

from executorch.backends.arm._passes import arm_pass_manager as apm
from executorch.backends.arm._passes.arm_pass import ArmPass
from torch.fx.passes.infra.pass_base import PassResult

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.compat import provenance
from recurrent_lowering.examples import models

_INSERTIONS = provenance.insertions


def _depth(sources) -> int:
    return 1 + max((_depth(s.from_node) for s in sources), default=0) if sources else 0


def _size(sources) -> int:
    return sum(1 + _size(s.from_node) for s in sources)


class _Probe(ArmPass):
    """Measures the records where it runs (after ExirToTosaPass: the end of the rewrites)."""

    _passes_required_after: set = set()

    def call(self, graph_module):
        records = [n.meta.get("from_node", []) for n in graph_module.graph.nodes]
        self.depth = max(_depth(r) for r in records)
        self.size = sum(_size(r) for r in records)
        return PassResult(graph_module, False)


def _lower(monkeypatch, tmp_path, drop: bool):
    """tiny_gru to TOSA-1.0+INT with only our registrations (none of another test's)."""
    monkeypatch.setattr(apm, "_registered_pass_insertions", {})  # the probe, for this test
    # lower() installs the compat passes around itself: these ones, or none of them
    monkeypatch.setattr(provenance, "insertions", _INSERTIONS if drop else lambda: [])
    probe = _Probe()
    apm.register_pass_insertions_after(apm.ExirToTosaPass, [probe])
    module, inputs = models.build("tiny_gru")
    return flow.lower(module, inputs, "TOSA-1.0+INT", artifact_dir=tmp_path), probe


def test_the_drop_keeps_the_record_small_and_the_program_the_same(monkeypatch, tmp_path):
    kept, kept_probe = _lower(monkeypatch, tmp_path / "kept", drop=False)
    dropped, dropped_probe = _lower(monkeypatch, tmp_path / "dropped", drop=True)
    # Measured: depth 9, 1,259 sources on 223 nodes kept; depth 1, 193 sources dropped.
    assert kept_probe.depth > 5 and dropped_probe.depth <= 2
    assert kept_probe.size > 3 * dropped_probe.size
    assert dropped.tosa_op_counts == kept.tosa_op_counts
    assert dropped.tosa_files[0].read_bytes() == kept.tosa_files[0].read_bytes()
