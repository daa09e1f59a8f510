"""A framework-free description of one recurrent layer stack (GRU, LSTM, RNN).

Adapters translate a framework node (aten.gru, ONNX GRU, ...) into a `RecurrentSpec`
plus `LayerWeights`, and the core emits the math from those alone. Everything a
PyTorch module or an ONNX node can express has a field here, so no adapter ever needs
to special-case the math.

Canonical weight layout used by the core (adapters convert with `gate_order`):
  gate order   GRU (r, z, n)   LSTM (i, f, g, o)   RNN (single gate)
  w            [G*H, input]    input = input_size for layer 0, else D*out_size
  r            [G*H, out]      out = proj_size or hidden_size
  b_w, b_r     [G*H] or None
  peephole     [3, H] as (i, f, o) or None (LSTM only)
  proj         [P, H] or None (LSTM proj_size only)
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional, Sequence


class CellKind(enum.Enum):
    GRU = "GRU"
    LSTM = "LSTM"
    RNN = "RNN"

    @property
    def num_gates(self) -> int:
        return {"GRU": 3, "LSTM": 4, "RNN": 1}[self.value]

    @property
    def num_activations(self) -> int:
        """Activation functions per direction, as ONNX counts them (f, g[, h])."""
        return {"GRU": 2, "LSTM": 3, "RNN": 1}[self.value]


class Direction(enum.Enum):
    FORWARD = "forward"
    REVERSE = "reverse"
    BIDIRECTIONAL = "bidirectional"

    @property
    def num_directions(self) -> int:
        return 2 if self is Direction.BIDIRECTIONAL else 1


ACTIVATIONS = (
    "Relu",
    "Tanh",
    "Sigmoid",
    "Affine",
    "LeakyRelu",
    "ThresholdedRelu",
    "ScaledTanh",
    "HardSigmoid",
    "Elu",
    "Softsign",
    "Softplus",
)


@dataclasses.dataclass(frozen=True)
class Activation:
    """One activation with its parameters already resolved by the adapter.

    Defaults differ between ONNX's spec and onnxruntime (ThresholdedRelu, Affine,
    ScaledTanh), so the adapter, not the core, decides which defaults apply.
    """

    name: str
    alpha: Optional[float] = None
    beta: Optional[float] = None

    def __post_init__(self):
        if self.name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.name!r}; known: {', '.join(ACTIVATIONS)}")


SIGMOID = Activation("Sigmoid")
TANH = Activation("Tanh")
RELU = Activation("Relu")

DEFAULT_ACTIVATIONS = {
    CellKind.GRU: (SIGMOID, TANH),
    CellKind.LSTM: (SIGMOID, TANH, TANH),
    CellKind.RNN: (TANH,),
}


@dataclasses.dataclass(frozen=True)
class IOLayout:
    """Tensor layouts at the layer's boundary, named by axis, not by framework.

    batch_first:        X is [B, T, I] (else [T, B, I]); Y likewise has batch before time.
    y_directions_axis:  Y keeps a separate direction axis, [T, D, B, H] or [B, T, D, H];
                        otherwise directions are concatenated on the last axis, [T, B, D*H].
    state_batch_first:  initial/final states are [B, L*D, H] (else [L*D, B, H]).
    """

    batch_first: bool = False
    y_directions_axis: bool = True
    state_batch_first: bool = False


@dataclasses.dataclass(frozen=True)
class RecurrentSpec:
    """Everything about a recurrent layer stack except its weights and runtime values."""

    name: str  # node or module name, used in every error message
    cell: CellKind
    input_size: int
    hidden_size: int
    num_layers: int = 1
    direction: Direction = Direction.FORWARD
    layout: IOLayout = IOLayout()
    # One tuple of activations per direction (f, g[, h]); None means the cell's defaults.
    activations: Optional[Sequence[Sequence[Activation]]] = None
    clip: Optional[float] = None
    linear_before_reset: bool = True  # GRU only; PyTorch's GRU is linear_before_reset=1
    input_forget: bool = False  # LSTM only
    proj_size: int = 0  # LSTM only (PyTorch proj_size)
    # Static number of timesteps (T), when known. Unrolled emission needs it; loop emission
    # needs it only for sequence_lens masks. (Added by the core: the builder has no shape query.)
    seq_len: Optional[int] = None
    has_initial_h: bool = False
    has_initial_c: bool = False
    has_sequence_lens: bool = False
    want_y: bool = True
    want_h: bool = True
    want_c: bool = False

    @property
    def num_directions(self) -> int:
        return self.direction.num_directions

    @property
    def output_size(self) -> int:
        """Width of h per direction: proj_size for a projected LSTM, else hidden_size."""
        return self.proj_size or self.hidden_size

    def activations_for(self, direction_index: int) -> tuple[Activation, ...]:
        if self.activations is None:
            return DEFAULT_ACTIVATIONS[self.cell]
        return tuple(self.activations[direction_index])

    def layer_input_size(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.num_directions * self.output_size


@dataclasses.dataclass
class LayerWeights:
    """Weights of one (layer, direction), in the core's canonical layout.

    Each field is a numpy array (a constant: the core folds it), or a value known only at
    run time: a builder value of the canonical shape, or a `weights.Lazy` (what
    gate_order.from_onnx makes of runtime ONNX inputs). Runtime weights are arranged with
    builder ops, once per layer; the per-step ops are the same as for constants.
    """

    w: Any
    r: Any
    b_w: Any = None
    b_r: Any = None
    peephole: Any = None
    proj: Any = None


def to_dict(spec: RecurrentSpec) -> dict:
    """`spec` as plain JSON values (how a description travels inside a framework's graph)."""
    d = dataclasses.asdict(spec)
    d["cell"], d["direction"] = spec.cell.value, spec.direction.value
    return d


def from_dict(d: dict) -> RecurrentSpec:
    """The inverse of `to_dict`."""
    d = dict(d)
    d["cell"], d["direction"] = CellKind(d["cell"]), Direction(d["direction"])
    d["layout"] = IOLayout(**d["layout"])
    if d["activations"] is not None:
        d["activations"] = tuple(tuple(Activation(**a) for a in acts) for acts in d["activations"])
    return RecurrentSpec(**d)


class SpecError(ValueError):
    """A recurrent layer the core cannot handle as described; names the layer and attribute."""

    def __init__(self, layer: str, attribute: str, message: str):
        super().__init__(f"{layer}: attribute {attribute!r}: {message}")
        self.layer = layer
        self.attribute = attribute
