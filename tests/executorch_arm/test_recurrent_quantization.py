"""quantization.states: h_n shares h0's quantization, so a streaming model fed its own state
requantizes nothing; int16 activations keep stream_gru's state above 30 dB SQNR over 200
closed-loop frames on the TOSA reference model (the doc's figure is over 1000); a stack's
states (a concat of its layers' final states) keep their values."""

import numpy as np
import torch
from executorch.backends.arm.tosa import TosaSpecification
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from torch import nn

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.options import Options
from recurrent_lowering.backends.executorch_arm.plan import ArmPlan
from recurrent_lowering.backends.executorch_arm.quantization import quantizer
from recurrent_lowering.backends.executorch_arm.quantization import states as rq
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics, metrics, streaming


class StreamLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 8, batch_first=True)

    def forward(self, x, h0, c0):
        y, (h, c) = self.rnn(x, (h0, c0))
        return y, h, c


def _graph(module, inputs):
    return torch.export.export(module, inputs).module(check_guards=False).graph


def test_state_pairs_gru_and_lstm():
    module, inputs = models.build("stream_gru")
    assert rq.state_pairs(_graph(module, inputs)) == [("h0", 1)]
    lstm_inputs = (torch.randn(1, 2, 4), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8))
    assert rq.state_pairs(_graph(StreamLSTM().eval(), lstm_inputs)) == [("h0", 1), ("c0", 2)]


def _state_qparams(share_state: bool):
    """(q params of h0 as quantized at the input, of h_n as dequantized at the output)."""
    module, inputs = models.build("stream_gru")
    spec = TosaCompileSpec(TosaSpecification.create_from_string("TOSA-1.0+INT"))
    calibration = streaming.fp32_states(
        module, streaming.frames(16, inputs[0].shape, seed=1), inputs[1]
    )
    converted = flow.quantize(
        module,
        inputs,
        quantizer.create(spec, ArmPlan("TOSA-1.0+INT", share_state=share_state)),
        calibration,
    )
    graph = converted.graph
    (h0,) = [n for n in graph.find_nodes(op="placeholder") if n.name == "h0"]
    (q_in,) = h0.users
    dq_out = graph.output_node().args[0][1]
    assert "dequantize_per_tensor" in str(dq_out.target)
    return tuple(q_in.args[1:6]), tuple(dq_out.args[1:6])


def test_h_n_shares_h0_qparams_only_when_shared():
    h0_params, h_n_params = _state_qparams(share_state=True)
    assert h0_params == h_n_params
    h0_params, h_n_params = _state_qparams(share_state=False)
    assert h0_params != h_n_params  # the plain Arm quantizer observes them separately


def test_stream_gru_int16_closed_loop_above_30db(tmp_path):
    module, inputs = models.build("stream_gru")
    h0 = torch.zeros(inputs[1].shape)
    calibration = streaming.fp32_states(module, streaming.frames(128, inputs[0].shape, seed=1), h0)
    result = flow.lower(
        module,
        inputs,
        "TOSA-1.0+INT",
        artifact_dir=tmp_path,
        calibration_inputs=calibration,
        quantization="int16",
    )
    assert result.num_delegates == 1 and result.cpu_nodes == 4  # q x, q h0, dq score, dq h_n
    state_in = result.input_quant[result.input_map.index(1)]
    state_out = result.output_quant[result.output_map[1]]
    assert state_in == state_out and state_in.dtype == "int16"

    loop = streaming.run_closed_loop(
        result, module, streaming.frames(200, inputs[0].shape, seed=2), h0
    )
    print(f"int16 state SQNR over 200 frames: min {loop.min_state_sqnr_db:.1f} dB")
    assert loop.requantized == 0
    assert loop.min_state_sqnr_db > 30
    # no drift: the last frames are as good as the first ones
    assert np.median(loop.state_sqnr_db[-50:]) > np.median(loop.state_sqnr_db[:50]) - 1.0


class StreamingReluRnn(nn.Module):
    """Two ReLU RNN layers in a stream: h_n is the concat of both layers' final states,
    which the Arm quantizer ties to its inputs (its TOSA CONCAT does not rescale)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.RNN(40, 32, num_layers=2, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x, h):
        y, h = self.rnn(torch.relu(x), h)
        return torch.sigmoid(self.head(y)), h


def test_a_stacks_state_keeps_its_values(tmp_path):
    """The two layers' states are quantized each on its own (quantization/state_parts.py),
    each layer's h_n at its h0's parameters. Measured: 40.3 dB for the state in int8 with
    one scale for both (-5.4 dB when h_n was given h0's qparams over the concat's own, which
    shifted every state code by the zero points' difference)."""
    module = StreamingReluRnn().eval()
    inputs = (torch.randn(1, 1, 40), torch.zeros(2, 1, 32))
    result = flow.lower(
        module, inputs, Options("ethos-u55-128", quantization="int8"), tmp_path, run_vela=False
    )
    assert result.state_pairs == [("h", 1)]
    (boundary,) = result.boundaries.values()
    key = lambda q: (q.scale, q.zero_point)  # noqa: E731
    parts_in = sorted((v.quant for v in boundary.inputs if 32 in v.shape), key=key)
    parts_out = sorted((v.quant for v in boundary.outputs if 32 in v.shape), key=key)
    assert len(parts_in) == 2 and parts_in == parts_out, (boundary.inputs, boundary.outputs)
    numerics = arm_numerics.check(result, module, inputs)
    state = metrics.sqnr_db(numerics.reference[1].ravel(), numerics.tosa[1].ravel())
    assert state > 35
