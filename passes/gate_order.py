"""Gate order and weight layout: PyTorch and ONNX to and from the core's `LayerWeights`.

The one place that knows how each framework stores a recurrent layer's weights.

  canonical (core)  GRU (r, z, n)   LSTM (i, f, g, o)   peephole [3, H] as (i, f, o)
  PyTorch           GRU (r, z, n)   LSTM (i, f, g, o)   weight_ih_l{k}[_reverse], weight_hh_..,
                                                        bias_ih_.., bias_hh_.., weight_hr_..
  ONNX              GRU (z, r, h)   LSTM (i, o, f, c)   W [D, G*H, I], R [D, G*H, H],
                                                        B [D, 2*G*H] = [Wb | Rb],
                                                        P [D, 3H] as (i, o, f)

Plain numpy (arrays are copied, never aliased); from_onnx also takes runtime weights,
arranged through `weights` (the weight algebra).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from . import weights
from .spec import CellKind, LayerWeights

# ONNX gate j holds canonical gate ONNX_GATES[cell][j].
# GRU: ONNX (z, r, h) = canonical (1, 0, 2); LSTM: ONNX (i, o, f, c) = canonical (0, 3, 1, 2).
ONNX_GATES = {CellKind.GRU: (1, 0, 2), CellKind.LSTM: (0, 3, 1, 2), CellKind.RNN: (0,)}
# ONNX peephole row j holds canonical row ONNX_PEEPHOLES[j]: ONNX (i, o, f), canonical (i, f, o).
ONNX_PEEPHOLES = (0, 2, 1)


def _inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for j, k in enumerate(perm):
        inv[k] = j
    return tuple(inv)


def permute_gates(
    a: Optional[np.ndarray], order: Sequence[int], axis: int = 0
) -> Optional[np.ndarray]:
    """Reorder the gate blocks of `a` along `axis`: block j of the result is block order[j]."""
    if a is None:
        return None
    blocks = np.split(np.asarray(a), len(order), axis=axis)
    return np.concatenate([blocks[k] for k in order], axis=axis)


# --- PyTorch --------------------------------------------------------------------------------


def torch_suffix(layer: int, direction_index: int) -> str:
    """Parameter-name suffix of nn.GRU/LSTM/RNN: '_l0', '_l1_reverse', ..."""
    return f"_l{layer}" + ("_reverse" if direction_index == 1 else "")


def from_torch(cell: CellKind, params: Mapping[str, np.ndarray]) -> LayerWeights:
    """LayerWeights from one (layer, direction) of a PyTorch module.

    `params` maps 'weight_ih', 'weight_hh' and optionally 'bias_ih', 'bias_hh',
    'weight_hr' (names without the '_l{k}[_reverse]' suffix) to arrays. PyTorch's gate
    order is already canonical; only names change.
    """
    del cell  # same order for every cell kind

    def get(name):
        v = params.get(name)
        return None if v is None else np.array(v)

    return LayerWeights(
        w=get("weight_ih"),
        r=get("weight_hh"),
        b_w=get("bias_ih"),
        b_r=get("bias_hh"),
        proj=get("weight_hr"),
    )


_TORCH_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")


def from_torch_module_params(
    cell: CellKind, named: Mapping[str, np.ndarray], num_layers: int, num_directions: int
) -> list[list[LayerWeights]]:
    """weights[layer][direction] from a module's named parameters (full names with suffixes)."""
    return [
        [
            from_torch(
                cell,
                {
                    base: named[base + torch_suffix(layer, d)]
                    for base in _TORCH_NAMES
                    if base + torch_suffix(layer, d) in named
                },
            )
            for d in range(num_directions)
        ]
        for layer in range(num_layers)
    ]


def to_torch(cell: CellKind, weights: LayerWeights) -> dict[str, np.ndarray]:
    """The inverse of `from_torch` (suffix-free names; absent arrays left out)."""
    del cell
    named = {
        "weight_ih": weights.w,
        "weight_hh": weights.r,
        "bias_ih": weights.b_w,
        "bias_hh": weights.b_r,
        "weight_hr": weights.proj,
    }
    return {k: np.array(v) for k, v in named.items() if v is not None}


# --- ONNX -----------------------------------------------------------------------------------


def from_onnx(cell: CellKind, W, R, B=None, P=None, direction_index: int = 0) -> LayerWeights:
    """LayerWeights of one direction of an ONNX GRU/LSTM/RNN node's W, R, B, P inputs.

    Each input is a numpy array (the result is numpy, copied) or a `weights.Lazy` runtime
    value (the result is lazy: the reordering is emitted, once, when the core uses it).
    """
    canon = _inverse(ONNX_GATES[cell])  # canonical gate k is ONNX gate canon[k]
    G, d = cell.num_gates, direction_index

    def gates(a):
        return _own(weights.blocks(a, G, canon))

    W, R = weights.take(W, d), weights.take(R, d)
    b_w = b_r = None
    if B is not None:
        B = weights.take(B, d)
        half = weights.shape(B)[0] // 2
        b_w, b_r = weights.rows(B, 0, half), weights.rows(B, half, 2 * half)
    peephole = None
    if P is not None:
        P = weights.take(P, d)
        h = weights.shape(P)[-1] // 3
        rows = [weights.rows(P, j * h, (j + 1) * h) for j in _inverse(ONNX_PEEPHOLES)]
        peephole = _own(weights.stack(rows))
    return LayerWeights(w=gates(W), r=gates(R), b_w=gates(b_w), b_r=gates(b_r), peephole=peephole)


def _own(a):
    """A numpy result copied (never a view of the caller's array); a Lazy as it is."""
    return np.array(a) if isinstance(a, np.ndarray) else a


def to_onnx(
    cell: CellKind, directions: Sequence[LayerWeights]
) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """W, R, B, P of an ONNX node from the LayerWeights of each direction.

    B is None when no direction has a bias (a missing one is zeros otherwise); P likewise.
    ONNX has no projection: a LayerWeights with `proj` is refused.
    """
    order = ONNX_GATES[cell]
    if any(lw.proj is not None for lw in directions):
        raise ValueError("ONNX recurrent operators have no projection (proj_size)")
    W = np.stack([permute_gates(lw.w, order) for lw in directions])
    R = np.stack([permute_gates(lw.r, order) for lw in directions])
    gh = W.shape[1]
    B = None
    if any(lw.b_w is not None or lw.b_r is not None for lw in directions):
        zeros = np.zeros(gh, W.dtype)
        B = np.stack(
            [
                np.concatenate(
                    [
                        permute_gates(lw.b_w if lw.b_w is not None else zeros, order),
                        permute_gates(lw.b_r if lw.b_r is not None else zeros, order),
                    ]
                )
                for lw in directions
            ]
        )
    P = None
    if any(lw.peephole is not None for lw in directions):
        h = gh // cell.num_gates
        zeros = np.zeros((3, h), W.dtype)
        P = np.stack(
            [
                (lw.peephole if lw.peephole is not None else zeros)[list(ONNX_PEEPHOLES)].reshape(
                    -1
                )
                for lw in directions
            ]
        )
    return W, R, B, P
