"""A TOSA graph used as a template: copied, tensors renamed, into another graph being built.

The recurrent step is lowered once by ExecuTorch (a small graph: seconds) and its TOSA
flatbuffer is instantiated T times into the delegate's graph (milliseconds), instead of
pushing T unrolled copies through ExecuTorch's per-node passes (about 40 ms per node).

Uses tosa-tools' serializer (`tosa_serializer`, the library ExecuTorch serializes with) both to
read the template and to write the copies, so every operator and attribute is carried over
without a schema of our own: an attribute is re-created from the properties of the one read.
Constants (CONST / CONST_SHAPE outputs) are written once and shared by every copy.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tosa_serializer as ts

from recurrent_lowering.runtime import tosa_copy

_CONST_OPS = (ts.Op.CONST, ts.Op.CONST_SHAPE)
# What an output's tail may hold: requantizations, elementwise arithmetic and lookup tables.
_TAIL_OPS = (ts.Op.RESCALE, ts.Op.ADD, ts.Op.SUB, ts.Op.MUL, ts.Op.TABLE)
_TAIL_MAX_OPS = 8


@dataclasses.dataclass(frozen=True)
class RowView:
    """Stands for a template input that is rows [row, row + its rows) of a 2-D `source`: the
    template's SLICEs of that input read `source` directly, shifted by `row`, so no copy of
    the rows is made (Vela turns a SLICE whose result is sliced again into a memory copy)."""

    source: str
    row: int


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple
    dtype: object  # ts.DType


class TosaTemplate:
    """The main block of a TOSA flatbuffer, ready to be instantiated into another graph."""

    def __init__(self, flatbuffer: bytes):
        self.flatbuffer = flatbuffer
        graph = tosa_copy.load(flatbuffer)
        block = graph.regions[0].basicBlocks[0]
        self._graph = graph  # keeps the block's objects alive
        self.operators = list(block.operators)
        self._tensors = {n: block.getTensorByName(n) for n in block.tensors.keys()}
        self._shapes = {n: block.getShapeByName(n) for n in block.shapes.keys()}
        # a copy's tensor is `prefix + short name`: the serializer finds a name by a linear
        # search over the graph's tensors, which short names (held inline) keep cheap
        self._short = {n: f"{j}" for j, n in enumerate([*self._tensors, *self._shapes])}
        self.inputs = [self._spec(n) for n in block.inputs]
        self.outputs = [self._spec(n) for n in block.outputs]
        self.constants = {
            name for op in self.operators if op.op in _CONST_OPS for name in op.outputs
        }
        self._producer = {o: i for i, op in enumerate(self.operators) for o in op.outputs}
        self._tails: dict = {}  # tensor name -> _tail_of(name)
        # Vela chains a TABLE into the op before it only if that op's result has no other
        # reader (else the TABLE is a separate op: 440 cycles for 128 values on U85). Such
        # TABLEs (LSTM's tanh(c'), c' also being the next step's c) read their own copy of
        # their input's tail.
        readers = collections.Counter(n for op in self.operators for n in op.inputs)
        readers.update(t.name for t in self.outputs)
        self._table_tails = {}
        for i, op in enumerate(self.operators):
            source = list(op.inputs)[0] if op.op == ts.Op.TABLE else None
            if source is not None and readers[source] > 1:
                chain = self._tail_of(source)
                if chain:
                    self._table_tails[i] = chain

    def __reduce__(self):  # pickled as its bytes (the serializer's objects are not)
        return (TosaTemplate, (self.flatbuffer,))

    def _spec(self, name: str) -> TensorSpec:
        t = self._tensors[name]
        return TensorSpec(name, tuple(t.shape), t.dtype)

    def only_sliced(self, k: int) -> bool:
        """True if input k is 2-D and read only by SLICEs (so it can be given as a RowView)."""
        name = self.inputs[k].name
        users = [op for op in self.operators if name in list(op.inputs)]
        return (
            len(self.inputs[k].shape) == 2
            and bool(users)
            and all(op.op == ts.Op.SLICE and list(op.inputs)[0] == name for op in users)
        )

    def reshape_readers(self, k: int) -> list:
        """The RESHAPE ops that read input k."""
        name = self.inputs[k].name
        return [o for o in self.operators if o.op == ts.Op.RESHAPE and list(o.inputs)[0] == name]

    def tail(self, k: int) -> list:
        """Indices of the ops that compute output k from the step's 8/16-bit values: its
        producer back to the RESCALEs that widen operands to int32, which Vela fuses with the
        elementwise op between them into one NPU op. [] if output k is not computed so."""
        return self._tail_of(self.outputs[k].name)

    def _tail_of(self, tensor: str) -> list:
        if tensor not in self._tails:
            self._tails[tensor] = self._find_tail(tensor)
        return self._tails[tensor]

    def _find_tail(self, tensor: str) -> list:
        inputs = {t.name for t in self.inputs}
        chain, frontier = [], [tensor]
        while frontier:
            name = frontier.pop()
            i = self._producer.get(name)
            if name in inputs or i is None or self.operators[i].op in _CONST_OPS:
                continue
            op = self.operators[i]
            if op.op not in _TAIL_OPS or len(chain) == _TAIL_MAX_OPS:
                return []
            if i not in chain:
                chain.append(i)
            source = self._tensors[list(op.inputs)[0]].dtype
            if op.op == ts.Op.RESCALE and source != ts.DType.INT32:
                continue  # widening: a leaf, reading a value that other ops read too
            frontier.extend(op.inputs)
        return sorted(chain)

    def instantiate(
        self,
        tosa_graph,
        prefix: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        constants_prefix: str,
        constants_written: set,
        copies: Optional[dict] = None,
        private: Optional[dict] = None,
    ) -> None:
        """Write one copy into `tosa_graph` (a ts.TosaSerializer being built).

        `inputs` / `outputs` name existing tensors of `tosa_graph` that take the places of the
        template's inputs / outputs (the caller creates them); an input may instead be a
        RowView (for inputs with `only_sliced`). Every other tensor is renamed `prefix` + a
        short name, constants `constants_prefix + name` and written once (their names are
        recorded in `constants_written`).

        Vela copies a value that has several readers where one of them is a RESHAPE or a
        CONCAT. `copies` {output k: [names]} writes each name by its own copy of `tail(k)`
        (a few fused NPU cycles instead of a copy), and `private` {input k: [names]} makes
        input k's RESHAPEs read those names, one each, instead of the shared input."""
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs):
            raise ValueError(
                f"template has {len(self.inputs)} inputs / {len(self.outputs)} outputs, "
                f"got {len(inputs)} / {len(outputs)}"
            )
        readers = {}  # id of a RESHAPE op -> the private tensor it reads
        for k, names_k in (private or {}).items():
            ops = self.reshape_readers(k)
            if len(ops) != len(names_k):
                raise ValueError(f"input {k} has {len(ops)} RESHAPE readers, got {names_k}")
            readers.update({id(o): n for o, n in zip(ops, names_k)})
        views = {t.name: v for t, v in zip(self.inputs, inputs) if isinstance(v, RowView)}
        names = {t.name: n for t, n in zip(self.inputs, inputs) if t.name not in views}
        names.update({t.name: n for t, n in zip(self.outputs, outputs)})
        block = tosa_graph.currRegion.currBasicBlock
        for name, t in self._tensors.items():
            if name in names or name in views:
                continue
            if name in self.constants:
                names[name] = constants_prefix + name
                if names[name] in constants_written:
                    continue
                values = tosa_copy.values(t.data, t.dtype, int(np.prod(t.shape)))
                block.addTensor(names[name], list(t.shape), t.dtype, values)
            else:
                names[name] = prefix + self._short[name]
                block.addTensor(names[name], list(t.shape), t.dtype)
        for name, shape in self._shapes.items():  # CONST_SHAPE outputs: shared
            names[name] = constants_prefix + name
            if names[name] not in constants_written:
                block.addShape(
                    names[name], shape.rank, tosa_copy.values(shape.data, ts.DType.SHAPE)
                )
        for i, op in enumerate(self.operators):
            outs = [names[n] for n in op.outputs]
            if op.op in _CONST_OPS:
                if outs[0] in constants_written:
                    continue
                constants_written.update(outs)
            ins = list(op.inputs)
            view = views.get(ins[0]) if op.op == ts.Op.SLICE else None
            if view is not None:  # SLICE(view, start, size) -> SLICE(source, start + row, size)
                start = tosa_copy.values(self._shapes[ins[1]].data, ts.DType.SHAPE)
                start[0] += view.row
                shifted = prefix + self._short[ins[1]] + "r"
                tosa_graph.addConst([len(start)], ts.DType.SHAPE, start.tolist(), name=shifted)
                ins = [view.source, shifted, names[ins[2]]]
            else:
                ins = [names[n] for n in ins]
            if id(op) in readers:
                ins[0] = readers[id(op)]
            if i in self._table_tails:  # the TABLE reads its own copy of its input's tail
                lut, source = f"{prefix}l{i}_", list(op.inputs)[0]
                ins[0] = self._write_copy(
                    block, self._table_tails[i], source, lut + self._short[source], names, lut
                )
            block.addOperator(op.op, ins, outs, tosa_copy.copy_attribute(op.attributes))
        for k, names_k in (copies or {}).items():
            self._write_tail(block, k, names_k, names, prefix)

    def _write_tail(self, block, k: int, targets: Sequence[str], names: dict, prefix: str):
        """Copies of tail(k), each ending in one of `targets` (existing tensors) instead of
        output k."""
        chain, out = self.tail(k), self.outputs[k].name
        if not chain:
            raise ValueError(f"output {k} has no tail to copy")
        for j, target in enumerate(targets):
            self._write_copy(block, chain, out, target, names, f"{prefix}f{j}_", existing=True)

    def _write_copy(self, block, chain, out, target, names, prefix, existing=False) -> str:
        """The ops `chain` once more, their results renamed `prefix` + short name and `out`'s
        `target` (created here unless `existing`); returns target."""
        renamed = dict(names)
        for i in chain:
            for n in self.operators[i].outputs:
                renamed[n] = target if n == out else prefix + self._short[n]
                if n != out or not existing:
                    t = self._tensors[n]
                    block.addTensor(renamed[n], list(t.shape), t.dtype)
        for i in chain:
            op = self.operators[i]
            ins, outs = [renamed[n] for n in op.inputs], [renamed[n] for n in op.outputs]
            block.addOperator(op.op, ins, outs, tosa_copy.copy_attribute(op.attributes))
        return target
