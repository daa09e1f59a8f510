"""ONNX GRU/LSTM/RNN node -> core `RecurrentSpec`, weights and runtime inputs.

Everything framework-specific about the ONNX operators is resolved here (attribute
defaults, activation alpha/beta defaults, input positions, layouts), so the core only
ever sees a complete spec. The caller supplies a lookup that folds initializers, Constant
nodes and constant-only expressions into numpy arrays; weights it cannot fold are runtime
weights (graph inputs, computed values), which the core arranges with graph ops, unless
the caller requires constants.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Union

import numpy as np
import onnx
from onnx import helper

from recurrent_lowering.passes import gate_order
from recurrent_lowering.passes import weights as wa
from recurrent_lowering.passes.spec import (
    ACTIVATIONS,
    Activation,
    CellKind,
    Direction,
    IOLayout,
    LayerWeights,
    RecurrentSpec,
    SpecError,
)

RECURRENT_OPS = {"GRU": CellKind.GRU, "LSTM": CellKind.LSTM, "RNN": CellKind.RNN}


def is_recurrent(node: onnx.NodeProto) -> bool:
    """An ONNX-domain GRU, LSTM or RNN node."""
    return node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx")


# Which activations consume an alpha / a beta from activation_alpha / activation_beta.
USES_ALPHA = {"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"}
USES_BETA = {"Affine", "ScaledTanh", "HardSigmoid"}

# Defaults when activation_alpha/beta do not supply a value.
# "onnx": those of the ONNX operators of the same name (Affine and ScaledTanh, which have
# no operator today, get the identity-like 1.0). "onnxruntime": what onnxruntime 1.32 does
# (measured: Affine, ThresholdedRelu and ScaledTanh fall back to 0).
ACTIVATION_DEFAULTS = {
    "onnx": {
        "Affine": (1.0, 0.0),
        "LeakyRelu": (0.01, None),
        "ThresholdedRelu": (1.0, None),
        "ScaledTanh": (1.0, 1.0),
        "HardSigmoid": (0.2, 0.5),
        "Elu": (1.0, None),
    },
    "onnxruntime": {
        "Affine": (0.0, 0.0),
        "LeakyRelu": (0.01, None),
        "ThresholdedRelu": (0.0, None),
        "ScaledTanh": (0.0, 0.0),
        "HardSigmoid": (0.2, 0.5),
        "Elu": (1.0, None),
    },
}

_CANONICAL_NAMES = {name.lower(): name for name in ACTIVATIONS}

ConstantLookup = Callable[[str], Optional[np.ndarray]]
ValueType = Callable[[str], tuple]  # name -> (ONNX elem type or None, shape or None)


class OnnxReadError(SpecError):
    """An ONNX recurrent node the adapter cannot translate; names node and attribute."""


@dataclasses.dataclass
class RecurrentNode:
    """What the rewrite needs from one ONNX recurrent node."""

    spec: RecurrentSpec
    weights: list  # weights[layer][direction] -> LayerWeights (one layer for ONNX)
    x: str
    initial_h: Optional[str]
    initial_c: Optional[str]
    sequence_lens: Union[None, np.ndarray, str]  # constant array or runtime value name
    outputs: tuple  # (Y, Y_h, Y_c) names, "" when not wanted
    float_dtype: np.dtype  # dtype of X and the weights
    runtime_weights: dict = dataclasses.field(default_factory=dict)  # name -> static shape


def node_label(node: onnx.NodeProto) -> str:
    """The node's name for messages; unnamed nodes are described by op and first output."""
    if node.name:
        return node.name
    first = next((o for o in node.output if o), "?")
    return f"{node.op_type}(->{first})"


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _weight(node, label, index, attribute, lookup: ConstantLookup, required: bool, runtime):
    """A weight input as a numpy array (constant) or a runtime `weights.Lazy`.

    `runtime(name)` gives (numpy dtype, static shape) of a value computed at run time, or
    None when runtime weights are refused (require_constant_weights) or their type is
    unknown.
    """
    name = _input(node, index)
    if not name:
        if required:
            raise OnnxReadError(label, attribute, "required input is missing")
        return None
    value = lookup(name)
    if value is not None:
        return np.asarray(value)
    if runtime is None:
        raise OnnxReadError(
            label,
            attribute,
            f"input {name!r} is computed at run time; this route needs constant weights "
            "(initializers, Constant nodes or expressions of constants)",
        )
    dtype, shape = runtime(name)
    if dtype is None or shape is None or any(d is None for d in shape):
        raise OnnxReadError(
            label,
            attribute,
            f"input {name!r} is computed at run time and its shape is not static "
            f"({'unknown' if shape is None else list(shape)}); a runtime weight needs one",
        )
    return wa.runtime(name, shape)


def _resolve_activations(
    node, label, cell: CellKind, num_directions: int, defaults: str
) -> Optional[tuple]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    names = attrs.get("activations")
    alphas = list(attrs.get("activation_alpha", []))
    betas = list(attrs.get("activation_beta", []))
    if names is None:
        if alphas or betas:
            raise OnnxReadError(
                label, "activation_alpha", "given without an 'activations' attribute"
            )
        return None
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    per_direction = cell.num_activations
    if len(names) == per_direction and num_directions == 2:
        names = names * 2  # one set for both directions (onnxruntime 1.32 refuses it)
        alphas, betas = alphas * 2, betas * 2
    if len(names) != per_direction * num_directions:
        raise OnnxReadError(
            label,
            "activations",
            f"expected {per_direction * num_directions} activation names "
            f"({per_direction} per direction), got {len(names)}: {names}",
        )
    table = ACTIVATION_DEFAULTS[defaults]
    resolved = []
    for raw in names:
        name = _CANONICAL_NAMES.get(raw.lower())
        if name is None:
            raise OnnxReadError(
                label, "activations", f"unknown activation {raw!r}; known: {', '.join(ACTIVATIONS)}"
            )
        alpha = beta = None
        default_alpha, default_beta = table.get(name, (None, None))
        if name in USES_ALPHA:
            alpha = float(alphas.pop(0)) if alphas else default_alpha
        if name in USES_BETA:
            beta = float(betas.pop(0)) if betas else default_beta
        resolved.append(Activation(name, alpha, beta))
    if alphas or betas:
        raise OnnxReadError(
            label,
            "activation_alpha" if alphas else "activation_beta",
            "more values than the activations consume",
        )
    return tuple(
        tuple(resolved[d * per_direction : (d + 1) * per_direction]) for d in range(num_directions)
    )


def _expect_shape(label, attribute, array, shape):
    if tuple(array.shape) != tuple(shape):
        raise OnnxReadError(
            label, attribute, f"shape {list(array.shape)} does not match expected {list(shape)}"
        )


def read_node(
    node: onnx.NodeProto,
    lookup: ConstantLookup,
    activation_defaults: str = "onnxruntime",
    require_constant_weights: bool = False,
    value_type: Optional[ValueType] = None,
) -> RecurrentNode:
    """Translate one ONNX GRU/LSTM/RNN node (any opset) for the core.

    `lookup(name)` returns the value of a constant tensor or None for run-time values.
    `activation_defaults` is "onnxruntime" or "onnx": whose alpha/beta defaults apply
    when the node omits them. W, R, B, P computed at run time (ONNX's node tests feed them
    as graph inputs) become runtime weights, which need `value_type(name)` -> (ONNX elem
    type, shape) with a static shape; `require_constant_weights` refuses them instead (for
    routes that need constants, such as conversion to a torch program).
    """
    if not is_recurrent(node):
        raise ValueError(f"{node_label(node)}: not an ONNX GRU/LSTM/RNN node")
    if activation_defaults not in ACTIVATION_DEFAULTS:
        raise ValueError(
            f"activation_defaults must be one of {sorted(ACTIVATION_DEFAULTS)}, "
            f"got {activation_defaults!r}"
        )
    label = node_label(node)
    cell = RECURRENT_OPS[node.op_type]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    known = {
        "activation_alpha",
        "activation_beta",
        "activations",
        "clip",
        "direction",
        "hidden_size",
        "layout",
        "output_sequence",  # opset 1 only; Y is produced whenever its output is named
    }
    known |= {"GRU": {"linear_before_reset"}, "LSTM": {"input_forget"}, "RNN": set()}[node.op_type]
    for name in attrs:
        if name not in known:
            raise OnnxReadError(label, name, f"unknown attribute for {node.op_type}")

    direction_name = attrs.get("direction", b"forward")
    direction_name = (
        direction_name.decode() if isinstance(direction_name, bytes) else direction_name
    )
    try:
        direction = Direction(direction_name)
    except ValueError:
        raise OnnxReadError(
            label, "direction", f"{direction_name!r} is not forward, reverse or bidirectional"
        ) from None
    num_directions = direction.num_directions
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise OnnxReadError(label, "layout", f"must be 0 or 1, got {layout}")

    runtime = None
    if not require_constant_weights:

        def runtime(name):
            elem, shape = value_type(name) if value_type is not None else (None, None)
            dtype = None if not elem else helper.tensor_dtype_to_np_dtype(elem)
            return dtype, shape

    def weight(index, attribute, required=False):
        return _weight(node, label, index, attribute, lookup, required, runtime)

    w = weight(1, "W", required=True)
    r = weight(2, "R", required=True)
    b = weight(3, "B")
    p = weight(7, "P") if cell is CellKind.LSTM else None
    if cell is not CellKind.LSTM and len(node.input) > 6:
        raise OnnxReadError(label, "inputs", f"{node.op_type} takes at most 6 inputs")
    if w.ndim != 3:
        raise OnnxReadError(label, "W", f"must have rank 3, got shape {list(w.shape)}")
    gates = cell.num_gates
    hidden_size = int(attrs.get("hidden_size", r.shape[-1] if r.ndim == 3 else 0))
    if hidden_size <= 0:
        raise OnnxReadError(label, "hidden_size", f"must be positive, got {hidden_size}")
    input_size = int(w.shape[2])
    _expect_shape(label, "W", w, (num_directions, gates * hidden_size, input_size))
    _expect_shape(label, "R", r, (num_directions, gates * hidden_size, hidden_size))
    if b is not None:
        _expect_shape(label, "B", b, (num_directions, 2 * gates * hidden_size))
    if p is not None:
        _expect_shape(label, "P", p, (num_directions, 3 * hidden_size))
    float_dtype = np.dtype(w.dtype if isinstance(w, np.ndarray) else runtime(_input(node, 1))[0])
    if float_dtype not in (np.float16, np.float32, np.float64):
        raise OnnxReadError(label, "W", f"unsupported dtype {float_dtype}")

    clip = attrs.get("clip")
    if clip is not None and not clip > 0:
        raise OnnxReadError(label, "clip", f"must be positive, got {clip}")
    linear_before_reset = bool(attrs.get("linear_before_reset", 0))
    input_forget = bool(attrs.get("input_forget", 0))

    x = _input(node, 0)
    if not x:
        raise OnnxReadError(label, "X", "required input is missing")
    seq_name = _input(node, 4)
    sequence_lens: Union[None, np.ndarray, str] = None
    if seq_name:
        folded = lookup(seq_name)
        sequence_lens = seq_name if folded is None else np.asarray(folded).astype(np.int64)
        if isinstance(sequence_lens, np.ndarray) and sequence_lens.ndim != 1:
            raise OnnxReadError(
                label, "sequence_lens", f"must have rank 1, got shape {list(sequence_lens.shape)}"
            )
    initial_h = _input(node, 5) or None
    initial_c = (_input(node, 6) or None) if cell is CellKind.LSTM else None

    outputs = tuple(node.output[i] if i < len(node.output) else "" for i in range(3))
    want_c = cell is CellKind.LSTM and bool(outputs[2])

    spec = RecurrentSpec(
        name=label,
        cell=cell,
        input_size=input_size,
        hidden_size=hidden_size,
        num_layers=1,
        direction=direction,
        layout=IOLayout(
            batch_first=layout == 1, y_directions_axis=True, state_batch_first=layout == 1
        ),
        activations=_resolve_activations(node, label, cell, num_directions, activation_defaults),
        clip=None if clip is None else float(clip),
        linear_before_reset=linear_before_reset if cell is CellKind.GRU else False,
        input_forget=input_forget if cell is CellKind.LSTM else False,
        has_initial_h=initial_h is not None,
        has_initial_c=initial_c is not None,
        has_sequence_lens=sequence_lens is not None,
        want_y=bool(outputs[0]),
        want_h=bool(outputs[1]),
        want_c=want_c,
    )
    weights = [[_layer_weights(cell, label, w, r, b, p, d) for d in range(num_directions)]]
    return RecurrentNode(
        spec=spec,
        weights=weights,
        x=x,
        initial_h=initial_h,
        initial_c=initial_c,
        sequence_lens=sequence_lens,
        outputs=outputs,
        float_dtype=float_dtype,
        runtime_weights={
            _input(node, i): tuple(a.shape)
            for i, a in ((1, w), (2, r), (3, b), (7, p))
            if wa.is_runtime(a)
        },
    )


def _layer_weights(cell, label, w, r, b, p, d) -> LayerWeights:
    try:
        return gate_order.from_onnx(cell, w, r, b, p, direction_index=d)
    except SpecError:
        raise
    except (ValueError, TypeError) as e:
        raise OnnxReadError(label, "W", f"cannot convert weights of direction {d}: {e}") from e
