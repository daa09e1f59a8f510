"""Inputs generated for an .onnx model without --calibration (tools.lowering.onnx_inputs):
what the graph fixes, then sizes onnxruntime takes for what it does not."""

from __future__ import annotations

import numpy as np

from recurrent_lowering.tests.onnx import models
from recurrent_lowering.tools.lowering import onnx_inputs


def test_open_dimension_grows_until_onnxruntime_takes_it():
    """Reflect-padding 20 needs more than 20 samples: 1 and 16 are refused."""
    generated = onnx_inputs.generate(models.reflect_pad(20))
    assert generated.refused is None
    assert generated.feeds["x"].shape == (1, 64)
    assert generated.chosen == ["x[1]=64 (nothing fixes it; onnxruntime takes it)"]


def test_inputs_nothing_can_satisfy_are_reported_with_onnxruntime_s_reason():
    generated = onnx_inputs.generate(models.reflect_pad(10**6))
    assert generated.feeds["x"].shape == (1, 1)  # the plainest sizes, for the message
    assert generated.refused and "Pad" in generated.refused


def test_floats_are_random_and_repeatable():
    first = onnx_inputs.generate(models.reflect_pad(20), seed=3).feeds["x"]
    again = onnx_inputs.generate(models.reflect_pad(20), seed=3).feeds["x"]
    np.testing.assert_array_equal(first, again)
    assert np.abs(first).max() <= 1 and np.std(first) > 0.1
