"""The streaming two-layer ReLU RNN of the Arm lowering's owner issue: ReLU, nn.RNN(40, 32,
num_layers=2, relu), Linear(32, 1), sigmoid; inputs x [1, 1, 40] and h [2, 1, 32]."""

from __future__ import annotations

import pathlib

import torch
from torch import nn


class StreamingReluRnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(40, 32, num_layers=2, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x, h):
        y, h = self.rnn(torch.relu(x), h)
        return torch.sigmoid(self.head(y)), h


def save(path: pathlib.Path) -> pathlib.Path:
    """The model exported with `torch.export.save` to `path`: example inputs randn, zeros."""
    torch.manual_seed(0)
    module = StreamingReluRnn().eval()
    inputs = (torch.randn(1, 1, 40), torch.zeros(2, 1, 32))
    torch.export.save(torch.export.export(module, inputs), str(path))
    return path
