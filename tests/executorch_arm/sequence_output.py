"""A recurrent torch module with its sequence Y as the model's output: no head whose own
quantization would hide the recurrent layer's error."""

from torch import nn


class SequenceOutput(nn.Module):
    def __init__(self, rnn: nn.Module):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]
