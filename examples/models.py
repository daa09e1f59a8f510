"""The bundled example and benchmark models as torch modules, with their example inputs.

`RNNHead(kind, I, H, layers, bidirectional)`: one torch GRU/LSTM/RNN stack (batch_first), then
Linear(H*dirs, 1) and sigmoid at every step; input [1, T, I]. stream_gru is one step (T=1) with
h0 as input and h_n as output, and a Linear-tanh-Linear-sigmoid head. crnn is a keyword
spotter: three convolutions on a 49x40 spectrogram, a GRU 160->64 and 12 classes.
`//tools:lower` lowers each by name; the benchmarks (docs/results/) measure gru_a, lstm_a,
rnn_tanh_a, bigru2, big_gru, stream_gru and crnn.

Every measurement (ExecuTorch baseline, our lowering, ONNX) must run on the very same weights,
so the models are built deterministically: `torch.manual_seed(0)`, then every parameter drawn
uniform(-0.2, 0.2), then the example input drawn from the same generator stream.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

_RNN_CLASSES = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}


def _init_uniform(module: nn.Module, bound: float = 0.2) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-bound, bound)


def _make_rnn(kind: str, input_size: int, hidden_size: int, layers: int, bidirectional: bool):
    if kind not in _RNN_CLASSES:
        raise ValueError(f"unknown recurrent kind {kind!r}; expected one of {sorted(_RNN_CLASSES)}")
    kwargs = dict(num_layers=layers, bidirectional=bidirectional, batch_first=True)
    if kind.startswith("rnn_"):
        kwargs["nonlinearity"] = kind[len("rnn_") :]
    return _RNN_CLASSES[kind](input_size, hidden_size, **kwargs)


class RNNHead(nn.Module):
    """One recurrent layer stack (batch_first) then Linear(H*dirs, 1) and sigmoid at every step.

    Input [1, T, I] -> output [1, T, 1].
    """

    def __init__(
        self, kind: str, input_size: int, hidden_size: int, layers: int = 1, bidirectional=False
    ):
        super().__init__()
        self.rnn = _make_rnn(kind, input_size, hidden_size, layers, bidirectional)
        self.head = nn.Linear(hidden_size * (2 if bidirectional else 1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return torch.sigmoid(self.head(y))


class StreamGRU(nn.Module):
    """Streaming GRU: one step (T=1), h0 in and h_n out; head Linear-tanh-Linear-sigmoid.

    Inputs x [1, 1, I], h0 [1, 1, H] -> (score [1, 1, 1], h_n [1, 1, H]).
    """

    def __init__(self, input_size: int, hidden_size: int, head_hidden: int | None = None):
        super().__init__()
        head_hidden = hidden_size if head_hidden is None else head_hidden
        self.rnn = nn.GRU(input_size, hidden_size, batch_first=True)
        self.fc1 = nn.Linear(hidden_size, head_hidden)
        self.fc2 = nn.Linear(head_hidden, 1)

    def forward(self, x: torch.Tensor, h0: torch.Tensor):
        y, h_n = self.rnn(x, h0)
        return torch.sigmoid(self.fc2(torch.tanh(self.fc1(y)))), h_n


class CRNN(nn.Module):
    """Keyword spotter: 3 convolutions (3x3, stride 2 along frequency, ReLU) on a [1, 1, T, F]
    spectrogram, a GRU over time on the 32 channels x F/8 bins, the last step to `classes`.

    Input [1, 1, T, 40] -> logits [1, classes]. The convolutions hold most of the MACs.
    """

    def __init__(self, freq_bins: int, hidden_size: int, classes: int = 12):
        super().__init__()
        chans = (1, 16, 32, 32)
        self.convs = nn.Sequential(
            *(
                layer
                for cin, cout in zip(chans, chans[1:])
                for layer in (nn.Conv2d(cin, cout, 3, stride=(1, 2), padding=1), nn.ReLU())
            )
        )
        self.rnn = nn.GRU(chans[-1] * freq_bins // 8, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.convs(x)  # [1, C, T, F/8]
        y, _ = self.rnn(f.permute(0, 2, 1, 3).flatten(2))
        return self.head(y[:, -1])


@dataclasses.dataclass(frozen=True)
class BenchmarkModel:
    """A named benchmark configuration; `build()` returns (module in eval mode, example inputs)."""

    name: str
    kind: str
    input_size: int
    hidden_size: int
    layers: int
    bidirectional: bool
    seq_len: int
    streaming: bool = False

    def build(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        if self.streaming:
            module: nn.Module = StreamGRU(self.input_size, self.hidden_size)
        elif self.kind == "crnn":
            module = CRNN(self.input_size, self.hidden_size)
        else:
            module = RNNHead(
                self.kind, self.input_size, self.hidden_size, self.layers, self.bidirectional
            )
        _init_uniform(module)
        module.eval()
        if self.kind == "crnn":
            x = torch.randn(1, 1, self.seq_len, self.input_size)
        else:
            x = torch.randn(1, self.seq_len, self.input_size)
        if self.streaming:
            h0 = torch.randn(self.layers, 1, self.hidden_size) * 0.5
            return module, (x, h0)
        return module, (x,)


MODELS: dict[str, BenchmarkModel] = {
    m.name: m
    for m in [
        BenchmarkModel("gru_a", "gru", 64, 128, 1, False, 16),
        BenchmarkModel("lstm_a", "lstm", 64, 128, 1, False, 16),
        BenchmarkModel("rnn_tanh_a", "rnn_tanh", 64, 128, 1, False, 16),
        BenchmarkModel("bigru2", "gru", 64, 128, 2, True, 32),
        BenchmarkModel("big_gru", "gru", 256, 256, 1, False, 100),
        BenchmarkModel("stream_gru", "gru", 64, 128, 1, False, 1, streaming=True),
        BenchmarkModel("crnn", "crnn", 40, 64, 1, False, 49),
        BenchmarkModel("tiny_gru", "gru", 8, 16, 1, False, 4),
        BenchmarkModel("tiny_lstm", "lstm", 8, 16, 1, False, 4),
        BenchmarkModel("tiny_rnn", "rnn_tanh", 8, 16, 1, False, 4),
    ]
}


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(module, example inputs) for a registered benchmark model name."""
    if name not in MODELS:
        raise KeyError(f"unknown benchmark model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name].build()
