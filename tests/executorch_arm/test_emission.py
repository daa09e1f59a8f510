"""How the Arm adapter writes recurrent layers per target (its `ProductForm`, the core passes of
its plan), pinned by op and by numbers.

linear: the recurrent product h R^T is aten.linear; matmul: at batch 1 it is aten.mm(R, h^T),
R on the left. Steps are row slices of the projection's 2-D view either way. Both match the
numpy reference builder over GRU (both reset forms), LSTM, RNN, bidirectional, stacked,
initial states and sequence lengths, and the target's ArmPlan picks MATMUL for
Ethos-U85 and aten.linear for U55 and TOSA.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from recurrent_lowering import passes
from recurrent_lowering.backends.executorch_arm.emission.fx_builder import FxBuilder, ProductForm
from recurrent_lowering.backends.executorch_arm.emission.fx_constants import ModuleConstants
from recurrent_lowering.backends.executorch_arm.plan import ArmPlan, core_plan
from recurrent_lowering.passes import CellKind, Direction, IOLayout, RecurrentSpec
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.spec import LayerWeights

aten = torch.ops.aten
RNG = np.random.default_rng(7)
I, H, T = 5, 4, 3  # noqa: E741 (input size, as in the equations)


def _weights(spec: RecurrentSpec):
    G = spec.cell.num_gates
    out = []
    for layer in range(spec.num_layers):
        width = I if layer == 0 else H * spec.num_directions
        row = []
        for _ in range(spec.num_directions):
            row.append(
                LayerWeights(
                    w=RNG.uniform(-0.5, 0.5, (G * H, width)).astype(np.float32),
                    r=RNG.uniform(-0.5, 0.5, (G * H, H)).astype(np.float32),
                    b_w=RNG.uniform(-0.5, 0.5, G * H).astype(np.float32),
                    b_r=RNG.uniform(-0.5, 0.5, G * H).astype(np.float32),
                )
            )
        out.append(row)
    return out


def _spec(cell, batch_first=True, **kw):
    return RecurrentSpec(
        "rec",
        cell,
        I,
        H,
        seq_len=T,
        layout=IOLayout(batch_first=batch_first, y_directions_axis=False),
        **kw,
    )


SPECS = {
    "gru": _spec(CellKind.GRU, linear_before_reset=True),
    "gru_lbr0_h0": _spec(CellKind.GRU, has_initial_h=True),
    "lstm_h0_c0": _spec(CellKind.LSTM, has_initial_h=True, has_initial_c=True, want_c=True),
    "rnn_time_major": _spec(CellKind.RNN, batch_first=False),
    "gru_bidir_2layers": _spec(
        CellKind.GRU, linear_before_reset=True, num_layers=2, direction=Direction.BIDIRECTIONAL
    ),
}
PRODUCTS = {"linear": ProductForm(), "matmul": ProductForm(recurrent_product="matmul")}


def _emit_fx(spec, ws, x, h0, c0, lens, products):
    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    feeds, values = [], {}
    for name, value in (("x", x), ("h", h0), ("c", c0)):
        values[name] = None
        if value is not None:
            t = torch.from_numpy(value)
            values[name] = graph.placeholder(name)
            values[name].meta["val"] = mode.from_tensor(t)
            feeds.append(t)
    graph.output(())
    with graph.inserting_before(graph.output_node()):
        b = FxBuilder(graph, ModuleConstants(gm, mode), products=products)
        shapes = {k: None if v is None else np.shape(v) for k, v in (("x", x), ("h0", h0))}
        plan = core_plan("unrolled")  # the Arm adapter's tunings, as decompose uses them
        out = passes.emit(
            b, spec, ws, values["x"], values["h"], values["c"], lens, plan=plan, shapes=shapes
        )
        outs = tuple(v for v in (out.y, out.h, out.c) if v is not None)
    graph.output_node().args = (outs,)
    graph.lint()
    gm.recompile()
    return gm(*feeds), b


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("products", sorted(PRODUCTS))
@pytest.mark.parametrize("name", sorted(SPECS))
def test_products_match_numpy_builder(name, products, batch):
    spec = SPECS[name]
    lens = None
    if batch == 2 and name == "rnn_time_major":  # constant lengths: masked steps
        spec, lens = dataclasses.replace(spec, has_sequence_lens=True), np.array([3, 1])
    ws = _weights(spec)
    shape = (batch, T, I) if spec.layout.batch_first else (T, batch, I)
    x = RNG.standard_normal(shape).astype(np.float32)
    ld = spec.num_layers * spec.num_directions
    h0 = RNG.standard_normal((ld, batch, H)).astype(np.float32) if spec.has_initial_h else None
    c0 = RNG.standard_normal((ld, batch, H)).astype(np.float32) if spec.has_initial_c else None
    want = passes.emit(NumpyBuilder(), spec, ws, x, h0, c0, lens)
    got, b = _emit_fx(spec, ws, x, h0, c0, lens, PRODUCTS[products])
    want = [v for v in (want.y, want.h, want.c) if v is not None]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w, atol=1e-5, rtol=0)
    # every step after the first (zero state) has a recurrent product
    mms = [n for n in b.nodes if n.target == aten.mm.default]
    linears = [n for n in b.nodes if n.target == aten.linear.default]
    if PRODUCTS[products].recurrent_product == "matmul" and batch == 1:
        # mm(R, h^T): the weight on the left, h^T a [H, 1] view
        assert len(mms) >= (T - 1) * ld
        assert all(n.args[0].op == "get_attr" for n in mms)
        assert all(tuple(n.args[1].meta["val"].shape) == (H, 1) for n in mms)
    else:
        assert not mms
        assert len(linears) >= (T - 1) * ld + spec.num_layers


@pytest.mark.parametrize("products", sorted(PRODUCTS))
def test_steps_are_rows_of_the_projection(products):
    """A GRU step's arithmetic runs on 2-D [1, k] values, sliced as rows of 2-D [T, k] views
    of the projection (or its gate blocks); Y is one concat of T rows."""
    spec = SPECS["gru"]
    ws = _weights(spec)
    x = RNG.standard_normal((1, T, I)).astype(np.float32)
    _, b = _emit_fx(spec, ws, x, None, None, None, PRODUCTS[products])
    step_ops = (aten.sigmoid.default, aten.tanh.default, aten.mul.Tensor, aten.sub.Tensor)
    assert {len(n.meta["val"].shape) for n in b.nodes if n.target in step_ops} == {2}
    views = [
        n
        for n in b.nodes
        if n.target == aten.view.default and len(n.args[1]) == 2 and n.args[1][0] == T
    ]
    assert views
    for v in views:
        rows = [n.args[1:] for n in b.nodes if n.target == aten.slice.Tensor and n.args[0] is v]
        assert sorted(rows) == [(0, t, t + 1) for t in range(T)]
    cats = [n for n in b.nodes if n.target == aten.cat.default]
    assert len(cats) == 1 and len(cats[0].args[0]) == T and cats[0].args[1] == 0


def test_products_per_target():
    assert ArmPlan("ethos-u85-256").products.recurrent_product == "matmul"
    for target in ("ethos-u55-128", "ethos-u65-256", "TOSA-1.0+INT", "TOSA-1.0+FP"):
        assert ArmPlan(target).products.recurrent_product == "linear", target
    with pytest.raises(ValueError, match="recurrent_product"):
        ProductForm(recurrent_product="conv")


@pytest.mark.parametrize(
    "target, steps, form",
    [
        ("ethos-u55-128", 8, "unrolled"),
        ("ethos-u55-128", 9, "loop"),
        ("TOSA-1.0+INT", 16, "loop"),
        ("ethos-u85-256", 8, "unrolled"),
        ("ethos-u85-256", 9, "loop"),
    ],
)
def test_auto_picks_the_form_by_length(target, steps, form):
    from recurrent_lowering.backends.executorch_arm.emission.decompose import decompose_recurrent
    from recurrent_lowering.backends.executorch_arm.loop import op as loop_op

    module = torch.nn.GRU(4, 8, batch_first=True).eval()
    ep = torch.export.export(module, (torch.randn(1, steps, 4),))
    out = decompose_recurrent(ep, "auto", ArmPlan(target).products)
    targets = [n.target for n in out.graph.nodes if n.op == "call_function"]
    loops = sum(t == loop_op.OP for t in targets)
    assert loops == (1 if form == "loop" else 0)
    assert not any("gru" in str(t) for t in targets)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_loop_form_glue(kind, bidirectional):
    """The loop form around a peeled first step: the projection is read through one
    [T*B, G] view (the peeled row too; Vela copies a reshape whose input has other
    readers), and the scan's result already holds the peeled step's h (no concat after
    it). Numbers unchanged."""
    from recurrent_lowering.backends.executorch_arm.emission.decompose import decompose_recurrent
    from recurrent_lowering.backends.executorch_arm.loop import op as loop_op

    torch.manual_seed(0)
    cls = torch.nn.GRU if kind == "gru" else torch.nn.LSTM
    module = cls(4, 8, batch_first=True, bidirectional=bidirectional).eval()
    x = torch.randn(1, 12, 4)
    out = decompose_recurrent(torch.export.export(module, (x,)), "loop")
    nodes = [n for n in out.graph.nodes if n.op == "call_function"]
    scans = [n for n in nodes if n.target == loop_op.OP]
    assert len(scans) == (2 if bidirectional else 1)
    for scan in scans:
        view = scan.args[0]
        assert view.target == aten.view.default and len(view.meta["val"].shape) == 2
        assert loop_op.LoopArgs.of(scan).initial_in_ys
        others = [u for u in view.users if u is not scan]
        assert [u.target for u in others] == [aten.slice.Tensor]  # the peeled step's row
    # no concatenation joins a scan's rows with anything but the other direction's
    ys = set(scans) | {u for s in scans for u in s.users if u.target == aten.slice.Tensor}
    for cat in (n for n in nodes if n.target == aten.cat.default):
        parts = set(cat.args[0])
        assert not parts & ys or parts <= ys, cat.format_node()
    with torch.no_grad():
        for got, want in zip(loop_op.run_graph(out.module(), x), module(x)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("target, form", [("ethos-u55-128", "unrolled"), ("ethos-u85-256", "loop")])
def test_a_step_with_a_select_is_unrolled_where_the_npu_has_none(target, form):
    """A ThresholdedRelu RNN loops past AUTO_UNROLL_MAX_STEPS; on ethos-u55 its step's
    select ran on the CPU and loop.step refused the step (not one delegate), an internal
    error under --emission auto."""
    from recurrent_lowering.passes.spec import Activation

    acts = ((Activation("ThresholdedRelu", alpha=0.1),),)
    spec = dataclasses.replace(_spec(CellKind.RNN), seq_len=10, activations=acts)
    assert ArmPlan(target, emission="auto").core().emission_of(spec) == form
    plain = dataclasses.replace(spec, activations=((Activation("Tanh"),),))
    assert ArmPlan(target, emission="auto").core().emission_of(plain) == "loop"
