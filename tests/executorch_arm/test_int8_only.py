"""What a target's Vela runs in int8 only (plan.INT8_ONLY) stays int8 in an int16 program:
ethos-u55/u65 Vela refuses ExecuTorch's int16 TRANSPOSE_CONV2D, so an int16 rest keeps its
transposed convolutions int8, rescaled at their edges, instead of giving up int16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm import plan as arm_plan
from recurrent_lowering.backends.executorch_arm.precision import cost_model
from recurrent_lowering.runtime import arm_numerics, tosa_flatbuffer
from recurrent_lowering.runtime import ethos_u55_int16 as u55

BUDGET = 0.03


class _Decoder(torch.nn.Module):
    """A GRU over time, then a transposed convolution (GTCRN's decoder upsamples so)."""

    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(16, 16, batch_first=True)
        self.up = torch.nn.ConvTranspose2d(16, 8, (1, 3), stride=(1, 2))

    def forward(self, x):
        y, _ = self.gru(x)  # [1, T, 16]
        return self.up(y.transpose(1, 2).unsqueeze(2))


class _Upsampler(torch.nn.Module):
    """Convolutions around a transposed one, with a wide range before it (tanh of a large
    gain) that int8 resolves coarsely."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(4, 24, (1, 3), padding=(0, 1))
        self.up = torch.nn.ConvTranspose2d(24, 16, (1, 3), stride=(1, 2))
        self.b = torch.nn.Conv2d(16, 16, (1, 3))
        self.c = torch.nn.Conv2d(16, 4, (1, 1))

    def forward(self, x):
        y = self.up(torch.tanh(4 * self.a(x)))
        return self.c(torch.tanh(self.b(torch.relu(y))))


def _samples(n: int, seed: int) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 4, 1, 20, generator=generator),) for _ in range(n)]


def _sqnr(result, model, samples) -> float:
    return float(np.mean([arm_numerics.check(result, model, s).sqnr_db for s in samples]))


def test_the_cost_model_weighs_an_int16_rest_and_names_what_stays_int8():
    torch.manual_seed(0)
    model, inputs = _Decoder().eval(), (torch.randn(1, 12, 16),)
    choice = cost_model.choose_for(model, inputs, "ethos-u55-128", BUDGET)
    assert choice.rest == "int16"
    assert choice.report()["int8_only"] == (
        "Vela refuses aten.conv_transpose2d.input in int16 on ethos-u55: kept int8 in an int16 rest"
    )
    assert cost_model.choose_for(model, inputs, "ethos-u85-256", BUDGET).int8_only is None


def test_vela_refuses_an_int16_transposed_convolution_on_u55(tmp_path, monkeypatch):
    """The behaviour INT8_ONLY answers (Vela 5.1.0 through ExecuTorch 1.5.1)."""
    monkeypatch.setattr(arm_plan, "INT8_ONLY", {})
    torch.manual_seed(0)
    up = torch.nn.ConvTranspose2d(24, 16, 3).eval()
    x = (torch.randn(1, 24, 4, 10),)
    with pytest.raises(Exception, match="could not run on NPU"):
        flow.lower(up, x, "ethos-u55-128", tmp_path / "int16", quantization="int16")


def test_int16_keeps_the_transposed_convolution_int8_on_u55(tmp_path):
    """One delegate: the transposed convolution reads int8, the convolutions int16; closer
    to fp32 torch eager than all-int8 on held-out samples."""
    torch.manual_seed(0)
    model = _Upsampler().eval()
    calibration, held_out = _samples(8, 1), _samples(4, 2)
    lowered = {
        q: flow.lower(
            model,
            calibration[0],
            "ethos-u55-128",
            tmp_path / q,
            quantization=q,
            calibration_inputs=calibration,
        )
        for q in ("int16", "int8")
    }
    int16 = lowered["int16"]
    assert int16.num_delegates == 1 and int16.cpu_reasons == {"q/dq at delegate boundary": 2}
    (tosa,) = int16.tosa_files
    assert [i.tosa_dtype for i in tosa_flatbuffer.op_inputs(tosa, "TRANSPOSE_CONV2D", 0)] == [
        "INT8"
    ]
    assert {i.tosa_dtype for i in tosa_flatbuffer.op_inputs(tosa, "CONV2D", 0)} == {"INT16"}
    assert int16.vela.summary.cycles > 0
    assert _sqnr(int16, model, held_out) > _sqnr(lowered["int8"], model, held_out) + 3
    _the_int8_island_is_modelled(int16, tosa)


def _the_int8_island_is_modelled(result, tosa):
    """Vela runs the int8 transposed convolution as one convolution that writes its int32
    accumulator plus TOSA's bias as is (unit scales, read back from its scale stream), the
    int16 rescale after it apart: a form whose figure rests on WIDE's assumption only."""
    (path,) = sorted(result.vela.output_dir.rglob("*_vela.npz"))
    with np.load(path) as npz:
        cmd_data = bytes(npz["cmd_data"].item())
        weights = u55.weight_data(npz)
    wide = [c for c in u55.convolutions(cmd_data, weights) if c.bits == (8, 32)]
    assert len(wide) == 1 and wide[0].unit_scales
    (bias,) = tosa_flatbuffer.op_inputs(tosa, "TRANSPOSE_CONV2D", 2)
    assert np.array_equal(wide[0].bias, tosa_flatbuffer.constant_values(tosa, bias.name))
    forms = {form: standing for standing, _, form, _ in u55.inventory(cmd_data, weights)}
    assert forms["CONV i8>i32 kernel(1, 3) unit scales"] == u55.WIDE
    assert u55.NOT_MODELLED in {s for s, *_ in u55.inventory(cmd_data)}  # unread, unproven
    assert u55.rests_on([path], [tosa])["operations"][u55.NOT_MODELLED] == 0
