"""Edge-dialect operators, which ExecuTorch exposes only through `exir.dialects._ops`."""

from __future__ import annotations

from executorch.exir.dialects._ops import ops as exir_ops

edge = exir_ops.edge
