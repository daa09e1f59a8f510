"""The bundled benchmark models: shapes, parameter init and determinism."""

import pytest
import torch

from recurrent_lowering.examples import models


@pytest.mark.parametrize("name", ["gru_a", "lstm_a", "rnn_tanh_a", "bigru2", "tiny_gru"])
def test_rnn_head_shapes_and_init(name):
    spec = models.MODELS[name]
    module, (x,) = models.build(name)
    assert x.shape == (1, spec.seq_len, spec.input_size)
    with torch.no_grad():
        y = module(x)
    assert y.shape == (1, spec.seq_len, 1)
    assert torch.all((y > 0) & (y < 1))  # sigmoid
    params = torch.cat([p.reshape(-1) for p in module.parameters()])
    assert params.abs().max() <= 0.2 and params.abs().max() > 0.19
    assert module.rnn.batch_first and module.rnn.num_layers == spec.layers
    assert module.rnn.bidirectional == spec.bidirectional
    assert module.head.in_features == spec.hidden_size * (2 if spec.bidirectional else 1)


def test_gru_a_parameter_count():
    module, _ = models.build("gru_a")
    # GRU: 3H(I + H) weights + 2 * 3H biases; head H + 1
    expected = 3 * 128 * (64 + 128) + 2 * 3 * 128 + 128 + 1
    assert sum(p.numel() for p in module.parameters()) == expected


def test_rnn_tanh_uses_tanh():
    module, _ = models.build("rnn_tanh_a")
    assert isinstance(module.rnn, torch.nn.RNN) and module.rnn.nonlinearity == "tanh"


def test_stream_gru_is_one_step_with_state():
    module, (x, h0) = models.build("stream_gru")
    assert x.shape == (1, 1, 64) and h0.shape == (1, 1, 128)
    with torch.no_grad():
        score, h1 = module(x, h0)
        _, h_ref = module.rnn(x, h0)
    assert score.shape == (1, 1, 1) and torch.equal(h1, h_ref)
    assert not torch.equal(h1, module.rnn(x)[1])  # h0 is used


def test_build_is_deterministic():
    a, (xa,) = models.build("tiny_gru")
    b, (xb,) = models.build("tiny_gru")
    assert torch.equal(xa, xb)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_unknown_model_lists_known_ones():
    with pytest.raises(KeyError, match="gru_a"):
        models.build("gru_z")
