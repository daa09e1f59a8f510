"""A Python loop of cell calls read back as the layer it computes (recurrent_ops.cell_chains),
against torch eager: fused where it is a layer (one way, both ways, stacked), left as cells
where it is not."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.emission.decompose import decompose_recurrent
from recurrent_lowering.backends.executorch_arm.recurrent_ops import cell_chains
from recurrent_lowering.backends.executorch_arm.recurrent_ops.aten import (
    CELL_OPS,
    SEQUENCE_OPS,
    TARGET_OPS,
)
from recurrent_lowering.runtime import arm_numerics

warnings.filterwarnings("ignore", message=".*were assigned during export.*")

CELLS = {
    "gru": lambda i, h: nn.GRUCell(i, h),
    "lstm": lambda i, h: nn.LSTMCell(i, h),
    "rnn_tanh": lambda i, h: nn.RNNCell(i, h),
    "rnn_relu": lambda i, h: nn.RNNCell(i, h, nonlinearity="relu", bias=False),
}


class Loop(nn.Module):
    """`cell` over x's time axis (1 if batch_first), each h gathered into y; returns y and
    the final states (initial states: inputs if given, else zeros). `form`: how a step is
    taken from x, and y made from the h's (stack, or cat of unsqueezed h's)."""

    FORMS = ("select", "unbind", "split_cat", "narrow_cat", "slice_cat")

    def __init__(self, cell, batch_first: bool, form: str, steps=None, only_y=False):
        super().__init__()
        self.cell, self.batch_first, self.form, self.steps = cell, batch_first, form, steps
        self.only_y = only_y

    def _steps(self, x, d):
        if self.form == "unbind":
            return x.unbind(d)
        if self.form == "split_cat":
            return [p.squeeze(d) for p in torch.split(x, 1, dim=d)]
        if self.form == "narrow_cat":
            return [x.narrow(d, t, 1).squeeze(d) for t in range(x.shape[d])]
        if self.form == "slice_cat":
            steps = range(x.shape[d])
            return [(x[t : t + 1] if d == 0 else x[:, t : t + 1]).squeeze(d) for t in steps]
        return [x.select(d, t) for t in range(x.shape[d])]

    def forward(self, x, *state):
        d = 1 if self.batch_first else 0
        lstm = isinstance(self.cell, nn.LSTMCell)
        if not state:
            zeros = torch.zeros(x.shape[1 - d], self.cell.hidden_size)
            state = (zeros, zeros) if lstm else (zeros,)
        ys = []
        for x_t in self._steps(x, d)[: self.steps]:
            state = self.cell(x_t, state) if lstm else (self.cell(x_t, state[0]),)
            ys.append(state[0])
        if self.form.endswith("_cat"):
            y = torch.cat([h.unsqueeze(d) for h in ys], dim=d)
        else:
            y = torch.stack(ys, d)
        return y if self.only_y else (y, *state)


def _count(graph, ops) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target in ops)


def _close(got, want, tol):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


def _fused(module, inputs):
    """(exported program with its chains fused, how many were)."""
    ep = torch.export.export(module.eval(), inputs)
    n = cell_chains.fuse(ep.graph)
    ep.graph.lint()
    ep.graph_module.recompile()
    return ep, n


def _check(module, inputs, layers: int, cells: int = 0):
    """Fuses into `layers` sequence ops leaving `cells` cell ops; the fused program and its
    decomposition both compute what eager does."""
    with torch.no_grad():
        want = module(*inputs)
    ep, n = _fused(module, inputs)
    assert n == layers
    assert _count(ep.graph, SEQUENCE_OPS) == layers and _count(ep.graph, CELL_OPS) == cells
    with torch.no_grad():
        _close(ep.module()(*inputs), want, 1e-6)
        decomposed = decompose_recurrent(ep)
        assert _count(decomposed.graph, TARGET_OPS) == 0
        _close(decomposed.module()(*inputs), want, 1e-5)


@pytest.mark.parametrize("form", Loop.FORMS)
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind", sorted(CELLS))
def test_a_loop_is_one_layer(kind, batch_first, given, form):
    torch.manual_seed(0)
    cell = CELLS[kind](3, 5)
    x = torch.randn(2, 4, 3) if batch_first else torch.randn(4, 2, 3)
    state = [torch.randn(2, 5) for _ in range(2 if kind == "lstm" else 1)] if given else []
    _check(Loop(cell, batch_first, form), (x, *state), layers=1)


class Stacked(nn.Module):
    """Two LSTM cells interleaved per step, a head on every step's top h."""

    def __init__(self):
        super().__init__()
        self.low, self.high, self.head = nn.LSTMCell(3, 4), nn.LSTMCell(4, 6), nn.Linear(6, 2)

    def forward(self, x):
        s1 = (torch.zeros(x.shape[1], 4),) * 2
        s2 = (torch.zeros(x.shape[1], 6),) * 2
        outs = []
        for t in range(x.shape[0]):
            s1 = self.low(x[t], s1)
            s2 = self.high(s1[0], s2)
            outs.append(self.head(s2[0]))
        return torch.stack(outs), s1[1]


def test_stacked_cells_are_two_layers():
    torch.manual_seed(1)
    _check(Stacked(), (torch.randn(5, 2, 3),), layers=2)


def test_reports_name_a_chain_as_one_layer():
    ep = torch.export.export(Stacked().eval(), (torch.randn(5, 2, 3),))
    nodes = len(ep.graph.nodes)
    assert cell_chains.layers(ep.graph) == [
        "low: lstm.input (5 lstm_cell calls)",
        "high: lstm.input (5 lstm_cell calls)",
    ]
    assert len(ep.graph.nodes) == nodes and _count(ep.graph, CELL_OPS) == 10  # untouched


class BothWays(nn.Module):
    """A forward and a backward cell loop over x, their h's concatenated per step (what a
    bidirectional layer's y is), and both final states."""

    def __init__(self, kind: str, batch_first: bool, given: bool):
        super().__init__()
        self.fw, self.bw = CELLS[kind](3, 5), CELLS[kind](3, 5)
        self.d, self.given = (1 if batch_first else 0), given
        self.lstm = kind == "lstm"

    def _run(self, cell, x, times, state):
        hs = {}
        for t in times:
            x_t = x.select(self.d, t)
            state = cell(x_t, state) if self.lstm else (cell(x_t, state[0]),)
            hs[t] = state[0]
        return [hs[t] for t in sorted(hs)], state

    def forward(self, x, *given):
        steps = range(x.shape[self.d])
        zeros = torch.zeros(x.shape[1 - self.d], 5)
        n = 2 if self.lstm else 1
        start = [given[:n], given[n:]] if self.given else [(zeros,) * n] * 2
        fs, f_state = self._run(self.fw, x, steps, start[0])
        bs, b_state = self._run(self.bw, x, reversed(steps), start[1])
        y = torch.cat([torch.stack(fs, self.d), torch.stack(bs, self.d)], -1)
        return y, *f_state, *b_state


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_a_loop_each_way_is_one_bidirectional_layer(kind, batch_first, given):
    torch.manual_seed(3)
    x = torch.randn(2, 4, 3) if batch_first else torch.randn(4, 2, 3)
    states = [torch.randn(2, 5) for _ in range(4 if kind == "lstm" else 2)] if given else []
    module = BothWays(kind, batch_first, given)
    _check(module, (x, *states), layers=1)
    ep, _ = _fused(module, (x, *states))
    (layer,) = [n for n in ep.graph.nodes if n.target in SEQUENCE_OPS]
    assert layer.args[7] is True  # bidirectional


class Decoder(nn.Module):
    """Each step reads the previous step's output: no layer computes that."""

    def __init__(self):
        super().__init__()
        self.cell, self.out = nn.GRUCell(3, 5), nn.Linear(5, 3)

    def forward(self, x):
        h, y, ys = torch.zeros(x.shape[0], 5), x, []
        for _ in range(4):
            h = self.cell(y, h)
            y = self.out(h)
            ys.append(y)
        return torch.stack(ys, 1)


class EveryCellState(nn.Module):
    """An LSTM loop that returns every step's c: a layer gives the last one only."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(3, 4)

    def forward(self, x):
        s, cs = (torch.zeros(x.shape[1], 4),) * 2, []
        for t in range(x.shape[0]):
            s = self.cell(x[t], s)
            cs.append(s[1])
        return torch.stack(cs)


@pytest.mark.parametrize(
    "module, inputs, cells",
    [
        (Decoder(), (torch.randn(2, 3),), 4),
        (EveryCellState(), (torch.randn(3, 2, 3),), 3),
        (Loop(nn.GRUCell(3, 5), True, "select", steps=3), (torch.randn(2, 4, 3),), 3),
    ],
    ids=["decoder", "every_cell_state", "part_of_the_sequence"],
)
def test_what_is_no_layer_stays_cells(module, inputs, cells):
    torch.manual_seed(2)
    _check(module, inputs, layers=0, cells=cells)


def test_lowered_loop_is_the_layers_program(tmp_path):
    """Quantized to TOSA-1.0+INT, a GRUCell loop lowers to the program nn.GRU with the same
    weights does: the same TOSA ops, the same accuracy on held-out samples (to 0.01 dB: the
    two eager references differ in float rounding)."""
    torch.manual_seed(0)
    gru = nn.GRU(4, 8, batch_first=True)
    cell = nn.GRUCell(4, 8)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(gru, name + "_l0"))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = gru

        def forward(self, x):
            return self.gru(x)[0]

    forms = {"layer": Layer().eval(), "cells": Loop(cell, True, "select", only_y=True).eval()}
    samples = [(torch.randn(1, 6, 4),) for _ in range(6)]
    calibration, held_out = samples[:4], samples[4:]
    results = {
        name: flow.lower(
            m, calibration[0], "TOSA-1.0+INT", tmp_path / name, calibration_inputs=calibration
        )
        for name, m in forms.items()
    }
    assert results["cells"].tosa_op_counts == results["layer"].tosa_op_counts
    for sample in held_out:
        checks = {name: arm_numerics.check(r, forms[name], sample) for name, r in results.items()}
        assert checks["cells"].sqnr_db == pytest.approx(checks["layer"].sqnr_db, abs=0.01)
        assert checks["cells"].sqnr_db > 10  # (int8 from 4 short sequences: 12.2 dB worst)


def test_a_streamed_loop_keeps_its_state_quantization(tmp_path):
    """A GRUCell loop taking h and returning the last h, quantized: read as a layer, its
    final state is the layer's, so h_n shares h0's quantization (states.py) and fed back
    it quantizes to the same integers."""
    torch.manual_seed(0)
    model = Loop(nn.GRUCell(3, 5), True, "select").eval()
    samples = [(torch.randn(1, 6, 3), torch.randn(1, 5)) for _ in range(3)]
    result = flow.lower(
        model, samples[0], "TOSA-1.0+INT", tmp_path, calibration_inputs=samples, quantization="int8"
    )
    assert result.state_pairs == [("state_0", 1)]
    assert result.input_quant[1] == result.output_quant[1]
