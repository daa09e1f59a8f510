"""Each delegate's dumped .tosa under a name of its own.

ExecuTorch's TOSA backend names the .tosa it dumps `output_<tag>_<spec>.tosa`, the tag
being the first `delegation_tag` among the delegate's nodes
(`tosa.backend.arm_get_first_delegation_tag`). A delegate fed directly by another's output
has a placeholder first, and a placeholder carries the tag of the node it was cut from, the
other delegate's: the two dumps got one name, the second overwrote the first, and the
numerics check and Vela's figures then ran on the wrong delegate (a transformer encoder
before a GRU, int16 on ethos-u55-128: three delegates, two files). Within `own_names()`
the tag is read from the delegate's own nodes, as `delegation_tag` below does for the
reader of the dumps (runtime.delegate_run). Written against executorch 1.5.1.
"""

from __future__ import annotations

import contextlib

from recurrent_lowering.runtime.delegate_run import delegation_tag


@contextlib.contextmanager
def own_names():
    """ExecuTorch's TOSA backend names each dump by `delegation_tag` within the block."""
    from executorch.backends.arm.tosa import backend

    original = backend.arm_get_first_delegation_tag
    backend.arm_get_first_delegation_tag = delegation_tag
    try:
        yield
    finally:
        backend.arm_get_first_delegation_tag = original
