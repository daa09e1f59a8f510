"""Small models whose ops the NPU cannot all run, shared by the fallback tests."""

import torch
from torch import nn


class MaskedHead(nn.Module):
    """GRU, then a threshold (gt + where: no SELECT/GREATER on U55), then a linear: on U55
    the program splits into two delegates with CPU ops between them."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(torch.where(y > 0.1, y, torch.zeros_like(y)))
