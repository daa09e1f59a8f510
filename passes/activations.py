"""Apply one `Activation` through a builder: its native op if it has one, else primitives.

  Relu, Tanh, Sigmoid   native ops
  Affine                alpha * x + beta
  LeakyRelu             alpha * x + (1 - alpha) * relu(x)       (= relu(x) - alpha * relu(-x))
  ThresholdedRelu       where(alpha < x, x, 0)                  (needs SELECT)
  ScaledTanh            alpha * tanh(beta * x)
  HardSigmoid           clamp(alpha * x + beta, 0, 1)
  Elu                   relu(x) + alpha * (exp(min(x, 0)) - 1)
  Softsign              x / (1 + |x|)
  Softplus              relu(x) + log(exp(-|x|) + 1)   (log(exp(x) + 1) overflows in float16)

Multiplications by 1 and additions of 0 are not emitted. Parameters must be resolved by
the adapter (ONNX's and onnxruntime's defaults differ); `check` says what is missing.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .builder import SELECT, Builder, Value
from .spec import Activation

# Parameters each activation reads; the adapter must have resolved them.
PARAMETERS = {
    "Affine": ("alpha", "beta"),
    "LeakyRelu": ("alpha",),
    "ThresholdedRelu": ("alpha",),
    "ScaledTanh": ("alpha", "beta"),
    "HardSigmoid": ("alpha", "beta"),
    "Elu": ("alpha",),
}


SELECTING = frozenset({"ThresholdedRelu"})  # written with a select (less, where)


def selecting(spec) -> Optional[str]:
    """The first activation of the stack `spec` (a RecurrentSpec) written with a select,
    or None: a target without select runs it outside the NPU's delegate."""
    for acts in spec.activations or ():
        for act in acts:
            if act.name in SELECTING:
                return act.name
    return None


def check(act: Activation, capabilities: frozenset) -> Optional[str]:
    """Why `act` cannot be applied with these builder capabilities, or None if it can."""
    missing = [p for p in PARAMETERS.get(act.name, ()) if getattr(act, p) is None]
    if missing:
        return f"{act.name} needs {' and '.join(missing)} (the adapter resolves defaults)"
    if act.name in SELECTING and SELECT not in capabilities:
        return f"{act.name} needs select (less/where), which this builder lacks"
    return None


def apply(
    builder: Builder, act: Activation, x: Value, const: Optional[Callable[[float], Value]] = None
) -> Value:
    """act(x), emitted through `builder`; `const` makes (and may cache) scalar constants."""
    native = builder.activation(act, x)
    if native is not None:
        return native
    const = const or (lambda v: builder.constant(np.array(v, np.float64)))
    b, a, beta = builder, act.alpha, act.beta

    def scale(v, k):  # k * v, skipping k == 1
        return v if k == 1 else b.mul(v, const(k))

    def shift(v, k):  # v + k, skipping k == 0
        return v if k == 0 else b.add(v, const(k))

    name = act.name
    if name == "Relu":
        return b.relu(x)
    if name == "Tanh":
        return b.tanh(x)
    if name == "Sigmoid":
        return b.sigmoid(x)
    if name == "Affine":
        return shift(scale(x, a), beta)
    if name == "LeakyRelu":
        if a == 0:
            return b.relu(x)
        if a == 1:
            return x
        return b.add(scale(x, a), scale(b.relu(x), 1 - a))
    if name == "ThresholdedRelu":
        return b.where(b.less(const(a), x), x, const(0.0))
    if name == "ScaledTanh":
        return scale(b.tanh(scale(x, beta)), a)
    if name == "HardSigmoid":
        return b.clamp(shift(scale(x, a), beta), 0.0, 1.0)
    if name == "Elu":
        return b.add(b.relu(x), scale(shift(b.exp(b.clamp(x, None, 0.0)), -1.0), a))
    if name == "Softsign":
        return b.div(x, shift(b.abs(x), 1.0))
    if name == "Softplus":
        return b.add(b.relu(x), b.log(shift(b.exp(scale(b.abs(x), -1.0)), 1.0)))
    raise ValueError(f"unknown activation {name!r}")
