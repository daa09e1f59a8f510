"""Read a serialized TOSA graph (.tosa flatbuffer): its I/O tensors and its operator counts.

Uses the flatbuffer bindings (`tosa` package) shipped by tosa-tools, so no schema or flatc is
needed. The TOSA op count is one of our figures of merit (ExecuTorch emits about 160 TOSA ops per
GRU step in INT8), so it is counted over every region and block, control-flow bodies included.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
from typing import Union

import numpy as np
from tosa.DType import DType
from tosa.Op import Op
from tosa.TosaGraph import TosaGraph

TosaSource = Union[bytes, bytearray, str, os.PathLike]

_DTYPE_NAMES = {v: k for k, v in vars(DType).items() if not k.startswith("_")}
_OP_NAMES = {v: k for k, v in vars(Op).items() if not k.startswith("_")}
NUMPY_DTYPES = {  # TOSA element type name -> numpy dtype
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT48": np.int64,
    "SHAPE": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
}
# Operators that only materialise constants; excluded from the "compute" op count.
CONSTANT_OPS = frozenset({"CONST", "CONST_SHAPE"})


def op_name(code: int) -> str:
    """The name of a TOSA operator code (e.g. "CONV2D")."""
    return _OP_NAMES.get(code, f"OP_{code}")


def dtype_name(code: int) -> str:
    """The name of a TOSA element type code (e.g. "INT16")."""
    return _DTYPE_NAMES.get(code, str(code))


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: name, shape and TOSA element type (e.g. "INT8", "FP32")."""

    name: str
    shape: tuple[int, ...]
    tosa_dtype: str

    @property
    def numpy_dtype(self) -> np.dtype:
        if self.tosa_dtype not in NUMPY_DTYPES:
            raise ValueError(f"tensor {self.name}: no numpy type for TOSA type {self.tosa_dtype}")
        return np.dtype(NUMPY_DTYPES[self.tosa_dtype])


def load_bytes(source: TosaSource) -> bytes:
    """The flatbuffer bytes of `source` (bytes, or a path to a .tosa file)."""
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    with open(source, "rb") as f:
        return f.read()


def _graph(buf: bytes) -> TosaGraph:
    return TosaGraph.GetRootAsTosaGraph(buf, 0)


def _main_block(graph: TosaGraph):
    if graph.RegionsLength() == 0 or graph.Regions(0).BlocksLength() == 0:
        raise ValueError("TOSA flatbuffer has no region/block: not a TOSA graph")
    return graph.Regions(0).Blocks(0)


def main_block(source: TosaSource):
    """The first block of the first region (the flatbuffer bindings' TosaBasicBlock)."""
    return _main_block(_graph(load_bytes(source)))


def _tensor_infos(block, names: list[str]) -> list[TensorInfo]:
    """The TensorInfo of each of `names`: the block's tensors walked by name only, shape and
    type read for the wanted ones (a loop's graph has some 50,000 tensors and wants a few),
    the walk ended once all are found."""
    wanted, found = set(names), {}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        name = t.Name().decode()
        if name in wanted and name not in found:
            shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
            found[name] = TensorInfo(name, shape, _DTYPE_NAMES.get(t.Type(), str(t.Type())))
            if len(found) == len(wanted):
                break
    return [found[n] for n in names]


def graph_io(source: TosaSource) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """(inputs, outputs) of the graph's main block, in the order the reference model uses."""
    inputs, outputs = _graph_io(load_bytes(source))
    return list(inputs), list(outputs)


@functools.lru_cache(maxsize=64)
def _graph_io(buf: bytes) -> tuple[tuple, tuple]:
    """graph_io, read once per graph: the flatbuffer bindings take 40 ms to walk a 1,000-tensor
    block in Python, and a stream runs the same graph once per frame (and a graph in pieces,
    each piece)."""
    block = _main_block(_graph(buf))
    inputs = [block.Inputs(i).decode() for i in range(block.InputsLength())]
    outputs = [block.Outputs(i).decode() for i in range(block.OutputsLength())]
    infos = _tensor_infos(block, inputs + outputs)
    return tuple(infos[: len(inputs)]), tuple(infos[len(inputs) :])


def op_counts(source: TosaSource) -> collections.Counter:
    """Operator name -> count over every region and basic block of the graph."""
    graph = _graph(load_bytes(source))
    counts: collections.Counter = collections.Counter()
    for r in range(graph.RegionsLength()):
        region = graph.Regions(r)
        for b in range(region.BlocksLength()):
            block = region.Blocks(b)
            for o in range(block.OperatorsLength()):
                op = block.Operators(o).Op()
                counts[_OP_NAMES.get(op, f"OP_{op}")] += 1
    return counts


def count_ops(source: TosaSource, include_constants: bool = True) -> int:
    """Total number of TOSA operators; `include_constants=False` drops CONST/CONST_SHAPE."""
    counts = op_counts(source)
    return sum(n for op, n in counts.items() if include_constants or op not in CONSTANT_OPS)


def op_inputs(source: TosaSource, op_name: str, index: int) -> list[TensorInfo]:
    """Input `index` of every `op_name` operator of the main block, in graph order (e.g. the
    weights of every CONV2D: op_inputs(f, "CONV2D", 1))."""
    block = _main_block(_graph(load_bytes(source)))
    names = []
    for o in range(block.OperatorsLength()):
        op = block.Operators(o)
        if _OP_NAMES.get(op.Op()) == op_name and op.InputsLength() > index:
            names.append(op.Inputs(index).decode())
    return _tensor_infos(block, names)


def unpack_int4(raw, count: int) -> np.ndarray:
    """`count` INT4 values from their serialized bytes: two per byte, the first in the low
    nibble (as tosa_serializer packs them), sign-extended to int8."""
    if not isinstance(raw, (bytes, bytearray)):
        raw = np.asarray(raw, dtype=np.uint8).tobytes()
    b = np.frombuffer(raw, np.uint8)
    v = np.stack([b & 0xF, b >> 4], axis=-1).reshape(-1)[:count].astype(np.int8)
    return np.where(v >= 8, v - 16, v).astype(np.int8)


def decode(raw, dtype: str, count: int) -> np.ndarray:
    """The `count` element values of a tensor's serialized bytes (TOSA type name `dtype`):
    INT4 two to a byte, INT48 six little-endian bytes sign-extended, the rest as numpy reads
    them. ValueError for a type numpy has no counterpart of."""
    raw = np.asarray(raw, dtype=np.uint8).tobytes()
    if dtype == "INT4":
        return unpack_int4(raw, count)
    if dtype == "INT48":
        b = np.frombuffer(raw, np.uint8).reshape(-1, 6).astype(np.int64)
        v = sum(b[:, k] << (8 * k) for k in range(6))
        return np.where(v >= 1 << 47, v - (1 << 48), v)
    if dtype not in NUMPY_DTYPES:
        raise ValueError(f"cannot read TOSA type {dtype}")
    return np.frombuffer(raw, NUMPY_DTYPES[dtype]).copy()


def constant_values(source: TosaSource, name: str) -> np.ndarray:
    """The values of constant tensor `name` of the main block, in its shape."""
    block = _main_block(_graph(load_bytes(source)))
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        if t.Name().decode() != name:
            continue
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        dtype = _DTYPE_NAMES.get(t.Type(), str(t.Type()))
        if dtype not in NUMPY_DTYPES and dtype not in ("INT4", "INT48"):
            raise ValueError(f"tensor {name}: cannot read TOSA type {dtype}")
        return decode(t.DataAsNumpy(), dtype, int(np.prod(shape))).reshape(shape)
    raise KeyError(f"no tensor {name!r} in the TOSA graph")
