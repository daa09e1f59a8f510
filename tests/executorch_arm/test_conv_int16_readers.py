"""compat.conv_int16_readers: on ethos-u55 an int16 convolution read by an int32 consumer
and another (y * y beside y) lowers, its accumulator read once; elsewhere nothing changes."""

from __future__ import annotations

import pytest
import torch
import tosa_serializer as ts

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.compat import conv_int16_readers
from recurrent_lowering.runtime import arm_numerics, tosa_copy


class _TwoReaders(torch.nn.Module):
    """A convolution whose output a MUL (int32 inputs) reads beside a convolution (int16)
    or, `int32_only`, beside an ADD (int32 too)."""

    def __init__(self, int32_only: bool = False):
        super().__init__()
        self.int32_only = int32_only
        self.a = torch.nn.Conv2d(4, 8, (1, 3), padding=(0, 1))
        self.b = torch.nn.Conv2d(8, 4, (1, 1))

    def forward(self, x):
        y = self.a(x)
        return self.b(y * y) + (self.b(y + 1.0) if self.int32_only else self.b(y))


def _model_and_input(int32_only: bool = False):
    torch.manual_seed(0)
    return _TwoReaders(int32_only).eval(), (torch.randn(1, 4, 1, 20),)


def _readers_of_convolutions(tosa) -> list:
    """How many operators read each convolution's output, in graph order."""
    block = tosa_copy.load(tosa.read_bytes()).regions[0].basicBlocks[0]
    ops = list(block.operators)
    convs = [op.outputs[0] for op in ops if op.op == ts.Op.CONV2D]
    return [sum(name in op.inputs for op in ops) for name in convs]


def _without_the_passes(monkeypatch):
    monkeypatch.setattr(conv_int16_readers, "insertions", lambda: [])


def test_vela_refuses_an_int16_convolution_read_twice_on_u55(tmp_path, monkeypatch):
    """The behaviour the passes answer (ExecuTorch 1.5.1, Vela 5.1.0)."""
    _without_the_passes(monkeypatch)
    model, x = _model_and_input()
    with pytest.raises(Exception, match="could not run on NPU"):
        flow.lower(model, x, "ethos-u55-128", tmp_path, quantization="int16")


@pytest.mark.parametrize("int32_only", [False, True])
def test_on_u55_the_accumulator_has_one_reader(tmp_path, int32_only):
    model, x = _model_and_input(int32_only)
    result = flow.lower(model, x, "ethos-u55-128", tmp_path, quantization="int16")
    assert result.num_delegates == 1
    assert _readers_of_convolutions(result.tosa_files[0]) == [1, 1, 1]
    assert arm_numerics.check(result, model, x).sqnr_db > 40


def test_elsewhere_the_program_is_executorchs(tmp_path, monkeypatch):
    model, x = _model_and_input()
    ours = flow.lower(model, x, "ethos-u85-256", tmp_path / "ours", quantization="int16")
    _without_the_passes(monkeypatch)
    theirs = flow.lower(model, x, "ethos-u85-256", tmp_path / "theirs", quantization="int16")
    assert _readers_of_convolutions(ours.tosa_files[0])[0] == 2
    assert ours.tosa_files[0].read_bytes() == theirs.tosa_files[0].read_bytes()
