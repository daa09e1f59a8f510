"""silero-vad's shipped ONNX models after rewriting: same outputs over a stream of frames.

Its LSTMs sit inside (nested) If branches with weights sliced from outer-scope Constants,
and the streaming state is fed back frame to frame, so errors would accumulate.
"""

import importlib.resources

import numpy as np
import onnx
import pytest

from recurrent_lowering.backends.onnx.rewrite import count_recurrent_nodes, rewrite_model

from .ort_util import assert_close, check_rewritten, session

FRAMES = 20


def _model(filename):
    path = importlib.resources.files("silero_vad") / "data" / filename
    with importlib.resources.as_file(path) as p:
        return onnx.load(str(p))


def _stream(sess, sr, samples, inputs, state_shape):
    rng = np.random.default_rng(sr)
    state = np.zeros(state_shape, np.float32)
    outs = []
    for _ in range(FRAMES):
        audio = (0.3 * rng.standard_normal((1, samples))).astype(np.float32)
        feeds = {"input": audio, "state": state}
        if "sr" in inputs:
            feeds["sr"] = np.array(sr, np.int64)
        prob, state = sess.run(None, feeds)
        outs.append((prob, state))
    return outs


@pytest.mark.parametrize(
    "filename,sr,samples",
    [
        ("silero_vad.onnx", 16000, 512),
        ("silero_vad.onnx", 8000, 256),
        ("silero_vad_16k_op15.onnx", 16000, 512),
        ("silero_vad_half.onnx", 16000, 512),
    ],
)
def test_streaming_matches_original(filename, sr, samples):
    original = _model(filename)
    assert count_recurrent_nodes(original) > 0
    rewritten = rewrite_model(original)
    check_rewritten(rewritten)
    inputs = {i.name for i in original.graph.input}
    want = _stream(session(original), sr, samples, inputs, (2, 1, 128))
    got = _stream(session(rewritten), sr, samples, inputs, (2, 1, 128))
    # the stream exercises the LSTM: its state moves from frame to frame
    assert np.abs(want[-1][1]).max() > 0.1
    assert np.abs(want[-1][1] - want[-2][1]).max() > 1e-3
    for (gp, gs), (wp, ws) in zip(got, want):
        assert_close(gp, wp)
        assert_close(gs, ws)


def test_sequence_model_with_dynamic_length_uses_scan():
    """silero_vad_16k_sequence.onnx has a dynamic time axis: auto picks Scan."""
    original = _model("silero_vad_16k_sequence.onnx")
    rewritten = rewrite_model(original)
    check_rewritten(rewritten)
    assert any(n.op_type == "Scan" for n in rewritten.graph.node)
    rng = np.random.default_rng(1)
    feeds = {
        "input": (0.3 * rng.standard_normal((7, 576))).astype(np.float32),
        "h": np.zeros((1, 1, 128), np.float32),
        "c": np.zeros((1, 1, 128), np.float32),
    }
    for g, w in zip(session(rewritten).run(None, feeds), session(original).run(None, feeds)):
        assert_close(g, w)
