"""RecurrentStateQuantizer: h_n shares h0's quantization, so a streaming model fed its own
state requantizes nothing; int16 activations keep stream_gru's state above 30 dB SQNR over
200 closed-loop frames on the TOSA reference model (the doc's figure is over 1000)."""

import numpy as np
import torch
from executorch.backends.arm.tosa import TosaSpecification
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from torch import nn

from recurrent_lowering.backends.executorch_arm import arm_hooks, flow, streaming
from recurrent_lowering.backends.executorch_arm import recurrent_quantization as rq
from recurrent_lowering.examples import models


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
        spec,
        calibration,
        quantizer_factory=arm_hooks.quantizer_factory(share_state=share_state),
    )
    graph = converted.graph
    (h0,) = [n for n in graph.find_nodes(op="placeholder") if n.name == "h0"]
    (q_in,) = h0.users
    dq_out = graph.output_node().args[0][1]
    assert "dequantize_per_tensor" in str(dq_out.target)
    return tuple(q_in.args[1:6]), tuple(dq_out.args[1:6])


def test_h_n_shares_h0_qparams_only_with_the_wrapper():
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
        "TOSA-1.0+INT+int16",
        artifact_dir=tmp_path,
        calibration_inputs=calibration,
        quantizer_factory=arm_hooks.quantizer_factory(),
        partitioner_factory=arm_hooks.create_partitioner,
        activations="int16",
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
