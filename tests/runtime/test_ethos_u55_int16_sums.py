"""Sums and means in int16 on Ethos-U55 (GTCRN's TRA takes the mean of squares over
frequency): Vela 5.1.0 runs each as a 1x1 POOL in mode REDUCE_SUM over the IFM's depth
with the RESCALE after it folded into its OFM scale. As runtime/ethos_u55_int16.py runs
that program it equals the TOSA reference model code for code."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.runtime import ethos_u55_int16 as u55
from recurrent_lowering.runtime import tosa_reference


class _Sums(torch.nn.Module):
    def forward(self, x, y):
        return torch.mean(x * x, dim=-1, keepdim=True), y.sum(dim=1, keepdim=True), y.mean(-1)


def _samples(seed: int, n: int = 4) -> list:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(1, 4, 6, 16, generator=g), torch.randn(1, 5, 12, generator=g))
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    out = tmp_path_factory.mktemp("u55_sums")
    calibration = _samples(0)
    result = flow.lower(
        _Sums().eval(),
        calibration[0],
        "ethos-u55-128",
        out,
        quantization="int16",
        calibration_inputs=calibration,
    )
    (path,) = sorted(result.vela.output_dir.rglob("*_vela.npz"))
    return result, result.tosa_files[0].read_bytes(), np.load(path)


def _feeds(result, rng) -> list:
    """The calibration and held-out samples as the program quantizes them, then uniform
    int16 (saturating every sum) and log-spread operands."""
    feeds = [
        [q.quantize(s[i].numpy()) for q, i in zip(result.input_quant, result.input_map)]
        for s in _samples(0) + _samples(1)
    ]
    shapes = [f.shape for f in feeds[0]]
    for k in range(24):
        if k % 2:
            x = [rng.integers(-32768, 32768, shape) for shape in shapes]
        else:
            x = [rng.standard_normal(shape) * 10 ** rng.uniform(1, 4.5) for shape in shapes]
        feeds.append([np.clip(v, -32768, 32767).astype(np.int16) for v in x])
    return feeds


def test_vela_runs_each_sum_as_a_pool_over_the_depth(lowered):
    _, _, npz = lowered
    cmd_data = bytes(npz["cmd_data"].item())
    sums = [op for op in u55.operations(cmd_data) if op.mode == "SUM"]
    assert len(sums) == 3 and all(op.kind == "POOL" and op.shape[2] == 1 for op in sums)
    standings = collections.Counter(s for s, *_ in u55.inventory(cmd_data))
    assert standings[u55.NOT_MODELLED] == 0 and standings[u55.MODELLED] > 0


def test_the_program_equals_tosa_on_every_input(lowered):
    result, tosa, npz = lowered
    differ, total, depths = 0, 0, set()
    for feed in _feeds(result, np.random.default_rng(7)):
        trace = []
        got = u55.run(npz, feed, trace)
        for want, out in zip(tosa_reference.run(tosa, feed), got):
            differ += int(np.sum(out.reshape(want.shape) != want))
            total += want.size
        depths |= {a.shape[2] for op, a, _, _ in trace if op.mode == "SUM"}
    assert differ == 0, f"{differ} of {total} outputs differ"
    assert total == 32 * (4 * 6 + 12 + 5) and depths == {16, 12, 5}  # each reduced axis


def test_the_sum_is_needed(lowered):
    """Were a SUM pool the value of its first channel (an AVERAGE pool's 1x1 reading), the
    program would differ from TOSA: the check above sees the sums."""
    result, tosa, npz = lowered

    def first(op, a, b=None, lut_words=None):
        if op.mode == "SUM":
            op, a = dataclasses.replace(op, mode="AVERAGE"), a[..., :1]
        return u55.compute(op, a, b, lut_words)

    feed = _feeds(result, np.random.default_rng(7))[0]
    wants = tosa_reference.run(tosa, feed)
    gots = u55.run(npz, feed, model=first)
    assert all(not np.array_equal(g.reshape(w.shape), w) for w, g in zip(wants, gots))
