"""The narrow op-builder interface the core emits through.

Each adapter implements it once for its graph (torch.fx, ONNX) and `numpy_builder`
implements it by evaluating, which makes the same emission code our reference.
Values are opaque handles (fx nodes, ONNX value names, numpy arrays); the core never
inspects them, only passes them back to the builder.

Shapes: the core uses axis-based ops (slice, concat, squeeze, unsqueeze) so the batch
dimension may stay dynamic; time is static in unrolled emission.
Dtype: float constants are given as numpy float32/float64 arrays; the builder casts
them to its graph's float dtype.
"""

from __future__ import annotations

import abc
from typing import Any, Optional, Sequence

import numpy as np

from .roles import WeightRole
from .spec import Activation

Value = Any

# Optional capabilities; the core checks them and raises a SpecError naming the layer
# and the attribute that needs the missing one.
SELECT = "select"  # less() and where(): masking for runtime sequence lengths
SCAN = "scan"  # scan(): loop emission
SCAN_WITH_INITIAL = "scan_with_initial"  # scan(..., initial_in_ys=True)
POSITIONS = "positions"  # positions(): masking a loop whose length is known at run time
LOOP_ROWS = "loop_rows"  # loop(): steps reading rows of a 2-D view, from a row on


class RuntimeArray(np.ndarray):
    """A numpy array standing for a runtime value (NumpyBuilder.input makes them).

    Where the core accepts a constant or a value (sequence_lens), a plain ndarray is a
    constant; builders whose values are numpy arrays mark theirs with this subclass.
    """


def is_constant(v) -> bool:
    return isinstance(v, np.ndarray) and not isinstance(v, RuntimeArray)


class Builder(abc.ABC):
    capabilities: frozenset = frozenset()

    #: The numpy float dtype of the graph's float tensors (float16/32/64). The core folds
    #: constants (biases, masks, scalars) in this dtype before handing them over, so every
    #: builder must set it; float32 unless the graph says otherwise.
    dtype: np.dtype = np.dtype(np.float32)

    # --- constants and linear algebra -------------------------------------------------
    @abc.abstractmethod
    def constant(self, array: np.ndarray, name: str = "") -> Value:
        """A constant tensor; float arrays are cast to the graph's float dtype."""

    @abc.abstractmethod
    def linear(self, x: Value, weight, bias=None, role: Optional[WeightRole] = None) -> Value:
        """x @ weight.T (+ bias) over the last axis; weight is [out, in], bias [out].

        weight and bias are numpy constants, or builder values when the model feeds its
        weights at run time (a builder that cannot take those raises SpecError). `role`
        says what the weight is for (roles.WeightRole: which layer and direction, read once
        or at every step); builders name parameters after it and may treat roles apart.
        """

    # --- elementwise (numpy broadcasting) ---------------------------------------------
    @abc.abstractmethod
    def add(self, a: Value, b: Value) -> Value: ...

    @abc.abstractmethod
    def sub(self, a: Value, b: Value) -> Value: ...

    @abc.abstractmethod
    def mul(self, a: Value, b: Value) -> Value: ...

    @abc.abstractmethod
    def div(self, a: Value, b: Value) -> Value: ...

    @abc.abstractmethod
    def sigmoid(self, x: Value) -> Value: ...

    @abc.abstractmethod
    def tanh(self, x: Value) -> Value: ...

    @abc.abstractmethod
    def relu(self, x: Value) -> Value: ...

    @abc.abstractmethod
    def exp(self, x: Value) -> Value: ...

    @abc.abstractmethod
    def log(self, x: Value) -> Value: ...

    @abc.abstractmethod
    def abs(self, x: Value) -> Value: ...

    @abc.abstractmethod
    def clamp(self, x: Value, lo: Optional[float], hi: Optional[float]) -> Value: ...

    def activation(self, act: Activation, x: Value) -> Optional[Value]:
        """A native op for `act`, or None to let the core compose it from primitives."""
        return None

    # --- shape ----------------------------------------------------------------------------
    @abc.abstractmethod
    def slice(self, x: Value, axis: int, start: int, end: int) -> Value: ...

    @abc.abstractmethod
    def concat(self, xs: Sequence[Value], axis: int) -> Value: ...

    @abc.abstractmethod
    def squeeze(self, x: Value, axis: int) -> Value: ...

    @abc.abstractmethod
    def unsqueeze(self, x: Value, axis: int) -> Value: ...

    @abc.abstractmethod
    def transpose(self, x: Value, perm: Sequence[int]) -> Value: ...

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        """x viewed as `shape` (one dim may be -1)."""
        raise NotImplementedError("reshape")

    def split(self, x: Value, axis: int, sizes) -> list:
        """Pieces of x along `axis`, each keeping it: `sizes`, or an int n for n equal
        pieces (the default slices, which needs the axis' size)."""
        if isinstance(sizes, int):
            raise NotImplementedError("split into equal pieces of an unknown size")
        out, start = [], 0
        for size in sizes:
            out.append(self.slice(x, axis, start, start + size))
            start += size
        return out

    def unstack(self, x: Value, axis: int, n: int) -> list:
        """The n slices of x along `axis` (static size n), each without that axis.

        Unrolled emission takes every timestep of the hoisted projection this way; a builder
        with a one-op form (ONNX Split of a 2-D view, torch unbind) overrides it."""
        if n == 1:
            return [self.squeeze(x, axis)]
        return [self.squeeze(self.slice(x, axis, t, t + 1), axis) for t in range(n)]

    def zeros_like_rows(self, like: Value, width: int) -> Value:
        """Zeros [B, width] with the batch (axis 0) of `like`, a [B, X] value with X >= width:
        a loop's zero initial state when the sequence length is known only at run time. The
        default multiplies a slice of `like` by zero (exact for finite values); builders
        with a shape operator give exact zeros."""
        zero = self.constant(np.zeros((), self.dtype))
        return self.mul(self.slice(like, -1, 0, width), zero)

    def stack(self, xs: Sequence[Value], axis: int) -> Value:
        """xs (equal shapes) stacked on a new `axis`: the per-step outputs into Y."""
        xs = [self.unsqueeze(x, axis) for x in xs]
        return self.concat(xs, axis) if len(xs) > 1 else xs[0]

    # --- optional: selection (capability SELECT) -------------------------------------------
    def less(self, a: Value, b: Value) -> Value:
        """Elementwise a < b as a boolean tensor."""
        raise NotImplementedError(SELECT)

    def where(self, cond: Value, a: Value, b: Value) -> Value:
        raise NotImplementedError(SELECT)

    # --- optional: run-time time indices (capability POSITIONS) ------------------------------
    def positions(self, like: Value) -> Value:
        """int64 [0, 1, ..., n-1] for the run-time size n of axis 0 of `like`: which step is
        which when sequence_lens masks a loop over a length the graph does not fix."""
        raise NotImplementedError(POSITIONS)

    # --- optional: loops (capability SCAN) ---------------------------------------------------
    def loop(
        self,
        loop,
        carried: Sequence[Value],
        xs: Sequence[Value],
        outer: dict,
        used: Optional[frozenset] = None,
    ) -> tuple[list, list]:
        """A loop node (`loop` is its graph.Loop: body, direction, where the steps read xs).
        The body is program data: the builder makes an inner builder for it and writes it
        with `translate.translate_body(loop.body, inner, leaves, outer)`, `outer` giving
        the values of the enclosing program's nodes the body reads. Returns (final
        carried, per-step outputs stacked on axis 0, in time order even when reverse).
        `used`: indices of the results (carried, then ys) the program reads; a builder
        need not compute the others. Capability SCAN; `initial_in_ys` needs
        SCAN_WITH_INITIAL, `first`/`steps`/`rows_per_step` other than their defaults
        LOOP_ROWS."""
        raise NotImplementedError(SCAN)
