"""Recurrent weights at fewer bits (flow.lower(recurrent_weight_bits=...), weight_precision):
only the weights every step reads are narrowed, in both emission forms, the TOSA given to
Vela holds them in the narrow range (4 bits: as TOSA INT4), and the lowered model still
matches fp32 torch eager on the TOSA reference model."""

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.options import Options
from recurrent_lowering.backends.executorch_arm.precision.candidates import candidates
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics, tosa_flatbuffer

INPUT, HIDDEN = 6, 8


def _model(kind="gru", T=10, **kwargs):
    torch.manual_seed(0)
    module = models.RNNHead(kind, INPUT, HIDDEN).eval()
    if kwargs:  # e.g. an LSTM with proj_size
        module.rnn = torch.nn.LSTM(INPUT, HIDDEN, batch_first=True, **kwargs)
        module.head = torch.nn.Linear(kwargs["proj_size"], 1)
    return module, (torch.randn(1, T, INPUT),)


def _conv_weights(tosa) -> list:
    """(input channels, TOSA type, values) of every CONV2D weight."""
    out = []
    for info in tosa_flatbuffer.op_inputs(tosa, "CONV2D", 1):
        values = tosa_flatbuffer.constant_values(tosa, info.name)
        out.append((info.shape[-1], info.tosa_dtype, values))
    return out


@pytest.mark.parametrize("emission", ["loop", "unrolled"])
def test_4_bit_recurrent_weights_are_int4_on_ethos_u55(emission, tmp_path):
    module, inputs = _model()
    result = flow.lower(
        module, inputs, "ethos-u55-128", tmp_path, emission=emission, recurrent_weight_bits=4
    )
    weights = _conv_weights(result.tosa_files[0])
    recurrent = [w for w in weights if w[0] == HIDDEN and w[2].shape[0] == 3 * HIDDEN]
    assert len(recurrent) == 9  # one product a step; the first step's h0 is zero
    for _, dtype, values in recurrent:
        assert dtype == "INT4" and values.min() == -7 and values.max() == 7
    projection = [w for w in weights if w[0] == INPUT]
    assert [(d, v.max()) for _, d, v in projection] == [("INT8", 127)]  # the model's int8
    assert result.vela is not None
    assert arm_numerics.check(result, module, inputs).sqnr_db > 30


def test_6_bit_weights_include_an_lstm_projection(tmp_path):
    module, inputs = _model("lstm", T=5, proj_size=4)
    result = flow.lower(
        module, inputs, "TOSA-1.0+INT", tmp_path, emission="unrolled", recurrent_weight_bits=6
    )
    weights = _conv_weights(result.tosa_files[0])
    narrow = [(c, v) for c, _, v in weights if np.abs(v).max() <= 31]
    # per step: R ([4H, P], P = 4 input channels) and the projection ([P, H]); the first
    # step skips R (h0 = 0) but projects
    assert sorted(c for c, _ in narrow) == [4] * 4 + [HIDDEN] * 5
    assert all(np.abs(v).max() == 31 for _, v in narrow)
    wide = [c for c, _, v in weights if np.abs(v).max() > 31]
    assert sorted(wide) == [4, INPUT]  # the head and the input projection keep 8 bits
    assert arm_numerics.check(result, module, inputs).sqnr_db > 30


def test_bad_requests_are_refused(tmp_path):
    module, inputs = _model(T=3)
    with pytest.raises(ValueError, match="need int8 activations"):
        flow.lower(
            module,
            inputs,
            "ethos-u55-128",
            tmp_path,
            recurrent_weight_bits=4,
            quantization="int16_state",
        )
    with pytest.raises(ValueError, match="ExecuTorch's own recurrent decomposition takes none"):
        flow.lower(
            module,
            inputs,
            "ethos-u55-128",
            tmp_path,
            decomposition="executorch",
            recurrent_weight_bits=6,
        )
    with pytest.raises(ValueError, match=r"must be one of 4, 5, 6, 7, 8: 3"):
        flow.lower(module, inputs, "ethos-u55-128", tmp_path, recurrent_weight_bits=3)


def test_a_tosa_target_gets_the_extensions_its_bits_need():
    module, inputs = _model(T=3)
    (plan,) = candidates(Options("TOSA-1.0+INT", recurrent_weight_bits=4), module, inputs)
    assert plan.target == "TOSA-1.0+INT+int4"
    (plan,) = candidates(Options("TOSA-1.0+INT", quantization="int16_state"), module, inputs)
    assert plan.target == "TOSA-1.0+INT+int16" and plan.state_bits == 16
