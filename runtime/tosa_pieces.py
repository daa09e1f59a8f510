"""Run a large TOSA graph on the reference model in pieces of consecutive operators.

The reference model's time grows faster than the graph: it allocates each operator's output
by looking the tensor up among all of the graph's tensors one by one
(`SubgraphTraverser::getSerializationTensorByName`, a string copy and compare each: over a
third of a run of silero-vad's 263-operator graph under `perf`), so a run costs about the
square of the graph's size. madmom's beats BLSTM (45,020 ops) ran in 208 s whole and in 11.2
s as pieces of 2,000. A piece also repeats the constants it reads and costs a call of its
own, which bounds how small pieces pay: pieces of 500 run GTCRN's 12,693-operator program in
1.08 s against 1.71 s for 2,000, madmom's BGRU (21,250) in 1.42 against 2.42 s and the BLSTM
(48,963) in 5.32 against 7.40 s, and pieces of 25 silero-vad's 263 operators in 16.7 ms
against 53.6 ms whole (docs/results/reference_pieces.md). So a graph is cut into pieces of a
tenth of it, at least 25 and at most 500 operators (`piece_size`); the cut, 0.2-0.4 ms an
operator, is made once per graph. The operators of a graph, in their serialized order, are
cut into pieces of at most `max_ops` non-constant operators. Each piece is a graph of its
own: the constants it reads, its operators unchanged, as inputs the tensors it reads from
the graph's inputs or from earlier pieces, as outputs what later pieces or the graph's
outputs read. The pieces run in order, each fed what the earlier ones computed; an output
that is a constant, or a graph input, is taken as it is. Every operator sees the same
operands as in the whole graph, so the outputs are the same, bit for bit (tests/runtime pin
it).

A cut never crosses a tensor the reference model's Python binding cannot pass (INT48
accumulators, shapes): the piece grows until it does not.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import tosa_serializer as ts

from . import tosa_copy, tosa_flatbuffer

_CONST_OPS = (ts.Op.CONST, ts.Op.CONST_SHAPE)
_PASSABLE = {"BOOL", "INT8", "INT16", "INT32", "FP16", "FP32"}  # across a cut
MAX_OPS = 500
MIN_OPS = 25


def piece_size(ops: int) -> int:
    """Pieces for a graph of `ops` non-constant operators: a tenth of it, from MIN_OPS up
    to MAX_OPS (docs/results/reference_pieces.md)."""
    return min(MAX_OPS, max(MIN_OPS, ops // 10))


@dataclasses.dataclass(frozen=True)
class Pieces:
    graphs: list  # flatbuffer bytes each, in the order they run
    inputs: list  # the whole graph's input names, in order
    outputs: list  # its output names, in order
    constants: dict = dataclasses.field(default_factory=dict)  # outputs no operator computes


def _cuts(operators, tensors, graph_outputs: set, max_ops: int) -> list:
    """[(operator indices of a piece, constants excluded; the tensors it computes that
    later pieces or the graph's outputs read)]."""
    last_read = {}  # tensor -> index of the last operator reading it
    for i, op in enumerate(operators):
        for name in op.inputs:
            last_read[name] = i
    pieces, current, produced = [], [], set()
    compute = [i for i, op in enumerate(operators) if op.op not in _CONST_OPS]
    for position, i in enumerate(compute):
        current.append(i)
        produced.update(operators[i].outputs)
        end = position + 1 == len(compute)
        if len(current) < max_ops and not end:
            continue
        live = {n for n in produced if last_read.get(n, -1) > i or n in graph_outputs}
        passable = all(tensors[n].dtype.name in _PASSABLE for n in live)
        if end or passable:
            pieces.append((current, live))
            current, produced = [], set()
    return pieces


def split(flatbuffer: bytes, max_ops: int = MAX_OPS) -> Optional[Pieces]:
    """`flatbuffer` in pieces, or None if it is one piece or has more than one block."""
    graph = tosa_copy.load(flatbuffer)
    if len(graph.regions) != 1 or len(graph.regions[0].basicBlocks) != 1:
        return None
    block = graph.regions[0].basicBlocks[0]
    operators = list(block.operators)
    outputs = list(block.outputs)
    tensors, shapes = read_tensors(flatbuffer)
    cuts = _cuts(operators, {**shapes, **tensors}, set(outputs), max_ops)
    if len(cuts) < 2:
        return None
    producer = {n: i for i, op in enumerate(operators) for n in op.outputs}
    graphs = []
    for ops, live in cuts:
        produced = {n for i in ops for n in operators[i].outputs}
        read = list(dict.fromkeys(n for i in ops for n in operators[i].inputs))
        constants = sorted(
            {producer[n] for n in read if n in producer and operators[producer[n]].op in _CONST_OPS}
        )
        from_constants = {n for c in constants for n in operators[c].outputs}
        fed = [n for n in read if n not in produced and n not in from_constants]
        results = sorted(live, key=lambda n: producer[n])
        graphs.append(write(tensors, shapes, operators, constants + ops, fed, results))
    # An output a CONST writes (ExecuTorch folds a view of a constant into one) is no
    # piece's result: its values come from the flatbuffer.
    constants = {
        name: tosa_flatbuffer.constant_values(flatbuffer, name)
        for name in outputs
        if name in producer and operators[producer[name]].op in _CONST_OPS
    }
    return Pieces(graphs, list(block.inputs), outputs, constants)


@dataclasses.dataclass(frozen=True)
class Tensor:
    shape: list
    dtype: object  # ts.DType
    data: np.ndarray  # serialized bytes (constants)


def read_tensors(flatbuffer: bytes) -> tuple[dict, dict]:
    """name -> Tensor for the main block's tensors and shapes, read from the flatbuffer
    (the serializer looks a name up by a linear search: quadratic over a large graph)."""
    block = tosa_flatbuffer.main_block(flatbuffer)
    tensors, shapes = {}, {}
    for j in range(block.TensorsLength()):
        t = block.Tensors(j)
        shape = [int(d) for d in t.ShapeAsNumpy()] if t.ShapeLength() else []
        data = t.DataAsNumpy() if t.DataLength() else np.zeros(0, np.uint8)
        tensors[t.Name().decode()] = Tensor(shape, ts.DType(t.Type()), data)
    for j in range(block.ShapesLength()):
        s = block.Shapes(j)
        data = s.DataAsNumpy() if s.DataLength() else np.zeros(0, np.uint8)
        shapes[s.Name().decode()] = Tensor([s.Rank()], ts.DType.SHAPE, data)
    return tensors, shapes


def write(tensors, shapes, operators, ops: list, inputs: list, outputs: list) -> bytes:
    """A graph of `operators[i]` for i in `ops`, in that order (each with op, inputs, outputs
    and attributes: one read back, or a writable ts.TosaSerializerAttribute), its tensors
    and shapes from `tensors` / `shapes` (read_tensors), `inputs` and `outputs` its I/O."""
    out = ts.TosaSerializer("")
    target = out.currRegion.currBasicBlock
    written = set()
    for name in inputs:
        t = tensors[name]
        target.addTensor(name, t.shape, t.dtype)
        target.addInput(name)
        written.add(name)
    for i in ops:
        op = operators[i]
        for name in list(op.outputs):
            if name in written:
                continue
            if name in shapes:
                shape = shapes[name]
                target.addShape(name, shape.shape[0], tosa_copy.values(shape.data, shape.dtype))
            else:
                t = tensors[name]
                if op.op == ts.Op.CONST:
                    data = tosa_copy.values(t.data, t.dtype, int(np.prod(t.shape)))
                    target.addTensor(name, t.shape, t.dtype, data)
                else:
                    target.addTensor(name, t.shape, t.dtype)
            written.add(name)
        attr = op.attributes
        if not isinstance(attr, ts.TosaSerializerAttribute):
            attr = tosa_copy.copy_attribute(attr)
        target.addOperator(op.op, list(op.inputs), list(op.outputs), attr)
    for name in outputs:
        target.addOutput(name)
    return bytes(out.serialize())


def run(pieces: Pieces, inputs: Sequence[np.ndarray], run_graph) -> list[np.ndarray]:
    """The whole graph's outputs: `run_graph(flatbuffer, arrays)` on each piece in turn."""
    values = {n: a.copy() for n, a in pieces.constants.items()}  # pieces may be cached
    values.update(zip(pieces.inputs, inputs))
    for graph in pieces.graphs:
        ins, outs = tosa_flatbuffer.graph_io(graph)
        results = run_graph(graph, [values[i.name] for i in ins])
        for info, array in zip(outs, results):
            values[info.name] = np.asarray(array).reshape(info.shape)
    return [values[name] for name in pieces.outputs]
