"""Random weights for a spec in the canonical layout; uniform(-0.3, 0.3) keeps values O(1)."""

from __future__ import annotations

import numpy as np

from recurrent_lowering.passes import CellKind, LayerWeights, RecurrentSpec


def random_weights(spec: RecurrentSpec, rng: np.random.Generator, bias=True, peephole=False):
    """weights[layer][direction] for `spec`."""

    def u(*shape):
        return rng.uniform(-0.3, 0.3, shape).astype(np.float32)

    G, H = spec.cell.num_gates, spec.hidden_size
    out = []
    for layer in range(spec.num_layers):
        row = []
        for _ in range(spec.num_directions):
            row.append(
                LayerWeights(
                    w=u(G * H, spec.layer_input_size(layer)),
                    r=u(G * H, spec.output_size),
                    b_w=u(G * H) if bias else None,
                    b_r=u(G * H) if bias else None,
                    peephole=u(3, H) if peephole and spec.cell is CellKind.LSTM else None,
                    proj=u(spec.proj_size, H) if spec.proj_size else None,
                )
            )
        out.append(row)
    return out
