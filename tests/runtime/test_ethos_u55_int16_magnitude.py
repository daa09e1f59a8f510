"""What an Ethos-U55 computes for the int16 three-range magnitude (quantization/magnitude.py,
sqrt(max(s, t1)) + sqrt(clamp(s, t2, t1)) + sqrt(min(s, t2)) - sqrt(t1) - sqrt(t2) with its
clamps), as Vela 5.1.0 programs it
(runtime/ethos_u55_int16.py, `run`), against the TOSA reference model. Each check fails if
Vela or the quantizer change what they emit.

The magnitude holds forms the GRU cell of test_ethos_u55_int16.py does not: RESCALEs regor
cannot fold into an operation (the ADDs of the roots at unequal scales, the squares'
inputs, the fine sums of squares' output scales), which Vela runs as a Cast to int32 and a
32-bit MUL by the multiplier (regor's RewriteRescale); a 16-bit ADD with a non-power-of-two
output scale and a clamp at t as its clip; CLAMPs as 1x1 pools that clip; a TABLE as a
1x1 pool with the LUT; a 32-bit ADD; a SUB of a broadcast constant. No ADD or SUB runs
with unequal OPA/OPB scales (IFM_SCALE_MODE OPA_32/OPB_32): regor takes unequal input
scales only as 16-bit integers, or when the larger is 2^14 (SupportedIFMQuant,
ethos_u55_constraints.cpp), and ExecuTorch's int16 ADD gives its operands 2^11.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import tosa_serializer as ts

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.runtime import ethos_u55_int16 as u55
from recurrent_lowering.runtime import tosa_copy, tosa_flatbuffer, tosa_reference
from recurrent_lowering.runtime.metrics import sqnr_db
from recurrent_lowering.tests.runtime.tosa_graphs import attribute, const, rescale


class _Magnitude(torch.nn.Module):
    def forward(self, a, b):
        return torch.sqrt(a * a + b * b)


def _spectrum(seed: int, level: float = 1.0) -> tuple:
    """As tests/executorch_arm/test_magnitude.py: magnitudes over 8 decades of power."""
    g = torch.Generator().manual_seed(seed)
    scale = level * torch.exp(torch.linspace(-8, 0, 256))
    return tuple(torch.randn(1, 256, generator=g) * scale for _ in range(2))


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    out = tmp_path_factory.mktemp("u55_magnitude")
    calibration = [_spectrum(seed) for seed in range(8)]
    result = flow.lower(
        _Magnitude().eval(),
        calibration[0],
        "ethos-u55-128",
        out,
        quantization="int16",
        calibration_inputs=calibration,
    )
    tosa = result.tosa_files[0].read_bytes()
    npz = np.load(out / "output" / "out_vela.npz")
    return result, tosa, npz


_describe = u55.describe


# What Vela 5.1.0 writes for the magnitude calibrated on _spectrum(0..7) (t1 = 627^2 codes of
# the middle range's squares' input, t2 = 39^2 of the finest's), per form: how many
# operations. Every op has zero points 0.
_OPERATIONS = {
    # RESCALE int16 -> int32 it cannot fold: Cast (ADD of 0) + MUL by the multiplier
    # (a constant tensor broadcast over C) with OFM scale (1, shift); the squares' inputs
    # (2^30, 30), the coarse root (2^30, 19), the middle root (1314154112, 25), the finest
    # (1314154112, 29); the constant sqrt(t1) + sqrt(t2) = 627 + 39 (2^30, 19) as a 1x1 Cast
    # of a scalar and a MUL
    "ELEM ADD i16/i16/i32 ofm(1, 0) DBL OPA_OPB_16 opa(1, 0) opb 1 ifm2 scalar 0": 9,
    "ELEM ADD i16/i16/i32 ofm(1, 0) DBL OPA_OPB_16 opa(1, 0) opb 1 ifm2 scalar 666 reversed": 1,
    "ELEM MUL i32/i32/i32 ofm(1, 30) NATURAL ifm2 broadcast c": 6,
    "ELEM MUL i32/i32/i32 ofm(1, 19) NATURAL ifm2 broadcast c": 1,
    "ELEM MUL i32/i32/i32 ofm(1, 19) NATURAL ifm2 tensor": 1,
    "ELEM MUL i32/i32/i32 ofm(1, 25) NATURAL ifm2 broadcast c": 1,
    "ELEM MUL i32/i32/i32 ofm(1, 29) NATURAL ifm2 broadcast c": 1,
    # the fine squares: int32 x * x, then its RESCALE -> int16 as a MUL, (1433673496, 34)
    # in the middle range, (1433673496, 26) in the finest
    "ELEM MUL i32/i32/i32 ofm(1, 0) DBL ifm2 tensor": 4,
    "ELEM MUL i32/i32/i16 ofm(1, 34) NATURAL ifm2 broadcast c": 2,
    "ELEM MUL i32/i32/i16 ofm(1, 26) NATURAL ifm2 broadcast c": 2,
    # the coarse squares: int32 x * x with its RESCALE (2^30, 42) folded
    "ELEM MUL i32/i32/i16 ofm(1, 12) NATURAL ifm2 tensor": 2,
    # CLAMP(x, -sqrt(t), sqrt(t)): a 1x1 average pool that clips
    "POOL AVERAGE i16>i16 ofm(1, 0) DBL clip(-627, 627)": 2,
    "POOL AVERAGE i16>i16 ofm(1, 0) DBL clip(-39, 39)": 2,
    # the finest sum of squares, as in the GRU, with the finest root's LUT as its activation
    "ELEM ADD i16/i16/i16 ofm(1, 11) NATURAL OPA_OPB_16 opa(2048, 0) opb 2048 ifm2 tensor LUT0": 1,
    # the middle sum, CLAMP(min t2) as its clip
    "ELEM ADD i16/i16/i16 ofm(1, 11) NATURAL OPA_OPB_16 opa(2048, 0) opb 2048 "
    "ifm2 tensor clip(128, 32767)": 1,
    # the coarse sum: RESCALE (1433673496, 41) reduced to (179209187, 38), CLAMP(min t1) as clip
    "ELEM ADD i16/i16/i16 ofm(179209187, 38) NATURAL OPA_OPB_16 opa(2048, 0) opb 2048 "
    "ifm2 tensor clip(128, 32767)": 1,
    # the coarse and middle roots: TABLE + RESCALE (2^30, 37) as a 1x1 pool with the LUT
    "POOL AVERAGE i16>i16 ofm(1, 0) NATURAL LUT0": 2,
    # the three roots (int32 at one scale) added, minus the constant, RESCALE (2^30, 41)
    # folded
    "ELEM ADD i32/i32/i32 ofm(1, 0) DBL OPA_OPB_16 opa(1, 0) opb 1 ifm2 tensor": 2,
    "ELEM SUB i32/i32/i16 ofm(1, 11) NATURAL OPA_OPB_16 opa(1, 0) opb 1 ifm2 broadcast c": 1,
}


def test_vela_programs_the_magnitude_as_these_operations(lowered):
    _, _, npz = lowered
    ops = u55.operations(bytes(npz["cmd_data"].item()))
    assert dict(collections.Counter(_describe(op) for op in ops)) == _OPERATIONS
    assert all(op.zero_points in ((0, 0, 0), (0, None, 0)) for op in ops)
    adds = [op for op in ops if op.opa is not None]  # ADD and SUB: equal scales, 16-bit mode
    assert all(op.ifm_scale_mode == "OPA_OPB_16" and op.opa == (op.opb, 0) for op in adds)


def _inputs(result, rng) -> list:
    """(a, b) int16 pairs: the calibration and held-out spectra as the program quantizes
    them, uniform int16, log-spread over the range, and near the clamp at sqrt(t)."""
    spectra = [_spectrum(s) for s in range(8)]
    spectra += [_spectrum(100 + s, level) for s in range(8) for level in (0.5, 1.0)]
    pairs = [
        [q.quantize(s[i].numpy()) for q, i in zip(result.input_quant, result.input_map)]
        for s in spectra
    ]
    for k in range(60):
        if k % 3 == 0:
            x = rng.integers(-32768, 32768, (2, 1, 256))
        elif k % 3 == 1:
            x = rng.standard_normal((2, 1, 256)) * 10 ** rng.uniform(0, 4.6, (2, 1, 256))
        else:
            x = rng.integers(-800, 800, (2, 1, 256))
        pairs.append(list(np.clip(x, -32768, 32767).astype(np.int16)))
    return pairs


def test_the_program_equals_tosa_on_every_input(lowered):
    """Vela's whole program, every operation as the model computes it, equals the TOSA
    reference model code for code, on the spectra and on random operands that saturate
    each clamp."""
    result, tosa, npz = lowered
    pairs = _inputs(result, np.random.default_rng(28))
    clamped, total, differ = 0, 0, 0
    for pair in pairs:
        (want,) = tosa_reference.run(tosa, pair)
        trace = []
        (got,) = u55.run(npz, pair, trace)
        differ += int(np.sum(got.reshape(want.shape) != want))
        total += want.size
        pools = [values for op, _, _, values in trace if op.clip == (-627, 627)]
        clamped += sum(int(np.sum(np.abs(v) == 627)) for v in pools)
    assert differ == 0, f"{differ} of {total} outputs differ"
    assert total == 84 * 256 and clamped > 5_000  # the fine squares' clamp saturates


def _spectra_sqnr(lowered, compute) -> float:
    """The magnitude's SQNR against torch on the spectra, with `compute` the model."""
    result, _, npz = lowered
    want, got = [], []
    for seed in range(8):
        s = _spectrum(100 + seed, 0.5)
        pair = [q.quantize(s[i].numpy()) for q, i in zip(result.input_quant, result.input_map)]
        want.append(_Magnitude()(*s).numpy().ravel())
        (out,) = u55.run(npz, pair, model=compute)
        got.append(result.output_quant[0].dequantize(out).ravel())
    return sqnr_db(np.concatenate(want), np.concatenate(got))


def test_what_the_equality_rests_on(lowered):
    """The model's two behaviours regor relies on and no public document states, each
    needed: were a 32-bit OFM clipped to ACTIVATION_MIN/MAX (the int16 range regor writes
    there), or a 32-bit MUL's product kept to 48 bits, the magnitude would be lost."""
    exact = _spectra_sqnr(lowered, u55.compute)

    def clipped(op, a, b=None, lut_words=None):
        v = u55.compute(op, a, b, lut_words)
        return np.clip(v, *op.clip) if op.bits[2] == 32 else v

    def product48(op, a, b=None, lut_words=None):
        if op.mode == "MUL" and op.bits[0] == 32:
            p = np.asarray(a, np.int64) * np.asarray(b, np.int64)
            a, b = ((p + (1 << 47)) % (1 << 48)) - (1 << 47), np.ones_like(p)
        return u55.compute(op, a, b, lut_words)

    assert exact > 40
    assert _spectra_sqnr(lowered, clipped) < 10
    assert _spectra_sqnr(lowered, product48) < exact - 10


_DTYPE = {16: ts.DType.INT16, 32: ts.DType.INT32}


def _rescale_graph(multiplier: int, shift: int, bits: tuple, n: int) -> bytes:
    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock
    block.addTensor("x", [1, n], _DTYPE[bits[0]])
    block.addInput("x")
    rescale(block, "x", "y", [1, n], (_DTYPE[bits[0]], _DTYPE[bits[1]]), multiplier, shift)
    block.addOutput("y")
    return bytes(graph.serialize())


def _rescales(tosa: bytes) -> set:
    """(multiplier, shift, input bits, output bits) of each RESCALE of the program."""
    found = set()
    for op in tosa_copy.load(tosa).regions[0].basicBlocks[0].operators:
        if op.op == ts.Op.RESCALE:
            m, s = (int(tosa_flatbuffer.constant_values(tosa, n)[0]) for n in op.inputs[1:3])
            zi, zo = (tosa_flatbuffer.constant_values(tosa, n) for n in op.inputs[3:5])
            found.add((m, s, 8 * zi.dtype.itemsize, 8 * zo.dtype.itemsize))
    return found


def test_each_rescale_as_a_32_bit_mul_equals_tosa(lowered):
    """Each RESCALE Vela runs as a Cast and a 32-bit MUL: the MUL's constant and shift are
    a RESCALE of the program, and the Cast then the MUL as the model computes them equal
    TOSA's RESCALE on every int16 input (int16 -> int32), or on int32 inputs over the whole
    range, most of them saturating (int32 -> int16). The products reach 2^61: the MUL
    keeps them whole (none of these multipliers puts an input in range on a tie)."""
    result, tosa, npz = lowered
    trace = []
    u55.run(npz, _inputs(result, np.random.default_rng(0))[0], trace)
    rescales = _rescales(tosa)
    casts = [op for op, *_ in trace if op.mode == "ADD" and op.bits == (16, 16, 32)]
    assert all(op.ifm2 == "scalar 0" for op in casts[1:])
    muls = {}
    for op, _, b, _ in trace:
        if op.mode == "MUL" and op.ifm2 == "broadcast c" and op.bits[0] == 32:
            muls[(int(b.ravel()[0]), op.ofm[1], op.bits[2])] = op
    assert sorted(muls) == [
        (1 << 30, 19, 32),
        (1 << 30, 30, 32),
        (1314154112, 25, 32),
        (1314154112, 29, 32),
        (1433673496, 26, 16),
        (1433673496, 34, 16),
    ]
    rng = np.random.default_rng(5)
    x16 = np.arange(-32768, 32768, dtype=np.int16)[None]
    for (multiplier, shift, bits), op in muls.items():
        source = 16 if bits == 32 else 32
        assert (multiplier, shift, source, bits) in rescales
        x = x16 if source == 16 else _int32_operands(rng, multiplier, shift)
        graph = _rescale_graph(multiplier, shift, (source, bits), x.size)
        (want,) = tosa_reference.run(graph, [x])
        widened = u55.compute(casts[1], x, np.zeros_like(x)) if source == 16 else x
        got = u55.compute(op, widened, np.full(x.shape, multiplier))
        assert np.array_equal(got, want), (
            f"({multiplier}, {shift}): {int(np.sum(got != want))} differ"
        )
        if source == 32:
            assert np.mean(np.abs(want) == 32767) > 0.2 and np.mean(np.abs(want) < 32767) > 0.2


def _int32_operands(rng, multiplier: int, shift: int) -> np.ndarray:
    """int32 inputs of a RESCALE to int16: uniform over the range TOSA defines it on
    (|x| < 2^(shift - 1), apply_scale_32's REQUIRE), and over twice the range it does not
    saturate on."""
    defined = min(1 << (shift - 1), 1 << 31)
    edge = min(int(2**15 * 2**shift / multiplier) * 2, defined)
    x = np.concatenate(
        [rng.integers(-defined, defined, 1 << 15), rng.integers(-edge, edge, 1 << 15)]
    )
    return x.astype(np.int32)[None]


def _ops_of(npz, describe: str) -> list:
    return [op for op in u55.operations(bytes(npz["cmd_data"].item())) if _describe(op) == describe]


def test_the_coarse_sum_with_its_clamp_equals_tosa(lowered):
    """The 16-bit ADD of the coarse squares at a non-power-of-two output scale, the clamp
    at t its clip: TOSA's RESCALEs (2^30, >> 19) + ADD + RESCALE (1433673496, >> 41) +
    CLAMP(128, 32767), on a pair for every sum of two int16 (with OPA = OPB the result
    depends on the sum alone; none falls on a rounding tie) and on uniform pairs."""
    _, tosa, npz = lowered
    (op,) = _ops_of(npz, [k for k in _OPERATIONS if "179209187" in k][0])
    (form,) = [(m, s) for m, s, i, o in _rescales(tosa) if s == 41 and m != 1 << 30]
    assert form == (1433673496, 41) and op.clip == (128, 32767)
    rng = np.random.default_rng(7)
    a, b = rng.integers(-32768, 32768, (2, 1 << 14))
    total = np.arange(-65536, 65535)  # every sum of two int16: all the op depends on
    a, b = np.concatenate([a, total // 2]), np.concatenate([b, total - total // 2])
    a, b = a.astype(np.int16)[None], b.astype(np.int16)[None]
    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock
    i16, i32, shape = ts.DType.INT16, ts.DType.INT32, [1, a.size]
    for name in "ab":
        block.addTensor(name, shape, i16)
        block.addInput(name)
        rescale(block, name, name + "32", shape, (i16, i32), 1 << 30, 19)
    block.addTensor("sum", shape, i32)
    block.addOperator(ts.Op.ADD, ["a32", "b32"], ["sum"], attribute("AddAttribute"))
    rescale(block, "sum", "sum16", shape, (i32, i16), *form)
    block.addTensor("y", shape, i16)
    bounds = (list(np.int16(v).tobytes()) for v in (128, 32767))
    clamp = attribute("ClampAttribute", *bounds, ts.NanPropagationMode.PROPAGATE)
    block.addOperator(ts.Op.CLAMP, ["sum16"], ["y"], clamp)
    block.addOutput("y")
    (want,) = tosa_reference.run(bytes(graph.serialize()), [a, b])
    got = u55.compute(op, a, b)
    assert np.array_equal(got, want), f"{int(np.sum(got != want))} of {a.size} differ"
    assert np.mean(want == 128) > 0.3 and np.mean(want == 32767) > 0.05


def test_the_roots_sum_less_the_constant_equals_tosa(lowered):
    """The int32 ADDs of the three roots at one scale (unit scales, 32-bit OFM), then the
    SUB of the broadcast constant sqrt(t1) + sqrt(t2) with TOSA's RESCALE (2^30, >> 41)
    folded as OFM scale (1, 11): TOSA's ADDs + SUB + RESCALE on int32 operands of the
    roots' range and beyond, ties (odd multiples of 1024) and saturation included."""
    _, _, npz = lowered
    adds = _ops_of(npz, [k for k in _OPERATIONS if k.startswith("ELEM ADD i32/i32/i32")][0])
    (sub,) = _ops_of(npz, [k for k in _OPERATIONS if k.startswith("ELEM SUB")][0])
    assert len(adds) == 2
    constant = 666 * 2048
    rng = np.random.default_rng(9)
    a, b, c = rng.integers(-(2**28), 2**28, (3, 1 << 16))
    ties = rng.integers(-(2**15), 2**15, 4096) * 2048 + 1024
    a, b = np.concatenate([a, ties]), np.concatenate([b, np.full(4096, constant)])
    c = np.concatenate([c, np.zeros(4096, np.int64)])
    a, b, c = (v.astype(np.int32)[None] for v in (a, b, c))
    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock
    i16, i32, shape = ts.DType.INT16, ts.DType.INT32, [1, a.size]
    for name in "abc":
        block.addTensor(name, shape, i32)
        block.addInput(name)
    const(block, "k", [1, 1], i32, [[constant]])
    for name, operands in (("ab", ["a", "b"]), ("sum", ["ab", "c"])):
        block.addTensor(name, shape, i32)
        block.addOperator(ts.Op.ADD, operands, [name], attribute("AddAttribute"))
    block.addTensor("difference", shape, i32)
    block.addOperator(ts.Op.SUB, ["sum", "k"], ["difference"], attribute("SubAttribute"))
    rescale(block, "difference", "y", shape, (i32, i16), 1 << 30, 41)
    block.addOutput("y")
    (want,) = tosa_reference.run(bytes(graph.serialize()), [a, b, c])
    total = u55.compute(adds[1], u55.compute(adds[0], a, b), c)
    got = u55.compute(sub, total, np.full(a.shape, constant))
    assert np.array_equal(got, want), f"{int(np.sum(got != want))} of {a.size} differ"
    exact = a.astype(np.int64) + b + c - constant
    assert np.sum(exact % 2048 == 1024) >= 4096 and np.mean(np.abs(want.astype(int)) >= 32767) > 0.3
