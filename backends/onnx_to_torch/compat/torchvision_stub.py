"""A stand-in for torchvision while onnx2torch is imported.

onnx2torch 1.5.15 imports torchvision at import time, only for its NonMaxSuppression and
RoiAlign converters (`import torchvision`, `from torchvision.ops import roi_align`).
Installing torchvision would pull another torch build, so while onnx2torch is imported we
put two tiny modules in sys.modules and take them out again afterwards: code that imports
torchvision later still gets ModuleNotFoundError (or the real package, if one is
installed), and the two converters fail with a message that says why.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types

_MARK = "__recurrent_lowering_stub__"
_NAMES = ("torchvision", "torchvision.ops")
_NEEDED_BY = ("nms", "box_convert", "roi_align")  # what onnx2torch's converters call


class TorchvisionMissing(ImportError):
    """An onnx2torch converter that needs torchvision ran without it."""


def _missing(name: str):
    def call(*args, **kwargs):
        raise TorchvisionMissing(
            f"torchvision.ops.{name}: torchvision is not installed (it would replace the pinned "
            "torch); onnx2torch's NonMaxSuppression and RoiAlign converters need it"
        )

    call.__name__ = name
    setattr(call, _MARK, True)
    return call


def _stub_modules() -> dict:
    root = types.ModuleType("torchvision", "recurrent-lowering stand-in: no torchvision here")
    ops = types.ModuleType("torchvision.ops", "recurrent-lowering stand-in")
    for name in _NEEDED_BY:
        setattr(ops, name, _missing(name))
    root.ops = ops
    for module in (root, ops):
        setattr(module, _MARK, True)
    return {"torchvision": root, "torchvision.ops": ops}


def is_stub(value) -> bool:
    """True for the stand-in modules and functions (what onnx2torch keeps references to)."""
    return getattr(value, _MARK, False) is True


@contextlib.contextmanager
def torchvision_stub():
    """Within the block, `import torchvision` gives the stand-in unless the real one exists."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        yield False
        return
    stubs = _stub_modules()
    sys.modules.update(stubs)
    try:
        yield True
    finally:
        for name in _NAMES:
            if sys.modules.get(name) is stubs[name]:
                del sys.modules[name]
