"""TOSA reference runner on small committed graphs (seeded Linear(4, 3) + tanh lowered by
ExecuTorch, see testdata/make_tosa_samples.py), checked against torch eager."""

import contextlib
import ctypes
import json
import os
import pathlib
import struct

import numpy as np
import pytest
import torch

from recurrent_lowering.runtime import (
    reference_process,
    tosa_flatbuffer,
    tosa_pieces,
    tosa_reference,
)
from recurrent_lowering.runtime.quantization import QuantParams

DATA = pathlib.Path(__file__).parent / "testdata"
FP = DATA / "linear_tanh_fp.tosa"
INT = DATA / "linear_tanh_int.tosa"


def _sample():
    """(module, calibration input) exactly as make_tosa_samples.sample_module builds them."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    return module, torch.randn(2, 4).numpy()


def _eager(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return _sample()[0](torch.from_numpy(x)).numpy()


def _quant():
    q = json.loads((DATA / "linear_tanh_int.quant.json").read_text())
    return [QuantParams(**p) for p in q["input"]], [QuantParams(**p) for p in q["output"]]


def _x(scale=1.0):
    """The calibration input (the INT graph's input range covers it), scaled."""
    return (_sample()[1] * scale).astype(np.float32)


def test_graph_io_and_op_counts():
    (inp,), (out,) = tosa_flatbuffer.graph_io(INT)
    assert (inp.shape, inp.tosa_dtype, out.shape, out.tosa_dtype) == (
        (2, 4),
        "INT8",
        (2, 3),
        "INT8",
    )
    (fp_in,), _ = tosa_flatbuffer.graph_io(FP)
    assert fp_in.tosa_dtype == "FP32" and fp_in.numpy_dtype == np.float32
    counts = tosa_flatbuffer.op_counts(INT)
    assert counts["TABLE"] == 1  # int8 tanh is a lookup table
    assert tosa_flatbuffer.count_ops(INT) == sum(counts.values())
    assert tosa_flatbuffer.count_ops(INT, include_constants=False) < sum(counts.values())


def test_fp_graph_matches_eager():
    x = _x()
    (y,) = tosa_reference.run(FP, [x])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, _eager(x), atol=1e-5)


def test_int_graph_with_float_io():
    x = _x()
    in_q, out_q = _quant()
    (y,) = tosa_reference.run(INT, [x], input_quant=in_q, output_quant=out_q)
    ref = _eager(x)
    # one int8 output step is 0.0054: allow two steps plus input rounding
    assert np.max(np.abs(y - ref)) < 3 * out_q[0].scale


def test_int_graph_with_integer_io_is_the_same():
    x = _x(0.5)
    in_q, out_q = _quant()
    (q,) = tosa_reference.run(INT, [in_q[0].quantize(x)])
    assert q.dtype == np.int8
    (y,) = tosa_reference.run(INT.read_bytes(), [x], input_quant=in_q, output_quant=out_q)
    np.testing.assert_array_equal(out_q[0].dequantize(q), y)


def test_quant_params_round_trip_and_clamp():
    q = QuantParams(0.5, 3, -128, 127, "int8")
    x = np.array([0.0, 1.0, -2.5, 1000.0], dtype=np.float32)
    np.testing.assert_array_equal(q.quantize(x), np.array([3, 5, -2, 127], dtype=np.int8))
    np.testing.assert_allclose(q.dequantize(q.quantize(x))[:3], x[:3])


def test_input_errors_name_the_tensor():
    with pytest.raises(ValueError, match="takes 1 inputs"):
        tosa_reference.run(FP, [_x(), _x()])
    with pytest.raises(ValueError, match=r"shape \(4, 2\) does not match"):
        tosa_reference.run(FP, [_x().T.copy()])
    with pytest.raises(ValueError, match="INT8 but a float array was given"):
        tosa_reference.run(INT, [_x()])
    with pytest.raises(ValueError, match="out of range for INT8"):
        tosa_reference.run(INT, [np.full((2, 4), 300, dtype=np.int32)])


@pytest.mark.parametrize("path", [FP, INT], ids=["fp", "int"])
def test_a_graph_run_in_pieces_gives_the_same_outputs_bit_for_bit(path):
    """One operator a piece: every tensor between two operators crosses a cut."""
    pieces = tosa_pieces.split(path.read_bytes(), max_ops=1)
    compute = tosa_flatbuffer.count_ops(path, include_constants=False)
    assert pieces is not None and len(pieces.graphs) == compute > 2
    x = _x() if path == FP else _quant()[0][0].quantize(_x())
    (whole,) = tosa_reference.run(path, [x])
    (parts,) = tosa_reference.run(path, [x], piece_ops=1)
    assert whole.dtype == parts.dtype
    np.testing.assert_array_equal(parts, whole)
    if path == FP:
        np.testing.assert_allclose(parts, _eager(x), atol=1e-5)


def _with_constant_output() -> bytes:
    """tanh(tanh(x)) and an output a CONST writes (as ExecuTorch writes a delegate output it
    folded from a view of a constant, `..._fused_const`)."""
    import tosa_serializer as ts

    graph = ts.TosaSerializer("")
    block = graph.currRegion.currBasicBlock
    block.addTensor("x", [2, 4], ts.DType.FP32)
    block.addInput("x")

    def attribute(kind):
        attr = ts.TosaSerializerAttribute()
        getattr(attr, kind)()
        return attr

    for src, dst in (("x", "t1"), ("t1", "t2")):
        block.addTensor(dst, [2, 4], ts.DType.FP32)
        block.addOperator(ts.Op.TANH, [src], [dst], attribute("TanhAttribute"))
    block.addTensor("folded_const", [2, 3], ts.DType.FP32, np.arange(6, dtype=np.float32))
    block.addOperator(ts.Op.CONST, [], ["folded_const"], attribute("ConstAttribute"))
    block.addOutput("t2")
    block.addOutput("folded_const")
    return bytes(graph.serialize())


def test_a_constant_output_of_a_graph_run_in_pieces():
    flatbuffer = _with_constant_output()
    whole = tosa_reference.run(flatbuffer, [_x()])
    parts = tosa_reference.run(flatbuffer, [_x()], piece_ops=1)
    assert len(whole) == len(parts) == 2
    for a, b in zip(whole, parts):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(parts[1], np.arange(6, dtype=np.float32).reshape(2, 3))
    # The pieces are kept for the next run of the same graph (a stream's next frame): what a
    # caller does to the outputs of one run is not in the next.
    parts[1][:] = -1
    again = tosa_reference.run(flatbuffer, [_x()], piece_ops=1)
    np.testing.assert_array_equal(again[1], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_the_reference_models_version_notice_stays_off_stdout(capfd, monkeypatch):
    """ExecuTorch writes TOSA 1.0.0 flatbuffers; the reference model, built for 1.1.0,
    prints a notice on the process's stdout (fd 1, from C++) for each run. A library
    caller's stdout is theirs: the run leaves nothing there, and the outputs are the same."""
    x = _x()
    capfd.readouterr()
    got = tosa_reference.run(FP, [x])[0]
    out, err = capfd.readouterr()
    assert out == "" and "Different TOSA spec" not in err
    np.testing.assert_allclose(got, _eager(x), rtol=1e-5, atol=1e-6)
    # without it the notice reaches fd 1: the check above can fail (in this process: the
    # worker of reference_process is another)
    monkeypatch.setattr(tosa_reference, "_reference_model_stdout", contextlib.nullcontext)
    tosa_reference.graph_outputs(FP, [x], False, None)
    ctypes.CDLL(None).fflush(None)
    assert "Different TOSA spec" in capfd.readouterr().out


@pytest.mark.parametrize("path", [FP, INT], ids=["fp", "int"])
def test_the_worker_process_gives_this_processs_outputs_bit_for_bit(path, monkeypatch):
    """tosa_reference.run computes in reference_process's worker, another process, what the
    reference model computes here; a worker that cannot start leaves the run here."""
    x = _x(3.0) if path == FP else _quant()[0][0].quantize(_x())
    (here,) = tosa_reference.graph_outputs(path, [x], False, 1)
    (there,) = tosa_reference.run(path, [x], piece_ops=1)
    worker = reference_process._worker
    assert worker is not None and worker.poll() is None and worker.pid != os.getpid()
    np.testing.assert_array_equal(np.asarray(here).reshape(there.shape), there)
    monkeypatch.setattr(reference_process, "_worker", None)
    monkeypatch.setattr(reference_process, "_failed", True)
    (alone,) = tosa_reference.run(path, [x], piece_ops=1)
    assert reference_process._worker is None
    np.testing.assert_array_equal(alone, there)


def test_the_workers_errors_are_raised_here():
    """What the worker raises is raised here, and the worker serves the next run."""
    with pytest.raises(struct.error):  # as the flatbuffer bindings raise it in this process
        reference_process.call(tosa_reference.__name__, "graph_outputs", b"junk", [], False, None)
    assert reference_process._worker.poll() is None
    (again,) = tosa_reference.run(FP, [_x()])
    np.testing.assert_allclose(again, _eager(_x()), atol=1e-5)
