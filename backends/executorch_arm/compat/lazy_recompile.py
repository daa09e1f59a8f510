"""torch.fx GraphModules built while we lower generate their Python code when first run.

A GraphModule compiles its graph to Python source and `exec`s it when constructed and on
every `recompile()`. ExecuTorch's passes rebuild the module after nearly every pass
(`ExportPass` constructs a new one) and its pass managers recompile it again when a pass
reports a change, yet the next pass walks the graph's nodes and never calls the code: on
GTCRN (3,500 nodes) 2,095 recompiles, a sixth of the lower stage under cProfile.

torch has the lazy form already: `_LazyGraphModule` marks a recompile as needed and does it
when the module is called or its code read (torch's inductor builds its modules so). But
`_use_lazy_graph_module` reaches only the constructions that go through torch's own factory,
and ExecuTorch calls `torch.fx.GraphModule(...)` directly, so `lazy()` makes that
constructor build the lazy class for the block. What the lowering returns is unchanged: a
lazy module compiles the same code, later. Written against torch 2.13.0 (requirements.txt
pins it): `tests/executorch_arm/test_lazy_recompile.py` pins what it relies on.
"""

from __future__ import annotations

import contextlib

from torch.fx import GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule


@contextlib.contextmanager
def lazy():
    """`torch.fx.GraphModule(...)` builds a `_LazyGraphModule` within the block."""
    original = GraphModule.__dict__["__new__"]
    new = original.__func__ if isinstance(original, staticmethod) else original

    def lazy_new(cls, *args, **kwargs):
        return new(_LazyGraphModule if cls is GraphModule else cls, *args, **kwargs)

    GraphModule.__new__ = staticmethod(lazy_new)
    try:
        yield
    finally:
        GraphModule.__new__ = original
