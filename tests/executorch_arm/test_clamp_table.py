"""clamp_table: an int8 clamp before a sigmoid/tanh folds into the TABLE; the lowered
program computes the same integers without the CLAMP (TOSA reference model)."""

from __future__ import annotations

import numpy as np
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.compat import clamp_table
from recurrent_lowering.runtime import arm_numerics

_INSERTIONS = clamp_table.insertions


class _Clipped(torch.nn.Module):
    """Both bounds before a sigmoid, an upper one before a tanh (ONNX clip's shapes)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.sigmoid(torch.clamp(self.a(x), -1.0, 1.5)), torch.tanh(
            torch.clamp(self.b(x), max=0.5)
        )


def _case():
    x = 3 * torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    return _Clipped().eval(), (x,)


def _lower(monkeypatch, tmp_path, fold: bool):
    # lower() installs the compat passes around itself: these ones, or none of them
    monkeypatch.setattr(clamp_table, "insertions", _INSERTIONS if fold else lambda: [])
    module, inputs = _case()
    result = flow.lower(module, inputs, "TOSA-1.0+INT", artifact_dir=tmp_path)
    return result, arm_numerics.check(result, module, inputs)


def test_the_clamp_folds_and_the_integers_stay(monkeypatch, tmp_path):
    kept, kept_numerics = _lower(monkeypatch, tmp_path / "kept", fold=False)
    folded, folded_numerics = _lower(monkeypatch, tmp_path / "folded", fold=True)
    assert kept.tosa_op_counts.get("CLAMP") == 2 and "CLAMP" not in folded.tosa_op_counts
    assert folded.tosa_op_counts["TABLE"] == kept.tosa_op_counts["TABLE"] == 2
    for a, b in zip(kept_numerics.tosa, folded_numerics.tosa):
        np.testing.assert_array_equal(a, b)
    # the bounds bite, and the folded program follows torch
    module, (x,) = _case()
    with torch.no_grad():
        clipped = ((module.a(x) < -1) | (module.a(x) > 1.5)).float().mean()
        clipped_b = (module.b(x) > 0.5).float().mean()
    assert clipped > 0.2 and clipped_b > 0.2
    assert folded_numerics.sqnr_db > 30


class _ClippedInt16(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.sigmoid(torch.clamp(self.a(x) + 0.1, -0.5, 0.5))  # an add, as in a gate


def test_an_int16_clip_becomes_the_range_of_its_input(tmp_path):
    """int16: the clamp's input is quantized to [-clip, clip], the clamp dropped, and the
    result still follows torch (an int16 TABLE cannot take a clamp in)."""
    module, (x,) = _ClippedInt16().eval(), _case()[1]
    with torch.no_grad():
        assert ((module.a(x) + 0.1).abs() > 0.5).float().mean() > 0.5  # the clip bites
    result = flow.lower(
        module, (x,), "TOSA-1.0+INT+int16", artifact_dir=tmp_path, quantization="int16"
    )
    assert "CLAMP" not in result.tosa_op_counts and result.tosa_op_counts["TABLE"] == 1
    assert arm_numerics.check(result, module, (x,)).sqnr_db > 50
