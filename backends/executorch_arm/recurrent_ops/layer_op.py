"""`recurrent_lowering::layer`: a recurrent layer stack as one torch op carrying the core's
complete description.

torch's nn.GRU/LSTM/RNN (aten.gru/lstm/rnn_*) express only what PyTorch computes. A layer
they cannot express (ONNX's peepholes, `linear_before_reset=0`, clip, other activations,
reverse direction, sequence lengths) travels through torch.export and into the Arm flow
as this op instead: its `description` is the RecurrentSpec (passes.spec.to_dict) and
which LayerWeights fields `weights` holds, so decompose.py reads it like an aten op and
the layer gets the same forms, quantization and options as a torch model's.

    layer(x, initial_h?, initial_c?, sequence_lens?, weights[], description) -> (y, h, c)

Tensors are in the spec's IOLayout; weights in the core's canonical layout, flattened
over (layer, direction) and LayerWeights' fields. Outputs the spec does not want (and c
of a GRU or RNN) are zeros of their shape. Eagerly the op runs the core on numpy
(NumpyBuilder): the reference, not a fast path.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import numpy as np
import torch

from recurrent_lowering import passes
from recurrent_lowering.passes.numpy_builder import NumpyBuilder
from recurrent_lowering.passes.spec import CellKind, LayerWeights, RecurrentSpec, from_dict, to_dict

FIELDS = tuple(f.name for f in dataclasses.fields(LayerWeights))


def describe(spec: RecurrentSpec, weights: Sequence[Sequence[LayerWeights]]):
    """(description, flat weight arrays) for the op."""
    present, flat = [], []
    for row in weights:
        present.append([])
        for lw in row:
            names = [f for f in FIELDS if getattr(lw, f) is not None]
            present[-1].append(names)
            flat.extend(np.asarray(getattr(lw, f), np.float32) for f in names)
    return json.dumps({"spec": to_dict(spec), "weights": present}), flat


def read(description: str, flat: Sequence) -> tuple[RecurrentSpec, list]:
    """(spec, weights[layer][direction]) from the op's arguments; `flat` holds what each
    weight is to the reader (arrays, or nodes)."""
    d = json.loads(description)
    flat, weights = list(flat), []
    for row in d["weights"]:
        weights.append([LayerWeights(**{f: flat.pop(0) for f in names}) for names in row])
    if flat:
        raise ValueError(f"{len(flat)} weights more than the description lists")
    return from_dict(d["spec"]), weights


def _shapes(spec: RecurrentSpec, x_shape) -> tuple:
    """(y, h) shapes of the op's outputs for an input of `x_shape`."""
    layout = spec.layout
    steps, batch = (x_shape[1], x_shape[0]) if layout.batch_first else (x_shape[0], x_shape[1])
    dirs, width = spec.num_directions, spec.output_size
    if layout.y_directions_axis:
        y = (batch, steps, dirs, width) if layout.batch_first else (steps, dirs, batch, width)
    else:
        y = (batch, steps, dirs * width) if layout.batch_first else (steps, batch, dirs * width)
    states = spec.num_layers * dirs
    h = (batch, states, width) if layout.state_batch_first else (states, batch, width)
    return y, h


@torch.library.custom_op("recurrent_lowering::layer", mutates_args=())
def layer(
    x: torch.Tensor,
    initial_h: Optional[torch.Tensor],
    initial_c: Optional[torch.Tensor],
    sequence_lens: Optional[torch.Tensor],
    weights: list[torch.Tensor],
    description: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    spec, layer_weights = read(description, [w.detach().cpu().numpy() for w in weights])
    steps = x.shape[1 if spec.layout.batch_first else 0]
    lstm = spec.cell is CellKind.LSTM
    spec = dataclasses.replace(
        spec,
        seq_len=steps,
        has_initial_h=initial_h is not None,
        has_initial_c=lstm and initial_c is not None,
        has_sequence_lens=sequence_lens is not None,
        want_y=True,
        want_h=True,
        want_c=lstm,
    )
    nb = NumpyBuilder()

    def value(t):
        return None if t is None else nb.input(t.detach().cpu().numpy())

    lens = None if sequence_lens is None else sequence_lens.detach().cpu().numpy()
    out = passes.emit(
        nb,
        spec,
        layer_weights,
        value(x),
        value(initial_h),
        value(initial_c if lstm else None),
        lens,
    )
    y_shape, h_shape = _shapes(spec, tuple(x.shape))
    c = out.c if out.c is not None else np.zeros(h_shape, np.float32)
    return tuple(
        torch.from_numpy(np.ascontiguousarray(np.asarray(v, np.float32))).to(x.dtype)
        for v in (out.y, out.h, c)
    )


@layer.register_fake
def _(x, initial_h, initial_c, sequence_lens, weights, description):
    spec = from_dict(json.loads(description)["spec"])
    y_shape, h_shape = _shapes(spec, tuple(x.shape))
    return x.new_empty(y_shape), x.new_empty(h_shape), x.new_empty(h_shape)


OP = torch.ops.recurrent_lowering.layer.default


class Layer(torch.nn.Module):
    """A layer stack as a module: its weights are parameters (so torch.export lifts them as
    the program's constants, where decompose.py reads them) and `forward` calls the op.
    `forward(x, initial_h=None, initial_c=None, sequence_lens=None) -> (y, h[, c])`, c for
    an LSTM only."""

    def __init__(self, spec: RecurrentSpec, weights: Sequence[Sequence[LayerWeights]]):
        super().__init__()
        self.description, flat = describe(spec, weights)
        self.lstm = spec.cell is CellKind.LSTM
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.from_numpy(w.copy()), requires_grad=False) for w in flat
        )

    def forward(self, x, initial_h=None, initial_c=None, sequence_lens=None):
        y, h, c = layer(
            x, initial_h, initial_c, sequence_lens, list(self.weights), self.description
        )
        return (y, h, c) if self.lstm else (y, h)
