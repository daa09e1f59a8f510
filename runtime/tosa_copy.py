"""Copy TOSA operators from one graph into another with tosa-tools' serializer
(`tosa_serializer`, the library ExecuTorch serializes with): every operator and attribute
is carried over without a schema of our own, an attribute re-created from the properties of
the one read. Used to instantiate the loop form's step template and to run a large graph
on the reference model in pieces.
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

import numpy as np
import tosa_serializer as ts

from . import tosa_flatbuffer


def load(flatbuffer: bytes) -> "ts.TosaSerializer":
    """A serializer holding the graph of `flatbuffer` (it reads files only)."""
    fd, path = tempfile.mkstemp(suffix=".tosa")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(flatbuffer)
        graph = ts.TosaSerializer("")
        if not graph.loadTosaFlatbuffer(path):
            raise ValueError("not a TOSA flatbuffer")
    finally:
        os.unlink(path)
    return graph


def values(raw, dtype, count: Optional[int] = None) -> np.ndarray:
    """The element values of a tensor's serialized bytes (the serializer reads back bytes but
    takes values when writing); `count` elements where the bytes alone do not say (INT4)."""
    try:
        return tosa_flatbuffer.decode(raw, dtype.name, count)
    except ValueError:
        raise ValueError(f"cannot copy a constant of TOSA type {dtype.name}") from None


def copy_attribute(attr) -> "ts.TosaSerializerAttribute":
    """A writable attribute with the same fields as `attr` (a TosaXxxAttribute read back)."""
    kind = type(attr).__name__
    if not (kind.startswith("Tosa") and kind.endswith("Attribute")):
        raise TypeError(f"not a TOSA attribute: {kind}")
    fields = {n: getattr(attr, n) for n in dir(attr) if not n.startswith("_")}
    out = ts.TosaSerializerAttribute()
    getattr(out, kind[len("Tosa") :])(**fields)
    return out
