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
        body,
        carried: Sequence[Value],
        xs: Sequence[Value],
        reverse: bool,
        initial_in_ys: bool,
        outer: dict,
        used: Optional[frozenset] = None,
    ) -> tuple[list, list]:
        """A loop over axis 0 of every value in `xs` (lax.scan / ONNX Scan semantics), whose
        body is a `graph.Body` (program data): the builder makes an inner builder for it and
        writes it with `translate.translate_body(body, inner, leaves, outer)`, `outer`
        giving the values of the enclosing program's nodes the body reads. Returns
        (final carried, per-step outputs stacked on axis 0, in time order even when
        reverse). With `initial_in_ys` (capability SCAN_WITH_INITIAL; one y, which is the
        new carried[0]) the ys also hold the initial carried[0], first in time order (last
        when reverse). `used`: indices of the results (carried, then ys) the program
        reads; a builder need not compute the others."""
        raise NotImplementedError(SCAN)
