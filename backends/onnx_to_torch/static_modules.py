"""onnx2torch modules that read their indices in `forward`, replaced by ones holding Python
ints (torch.export cannot trace `.numpy()`/`.tolist()` or indexing by a tensor), in the
forms the Arm backend lowers to the NPU: slices and concatenations where the indices allow.

ONNX semantics throughout: negative axes count from the back, out-of-range slice bounds
clamp, as Python slices do.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class StaticSlice(nn.Module):
    def __init__(self, specs: list):  # [(axis, start, end, step)]
        super().__init__()
        self.specs = specs

    def forward(self, x):
        for axis, start, end, step in self.specs:
            axis %= x.dim()
            lead = (slice(None),) * axis
            if step > 0:
                x = x[lead + (slice(start, end, step),)]
                continue
            picked = range(x.shape[axis])[slice(start, end, step)]
            first = x.shape[axis] - 1 - picked.start if len(picked) else 0
            x = x.flip(axis)[lead + (slice(first, first + len(picked) * -step, -step),)]
        return x


class StaticSplit(nn.Module):
    def __init__(self, sizes: list, axis: int):
        super().__init__()
        self.sizes, self.axis = sizes, axis

    def forward(self, x):
        return torch.split(x, self.sizes, dim=self.axis)


class StaticSqueeze(nn.Module):
    def __init__(self, axes: list):
        super().__init__()
        self.axes = axes

    def forward(self, x):
        if not self.axes:
            return x.squeeze()
        for axis in sorted((a % x.dim() for a in self.axes), reverse=True):
            x = x.squeeze(axis)
        return x


class StaticUnsqueeze(nn.Module):
    def __init__(self, axes: list):
        super().__init__()
        self.axes = axes

    def forward(self, x):
        rank = x.dim() + len(self.axes)
        for axis in sorted(a % rank for a in self.axes):
            x = x.unsqueeze(axis)
        return x


class StaticReshape(nn.Module):
    def __init__(self, shape: list):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(self.shape)])


class StaticExpand(nn.Module):
    def __init__(self, shape: list):
        super().__init__()
        self.shape = shape

    def forward(self, x):  # ONNX Expand broadcasts both ways
        return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(self.shape)))


class StaticPad(nn.Module):
    """Pad with constant pads. torch pads reflect/edge only over the last 1-3 dims of a
    tensor with one or two leading dims more (silero-vad's STFT reflects a 2-D [1, N]):
    the dims before the first padded one are flattened into that batch and restored."""

    def __init__(self, pads: list, mode: str, value: float):
        super().__init__()
        rank = len(pads) // 2
        padded = [a for a in range(rank) if pads[a] or pads[rank + a]] or [rank - 1]
        self.first = padded[0] if mode != "constant" else 0
        trailing = range(rank - 1, self.first - 1, -1)  # torch lists the last dim first
        self.pads = [p for a in trailing for p in (pads[a], pads[rank + a])]
        self.mode, self.value = mode, value

    def forward(self, x):
        if self.mode == "constant":
            return nn.functional.pad(x, self.pads, value=self.value)
        lead = x.shape[: self.first]
        y = x.reshape(1, -1, *x.shape[self.first :])
        y = nn.functional.pad(y, self.pads, mode=self.mode)
        return y.reshape(*lead, *y.shape[2:])


class StaticGather(nn.Module):
    """Gather with constant indices. The indices, read in order, are a few runs of
    consecutive positions (silero-vad's state reads: one; GTCRN's sliding windows of 3 over
    the frequency axis: three): a select, or a slice per run and a concatenation, which
    the NPU runs. Otherwise index_select, which U55 cannot run; onnx2torch indexes with the
    tensor, which torch.export turns into a data-dependent `.item()`."""

    MAX_RUNS = 16

    def __init__(self, indices: np.ndarray, axis: int):
        super().__init__()
        self.axis, self.shape = axis, list(indices.shape)
        self.flat = [int(i) for i in indices.reshape(-1)]

    def forward(self, x):
        axis = self.axis % x.dim()
        flat = [i % x.shape[axis] for i in self.flat]
        if not self.shape:
            return x.select(axis, flat[0])
        runs = _runs(flat)
        if len(runs) <= self.MAX_RUNS:
            parts = [_rows(x, axis, start, size) for start, size in runs]
            y = parts[0] if len(parts) == 1 else torch.cat(parts, axis)
        else:
            index = torch.tensor(flat, dtype=torch.int64, device=x.device)
            y = x.index_select(axis, index)
        if len(self.shape) == 1:
            return y
        return y.reshape(*x.shape[:axis], *self.shape, *x.shape[axis + 1 :])


def _rows(x, dim: int, start: int, size: int):
    """x[..., start:start + size, ...] on `dim`: aten.slice, which the Arm quantizer
    annotates (it leaves aten.narrow in float, so on the CPU)."""
    return x[(slice(None),) * dim + (slice(start, start + size),)]


def _runs(flat: list) -> list:
    """[(start, size)] of the maximal runs of consecutive values in `flat`."""
    runs = []
    for i in flat:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return [(start, size) for start, size in runs]


class Square(nn.Module):
    """Pow(x, 2) as x * x: U55 has no pow (an STFT's power spectrum would leave the NPU)."""

    def forward(self, x):
        return x * x


class StaticScatterND(nn.Module):
    """ScatterND with constant indices (streaming models' cache writes). Indices that
    enumerate a block (contiguous ranges, row-major) become slices and a concatenation,
    which the NPU runs; others an index_put with constant indices. onnx2torch reads the
    indices with `.tolist()` in `forward`, which torch.export cannot trace."""

    def __init__(self, indices: np.ndarray):
        super().__init__()
        self.depth = int(indices.shape[-1])
        flat = indices.reshape(-1, self.depth).astype(np.int64)
        self.points = [[int(i) for i in column] for column in flat.T]
        self.block = _block_of(flat, indices.shape[:-1])  # [(start, size)] per indexed dim

    def forward(self, data, updates):
        if self.block is None:
            points = [
                torch.tensor([i % data.shape[d] for i in column], dtype=torch.int64)
                for d, column in enumerate(self.points)
            ]
            values = updates.reshape(-1, *data.shape[self.depth :])
            return data.index_put(tuple(points), values)
        sizes = [size for _, size in self.block]
        return _replace_block(
            data, updates.reshape(*sizes, *data.shape[self.depth :]), self.block, 0
        )


def _block_of(flat: np.ndarray, grid: tuple):
    """[(start, size)] per indexed dim if `flat` lists a block in row-major order."""
    if flat.size == 0 or (flat < 0).any():
        return None
    starts, stops = flat.min(axis=0), flat.max(axis=0) + 1
    ranges = [np.arange(a, b) for a, b in zip(starts, stops)]
    mesh = np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1).reshape(-1, flat.shape[1])
    if mesh.shape != flat.shape or not (mesh == flat).all():
        return None
    return [(int(a), int(b - a)) for a, b in zip(starts, stops)]


def _replace_block(data, block, where: list, dim: int):
    """`data` with the block at `where` (from `dim` on) replaced by `block`: slices of
    what stays and a concatenation per indexed dim, none for a dim the block spans whole
    (an empty or unused slice would be an op the quantizer leaves in float, on the CPU)."""

    def whole(d: int) -> bool:
        return where[d] == (0, data.shape[d])

    if all(whole(d) for d in range(dim, len(where))):
        return block
    if whole(dim):
        return _replace_block(data, block, where, dim + 1)
    start, size = where[dim]
    if all(whole(d) for d in range(dim + 1, len(where))):
        inner = block
    else:
        inner = _replace_block(_rows(data, dim, start, size), block, where, dim + 1)
    parts = [_rows(data, dim, 0, start)] if start else []
    parts.append(inner)
    rest = data.shape[dim] - start - size
    if rest:
        parts.append(_rows(data, dim, start + size, rest))
    return torch.cat(parts, dim)


def _static_pad(module, pads, value=None):
    value = 0.0 if value is None else float(value.reshape(-1)[0])
    static = StaticPad(_ints(pads), module.mode, value)
    return None if static.mode != "constant" and len(static.pads) > 6 else static  # 3 dims


def _ints(value) -> list:
    return [int(v) for v in value.reshape(-1).tolist()]


def _static_slice(module, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    return StaticSlice(list(zip(axes, starts, ends, steps)))


def _static_split(module, sizes=None):
    return None if sizes is None else StaticSplit(_ints(sizes), module.axis)


# onnx2torch class -> factory(module, *constant inputs) of its replacement, or None
STATIC = {
    "OnnxSlice": _static_slice,
    "OnnxSplit13": _static_split,
    "OnnxSqueezeDynamicAxes": lambda module, axes=None: StaticSqueeze(
        [] if axes is None else _ints(axes)
    ),
    "OnnxUnsqueezeDynamicAxes": lambda module, axes: StaticUnsqueeze(_ints(axes)),
    "OnnxReshape": lambda module, shape: StaticReshape(_ints(shape)),
    "OnnxExpand": lambda module, shape: StaticExpand(_ints(shape)),
    "OnnxPadDynamic": _static_pad,
    "OnnxGather": lambda module, indices: StaticGather(indices.numpy(), module._axis),
    "OnnxPow": lambda module, exponent: (
        Square() if exponent.numel() == 1 and exponent == 2 else None
    ),
}
