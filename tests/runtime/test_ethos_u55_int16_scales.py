"""The forms the real models' int16 programs add on Ethos-U55 (docs/results/u55_forms.md)
beyond the GRU's: a 16-bit MUL whose output scale is no power of two, operands broadcast
over rows or over everything but channels, an ADD of values at unequal scales (regor's
RewriteRescale: each operand cast to int32 and multiplied by its RESCALE's multiplier),
and the int8 <-> int16 requantizations where int16_recurrent's regions meet. What Vela
5.1.0 writes for them, as runtime/ethos_u55_int16.py runs it, equals the TOSA reference
model code for code."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import tosa_serializer as ts

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.runtime import ethos_u55_int16 as u55
from recurrent_lowering.runtime import tosa_reference, vela
from recurrent_lowering.tests.runtime.tosa_graphs import rescale


class _Scales(torch.nn.Module):
    """a [4, 64] at about 3, b [4, 64] at about 0.7, r [1, 64] (a row for every row) and
    c [4, 1] (a value for every row)."""

    def forward(self, a, b, r, c):
        return a * b, a * r, b * c, a + b


def _samples(seed: int, n: int = 6) -> list:
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(4, 64, generator=g) * 3.1,
            torch.randn(4, 64, generator=g) * 0.7,
            torch.randn(1, 64, generator=g) * 1.9,
            torch.randn(4, 1, generator=g) * 5.3,
        )
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    out = tmp_path_factory.mktemp("u55_scales")
    calibration = _samples(0)
    result = flow.lower(
        _Scales().eval(),
        calibration[0],
        "ethos-u55-128",
        out,
        quantization="int16",
        calibration_inputs=calibration,
    )
    return result, result.tosa_files[0].read_bytes(), np.load(out / "output" / "out_vela.npz")


def test_the_program_holds_the_forms(lowered):
    """16-bit MULs at scales no power of two, broadcast operands, and the ADD's RESCALEs as
    casts and 32-bit MULs; every operation one the model computes."""
    _, _, npz = lowered
    ops = u55.operations(bytes(npz["cmd_data"].item()))
    found = list(u55.inventory(bytes(npz["cmd_data"].item())))
    assert {s for s, *_ in found} <= {u55.MODELLED, u55.WIDE}
    muls = [op for op in ops if op.mode == "MUL" and op.bits == (16, 16, 16)]
    assert any(op.ofm[0] != 1 for op in muls), [u55.describe(op) for op in muls]
    assert {op.ifm2.split()[0] for op in ops if op.ifm2} >= {"tensor", "broadcast"}
    assert collections.Counter(op.bits for op in ops)[(32, 32, 32)] > 0


def test_the_program_equals_tosa_on_every_input(lowered):
    """Vela's whole program as the model computes it against the TOSA reference model, on
    held-out samples as the program quantizes them and on uniform int16 operands (which
    saturate every output)."""
    result, tosa, npz = lowered
    rng = np.random.default_rng(11)
    feeds = [
        [q.quantize(s[i].numpy()) for q, i in zip(result.input_quant, result.input_map)]
        for s in _samples(1)
    ]
    shapes = [f.shape for f in feeds[0]]
    feeds += [
        [rng.integers(-32768, 32768, shape).astype(np.int16) for shape in shapes] for _ in range(16)
    ]
    differ, total = u55.differing(npz, tosa, feeds)
    assert total == 22 * (3 * 256 + 256) and differ == 0, (differ, total)


# crnn's boundaries under the default (int16_recurrent): its int8 convolutions' output into
# the GRU's int16, and the GRU's int16 output back to int8, as ExecuTorch writes them.
_BOUNDARIES = {
    "int8 -> int16": ((ts.DType.INT8, ts.DType.INT16), 1800410496, 26, (-128, 0)),
    "int16 -> int8": ((ts.DType.INT16, ts.DType.INT8), 1774095015, 35, (0, -5)),
}


@pytest.mark.parametrize("boundary", sorted(_BOUNDARIES))
def test_a_boundary_requantization_equals_tosa_on_every_input(boundary, tmp_path):
    """The RESCALE alone, compiled by Vela: one 1x1 pool with the rescale as its OFM scale
    and zero points, which the model computes equal to TOSA's on every input code."""
    dtypes, multiplier, shift, zero_points = _BOUNDARIES[boundary]
    n = 256 if dtypes[0] == ts.DType.INT8 else 65536
    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock
    block.addTensor("x", [1, 1, n // 256, 256], dtypes[0])
    block.addInput("x")
    rescale(block, "x", "y", [1, 1, n // 256, 256], dtypes, multiplier, shift, zero_points)
    block.addOutput("y")
    tosa = bytes(graph.serialize())
    vela.run_vela(tosa, "ethos-u55-128", output_dir=tmp_path)
    npz = np.load(tmp_path / "out_vela.npz")
    (op,) = u55.operations(bytes(npz["cmd_data"].item()))
    assert op.kind == "POOL" and op.ofm == (multiplier, shift), op
    assert (op.zero_points[0], op.zero_points[2]) == zero_points
    low = -128 if n == 256 else -32768
    x = np.arange(low, low + n).reshape(1, 1, n // 256, 256)
    x = x.astype(np.int8 if n == 256 else np.int16)
    (want,) = tosa_reference.run(tosa, [x])
    (got,) = u55.run(npz, [x])
    assert np.array_equal(got.reshape(want.shape), want)
    assert np.ptp(want.astype(np.int64)) > 100  # codes move through the range
