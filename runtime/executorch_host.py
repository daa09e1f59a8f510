"""Run a .pte on the host CPU with ExecuTorch's portable runtime (the pybindings in the wheel).

Only for CPU-only programs, e.g. a recurrent layer kept on the CPU after decomposition into
portable ops. A program with an Ethos-U (or TOSA) delegate cannot run here: the host runtime has
no such backend registered and loading the method fails; use runtime.fvp (Ethos-U) or
runtime.tosa_reference (the dumped .tosa) instead. Note that the portable runtime has no
`aten::gru` kernel, so an undecomposed GRU fails to load as well.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np


class HostRuntimeError(RuntimeError):
    """The host runtime could not load or run the program."""


def run_pte(
    pte: "bytes | bytearray | str | os.PathLike",
    inputs: Sequence[np.ndarray],
    method: str = "forward",
) -> list[np.ndarray]:
    """Outputs of `method` of the program `pte` (bytes or path) for numpy `inputs`."""
    import torch
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    source = bytes(pte) if isinstance(pte, (bytes, bytearray)) else os.fspath(pte)
    program = runtime.load_program(source)
    try:
        loaded = program.load_method(method)
    except Exception as e:  # the pybindings raise RuntimeError with an ExecuTorch error code
        raise HostRuntimeError(
            f"cannot load method {method!r} on the host runtime (a delegated program or an op "
            f"without a portable kernel?): {e}"
        ) from e
    if loaded is None:
        raise HostRuntimeError(f"program has no method {method!r} ({program.method_names})")
    tensors = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]
    outputs = loaded.execute(tensors)
    return [o.detach().numpy().copy() if hasattr(o, "numpy") else np.asarray(o) for o in outputs]
