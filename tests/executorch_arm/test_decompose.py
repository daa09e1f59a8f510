"""decompose_recurrent on what torch.export.export gives by default, against eager PyTorch.

The matrix covers every cell kind (GRU, LSTM, LSTM with proj_size, RNN tanh/relu) with
1-2 layers, uni/bidirectional, each with batch_first off and on and initial states present
and absent; batch (1, 2) and sequence length (1..8) cycle across it. (torch.export itself
takes 0.3-5 s per recurrent model here, which is what bounds the matrix.)
"""

from __future__ import annotations

import io
import itertools
import warnings

import pytest
import torch
from torch import nn

from recurrent_lowering.backends.executorch_arm.emission.decompose import decompose_recurrent
from recurrent_lowering.backends.executorch_arm.recurrent_ops.aten import TARGET_OPS
from recurrent_lowering.passes.spec import SpecError

warnings.filterwarnings("ignore", message=".*were assigned during export.*")

TOL = 1e-5
KINDS = ("gru", "lstm", "lstm_proj", "rnn_tanh", "rnn_relu")


def make_rnn(kind: str, layers: int, bidir: bool, batch_first: bool, inp=3, hid=5) -> nn.Module:
    kw = dict(num_layers=layers, bidirectional=bidir, batch_first=batch_first)
    if kind == "gru":
        return nn.GRU(inp, hid, **kw)
    if kind.startswith("lstm"):
        return nn.LSTM(inp, hid, proj_size=3 if kind == "lstm_proj" else 0, **kw)
    return nn.RNN(inp, hid, nonlinearity=kind[4:], **kw)


class Wrap(nn.Module):
    """Returns every output of the recurrent module, so y, h_n and c_n are all checked."""

    def __init__(self, rnn: nn.Module):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, *state):
        if not state:
            return self.rnn(x)
        if isinstance(self.rnn, (nn.LSTM, nn.LSTMCell)):
            return self.rnn(x, tuple(state))
        return self.rnn(x, state[0])


def states(rnn: nn.Module, batch: int) -> tuple:
    if isinstance(rnn, nn.RNNBase):
        ld = rnn.num_layers * (2 if rnn.bidirectional else 1)
        out = rnn.proj_size or rnn.hidden_size
        h = torch.randn(ld, batch, out)
        return (h, torch.randn(ld, batch, rnn.hidden_size)) if isinstance(rnn, nn.LSTM) else (h,)
    h = torch.randn(batch, rnn.hidden_size)
    return (h, torch.randn(batch, rnn.hidden_size)) if isinstance(rnn, nn.LSTMCell) else (h,)


def check(module: nn.Module, args: tuple) -> torch.export.ExportedProgram:
    module.eval()
    ep = torch.export.export(module, args)
    out = decompose_recurrent(ep)
    left = [n.target for n in out.graph.nodes if n.target in TARGET_OPS]
    assert not left, f"recurrent ops left: {left}"
    want = torch.utils._pytree.tree_leaves(module(*args))
    got = torch.utils._pytree.tree_leaves(out.module()(*args))
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=TOL, rtol=0)
    return out


def _matrix():
    """Each (kind, layers, bidirectional) twice: batch_first off and on, with the initial
    states present in one of the two (alternating), batch and T cycling."""
    cases = []
    for i, (kind, layers, bidir) in enumerate(itertools.product(KINDS, (1, 2), (False, True))):
        for bf in (False, True):
            k = len(cases)
            cases.append((kind, layers, bidir, bf, bf != bool(i % 2), 1 + k % 2, 1 + k % 8))
    return cases


MATRIX = _matrix()


@pytest.mark.parametrize("kind,layers,bidir,batch_first,init,batch,T", MATRIX)
def test_sequence_ops_match_eager(kind, layers, bidir, batch_first, init, batch, T):
    torch.manual_seed(len(MATRIX) * T + batch)
    rnn = make_rnn(kind, layers, bidir, batch_first)
    x = torch.randn(batch, T, 3) if batch_first else torch.randn(T, batch, 3)
    check(Wrap(rnn), (x, *states(rnn, batch)) if init else (x,))


CELLS = {
    "gru_cell": lambda: nn.GRUCell(3, 5),
    "lstm_cell": lambda: nn.LSTMCell(3, 5),
    "rnn_tanh_cell": lambda: nn.RNNCell(3, 5),
    "rnn_relu_cell": lambda: nn.RNNCell(3, 5, nonlinearity="relu", bias=False),
}


@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_cells_match_eager(cell, batch, init):
    torch.manual_seed(batch)
    c = CELLS[cell]()
    x = torch.randn(batch, 3)
    check(Wrap(c), (x, *states(c, batch)) if init else (x,))


class Streaming(nn.Module):
    """An LSTMCell run over a short sequence inside forward, as a streaming loop traces."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        h = c = torch.zeros(x.shape[1], 4)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(self.head(h))
        return torch.stack(outs)


def test_unrolled_cells_in_a_loop():
    torch.manual_seed(0)
    out = check(Streaming(), (torch.randn(3, 2, 3),))
    assert not any(n.target in TARGET_OPS for n in out.graph.nodes)


class GRUHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 4, num_layers=2, batch_first=True)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        y, _ = self.rnn(x)
        return torch.sigmoid(self.head(y))


def test_weights_are_parameters_and_metadata_is_kept():
    torch.manual_seed(0)
    ep = torch.export.export(GRUHead().eval(), (torch.randn(1, 4, 3),))
    out = decompose_recurrent(ep)
    sig = out.graph_signature
    # the GRU's own parameters are gone, the new weights are PARAMETERs under its FQN
    assert not [t for t in sig.parameters if t.startswith("rnn.weight_ih")]
    new = [t for t in sig.parameters if t.startswith("rnn.")]
    assert new and all(t in out.state_dict for t in new)
    assert {"head.weight", "head.bias"} <= set(sig.parameters)
    for n in out.graph.nodes:
        if n.op == "call_function" and n.meta.get("nn_module_stack", {}):
            stack = list(n.meta["nn_module_stack"].values())
            if stack[-1][0] == "rnn":
                assert "stack_trace" in n.meta
                assert isinstance(n.meta["val"], torch.Tensor)
    # meta vals agree with what the nodes really compute
    real = {}
    interp = torch.fx.Interpreter(out.graph_module)
    orig_run = interp.run_node

    def run_node(n):
        real[n] = orig_run(n)
        return real[n]

    interp.run_node = run_node
    flat = [out.state_dict.get(s.target, out.constants.get(s.target)) for s in sig.input_specs[:-1]]
    interp.run(*flat, torch.randn(1, 4, 3))
    for n, v in real.items():
        if n.op == "call_function":
            assert tuple(n.meta["val"].shape) == tuple(v.shape), n.name


def test_dynamic_batch_and_save_load_round_trip():
    torch.manual_seed(0)
    model = GRUHead().eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    ep = torch.export.export(model, (torch.randn(2, 4, 3),), dynamic_shapes={"x": {0: batch}})
    out = decompose_recurrent(ep)
    buf = io.BytesIO()
    torch.export.save(out, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    assert not any(n.target in TARGET_OPS for n in loaded.graph.nodes)
    x = torch.randn(5, 4, 3)
    torch.testing.assert_close(loaded.module()(x), model(x), atol=TOL, rtol=0)


def test_program_without_recurrent_ops_is_returned_unchanged():
    ep = torch.export.export(nn.Linear(3, 2), (torch.randn(1, 3),))
    assert decompose_recurrent(ep) is ep


class RuntimeWeights(nn.Module):
    def forward(self, x, w_ih, w_hh):
        return torch.ops.aten.rnn_tanh_cell(x, torch.zeros(1, 4), w_ih, w_hh)


def test_non_constant_weights_are_refused_by_name():
    ep = torch.export.export(
        RuntimeWeights(), (torch.randn(1, 3), torch.randn(4, 3), torch.randn(4, 4))
    )
    with pytest.raises(SpecError, match=r"rnn_tanh_cell.*'w_ih'.*not a constant"):
        decompose_recurrent(ep)


def test_input_program_is_not_modified():
    ep = torch.export.export(GRUHead().eval(), (torch.randn(1, 4, 3),))
    before = len(ep.graph.nodes)
    decompose_recurrent(ep)
    assert len(ep.graph.nodes) == before
    assert any(n.target is torch.ops.aten.gru.input for n in ep.graph.nodes)


class _StreamingGru(nn.Module):
    """State kept in a buffer across calls, as a streaming model on a device does."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 4, batch_first=True)
        self.register_buffer("h", torch.zeros(1, 2, 4))

    def forward(self, x):
        y, h = self.rnn(x, self.h)
        self.h.copy_(h)
        return y


def test_state_buffer_written_in_place_is_read_every_call():
    """A zero buffer that the model writes back is no constant zero h0: from the second call
    on it holds the last state (it was dropped as 'no initial state': 0.33 off)."""
    torch.manual_seed(0)
    program = torch.export.export(_StreamingGru().eval(), (torch.randn(2, 3, 3),))
    reference, lowered = program.module(), decompose_recurrent(program).module()
    x = torch.randn(2, 3, 3)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(lowered(x), reference(x), atol=1e-5, rtol=0)


def test_bfloat16_program():
    """numpy has no bfloat16: the builder's constant cache hashed bf16 weights through
    numpy and failed (TypeError: unsupported ScalarType BFloat16)."""
    torch.manual_seed(0)
    module = nn.GRU(3, 4, batch_first=True).to(torch.bfloat16).eval()
    x = torch.randn(2, 3, 3, dtype=torch.bfloat16)
    lowered = decompose_recurrent(torch.export.export(module, (x,))).module()
    with torch.no_grad():
        for got, want in zip(lowered(x), module(x)):
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=0)
