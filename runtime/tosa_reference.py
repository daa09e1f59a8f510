"""Run a serialized TOSA graph on the TOSA reference model (tosa-tools' Python binding).

The reference model is the numerical ground truth for what an Ethos-U (or any TOSA consumer)
should compute, so comparing its outputs to torch eager checks a lowering without hardware.
Inputs are matched to the graph's inputs by position. For a quantized graph (int8/int16 I/O)
pass float inputs together with `input_quant` (they are quantized here) or pass integer arrays
directly; `output_quant` dequantizes the integer outputs back to float.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import tempfile
from typing import Optional, Sequence

import numpy as np

from . import reference_process, tosa_flatbuffer, tosa_pieces
from .quantization import QuantParams


class TosaReferenceError(RuntimeError):
    """The reference model rejected the graph or its inputs."""


_VERSION_NOTICE = "WARNING: Different TOSA spec in flatbuffer and serializer versions"


@contextlib.contextmanager
def _reference_model_stdout():
    """The reference model's C++ prints a version notice on stdout for every flatbuffer
    ExecuTorch writes (TOSA 1.0.0 read by a 1.1.0 serializer, backward compatible): kept off
    the caller's stdout. Anything else it prints goes to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            ctypes.CDLL(None).fflush(None)  # the C library's buffered stdout, into the sink
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(_VERSION_NOTICE)]
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")


def _prepare_input(
    info: tosa_flatbuffer.TensorInfo, value: np.ndarray, quant: Optional[QuantParams]
) -> np.ndarray:
    value = np.asarray(value)
    if tuple(value.shape) != info.shape:
        raise ValueError(
            f"input {info.name}: shape {tuple(value.shape)} does not match graph shape {info.shape}"
        )
    target = info.numpy_dtype
    if np.issubdtype(target, np.integer) and np.issubdtype(value.dtype, np.floating):
        if quant is None:
            raise ValueError(
                f"input {info.name}: graph takes {info.tosa_dtype} but a float array was given "
                "without quantization parameters (input_quant)"
            )
        value = quant.quantize(value)
    if np.issubdtype(target, np.integer) and np.issubdtype(value.dtype, np.integer):
        bounds = np.iinfo(target)
        if value.size and (value.min() < bounds.min or value.max() > bounds.max):
            raise ValueError(f"input {info.name}: values out of range for {info.tosa_dtype}")
    return np.ascontiguousarray(value.astype(target, copy=False))


@functools.lru_cache(maxsize=4)
def _pieces(buf: bytes, piece_ops: Optional[int]) -> Optional[tosa_pieces.Pieces]:
    """`buf` split for the reference model (tosa_pieces; `piece_ops` None: its
    piece_size), or None to run it whole: decided once per graph, not once per sample of a
    stream."""
    ops = tosa_flatbuffer.count_ops(buf, include_constants=False)
    size = piece_ops or tosa_pieces.piece_size(ops)
    return tosa_pieces.split(buf, size) if ops > size else None


def run(
    tosa: tosa_flatbuffer.TosaSource,
    inputs: Sequence[np.ndarray],
    *,
    input_quant: Optional[Sequence[Optional[QuantParams]]] = None,
    output_quant: Optional[Sequence[Optional[QuantParams]]] = None,
    precise_mode: bool = False,
    piece_ops: Optional[int] = None,
) -> list[np.ndarray]:
    """Outputs of the TOSA graph `tosa` (bytes or .tosa path) for numpy `inputs`.

    With `output_quant[i]` set, output i is dequantized to float32; otherwise it is returned in
    the graph's own element type (e.g. int8). `precise_mode` computes float ops in fp64.
    A graph of more than `piece_ops` operators (default: tosa_pieces.piece_size of it)
    runs in pieces of that many (tosa_pieces: the same results, in a fraction of the time),
    in a process of its own (reference_process).
    """
    buf = tosa_flatbuffer.load_bytes(tosa)
    in_infos, out_infos = tosa_flatbuffer.graph_io(buf)
    if len(inputs) != len(in_infos):
        names = [i.name for i in in_infos]
        raise ValueError(f"TOSA graph takes {len(in_infos)} inputs {names}, got {len(inputs)}")
    input_quant = list(input_quant or [None] * len(in_infos))
    output_quant = list(output_quant or [None] * len(out_infos))
    if len(input_quant) != len(in_infos) or len(output_quant) != len(out_infos):
        raise ValueError("input_quant/output_quant must have one entry per graph input/output")
    arrays = [_prepare_input(i, v, q) for i, v, q in zip(in_infos, inputs, input_quant)]

    source = tosa if isinstance(tosa, (bytes, bytearray)) else os.fspath(tosa)
    outputs = reference_process.call(
        __name__, "graph_outputs", source, arrays, precise_mode, piece_ops
    )
    results = []
    for info, out, quant in zip(out_infos, outputs, output_quant):
        out = np.asarray(out).reshape(info.shape)
        results.append(quant.dequantize(out) if quant is not None else out)
    return results


def graph_outputs(
    tosa: tosa_flatbuffer.TosaSource, arrays: list, precise_mode: bool, piece_ops: Optional[int]
) -> list:
    """The reference model's raw outputs of `tosa` for prepared `arrays`, in this process."""
    import tosa_reference_model

    def run_graph(graph: bytes, arrays: list) -> list:
        outputs, status = tosa_reference_model.run(
            graph, arrays, precise_mode=int(precise_mode), initialize_variable_tensor_from_numpy=1
        )
        if status != tosa_reference_model.GraphStatus.TOSA_VALID:
            raise TosaReferenceError(f"TOSA reference model returned {status.name}")
        return outputs

    buf = tosa_flatbuffer.load_bytes(tosa)
    pieces = _pieces(buf, piece_ops)
    with _reference_model_stdout():
        return tosa_pieces.run(pieces, arrays, run_graph) if pieces else run_graph(buf, arrays)
