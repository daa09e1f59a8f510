"""What a weight is for, as a type: adapters choose by role (fewer bits for the weights every
step reads, an initializer's name), never by parsing a name."""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional


class WeightKind(enum.Enum):
    INPUT = "W"  # the hoisted input projection: read once per sequence
    RECURRENT = "R"  # h R^T: read at every timestep
    PROJECTION = "proj"  # an LSTM's output projection: read at every timestep


@dataclasses.dataclass(frozen=True)
class WeightRole:
    """One weight of a recurrent layer stack. `direction` is None for an input projection
    shared by both directions; `rows` is the range of the full weight's rows (gate blocks,
    directions) this one holds, when a pass split it."""

    kind: WeightKind
    layer: int
    direction: Optional[str]  # "fwd" | "rev" | None
    bias: bool = False
    rows: Optional[tuple] = None

    @property
    def per_step(self) -> bool:
        """Read at every timestep: on an NPU that streams weights from flash, these bound
        the recurrence."""
        return self.kind is not WeightKind.INPUT

    def of_bias(self) -> "WeightRole":
        return dataclasses.replace(self, bias=True)

    def sliced(self, start: int, end: int) -> "WeightRole":
        base = self.rows[0] if self.rows else 0
        return dataclasses.replace(self, rows=(base + start, base + end))

    def __str__(self) -> str:
        """A name for humans: l0_fwd_R, l1_W, l0_rev_proj_b, l0_fwd_R_0_32 (rows 0-32)."""
        parts = [f"l{self.layer}"] + ([self.direction] if self.direction else [])
        parts.append(self.kind.value)
        if self.rows:
            parts += [str(self.rows[0]), str(self.rows[1])]
        return "_".join(parts) + ("_b" if self.bias else "")
