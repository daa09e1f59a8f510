"""`lower MODEL --target onnx` and nothing else, on pretrained models: exit 0, the report
says which input sizes its own check used, and the rewritten model matches the original in
onnxruntime on inputs this test chooses, streaming state fed back from call to call."""

from __future__ import annotations

import importlib.resources
import os
import pathlib
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from recurrent_lowering.tests.tools.cli import run_lower

CHUNKS = 3  # calls of a stream, each fed the state the previous one returned


def _madmom(relative: str) -> pathlib.Path:
    return pathlib.Path(os.environ["TEST_SRCDIR"], "madmom_models", relative)


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _lower(tmp_path, source: pathlib.Path) -> tuple[pathlib.Path, str]:
    shutil.copy(source, tmp_path / source.name)
    result = run_lower([source.name, "--target", "onnx"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    rewritten = tmp_path / f"{source.stem}.rewritten.onnx"
    recurrent = {"GRU", "LSTM", "RNN"}
    assert not any(n.op_type in recurrent for n in onnx.load(str(rewritten)).graph.node)
    return rewritten, result.stdout


def _assert_streams_match(original, rewritten, inputs, state: dict) -> None:
    """`inputs(rng)`: one call's feeds besides the state; the state starts as `state` and
    is then what the previous call returned (outputs[1:], in the order of `state`)."""
    want, got = _session(original), _session(rewritten)
    state_want, state_got = dict(state), dict(state)
    rng = np.random.default_rng(0)
    for _ in range(CHUNKS):
        feeds = inputs(rng)
        out_want = want.run(None, {**feeds, **state_want})
        out_got = got.run(None, {**feeds, **state_got})
        for w, g in zip(out_want, out_got, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
        state_want = dict(zip(state, out_want[1:], strict=True))
        state_got = dict(zip(state, out_got[1:], strict=True))
    assert any(np.abs(s).max() > 0.05 for s in state_want.values()), "state never moved"


@pytest.mark.parametrize(
    "relative,features",
    [
        ("beats/2015/beats_blstm_1.onnx", 266),  # peephole BLSTM, 3 layers
        ("downbeats/2016/downbeats_bgru_harmonic_0.onnx", 24),  # BGRU
        ("onsets/2013/onsets_brnn_1.onnx", 266),  # bidirectional tanh RNN
    ],
)
def test_madmom(tmp_path, relative, features):
    source = _madmom(relative)
    rewritten, summary = _lower(tmp_path, source)
    # input is [time, features], both dynamic: the features come from the first layer's W
    assert f"input[1]={features} (the input size of" in summary
    assert "input[0]=16 (the time axis of" in summary
    states = [i.name for i in onnx.load(str(source)).graph.input[1:]]

    def inputs(rng):
        return {"input": rng.uniform(0, 1, (40, features)).astype(np.float32)}

    _assert_streams_match(source, rewritten, inputs, {s: np.zeros(25, np.float32) for s in states})


@pytest.mark.parametrize("sr,samples", [(16000, 512), (8000, 256)])
def test_silero_vad(tmp_path, sr, samples):
    data = importlib.resources.files("silero_vad") / "data" / "silero_vad.onnx"
    with importlib.resources.as_file(data) as source:
        rewritten, summary = _lower(tmp_path, source)
        assert "sr=16000 (the value" in summary  # the model compares sr with 16000

        def inputs(rng):
            audio = (0.3 * rng.standard_normal((1, samples))).astype(np.float32)
            return {"input": audio, "sr": np.array(sr, np.int64)}

        state = {"state": np.zeros((2, 1, 128), np.float32)}
        _assert_streams_match(source, rewritten, inputs, state)
