"""Torch eager as the reference: build nn.GRU/LSTM/RNN for a spec and run it."""

from __future__ import annotations

import numpy as np
import torch

from recurrent_lowering.passes import CellKind, Direction, IOLayout, RecurrentSpec
from recurrent_lowering.passes.gate_order import from_torch_module_params
from recurrent_lowering.passes.spec import RELU

torch.set_num_threads(1)  # 2 cores shared by several test processes: threads only contend

MODULES = {CellKind.GRU: torch.nn.GRU, CellKind.LSTM: torch.nn.LSTM, CellKind.RNN: torch.nn.RNN}


def make_module(kind: str, I, H, layers, bidir, bias, batch_first, proj, seed):  # noqa: E741
    """kind: 'GRU', 'LSTM', 'RNN_TANH', 'RNN_RELU'. Weights uniform(-0.3, 0.3) from `seed`."""
    torch.manual_seed(seed)
    cell = CellKind(kind.split("_")[0])
    kw = dict(num_layers=layers, bidirectional=bidir, bias=bias, batch_first=batch_first)
    if kind.startswith("RNN"):
        kw["nonlinearity"] = kind.split("_")[1].lower()
    if proj:
        kw["proj_size"] = proj
    m = MODULES[cell](I, H, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(-0.3, 0.3)
    return m.eval()


def spec_and_weights(m, kind: str, T: int, has_h: bool, has_c: bool):
    """The core's RecurrentSpec and weights for module `m` (PyTorch layouts)."""
    cell = CellKind(kind.split("_")[0])
    D = 2 if m.bidirectional else 1
    acts = None
    if kind == "RNN_RELU":
        acts = [(RELU,)] * D
    spec = RecurrentSpec(
        name="torch_" + kind.lower(),
        cell=cell,
        input_size=m.input_size,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        direction=Direction.BIDIRECTIONAL if D == 2 else Direction.FORWARD,
        layout=IOLayout(batch_first=m.batch_first, y_directions_axis=False),
        activations=acts,
        proj_size=getattr(m, "proj_size", 0),
        seq_len=T,
        has_initial_h=has_h,
        has_initial_c=has_c,
        want_c=cell is CellKind.LSTM,
    )
    named = {k: v.detach().numpy() for k, v in m.named_parameters()}
    return spec, from_torch_module_params(cell, named, m.num_layers, D)


def run_module(m, x: np.ndarray, h0, c0):
    """(y, h_n, c_n or None) of torch eager, as numpy."""
    with torch.no_grad():
        xt = torch.from_numpy(x)
        if isinstance(m, torch.nn.LSTM):
            state = None
            if h0 is not None or c0 is not None:
                D = 2 if m.bidirectional else 1
                B = x.shape[0] if m.batch_first else x.shape[1]
                hp = m.proj_size or m.hidden_size
                h = torch.zeros(m.num_layers * D, B, hp) if h0 is None else torch.from_numpy(h0)
                c = (
                    torch.zeros(m.num_layers * D, B, m.hidden_size)
                    if c0 is None
                    else torch.from_numpy(c0)
                )
                state = (h, c)
            y, (hn, cn) = m(xt, state)
            return y.numpy(), hn.numpy(), cn.numpy()
        y, hn = m(xt, None if h0 is None else torch.from_numpy(h0))
        return y.numpy(), hn.numpy(), None
