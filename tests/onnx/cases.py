"""Shared by the ONNX tests: ONNX's own recurrent node-test cases, and the core's numpy
reference for a one-node model."""

import dataclasses
import warnings

from onnx.backend.test.case.node import collect_testcases

from recurrent_lowering import passes
from recurrent_lowering.backends.onnx.folding import Scope
from recurrent_lowering.backends.onnx.reader import read_node
from recurrent_lowering.passes.numpy_builder import NumpyBuilder


def node_cases() -> dict:
    """name -> case (.model, .data_sets) for every GRU/LSTM/RNN case of ONNX's node tests."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return {c.name: c for c in cases if any(k in c.name for k in ("gru", "lstm", "rnn"))}


def numpy_reference(model, feeds):
    """The node's outputs from the core with NumpyBuilder (weights read as constants)."""
    (node,) = model.graph.node
    read = read_node(node, Scope(model.graph, model.opset_import).value)
    nb = NumpyBuilder(read.float_dtype)
    seq = read.sequence_lens
    if isinstance(seq, str):
        seq = feeds[seq]
    steps = feeds["X"].shape[1 if read.spec.layout.batch_first else 0]
    out = passes.emit(
        nb,
        dataclasses.replace(read.spec, seq_len=steps),
        read.weights,
        nb.input(feeds["X"]),
        None if read.initial_h is None else nb.input(feeds[read.initial_h]),
        None if read.initial_c is None else nb.input(feeds[read.initial_c]),
        sequence_lens=seq,
    )
    return [v for v, name in zip((out.y, out.h, out.c), read.outputs) if name]
