"""A sum read in slices by sigmoids or tanhs is summed slice by slice
(quantization/sliced_sums.py): an LSTM cell written as plain ops, as torch.onnx writes
nn.LSTMCell, gets each gate's table fused with its own sum on Ethos-U."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import exported, flow
from recurrent_lowering.backends.executorch_arm.emission.fx_builder import ProductForm
from recurrent_lowering.backends.executorch_arm.quantization import sliced_sums
from recurrent_lowering.runtime import arm_numerics, tosa_flatbuffer

IN, H = 8, 16
_aten = torch.ops.aten


class _Cell(torch.nn.Module):
    """An LSTM cell as plain ops: both products summed once, the sum cut into gates."""

    def __init__(self, cut: str):
        super().__init__()
        self.cut = cut
        self.wx, self.wh = torch.nn.Linear(IN, 4 * H), torch.nn.Linear(H, 4 * H)
        self.shift = torch.nn.Parameter(torch.tensor([0.25]))  # broadcast on every gate
        self.head = torch.nn.Linear(H, 3)

    def forward(self, x, h, c):
        g = self.wx(x) + self.wh(h)
        if self.cut == "broadcast":
            g = g - self.shift
        if self.cut == "chunk":
            i, f, n, o = torch.chunk(g, 4, dim=-1)
        elif self.cut == "sizes":
            i, f, n, o = torch.split(g, [H, H, H, H], dim=1)
        elif self.cut == "split":
            i, f, n, o = torch.split(g, H, dim=1)
        else:
            i, f, n, o = (g[:, k * H : (k + 1) * H] for k in range(4))
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(n)
        h2 = torch.sigmoid(o) * torch.tanh(c2)
        return self.head(h2), h2, c2


def _samples(n: int, seed: int) -> list:
    """A stream's steps: each sample's state is the one the model left."""
    torch.manual_seed(0)
    model, g = _Cell("slice").eval(), torch.Generator().manual_seed(seed)
    h, c = torch.zeros(1, H), torch.zeros(1, H)  # two tensors: export would alias one
    out = []
    for _ in range(n):
        x = torch.randn(1, IN, generator=g)
        out.append((x, h, c))
        with torch.no_grad():
            _, h, c = model(x, h, c)
    return out


def _sums_read_in_slices(gm) -> int:
    return sum(1 for n in gm.graph.nodes if sliced_sums._candidate(n))


@pytest.mark.parametrize("cut", ["slice", "chunk", "sizes", "split", "broadcast"])
def test_each_gate_gets_its_own_sum_of_the_same_value(cut):
    torch.manual_seed(0)
    model, sample = _Cell(cut).eval(), _samples(3, 1)[2]
    gm = exported.module_of(torch.export.export(model, sample))
    assert sliced_sums.split(gm) == 1
    assert _sums_read_in_slices(gm) == 0
    tables = [n for n in gm.graph.nodes if n.target in (_aten.sigmoid.default, _aten.tanh.default)]
    gates = [n for n in tables if n.args[0].target in (_aten.add.Tensor, _aten.sub.Tensor)]
    assert len(gates) == 5  # four gates and tanh(c2)
    for want, got in zip(model(*sample), gm(*sample)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_in_the_matmul_form_the_products_are_mms_of_the_same_value():
    torch.manual_seed(0)
    model, sample = _Cell("chunk").eval(), _samples(3, 1)[2]
    gm = exported.module_of(torch.export.export(model, sample))
    assert sliced_sums.split(gm, ProductForm("matmul")) == 1
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert calls.count(_aten.mm.default) == 2 and calls.count(_aten.linear.default) == 1  # head
    for want, got in zip(model(*sample), gm(*sample)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


class _GruCell(torch.nn.Module):
    """A GRU cell as torch.onnx writes nn.GRUCell: each product cut into gates first."""

    def __init__(self):
        super().__init__()
        self.wx, self.wh = torch.nn.Linear(IN, 3 * H), torch.nn.Linear(H, 3 * H)

    def forward(self, x, h, c):
        xr, xz, xn = torch.split(self.wx(x), H, dim=1)
        hr, hz, hn = torch.split(self.wh(h), H, dim=1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1 - z) * n + z * h + 0 * c


def test_a_product_cut_into_gates_takes_the_matmul_form_alone():
    torch.manual_seed(0)
    model, sample = _GruCell().eval(), _samples(3, 1)[2]
    gm = exported.module_of(torch.export.export(model, sample))
    assert sliced_sums.split(gm, ProductForm("matmul")) == 0  # no sum read in slices
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert calls.count(_aten.mm.default) == 2 and _aten.linear.default not in calls
    torch.testing.assert_close(gm(*sample), model(*sample), rtol=1e-6, atol=1e-6)
    plain = exported.module_of(torch.export.export(model, sample))
    assert sliced_sums.split(plain) == 0
    assert _aten.mm.default not in [n.target for n in plain.graph.nodes]


def test_a_sum_also_read_whole_is_left_as_it_is():
    class WholeToo(_Cell):
        def forward(self, x, h, c):
            g = self.wx(x) + self.wh(h)
            i, f, n, o = torch.chunk(g, 4, dim=-1)
            return torch.sigmoid(i) * torch.tanh(n) + torch.sigmoid(f) * torch.sigmoid(o), g

    sample = _samples(1, 1)[0]
    gm = exported.module_of(torch.export.export(WholeToo("chunk").eval(), sample))
    assert sliced_sums.split(gm) == 0


def _table_sources(tosa) -> list[str]:
    """The op each TABLE reads, through RESCALEs."""
    block = tosa_flatbuffer.main_block(tosa)
    ops = [block.Operators(k) for k in range(block.OperatorsLength())]
    producer = {op.Outputs(j).decode(): op for op in ops for j in range(op.OutputsLength())}
    sources = []
    for op in ops:
        if tosa_flatbuffer.op_name(op.Op()) != "TABLE":
            continue
        source = producer.get(op.Inputs(0).decode())
        while source is not None and tosa_flatbuffer.op_name(source.Op()) == "RESCALE":
            source = producer.get(source.Inputs(0).decode())
        sources.append(tosa_flatbuffer.op_name(source.Op()) if source is not None else "input")
    return sources


def _lower(tmp_path, monkeypatch=None, target="ethos-u55-128"):
    torch.manual_seed(0)
    model, calibration = _Cell("sizes").eval(), _samples(8, 1)
    if monkeypatch is not None:
        monkeypatch.setattr(sliced_sums, "split", lambda gm, products: 0)
    result = flow.lower(
        model,
        calibration[0],
        target,
        tmp_path,
        quantization="int16",
        calibration_inputs=calibration,
    )
    return model, result


def test_on_u55_every_gate_table_reads_a_sum_and_tracks_torch(tmp_path):
    model, result = _lower(tmp_path)
    (tosa,) = result.tosa_files
    assert _table_sources(tosa) == ["ADD"] * 5
    held_out = _samples(12, 2)[8:]  # the same stream, steps never calibrated on
    sqnr = np.mean([arm_numerics.check(result, model, s).sqnr_db for s in held_out])
    assert sqnr > 45  # 53.7 dB measured


def test_on_u85_the_products_are_matmuls_and_track_torch(tmp_path):
    model, result = _lower(tmp_path, target="ethos-u85-256")
    (tosa,) = result.tosa_files
    counts = tosa_flatbuffer.op_counts(tosa)
    assert counts["MATMUL"] == 2 and counts["CONV2D"] == 1  # the head
    assert _table_sources(tosa) == ["ADD"] * 5
    held_out = _samples(12, 2)[8:]
    sqnr = np.mean([arm_numerics.check(result, model, s).sqnr_db for s in held_out])
    assert sqnr > 58  # 64.8 dB measured; 53.7 as CONV2Ds (the ethos-u55-128 form)


def test_without_it_the_gate_tables_read_slices(tmp_path, monkeypatch):
    _, result = _lower(tmp_path, monkeypatch)
    (tosa,) = result.tosa_files
    assert _table_sources(tosa).count("SLICE") == 4
