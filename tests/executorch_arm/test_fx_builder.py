"""FxBuilder against the core's NumpyBuilder on specs PyTorch never produces.

Exercises every builder op the ONNX-only features need (non-default activations incl.
ThresholdedRelu through less/where, clip, linear_before_reset=0, peepholes, input_forget,
direction axis and batch-first state layouts, constant and runtime sequence lengths), and
checks each emitted node's fake `meta["val"]` against the tensor it really computes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from recurrent_lowering import passes
from recurrent_lowering.backends.executorch_arm.emission.fx_builder import FxBuilder
from recurrent_lowering.backends.executorch_arm.emission.fx_constants import ModuleConstants
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.spec import (
    Activation,
    CellKind,
    Direction,
    IOLayout,
    LayerWeights,
    RecurrentSpec,
)

T, B, I, H = 4, 3, 5, 6  # noqa: E741
RNG = np.random.default_rng(0)


def weights(cell: CellKind, spec: RecurrentSpec) -> list:
    g = cell.num_gates
    out = []
    for layer in range(spec.num_layers):
        row = []
        for _ in range(spec.num_directions):
            inp = spec.layer_input_size(layer)
            row.append(
                LayerWeights(
                    w=RNG.uniform(-0.5, 0.5, (g * H, inp)).astype(np.float32),
                    r=RNG.uniform(-0.5, 0.5, (g * H, H)).astype(np.float32),
                    b_w=RNG.uniform(-0.5, 0.5, g * H).astype(np.float32),
                    b_r=RNG.uniform(-0.5, 0.5, g * H).astype(np.float32),
                    peephole=(
                        RNG.uniform(-0.5, 0.5, (3, H)).astype(np.float32)
                        if cell is CellKind.LSTM
                        else None
                    ),
                )
            )
        out.append(row)
    return out


SPECS = {
    "gru_lbr0_clip_hardsigmoid_softsign_bidir": RecurrentSpec(
        name="gru",
        cell=CellKind.GRU,
        input_size=I,
        hidden_size=H,
        direction=Direction.BIDIRECTIONAL,
        activations=[(Activation("HardSigmoid", 0.2, 0.5), Activation("Softsign"))] * 2,
        clip=0.8,
        linear_before_reset=False,
        layout=IOLayout(batch_first=False, y_directions_axis=True, state_batch_first=True),
        seq_len=T,
        has_initial_h=True,
    ),
    "lstm_peephole_input_forget_elu_softplus": RecurrentSpec(
        name="lstm",
        cell=CellKind.LSTM,
        input_size=I,
        hidden_size=H,
        num_layers=2,
        activations=[(Activation("Sigmoid"), Activation("Elu", 1.0), Activation("Softplus"))],
        input_forget=True,
        layout=IOLayout(batch_first=True, y_directions_axis=True),
        seq_len=T,
        has_initial_h=True,
        has_initial_c=True,
        want_c=True,
    ),
    "rnn_thresholded_leaky_scaled_affine": RecurrentSpec(
        name="rnn",
        cell=CellKind.RNN,
        input_size=I,
        hidden_size=H,
        direction=Direction.BIDIRECTIONAL,
        activations=[(Activation("ThresholdedRelu", 0.1),), (Activation("ScaledTanh", 0.7, 1.3),)],
        layout=IOLayout(batch_first=True, y_directions_axis=False),
        seq_len=T,
    ),
    "rnn_affine_leaky_reverse": RecurrentSpec(
        name="rnn2",
        cell=CellKind.RNN,
        input_size=I,
        hidden_size=H,
        direction=Direction.REVERSE,
        activations=[(Activation("LeakyRelu", 0.1),)],
        layout=IOLayout(batch_first=False, y_directions_axis=False),
        seq_len=T,
        has_initial_h=True,
    ),
}
LENS = {"none": None, "constant": np.array([4, 2, 1]), "runtime": np.array([3, 4, 1])}


def build_graph(spec, ws, x, h, c, lens, runtime_lens: bool):
    """An fx GraphModule computing `passes.emit` through FxBuilder; returns (gm, inputs)."""
    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    feeds, inputs = [], {}
    for name, value in (("x", x), ("h", h), ("c", c), ("lens", lens if runtime_lens else None)):
        if value is None:
            inputs[name] = None
            continue
        t = torch.from_numpy(value)
        node = graph.placeholder(name)
        node.meta["val"] = mode.from_tensor(t)
        inputs[name] = node
        feeds.append(t)
    graph.output(())  # replaced below; constants are inserted before the first non-placeholder
    with graph.inserting_before(graph.output_node()):
        b = FxBuilder(graph, ModuleConstants(gm, mode))
        lens_value = inputs["lens"] if runtime_lens else lens
        out = passes.emit(b, spec, ws, inputs["x"], inputs["h"], inputs["c"], lens_value)
    graph.output_node().args = (tuple(v for v in (out.y, out.h, out.c) if v is not None),)
    graph.lint()
    gm.recompile()
    return gm, feeds, b


@pytest.mark.parametrize("lens_kind", sorted(LENS))
@pytest.mark.parametrize("name", sorted(SPECS))
def test_fx_builder_matches_numpy_builder(name, lens_kind):
    spec = SPECS[name]
    lens = LENS[lens_kind]
    if lens is not None:
        spec = dataclasses.replace(spec, has_sequence_lens=True)
    ws = weights(spec.cell, spec)
    x = RNG.standard_normal((B, T, I) if spec.layout.batch_first else (T, B, I)).astype(np.float32)
    ld = spec.num_layers * spec.num_directions
    sb = spec.layout.state_batch_first
    h = c = None
    if spec.has_initial_h:
        h = RNG.standard_normal((B, ld, H) if sb else (ld, B, H)).astype(np.float32)
    if spec.has_initial_c:
        c = RNG.standard_normal((ld, B, H)).astype(np.float32)
    want = passes.emit(NumpyBuilder(), spec, ws, x, h, c, lens)
    gm, feeds, b = build_graph(spec, ws, x, h, c, lens, runtime_lens=lens_kind == "runtime")
    got = gm(*feeds)
    want = [v for v in (want.y, want.h, want.c) if v is not None]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, atol=1e-5, rtol=0)
    if lens_kind == "runtime":
        targets = {n.target for n in b.nodes}
        assert torch.ops.aten.where.self in targets

    # every emitted node's fake value has the real shape and dtype
    real = {}
    interp = torch.fx.Interpreter(gm)
    run_node = interp.run_node

    def record(n):
        real[n] = run_node(n)
        return real[n]

    interp.run_node = record
    interp.run(*feeds)
    for n in b.nodes:
        assert tuple(n.meta["val"].shape) == tuple(real[n].shape), n.name
        assert n.meta["val"].dtype == real[n].dtype, n.name


def test_identical_weights_share_one_constant():
    spec = RecurrentSpec("gru", CellKind.GRU, I, H, seq_len=T)
    ws = weights(CellKind.GRU, spec)
    x = RNG.standard_normal((T, B, I)).astype(np.float32)
    gm, _, b = build_graph(spec, ws, x, None, None, None, False)
    recurrent = [n for n in b.nodes if n.target is torch.ops.aten.linear.default][1:]
    assert len(recurrent) == T - 1  # step 0 has a zero state: no recurrent product
    assert len({n.args[1] for n in recurrent}) == 1  # R is one get_attr, read every step
