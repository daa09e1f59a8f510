"""A stream's packed state is quantized part by part (quantization/state_parts.py).

The model packs two states of very different ranges in one tensor, as DTLN packs its LSTMs'
h (|h| <= 1) with their c (up to +-234): a GRU's h and a running sum that grows to about
600 over the calibration stream. With one scale for the tensor, the sum's range sets h's
step; with a scale per part, h keeps its own. Against torch eager over a held-out stream
fed back (TOSA reference model), mask / h / sum: 54.5 / 37.0 / 48.9 dB with one scale,
67.3 / 50.7 / 47.8 with a scale per part (measured).
"""

from __future__ import annotations

import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.partition import cpu_reasons
from recurrent_lowering.backends.executorch_arm.precision import accuracy
from recurrent_lowering.backends.executorch_arm.quantization import state_parts
from recurrent_lowering.runtime import streams
from recurrent_lowering.runtime.metrics import sqnr_per_output


class _Packed(torch.nn.Module):
    """A GRU's h and a running sum of the input, one state tensor [1, 1, 32]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gru = torch.nn.GRU(12, 16, batch_first=True)
        self.mask = torch.nn.Linear(16, 12)

    def forward(self, x, state):
        h, total = state[..., :16], state[..., 16:]
        y, h_n = self.gru(x, h.contiguous())
        total = total + 10 * x.mean(dim=(1, 2), keepdim=True).expand(1, 1, 16)
        return torch.sigmoid(self.mask(y)), torch.cat([h_n, total], -1)


def _frames(n: int, generator) -> list:
    state = torch.zeros(1, 1, 32)
    return [(torch.rand(1, 4, 12, generator=generator) * 2, state) for _ in range(n)]


def _lowered(tmp_path, name: str):
    generator = torch.Generator().manual_seed(1)
    calibration, held_out = _frames(60, generator), _frames(40, generator)
    module = _Packed().eval()
    stream = [(1, 1)]
    calibration = [
        tuple(torch.as_tensor(a) for a in s)
        for s in streams.fed_back(accuracy.of_module(module), calibration, stream)[0]
    ]
    result = flow.lower(
        module,
        calibration[0],
        "TOSA-1.0+INT",
        tmp_path / name,
        quantization="int16",
        calibration_inputs=calibration,
    )
    samples = accuracy.Evaluation(held_out, stream)
    want = accuracy.outputs(accuracy.of_module(module), samples)
    got = accuracy.outputs(accuracy.of_lowered(result), samples)
    parts = [lambda o: o[0], lambda o: o[1][..., :16], lambda o: o[1][..., 16:]]
    return result, sqnr_per_output([p(want) for p in parts], [p(got) for p in parts])


def _state_scales(result) -> list:
    (boundary,) = result.boundaries.values()
    return sorted(v.quant.scale for v in boundary.inputs if tuple(v.shape) == (1, 1, 16))


def test_each_part_of_a_packed_state_has_its_own_scale(tmp_path, monkeypatch):
    split, (mask, h, total) = _lowered(tmp_path, "split")
    scales = _state_scales(split)
    assert len(scales) == 2 and scales[1] > 20 * scales[0], scales  # h's step, the sum's
    assert split.cpu_reasons[cpu_reasons.STATE_PARTS] > 0, split.cpu_reasons
    program_inputs = split.program_module.graph.find_nodes(op="placeholder")
    assert [tuple(p.meta["val"].shape) for p in program_inputs] == [(1, 4, 12), (1, 1, 32)]

    monkeypatch.setattr(state_parts, "split", lambda graph, spec: [])
    whole, (mask_whole, h_whole, total_whole) = _lowered(tmp_path, "whole")
    assert _state_scales(whole) == [], whole.boundaries  # one input [1, 1, 32]
    assert mask > mask_whole + 8 and h > h_whole + 8, (mask_whole, h_whole, mask, h)
    assert total > total_whole - 3, (total_whole, total)  # the wide part keeps its own


class _Layers(torch.nn.Module):
    """A two-layer GRU's h in one tensor [2, 1, 32], as torch returns it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gru = torch.nn.GRU(12, 32, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x, h):
        y, h = self.gru(x, h)
        return torch.sigmoid(self.head(y)), h


def test_a_state_the_loop_form_reads_keeps_one_scale(tmp_path):
    """At T = 16 the layers run in the loop form, whose step pairs its state input and
    output in one quantization of its own: a part's observer outside it would split that
    pair (measured: state -82.6 dB against torch before the guard, 48.5 with it)."""
    generator = torch.Generator().manual_seed(1)

    def frames(n):
        return [(torch.randn(1, 16, 12, generator=generator), torch.zeros(2, 1, 32))] * n

    module, stream = _Layers().eval(), [(1, 1)]
    calibration = [
        tuple(torch.as_tensor(a) for a in s)
        for s in streams.fed_back(accuracy.of_module(module), frames(8), stream)[0]
    ]
    result = flow.lower(
        module,
        calibration[0],
        "TOSA-1.0+INT",
        tmp_path,
        quantization="int16",
        calibration_inputs=calibration,
    )
    assert result.loop_programs and cpu_reasons.STATE_PARTS not in result.cpu_reasons
    samples = accuracy.Evaluation(frames(8), stream)
    want = accuracy.outputs(accuracy.of_module(module), samples)
    got = accuracy.outputs(accuracy.of_lowered(result), samples)
    assert min(sqnr_per_output(want, got)) > 40
