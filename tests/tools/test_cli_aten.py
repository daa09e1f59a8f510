"""`lower --target aten`: a .pt2 that torch.export.load reads, with no recurrent aten op,
matching the input model to 1e-5."""

from __future__ import annotations

import json

import pytest
import torch

from recurrent_lowering.tests.tools.cli import run_lower

RECURRENT = ("gru", "lstm", "rnn_tanh", "rnn_relu")


def _recurrent_ops(program) -> list[str]:
    return [
        str(n.target)
        for n in program.graph.nodes
        if n.op == "call_function" and any(f"aten.{r}" in str(n.target) for r in RECURRENT)
    ]


class TwoLayerLstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(6, 10, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x, h0, c0):
        y, (h, c) = self.rnn(x, (h0, c0))
        return y, h, c


def test_user_pt2(tmp_path):
    torch.manual_seed(0)
    model = TwoLayerLstm().eval()
    inputs = (torch.randn(2, 5, 6), torch.randn(4, 2, 10), torch.randn(4, 2, 10))
    program = torch.export.export(model, inputs)
    assert _recurrent_ops(program), (
        "the input must contain a recurrent op for this test to mean anything"
    )
    torch.export.save(program, str(tmp_path / "lstm.pt2"))

    result = run_lower(
        ["lstm.pt2", "--target", "aten", "--output", "out/lstm_dec.pt2", "--report", "r.json"],
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]

    lowered = torch.export.load(str(tmp_path / "out/lstm_dec.pt2"))
    assert _recurrent_ops(lowered) == []
    with torch.no_grad():
        expected = model(*inputs)
        actual = lowered.module()(*inputs)
    for e, a in zip(expected, actual):
        assert torch.max(torch.abs(e - a)).item() <= 1e-5
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["target"] == "aten"
    assert report["output"] == str(tmp_path / "out/lstm_dec.pt2")
    assert report["numerics"]["max_abs_err"] <= 1e-5
    assert report["time"]["total_s"] > 0
    assert report["ops"]["recurrent_layers"] == ["rnn: lstm.input"]
    assert report["warnings"] == []


@pytest.mark.parametrize("example", ["tiny_gru"])
def test_bundled_example(tmp_path, example):
    result = run_lower([example, "--target", "aten"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    lowered = torch.export.load(str(tmp_path / f"{example}.decomposed.pt2"))
    assert _recurrent_ops(lowered) == []
    assert "SQNR" in result.stdout


class BatchedGru(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(4, 8, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


def test_calibration_inputs_drive_the_numerics_check(tmp_path):
    """A .pt2 with a dynamic batch keeps it, and --calibration's batch of 3 is what the
    numerics check runs (the example has 2)."""
    import numpy as np

    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(
        BatchedGru().eval(), (torch.randn(2, 5, 4),), dynamic_shapes={"x": {0: batch}}
    )
    torch.export.save(program, str(tmp_path / "gru.pt2"))
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).standard_normal((3, 5, 4)))
    args = ["gru.pt2", "--target=aten", "--calibration=c.npz", "--report=r.json"]
    result = run_lower(args, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["numerics"]["inputs"] == "--calibration"
    assert report["numerics"]["max_abs_err"] <= 1e-5
    assert report["warnings"] == []
    lowered = torch.export.load(str(tmp_path / "gru.decomposed.pt2"))
    assert lowered.module()(torch.randn(5, 5, 4)).shape == (5, 5, 8)  # still dynamic


def test_every_calibration_sample_is_checked(tmp_path):
    """Each sample of --calibration at its own batch (the .pt2's dynamic one), all of them
    against torch eager (samples of two batches were refused as "an NPU program is static",
    and only the first was checked)."""
    import numpy as np

    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=4)
    program = torch.export.export(
        BatchedGru().eval(), (torch.randn(2, 5, 4),), dynamic_shapes={"x": {0: batch}}
    )
    torch.export.save(program, str(tmp_path / "gru.pt2"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", x=rng.standard_normal((2, 3, 5, 4)))  # two samples of 3
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((1, 5, 4)))
    args = ["gru.pt2", "--target=aten", "--calibration=c.npz,d.npz", "--report=r.json"]
    result = run_lower(args, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["numerics"]["samples"] == {"calibration": 0, "evaluation": 3}
    assert report["numerics"]["max_abs_err"] <= 1e-5


class StreamingGru(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(3, 4, batch_first=True)
        self.register_buffer("h", torch.zeros(1, 2, 4))

    def forward(self, x):
        y, h = self.rnn(x, self.h)
        self.h.copy_(h)
        return y


@pytest.mark.parametrize(
    "target,calibrated", [("aten", False), ("TOSA-1.0+FP", False), ("aten", True)]
)
def test_state_buffer_written_in_place(tmp_path, target, calibrated):
    """The numerics runs must not leave their state in the saved program (aten saved the
    state after one reference call: 6.4 dB), and a buffer written in place lowers for TOSA
    (to_executorch failed: 'a leaf Variable that requires grad'). With --calibration the
    reference runs once (checking the sample and then computing the reference from the
    state the check left: max abs error 0.39)."""
    import numpy as np

    torch.manual_seed(0)
    program = torch.export.export(StreamingGru().eval(), (torch.randn(2, 3, 3),))
    torch.export.save(program, str(tmp_path / "s.pt2"))
    args = ["s.pt2", f"--target={target}", "--output=out.bin", "--report=r.json"]
    if calibrated:
        np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).standard_normal((2, 3, 3)))
        args.append("--calibration=c.npz")
    result = run_lower(args, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["numerics"]["max_abs_err"] <= 1e-5
    if target == "aten":
        saved = torch.export.load(str(tmp_path / "out.bin"))
        assert not saved.state_dict["h"].any()
        assert _recurrent_ops(saved) == []


def test_model_without_recurrent_layers_warns(tmp_path):
    program = torch.export.export(torch.nn.Linear(3, 2).eval(), (torch.randn(1, 3),))
    torch.export.save(program, str(tmp_path / "mlp.pt2"))
    result = run_lower(["mlp.pt2", "--target=aten", "--report=r.json"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ops"]["recurrent_layers"] == []
    assert report["warnings"] == ["no recurrent layer in the model: written unchanged"]
