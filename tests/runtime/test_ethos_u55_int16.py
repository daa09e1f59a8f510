"""What an Ethos-U55 computes for our int16 programs' forms, as Vela 5.1.0 programs them
(runtime/ethos_u55_int16.py), against the TOSA reference model the report's figures come
from. Each check fails if Vela or ExecuTorch change what they emit for the form.

- TABLE int16 -> int32 + RESCALE: ExecuTorch's sigmoid and tanh tables reach Vela's output as
  the 512-word LUT the model reads, their RESCALE is the (2^30, >> 37) Vela fuses into it,
  and the LUT as the hardware interpolates it (rounding half up) equals TOSA's TABLE +
  RESCALE on all 65,536 int16 inputs.
- CONV2D int16 x int8: every convolution of the program keeps its accumulator within the
  U55's 40 bits for any int16 input (TOSA's has 48).
- MUL / ADD / SUB on int32 between RESCALEs: the program holds one form of each, Vela
  programs each as one 16-bit elementwise operation (read back from its command stream),
  and that operation as the model computes it equals TOSA's RESCALEs + op + RESCALE on
  random and saturating int16 operands.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch
import tosa_serializer as ts

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.runtime import ethos_u55_int16 as u55
from recurrent_lowering.runtime import tosa_copy, tosa_flatbuffer, tosa_reference
from recurrent_lowering.tests.runtime.tosa_graphs import attribute, const, rescale


class _GruCell(torch.nn.Module):
    """A GRU cell in an int16 program: its gates (sigmoid and tanh TABLEs) and the MUL, ADD
    and SUB of its update, h' = n + z * (h - n)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cell = torch.nn.GRUCell(16, 32)

    def forward(self, x, h):
        return self.cell(x, h)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    h = torch.randn(4, 32, generator=torch.Generator().manual_seed(2)) / 2
    out = tmp_path_factory.mktemp("u55")
    result = flow.lower(_GruCell().eval(), (x, h), "ethos-u55-128", out, quantization="int16")
    tosa = result.tosa_files[0].read_bytes()
    npz = np.load(out / "output" / "out_vela.npz")
    return tosa, bytes(npz["weight_data"].item()), bytes(npz["cmd_data"].item())


def _ops(tosa: bytes) -> list:
    return list(tosa_copy.load(tosa).regions[0].basicBlocks[0].operators)


def _tables(tosa: bytes) -> dict:
    """name -> values of each 513-entry int16 constant the program's TABLEs read."""
    names = {op.inputs[1] for op in _ops(tosa) if op.op == ts.Op.TABLE}
    return {n: tosa_flatbuffer.constant_values(tosa, n) for n in names}


def test_vela_writes_each_table_as_the_lut_the_model_reads(lowered):
    tosa, read_only, _ = lowered
    tables = _tables(tosa)
    assert len(tables) == 2  # sigmoid and tanh
    for name, table in tables.items():
        assert u55.lut_offsets(read_only, table), f"{name}: no such LUT in Vela's output"


def test_every_table_is_followed_by_the_rescale_vela_fuses(lowered):
    tosa, _, _ = lowered
    ops = _ops(tosa)
    readers = {name: op for op in ops for name in op.inputs}
    for op in (op for op in ops if op.op == ts.Op.TABLE):
        after = readers[op.outputs[0]]
        assert after.op == ts.Op.RESCALE
        multiplier = tosa_flatbuffer.constant_values(tosa, after.inputs[1])
        shift = tosa_flatbuffer.constant_values(tosa, after.inputs[2])
        assert (int(multiplier[0]), int(shift[0])) == (1 << 30, 37)  # >> 7, rounding half up


def _table_then_rescale(table: np.ndarray) -> bytes:
    """x int16 [256, 256] -> TABLE -> int32 -> RESCALE (2^30, >> 37, single round) -> int16."""
    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock
    block.addTensor("x", [256, 256], ts.DType.INT16)
    block.addInput("x")
    const(block, "table", [513], ts.DType.INT16, table)
    block.addTensor("value", [256, 256], ts.DType.INT32)
    block.addOperator(ts.Op.TABLE, ["x", "table"], ["value"], attribute("TableAttribute"))
    rescale(block, "value", "y", [256, 256], (ts.DType.INT32, ts.DType.INT16), 1 << 30, 37)
    block.addOutput("y")
    return bytes(graph.serialize())


def test_the_lut_equals_tosa_on_every_input(lowered):
    tosa, _, _ = lowered
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


def test_truncating_luts_computes_a_lut_rounding_down(lowered):
    """The program rewritten as a U55 whose LUT rounded down would compute it: on the TOSA
    reference model, equal to the LUT model with the rounding down on every input, and
    different from the program as it is (rounding half up) on many."""
    tosa, _, _ = lowered
    x = np.arange(-32768, 32768, dtype=np.int16).reshape(256, 256)
    for name, table in _tables(tosa).items():
        graph = _table_then_rescale(table)
        (down,) = tosa_reference.run(u55.truncating_luts(graph), [x])
        (up,) = tosa_reference.run(graph, [x])
        words = u55.lut_words(table)
        assert np.array_equal(down, u55.lut(x, words, half=0)), name
        assert np.mean(down != up) > 0.1 and np.all(np.abs(down.astype(int) - up) <= 1), name


def test_truncating_luts_keeps_the_rest_of_the_program(lowered):
    """The GRU cell rewritten: one ADD and one constant more per int16 TABLE, every other
    operator as it was, and outputs within a few codes of the program's."""
    tosa, _, _ = lowered
    rewritten = u55.truncating_luts(tosa)
    before, after = (collections.Counter(op.op for op in _ops(t)) for t in (tosa, rewritten))
    tables = before[ts.Op.TABLE]
    assert tables == 2 and after - before == {ts.Op.ADD: tables, ts.Op.CONST: tables}
    rng = np.random.default_rng(3)
    inputs = [rng.integers(-20000, 20000, (4, n)).astype(np.int16) for n in (16, 32)]
    (want,), (got,) = (tosa_reference.run(t, inputs) for t in (tosa, rewritten))
    assert 0 < np.max(np.abs(got.astype(int) - want)) <= 8


def test_every_convolution_fits_the_40_bit_accumulator(lowered):
    tosa, _, _ = lowered
    convs = [op for op in _ops(tosa) if op.op == ts.Op.CONV2D]
    assert convs
    for op in convs:
        weights = tosa_flatbuffer.constant_values(tosa, op.inputs[1]).astype(np.int64)
        bias = tosa_flatbuffer.constant_values(tosa, op.inputs[2]).astype(np.int64)
        worst = np.abs(weights).reshape(len(weights), -1).sum(axis=1) * 32768 + np.abs(bias)
        assert worst.max() < 2 ** (u55.ACCUMULATOR_BITS - 1)


_KINDS = {ts.Op.MUL: "MUL", ts.Op.ADD: "ADD", ts.Op.SUB: "SUB"}


def _elementwise_forms(tosa: bytes) -> dict:
    """kind -> the forms its MUL/ADD/SUB take in the program: each (multiplier, shift) of the
    RESCALE int16 -> int32 before each operand and of the RESCALE int32 -> int16 after."""
    ops = _ops(tosa)
    writers = {name: op for op in ops for name in op.outputs}
    readers = {name: op for op in ops for name in op.inputs}

    def scale(rescale, rounding=ts.RoundingMode.SINGLE_ROUND):
        assert rescale.op == ts.Op.RESCALE and rescale.attributes.rounding_mode == rounding
        for name in rescale.inputs[3:]:  # zero points
            assert not tosa_flatbuffer.constant_values(tosa, name).any()
        m, s = (tosa_flatbuffer.constant_values(tosa, n) for n in rescale.inputs[1:3])
        return int(m[0]), int(s[0])

    forms: dict = {}
    for op in (op for op in ops if op.op in _KINDS):
        if op.op == ts.Op.MUL:
            assert not tosa_flatbuffer.constant_values(tosa, op.inputs[2]).any()  # shift 0
        form = tuple(scale(writers[n]) for n in op.inputs[:2]) + (scale(readers[op.outputs[0]]),)
        forms.setdefault(_KINDS[op.op], set()).add(form)
    return forms


# ExecuTorch's int16 rescales around them, every activation at one scale: MUL multiplies the
# operands as they are and shifts the product right by 12; ADD/SUB take both operands times
# 2048 (>> 19 of 2^30) and shift the result right by 11.
_FORMS = {
    "MUL": {((1 << 30, 30), (1 << 30, 30), (1 << 30, 42))},
    "ADD": {((1 << 30, 19), (1 << 30, 19), (1 << 30, 41))},
    "SUB": {((1 << 30, 19), (1 << 30, 19), (1 << 30, 41))},
}


def test_the_program_holds_one_form_of_each_elementwise_op(lowered):
    tosa, _, _ = lowered
    assert _elementwise_forms(tosa) == _FORMS


def test_vela_programs_each_as_one_16_bit_elementwise_operation(lowered):
    """Regor fuses both input RESCALEs and the output RESCALE into the op (FuseRescale), the
    input scales into OPA/OPB (ADD/SUB only), the output's into the OFM scale, reduced to
    the fewest bits; no RESCALE is left for an int32 multiply of its own."""
    tosa, _, cmd_data = lowered
    ops = u55.elementwise_ops(cmd_data)
    counts = collections.Counter(_KINDS[op.op] for op in _ops(tosa) if op.op in _KINDS)
    assert collections.Counter(op.mode for op in ops) == counts
    assert sum(op.activation >= 16 for op in ops) == 2  # ADD + sigmoid / tanh LUT
    for op in ops:
        assert op.bits == (16, 16, 16) and op.zero_points == (0, 0, 0)
        assert op.rounding == ("NATURAL", "NATURAL") and op.clip == (-32768, 32767)
        if op.mode == "MUL":  # OPA/OPB not written for a MUL: the last ADD/SUB's stay
            assert op.ofm == (1, 12)
        else:
            assert op.ifm_scale_mode == "OPA_OPB_16"
            assert (op.opa, op.opb, op.ofm) == ((2048, 0), 2048, (1, 11))


def _elementwise_form(kind: str, form: tuple, n: int) -> bytes:
    """a, b int16 [1, n] -> RESCALE each to int32 -> kind -> RESCALE to int16, as `form`."""
    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock
    i16, i32, shape = ts.DType.INT16, ts.DType.INT32, [1, n]
    for name, scale in zip("ab", form):
        block.addTensor(name, shape, i16)
        block.addInput(name)
        rescale(block, name, name + "32", shape, (i16, i32), *scale)
    block.addTensor("value", shape, i32)
    if kind == "MUL":
        const(block, "shift", [1], ts.DType.INT8, [0])
        block.addOperator(ts.Op.MUL, ["a32", "b32", "shift"], ["value"], attribute("MulAttribute"))
    else:
        op = ts.Op.ADD if kind == "ADD" else ts.Op.SUB
        block.addOperator(op, ["a32", "b32"], ["value"], attribute(f"{kind.title()}Attribute"))
    rescale(block, "value", "y", shape, (i32, i16), *form[2])
    block.addOutput("y")
    return bytes(graph.serialize())


def _operands(kind: str) -> tuple:
    """int16 pairs: uniform over the whole range, every pair of edge values, pairs on the
    edge of saturating the result and (MUL) products halfway between two results."""
    rng = np.random.default_rng(28)
    a, b = rng.integers(-32768, 32768, (2, 1 << 16))
    edges = np.array([-32768, -32767, -16385, -16384, -2048, -2, -1, 0, 1, 2, 2048, 16384, 32767])
    ea, eb = (g.ravel() for g in np.meshgrid(edges, edges))
    x = rng.integers(1, 32768, 4096) * rng.choice([-1, 1], 4096)
    near = np.arange(-3, 4)[:, None]
    if kind == "MUL":  # |a * b| >> 12 near 32767; odd a times 2048 x odd b: a tie
        top = np.round(32767.5 * 4096 / x)
        edge_b = np.concatenate([top + near, -top + near])
        a, b = np.append(a, x | 1), np.append(b, 2048 * (x % 16 - 8 | 1))
    else:  # a +- b near 32767 and -32768
        edge_b = (1 if kind == "ADD" else -1) * np.concatenate(
            [32767 - x + near, -32768 - x + near]
        )
    a = np.concatenate([a, ea, np.broadcast_to(x, edge_b.shape).ravel()])
    b = np.concatenate([b, eb, edge_b.ravel()])
    keep = (b >= -32768) & (b <= 32767)
    return a[keep].astype(np.int16), b[keep].astype(np.int16)


@pytest.mark.parametrize("kind", ["MUL", "ADD", "SUB"])
def test_each_elementwise_operation_equals_tosa(lowered, kind):
    """Every elementwise operation Vela wrote for `kind`, as the model computes it from the
    registers it reads (before any LUT), against the TOSA reference model on the program's
    form; the operands saturate the result and (MUL) fall on rounding ties, where rounding
    down or away from zero would differ."""
    tosa, _, cmd_data = lowered
    (form,) = _elementwise_forms(tosa)[kind]
    a, b = _operands(kind)
    (want,) = tosa_reference.run(_elementwise_form(kind, form, a.size), [a[None], b[None]])
    want = want[0]
    x, y = a.astype(np.int64), b.astype(np.int64)
    exact = x * y if kind == "MUL" else x + (y if kind == "ADD" else -y)
    assert np.any(np.abs(exact >> (12 if kind == "MUL" else 0)) > 32767)  # saturating pairs
    if kind == "MUL":
        half = (exact & 4095) == 2048
        assert np.sum(half & (exact < 0)) > 100  # where rounding away from zero differs
    for op in {op for op in u55.elementwise_ops(cmd_data) if op.mode == kind}:
        got = u55.elementwise(op, a, b)
        assert np.array_equal(got, want), f"{op}: {int(np.sum(got != want))} of {a.size} differ"


@pytest.mark.parametrize("kind", ["MUL", "ADD", "SUB"])
def test_the_whole_stream_model_agrees(lowered, kind):
    """`operations` reads the GRU's elementwise operations as `elementwise_ops` does, and
    `compute` (the model `run` executes whole programs with) equals `elementwise` on them."""
    _, _, cmd_data = lowered
    old = [op for op in u55.elementwise_ops(cmd_data) if op.mode == kind]
    new = [op for op in u55.operations(cmd_data) if op.kind == "ELEMENTWISE" and op.mode == kind]
    assert [(op.bits, op.ofm, op.activation, op.clip) for op in old] == [
        (op.bits, op.ofm, op.activation, op.clip) for op in new
    ]
    a, b = _operands(kind)
    for op_old, op_new in zip(old, new):
        assert op_new.ifm2 == "tensor" and op_new.zero_points == (0, 0, 0)
        if kind != "MUL":
            assert (op_new.opa, op_new.opb) == (op_old.opa, op_old.opb)
        got = u55.compute(dataclasses.replace(op_new, activation=0), a, b)
        assert np.array_equal(got, u55.elementwise(op_old, a, b))


def test_the_inventory_names_what_each_operation_rests_on(lowered):
    """benchmarks/u55_forms.py's classification on the GRU cell: its convolutions int16
    within the 40-bit accumulator (the bound the test above checks, from the same weights),
    the rest 16-bit operations `compute` models, two of them (sigmoid, tanh) through a
    16-bit LUT; nothing 32-bit, nothing outside the model."""
    tosa, _, cmd_data = lowered
    found = list(u55.inventory(cmd_data))
    ops = u55.operations(cmd_data)
    assert [lut for s, lut, *_ in found if s == u55.MODELLED] == [op.activation >= 16 for op in ops]
    assert sum(lut for _, lut, *_ in found) == 2
    convs = [f for s, _, f, _ in found if s == u55.CONV16]
    assert len(convs) == sum(1 for op in _ops(tosa) if op.op == ts.Op.CONV2D) > 0
    assert {s for s, *_ in found} == {u55.MODELLED, u55.CONV16}
    assert all(sixteen for *_, sixteen in found)
    assert u55.accumulator_bits(tosa) <= u55.ACCUMULATOR_BITS


def test_the_inventory_refuses_what_the_model_does_not_compute(lowered):
    _, _, cmd_data = lowered
    op = next(op for op in u55.operations(cmd_data) if op.activation == 0)
    assert u55.standing(op) == u55.MODELLED
    assert u55.standing(dataclasses.replace(op, rounding=("DBL", "AUTO"))) == u55.NOT_MODELLED
    assert u55.standing(dataclasses.replace(op, kind="POOL", kernel=(3, 3))) == u55.NOT_MODELLED
    # Vela's Softsign in a GRU on ethos-u55-128 reads an unsigned operand: the inventory
    # raised "an unsigned operand" and the CLI ended in an internal error
    assert u55.standing(dataclasses.replace(op, signed=False)) == u55.NOT_MODELLED
    assert u55.standing(dataclasses.replace(op, bits=(32, 32, 32))) == u55.WIDE
    assert u55.standing(dataclasses.replace(op, bits=(8, 8, 8))) == u55.INT8
