"""Recurrent-layer decomposition core: GRU, LSTM and RNN emitted through a narrow builder.

    from passes import emit
    out = emit(builder, spec, weights, x, initial_h=None, initial_c=None,
               sequence_lens=None, emission="unrolled")   # -> Outputs(y, h, c)

spec: RecurrentSpec; weights[layer][direction]: LayerWeights (see gate_order for PyTorch
and ONNX conversions); builder: a Builder (numpy_builder.NumpyBuilder evaluates).
"""

from .builder import POSITIONS, SCAN, SCAN_WITH_INITIAL, SELECT, Builder
from .sequence import Outputs, emit, emit_step
from .spec import (
    Activation,
    CellKind,
    Direction,
    IOLayout,
    LayerWeights,
    RecurrentSpec,
    SpecError,
)

__all__ = [
    "Activation",
    "Builder",
    "CellKind",
    "Direction",
    "IOLayout",
    "LayerWeights",
    "Outputs",
    "POSITIONS",
    "RecurrentSpec",
    "SCAN",
    "SCAN_WITH_INITIAL",
    "SELECT",
    "SpecError",
    "emit",
    "emit_step",
]
