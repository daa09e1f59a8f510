"""`lower MODEL.onnx --target onnx` on the onnx package's own GRU/LSTM/RNN node-test models,
portable and tuned for onnxruntime: the written file has no recurrent node and onnxruntime
gives the test's expected outputs. The input file is never modified, and an output naming
the input is refused."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.backend.test.case.node import collect_testcases

from recurrent_lowering.tests.tools.cli import run_lower

RECURRENT = {"GRU", "LSTM", "RNN"}
CASES = [
    c for c in collect_testcases(None) if any(n.op_type in RECURRENT for n in c.model.graph.node)
]


def test_cases_were_collected():
    assert len(CASES) >= 12, [c.name for c in CASES]


@pytest.mark.parametrize("tune_for", ["portable", "onnxruntime"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case_through_cli(tmp_path, case, tune_for):
    source = tmp_path / f"{case.name}.onnx"
    onnx.save(case.model, str(source))
    digest = hashlib.sha256(source.read_bytes()).hexdigest()

    args = [source.name, "--target=onnx", f"--onnx_tune_for={tune_for}", "--report=r.json"]
    result = run_lower(args, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert hashlib.sha256(source.read_bytes()).hexdigest() == digest, "input file modified"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rewrite"] == {"tune_for": tune_for, "replaced": 1}
    # onnxruntime refuses layout=1 nodes: the check has no reference, and says so
    unchecked = [w for w in report["warnings"] if w.startswith("numerics not checked")]
    batchwise = any(a.name == "layout" and a.i == 1 for a in case.model.graph.node[0].attribute)
    assert (report["numerics"]["sqnr_db"] is None) == batchwise == bool(unchecked), unchecked

    rewritten = onnx.load(str(tmp_path / f"{case.name}.rewritten.onnx"))
    assert not [n.op_type for n in rewritten.graph.node if n.op_type in RECURRENT]
    if tune_for == "portable":  # node tests have static lengths: unrolled
        assert not any(n.op_type == "Scan" for n in rewritten.graph.node)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(rewritten.SerializeToString(), options)
    names = [i.name for i in rewritten.graph.input]
    for inputs, expected in case.data_sets:
        outputs = session.run(None, dict(zip(names, inputs)))
        for want, got in zip(expected, outputs):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_output_naming_the_input_is_refused(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(CASES[0].model, str(source))
    before = source.read_bytes()
    result = run_lower(["m.onnx", "--target=onnx", "--output=m.onnx"], str(tmp_path))
    assert result.returncode != 0
    assert "would overwrite the input model" in result.stderr
    assert source.read_bytes() == before


def test_onnx_tuning_is_refused_for_other_targets(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(CASES[0].model, str(source))
    result = run_lower(
        ["m.onnx", "--target=TOSA-1.0+FP", "--onnx_tune_for=onnxruntime"], str(tmp_path)
    )
    assert result.returncode != 0
    assert "applies to --target onnx, not TOSA-1.0+FP" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("flag,reader_name", [("onnxruntime", "onnxruntime"), ("spec", "onnx")])
def test_activation_defaults_flag(tmp_path, flag, reader_name):
    """Affine without alpha/beta: the ONNX spec says (1, 0), onnxruntime uses (0, 0); the CLI
    writes what rewrite_model gives with the reader's name for that choice."""
    from recurrent_lowering.backends.onnx import rewrite
    from recurrent_lowering.tests.onnx import models

    cfg = models.Config(op="RNN", activations=["Affine"])
    model, feeds = models.build(cfg)
    onnx.save(model, str(tmp_path / "m.onnx"))
    result = run_lower(
        ["m.onnx", "--target=onnx", f"--onnx_activation_defaults={flag}"], str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = rewrite.rewrite_model(model, activation_defaults=reader_name)
    got = ort.InferenceSession(str(tmp_path / "m.rewritten.onnx")).run(None, feeds)
    want = ort.InferenceSession(expected.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
    if flag == "spec":  # the spec's alpha = 1 passes the pre-activation through: not zero
        assert np.abs(got[0]).max() > 0.01


def test_calibration_inputs_drive_the_numerics_check(tmp_path):
    """--calibration on --target onnx: the numerics check runs on the user's arrays (here
    seven steps of a model with a dynamic length) instead of random inputs."""
    from recurrent_lowering.tests.onnx import models

    model, _ = models.build(models.Config(op="LSTM", dynamic_steps=True))
    onnx.save(model, str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "c.npz", X=rng.standard_normal((7, 2, 3)).astype(np.float32))
    args = ["m.onnx", "--target=onnx", "--calibration=c.npz", "--report=r.json"]
    result = run_lower(args, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    numerics = json.loads((tmp_path / "r.json").read_text())["numerics"]
    assert numerics["inputs"] == "--calibration"
    assert numerics["reference"] == "onnxruntime on the input model"
    assert numerics["max_abs_err"] <= 1e-5


def test_samples_of_several_lengths_are_each_checked_in_loop_form(tmp_path):
    """A dynamic length in loop form takes any length, as onnxruntime does: --calibration
    samples of 7 and 4 steps are each checked; --emission unrolled, which writes one length,
    refuses them naming the two samples."""
    from recurrent_lowering.tests.onnx import models

    model, _ = models.build(models.Config(op="GRU", dynamic_steps=True))
    onnx.save(model, str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(3)
    for name, steps in (("a", 7), ("b", 4)):
        np.savez(tmp_path / f"{name}.npz", X=rng.standard_normal((steps, 2, 3)).astype(np.float32))
    args = ["m.onnx", "--target=onnx", "--calibration=a.npz,b.npz"]
    result = run_lower([*args, "--report=r.json", "--output=l.onnx"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    numerics = json.loads((tmp_path / "r.json").read_text())["numerics"]
    assert numerics["samples"] == {"calibration": 0, "evaluation": 2}
    assert numerics["max_abs_err"] <= 1e-5
    x = np.load(tmp_path / "b.npz")["X"]
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"X": x})
    got = ort.InferenceSession(str(tmp_path / "l.onnx")).run(None, {"X": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    refused = run_lower([*args, "--emission=unrolled"], str(tmp_path))
    assert refused.returncode == 1
    assert "b.npz: sample 0 has shapes [[4, 2, 3]]" in refused.stderr
    assert "--emission unrolled writes one sequence length" in refused.stderr


def test_calibration_fixes_the_lengths_an_unrolled_rewrite_needs(tmp_path):
    """--emission unrolled of a dynamic length: the --calibration shapes fix it (the
    rewritten model then takes those shapes only, and says so); without them it is refused."""
    from recurrent_lowering.tests.onnx import models

    model, _ = models.build(models.Config(op="GRU", dynamic_steps=True))
    onnx.save(model, str(tmp_path / "m.onnx"))
    refused = run_lower(["m.onnx", "--target=onnx", "--emission=unrolled"], str(tmp_path))
    assert refused.returncode == 1 and "unrolling needs a static sequence length" in refused.stderr
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "c.npz", X=rng.standard_normal((7, 2, 3)).astype(np.float32))
    args = ["m.onnx", "--target=onnx", "--calibration=c.npz", "--emission=unrolled"]
    result = run_lower([*args, "--report=r.json", "--output=u.onnx"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["warnings"] == [
        "--emission unrolled: the rewritten model takes the --calibration shapes only "
        "(X [7, 2, 3]), which fix its sequence lengths"
    ]
    assert report["numerics"]["max_abs_err"] <= 1e-5
    ops = {n.op_type for n in onnx.load(str(tmp_path / "u.onnx")).graph.node}
    assert not ops & {"GRU", "Scan", "Loop"}  # unrolled


def test_an_unrolled_rewrite_fixes_the_integer_inputs_that_pick_a_branch(tmp_path):
    """silero-vad's LSTM sits in an If on its sample-rate input, where no input shape reaches
    it: --calibration's sr makes the If fold (as on the NPU targets), the LSTM unrolls, and
    the rewritten model takes the float inputs only, and says so."""
    import importlib.resources

    path = importlib.resources.files("silero_vad") / "data" / "silero_vad.onnx"
    with importlib.resources.as_file(path) as p:
        onnx.save(onnx.load(str(p)), str(tmp_path / "vad.onnx"))
    rng = np.random.default_rng(2)
    audio = (0.3 * rng.standard_normal((1, 576))).astype(np.float32)
    state = (0.1 * rng.standard_normal((2, 1, 128))).astype(np.float32)
    sr = np.array(16000, np.int64)
    np.savez(tmp_path / "c.npz", input=audio, state=state, sr=sr)
    args = ["vad.onnx", "--target=onnx", "--calibration=c.npz", "--emission=unrolled"]
    result = run_lower([*args, "--report=r.json", "--output=u.onnx"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["warnings"][0] == (
        "integer inputs fixed to their values in the numerics inputs (sr = 16000): the "
        "rewritten model takes the float inputs only"
    )
    rewritten = onnx.load(str(tmp_path / "u.onnx"))
    assert not {n.op_type for n in rewritten.graph.node} & {"LSTM", "If", "Scan", "Loop"}
    assert [i.name for i in rewritten.graph.input] == ["input", "state"]
    want = ort.InferenceSession(str(tmp_path / "vad.onnx")).run(
        None, {"input": audio, "state": state, "sr": sr}
    )
    got = ort.InferenceSession(rewritten.SerializeToString()).run(
        None, {"input": audio, "state": state}
    )
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)
    assert report["numerics"]["max_abs_err"] <= 1e-5


def test_generated_inputs_say_what_they_are(tmp_path):
    """No --calibration: the dynamic length gets the default time steps, sequence_lens the
    full length, and the report says so and gives the shapes its check used."""
    from recurrent_lowering.tests.onnx import models

    cfg = models.Config(op="GRU", dynamic_steps=True, sequence_lens="input")
    onnx.save(models.build(cfg)[0], str(tmp_path / "m.onnx"))
    result = run_lower(["m.onnx", "--target=onnx", "--report=r.json"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rewrite"]["replaced"] == 1
    assert report["warnings"] == [
        "no --calibration: inputs generated with X[0]=16 (the time axis of rec); "
        "sequence_lens=16 (the full length of rec) (pass --calibration to choose)"
    ]
    assert report["numerics"]["inputs"] == "generated"
    assert report["numerics"]["input_shapes"] == {"X": [16, 2, 3], "sequence_lens": [2]}
    assert report["numerics"]["max_abs_err"] <= 1e-5


def test_calibration_the_input_model_refuses_is_an_error(tmp_path):
    """Lengths beyond T: onnxruntime refuses them on the input model (which runs on other
    inputs), so the check did not happen; it used to pass as 'refused the input model'."""
    from recurrent_lowering.tests.onnx import models

    cfg = models.Config(op="GRU", sequence_lens="input")
    model, feeds = models.build(cfg)
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "c.npz", **{**feeds, "sequence_lens": np.full(2, 9, np.int32)})
    result = run_lower(["m.onnx", "--target=onnx", "--calibration=c.npz"], str(tmp_path))
    assert result.returncode != 0
    assert "lower: error: onnxruntime refuses the input model on --calibration:" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "m.onnx"]


def test_model_without_recurrent_nodes_is_written_unchanged_with_a_warning(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph), str(tmp_path / "m.onnx"))
    result = run_lower(["m.onnx", "--target=onnx", "--report=r.json"], str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rewrite"]["replaced"] == 0
    assert "no GRU/LSTM/RNN node in the model: written unchanged" in report["warnings"]
