"""What an Ethos-U55 computes for our int16 programs' forms, as Vela 5.1.0 programs them
(runtime/ethos_u55_int16.py), against the TOSA reference model the report's figures come
from. Each check fails if Vela or ExecuTorch change what they emit for the form.

- TABLE int16 -> int32 + RESCALE: ExecuTorch's sigmoid and tanh tables reach Vela's output as
  the 512-word LUT the model reads, their RESCALE is the (2^30, >> 37) Vela fuses into it,
  and the LUT as the hardware interpolates it (rounding half up) equals TOSA's TABLE +
  RESCALE on all 65,536 int16 inputs.
- CONV2D int16 x int8: every convolution of the program keeps its accumulator within the
  U55's 40 bits for any int16 input (TOSA's has 48).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tosa_serializer as ts

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.runtime import ethos_u55_int16 as u55
from recurrent_lowering.runtime import tosa_copy, tosa_flatbuffer, tosa_reference


class _Gates(torch.nn.Module):
    """A GRU's gate functions in an int16 program."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(16, 32)

    def forward(self, x):
        return torch.sigmoid(self.a(x)) * torch.tanh(self.b(x))


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    out = tmp_path_factory.mktemp("u55")
    result = flow.lower(_Gates().eval(), (x,), "ethos-u55-128", out, quantization="int16")
    tosa = result.tosa_files[0].read_bytes()
    read_only = bytes(np.load(out / "output" / "out_vela.npz")["weight_data"].item())
    return tosa, read_only


def _ops(tosa: bytes) -> list:
    return list(tosa_copy.load(tosa).regions[0].basicBlocks[0].operators)


def _tables(tosa: bytes) -> dict:
    """name -> values of each 513-entry int16 constant the program's TABLEs read."""
    names = {op.inputs[1] for op in _ops(tosa) if op.op == ts.Op.TABLE}
    return {n: tosa_flatbuffer.constant_values(tosa, n) for n in names}


def test_vela_writes_each_table_as_the_lut_the_model_reads(lowered):
    tosa, read_only = lowered
    tables = _tables(tosa)
    assert len(tables) == 2  # sigmoid and tanh
    for name, table in tables.items():
        assert u55.lut_offsets(read_only, table), f"{name}: no such LUT in Vela's output"


def test_every_table_is_followed_by_the_rescale_vela_fuses(lowered):
    tosa, _ = lowered
    ops = _ops(tosa)
    readers = {name: op for op in ops for name in op.inputs}
    for op in (op for op in ops if op.op == ts.Op.TABLE):
        rescale = readers[op.outputs[0]]
        assert rescale.op == ts.Op.RESCALE
        multiplier = tosa_flatbuffer.constant_values(tosa, rescale.inputs[1])
        shift = tosa_flatbuffer.constant_values(tosa, rescale.inputs[2])
        assert (int(multiplier[0]), int(shift[0])) == (1 << 30, 37)  # >> 7, rounding half up


def _table_then_rescale(table: np.ndarray) -> bytes:
    """x int16 [256, 256] -> TABLE -> int32 -> RESCALE (2^30, >> 37, single round) -> int16."""
    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock

    def attribute(kind, *args):
        attr = ts.TosaSerializerAttribute()
        getattr(attr, kind)(*args)
        return attr

    def const(name, shape, dtype, values):
        block.addTensor(name, shape, dtype, np.asarray(values))
        block.addOperator(ts.Op.CONST, [], [name], attribute("ConstAttribute"))

    block.addTensor("x", [256, 256], ts.DType.INT16)
    block.addInput("x")
    const("table", [513], ts.DType.INT16, table)
    block.addTensor("value", [256, 256], ts.DType.INT32)
    block.addOperator(ts.Op.TABLE, ["x", "table"], ["value"], attribute("TableAttribute"))
    const("multiplier", [1], ts.DType.INT32, [1 << 30])
    const("shift", [1], ts.DType.INT8, [37])
    const("in_zp", [1], ts.DType.INT32, [0])
    const("out_zp", [1], ts.DType.INT16, [0])
    block.addTensor("y", [256, 256], ts.DType.INT16)
    rescale = attribute("RescaleAttribute", True, ts.RoundingMode.SINGLE_ROUND, False, False, False)
    block.addOperator(
        ts.Op.RESCALE, ["value", "multiplier", "shift", "in_zp", "out_zp"], ["y"], rescale
    )
    block.addOutput("y")
    return bytes(graph.serialize())


def test_the_lut_equals_tosa_on_every_input(lowered):
    tosa, _ = lowered
    x = np.arange(-32768, 32768, dtype=np.int16).reshape(256, 256)
    for name, table in _tables(tosa).items():
        (want,) = tosa_reference.run(_table_then_rescale(table), [x])
        got = u55.lut(x, u55.lut_words(table))
        assert np.array_equal(got, want), f"{name}: {int(np.sum(got != want))} inputs differ"


def test_the_model_rounds_the_lut_half_up():
    """The one hardware behaviour the LUT's exactness rests on: rounding down instead would
    put a sigmoid-like table's outputs one code off on many inputs."""
    table = np.round(32767 / (1 + np.exp(-np.linspace(-8, 8, 513)))).astype(np.int16)
    x = np.arange(-32768, 32768, dtype=np.int16)
    words = u55.lut_words(table)
    u = x.astype(np.int64) + 32768
    i, f = u >> 7, u & 127
    slope = table[1:].astype(np.int64) - table[:-1]
    truncated = table[i] + ((slope[i] * f) >> 7)
    assert np.mean(u55.lut(x, words) != truncated) > 0.1


def test_every_convolution_fits_the_40_bit_accumulator(lowered):
    tosa, _ = lowered
    convs = [op for op in _ops(tosa) if op.op == ts.Op.CONV2D]
    assert convs
    for op in convs:
        weights = tosa_flatbuffer.constant_values(tosa, op.inputs[1]).astype(np.int64)
        bias = tosa_flatbuffer.constant_values(tosa, op.inputs[2]).astype(np.int64)
        worst = np.abs(weights).reshape(len(weights), -1).sum(axis=1) * 32768 + np.abs(bias)
        assert worst.max() < 2 ** (u55.ACCUMULATOR_BITS - 1)
