"""permute_propagation: ExecuTorch's permute propagation with in-place rounds gives the same
TOSA flatbuffer, byte for byte, with one whole-graph retrace per pass instead of one per
round, and leaves ExecuTorch's own passes nothing to move."""

from __future__ import annotations

import collections

import torch
from executorch.backends.transforms import propagate_view_copy_permute_pass as pv

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.compat import permute_propagation

_INSERTIONS = permute_propagation.insertions


class _Permuted(torch.nn.Module):
    """A convolution (NHWC transposes), permutes and views around elementwise ops, a GRU."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.gru = torch.nn.GRU(16, 8, batch_first=True)

    def forward(self, x):  # [1, 2, 6, 4]
        y = torch.relu(self.conv(x)).permute(0, 2, 1, 3)  # [1, 6, 4, 4]
        y = torch.sigmoid(y * 1.5 + 0.25).reshape(1, 6, 16)
        out, _ = self.gru(y)
        return torch.tanh(out.transpose(1, 2).unsqueeze(-1) - 0.1) * 2  # [1, 8, 6, 1]


def _lower(monkeypatch, tmp_path, in_place: bool):
    # lower() installs the compat passes around itself: these ones, or none of them
    monkeypatch.setattr(permute_propagation, "insertions", _INSERTIONS if in_place else lambda: [])
    retraces = collections.Counter()
    whole = pv.PropagateViewCopyPermutePass._retrace

    def counted(self, graph_module):
        retraces[type(self).__name__] += 1
        return whole(self, graph_module)

    monkeypatch.setattr(pv.PropagateViewCopyPermutePass, "_retrace", counted)
    x = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(3))
    result = flow.lower(_Permuted().eval(), (x,), "TOSA-1.0+INT", artifact_dir=tmp_path)
    return result, retraces


def test_in_place_rounds_give_the_same_program_with_one_retrace(monkeypatch, tmp_path):
    theirs, their_retraces = _lower(monkeypatch, tmp_path / "theirs", in_place=False)
    ours, our_retraces = _lower(monkeypatch, tmp_path / "ours", in_place=True)
    # Measured: ExecuTorch's passes retrace 3 (down) and 8 (up) times on this model.
    assert sum(their_retraces.values()) >= 6
    assert our_retraces == {"InPlaceDownPass": 1, "InPlaceUpPass": 1}  # ExecuTorch's: none
    assert ours.tosa_files[0].read_bytes() == theirs.tosa_files[0].read_bytes()
