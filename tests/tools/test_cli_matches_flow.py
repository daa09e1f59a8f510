"""`//tools:lower` and `flow.lower` are one lowering: the same model and options give the
same TOSA bytes (the Bazel rule runs the command line; tests/consumer_check compares its
.tosa with flow.lower's). Includes the streaming two-layer ReLU RNN whose state the command
line once quantized apart from the API (and at -5.4 dB)."""

from __future__ import annotations

import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.exported import as_module
from recurrent_lowering.examples import models
from recurrent_lowering.tests.tools.cli import run_lower
from recurrent_lowering.tests.tools.relu_rnn import save as _relu_rnn

CASES = [  # (model, target, CLI flags = flow.lower keywords)
    ("relu_rnn", "ethos-u55-128", {"quantization": "int8"}),
    ("relu_rnn", "ethos-u55-128", {}),
    ("tiny_gru", "ethos-u85-256", {}),
    ("tiny_lstm", "ethos-u55-128", {"emission": "loop", "quantization": "int16"}),
    ("stream_gru", "TOSA-1.0+INT", {"quantization": "int16_state"}),
    ("tiny_rnn", "ethos-u55-128", {"recurrent_weight_bits": 6}),
]


@pytest.mark.parametrize("name, target, options", CASES)
def test_same_tosa_bytes(tmp_path, name, target, options):
    if name == "relu_rnn":
        model = str(_relu_rnn(tmp_path / "relu_rnn.pt2"))
        ep = torch.export.load(model)
        module, inputs = as_module(ep), ep.example_inputs[0]
    else:
        model = name
        module, inputs = models.build(name)
    flags = [f"--{k}={v}" for k, v in options.items()]
    cli = run_lower([model, "--target", target, "--tosa_output", "cli.tosa", *flags], str(tmp_path))
    assert cli.returncode == 0, cli.stderr[-2000:]
    result = flow.lower(module, inputs, target, tmp_path / "flow", **options)
    assert (tmp_path / "cli.tosa").read_bytes() == result.tosa_files[0].read_bytes()
