"""A transposed convolution of stride 1 is the convolution it is (quantization/transposed.py):
on ethos-u55, where Vela runs transposed convolutions in int8 only, it takes the int16 of
the region around it; one of stride 2 stays an int8 island."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import exported, flow
from recurrent_lowering.backends.executorch_arm.precision import cost_model
from recurrent_lowering.backends.executorch_arm.quantization import transposed
from recurrent_lowering.runtime import arm_numerics, tosa_flatbuffer

TYPES = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d)


class _Decoder(torch.nn.Module):
    """GTCRN's decoder block in small: 1x1, dilated depthwise and 1x1 transposed
    convolutions, an attention on their output's energy, then one of stride 2."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.ConvTranspose2d(8, 16, 1)
        self.dw = torch.nn.ConvTranspose2d(16, 16, 3, dilation=(2, 1), padding=(2, 1), groups=16)
        self.b = torch.nn.ConvTranspose2d(16, 8, 1)
        self.up = torch.nn.ConvTranspose2d(8, 8, (1, 3), stride=(1, 2))
        self.c = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.b(torch.tanh(self.dw(torch.relu(self.a(x)))))
        e = torch.sigmoid(torch.mean(y * y, dim=-1, keepdim=True))
        return self.c(torch.relu(self.up(torch.tanh(y * e))))


class _Shapes(torch.nn.Module):
    """Groups, padding wider than a plain convolution's, 1-D, a padding beyond the
    kernel's reach (a crop: not a convolution), stride 2."""

    def __init__(self):
        super().__init__()
        self.g = torch.nn.ConvTranspose2d(8, 8, (3, 3), padding=(0, 1), groups=2)
        self.one = torch.nn.ConvTranspose1d(8, 6, 3, padding=2)
        self.crop = torch.nn.ConvTranspose2d(8, 4, 3, padding=3)
        self.up = torch.nn.ConvTranspose1d(8, 2, 4, stride=2)

    def forward(self, x):
        return self.g(x), self.one(x[:, :, 0]), self.crop(x), self.up(x[:, :, 1])


def _samples(n: int, seed: int, height: int = 1) -> list:
    """[1, 8, height, 10]: one frame of GTCRN-like features by default."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 8, height, 10, generator=g),) for _ in range(n)]


def test_a_transposed_convolution_of_stride_1_is_its_convolution():
    torch.manual_seed(0)
    model, (x,) = _Shapes().eval(), _samples(1, 3, height=6)[0]
    gm = exported.module_of(torch.export.export(model, (x,)))
    assert transposed.as_convolutions(gm, TYPES) == 2
    calls = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    left = [target for target in calls if "transpose" in target]
    assert left == ["aten.conv_transpose2d.input", "aten.conv_transpose1d.default"]
    for want, got in zip(model(x), gm(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_rewritten_convolution_leaves_the_transposed_module():
    """set_module_type(ConvTranspose2d, int8) no longer takes the rewritten node."""
    model, (x,) = _Decoder().eval(), _samples(1, 3)[0]
    gm = exported.module_of(torch.export.export(model, (x,)))
    assert transposed.as_convolutions(gm, TYPES) == 3
    for node in gm.graph.nodes:
        if node.op == "call_function" and "conv" in str(node.target):
            types = [t for _, t in node.meta["nn_module_stack"].values()]
            transposed_stack = any("ConvTranspose" in t for t in types)
            assert transposed_stack == (node.target == torch.ops.aten.conv_transpose2d.input)


def test_the_cost_model_names_only_what_stays_int8():
    model, inputs = _Decoder().eval(), _samples(1, 0)[0]
    choice = cost_model.choose_for(model, inputs, "ethos-u55-128", 0.03)
    assert "conv_transpose2d" in choice.report()["int8_only"]
    model.up = torch.nn.ConvTranspose2d(8, 8, (1, 5), padding=(0, 2))  # stride 1: a conv
    assert cost_model.choose_for(model, inputs, "ethos-u55-128", 0.03).int8_only is None


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    torch.manual_seed(0)
    model = _Decoder().eval()
    calibration = _samples(8, 1)
    out = tmp_path_factory.mktemp("transposed")
    result = flow.lower(
        model,
        calibration[0],
        "ethos-u55-128",
        out,
        quantization="int16",
        calibration_inputs=calibration,
    )
    return model, result


def test_on_u55_the_stride_1_ones_are_int16_convolutions(lowered):
    _, result = lowered
    assert result.num_delegates == 1
    (tosa,) = result.tosa_files
    counts = tosa_flatbuffer.op_counts(tosa)
    assert counts["TRANSPOSE_CONV2D"] == 1 and counts["DEPTHWISE_CONV2D"] == 1
    assert [i.tosa_dtype for i in tosa_flatbuffer.op_inputs(tosa, "TRANSPOSE_CONV2D", 0)] == [
        "INT8"
    ]
    inputs = tosa_flatbuffer.op_inputs(tosa, "CONV2D", 0)
    assert [i.tosa_dtype for i in inputs].count("INT16") == 3  # a, b and c


def test_on_u55_it_is_closer_to_torch_than_the_islands(lowered, tmp_path, monkeypatch):
    model, result = lowered
    held_out = _samples(4, 2)

    def sqnr(r) -> float:
        return float(np.mean([arm_numerics.check(r, model, s).sqnr_db for s in held_out]))

    monkeypatch.setattr(transposed, "as_convolutions", lambda gm, types: 0)
    calibration = _samples(8, 1)
    islands = flow.lower(
        model,
        calibration[0],
        "ethos-u55-128",
        tmp_path,
        quantization="int16",
        calibration_inputs=calibration,
    )
    assert sqnr(result) > sqnr(islands) + 1
