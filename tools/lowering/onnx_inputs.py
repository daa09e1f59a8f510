"""Inputs for an .onnx model when the user gives no --calibration.

The numerics check (and, for NPU targets, the static shapes) needs inputs the model takes.
Dynamic dimensions get what the graph fixes (backends.onnx.input_sizes: feature sizes from
weights, batch 1, DEFAULT_TIME_STEPS on recurrent time axes); integer inputs the value the
graph compares them with or the full length. Dimensions nothing fixes start at 1, and when
onnxruntime refuses the inputs, one such dimension at a time tries larger sizes (an STFT
front-end needs a few hundred samples, for instance). The sizes used, and why, go into the
report.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Optional

import numpy as np

from .errors import first_line

DEFAULT_TIME_STEPS = 16
LARGER_SIZES = (16, 64, 256, 512, 1024, 4096)


@dataclasses.dataclass
class Generated:
    """Inputs in graph input order. `refused`: onnxruntime's reason when it ran none of the
    candidates (None when it ran them, or when it cannot load the model at all)."""

    feeds: dict  # name -> np.ndarray
    chosen: list  # "name[axis]=size (why)" and "name=value (why)", for the report
    refused: Optional[str] = None

    @property
    def shapes(self) -> dict:
        return {name: list(a.shape) for name, a in self.feeds.items()}

    def describe(self) -> str:
        return ", ".join(f"{name} {list(a.shape)}" for name, a in self.feeds.items())

    def warning(self) -> str:
        """The report's account of what was chosen, and why."""
        return (
            f"no --calibration: inputs generated with {'; '.join(self.chosen)} (pass "
            "--calibration to choose)"
        )


def _candidates(specs, open_slots: list) -> Iterator[dict]:
    """(input, axis) -> size for the open slots: all 1, then each slot alone larger."""
    yield {slot: 1 for slot in open_slots}
    for slot, size in itertools.product(open_slots, LARGER_SIZES):
        yield {other: (size if other == slot else 1) for other in open_slots}


def _arrays(specs, fixed: dict, trial: dict, values: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, dtype in specs:
        dims = [
            d if d is not None else (fixed.get((name, axis)) or trial[(name, axis)])
            for axis, d in enumerate(shape)
        ]
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.uniform(-1, 1, size=dims).astype(dtype)
        elif name in values:
            feeds[name] = np.full(dims, values[name].size, dtype=dtype)
        else:
            feeds[name] = np.ones(dims, dtype=dtype)
    return feeds


def _session(model):
    from recurrent_lowering.runtime.onnxruntime_session import session

    try:
        return session(model)
    except Exception:  # noqa: BLE001 - e.g. layout=1 recurrent nodes: nothing to probe with
        return None


def generate(model, progress=None, seed: int = 0) -> Generated:
    from recurrent_lowering.backends.onnx import input_sizes, to_torch

    specs = to_torch.input_specs(model)
    sizes = input_sizes.infer(model, DEFAULT_TIME_STEPS)
    fixed, chosen = {}, []
    for name, axes in sizes.dims.items():
        for axis, bound in sorted(axes.items()):
            if bound is not None:
                fixed[(name, axis)] = bound.size
                chosen.append(f"{name}[{axis}]={bound.size} ({bound.why})")
    for name, bound in sizes.values.items():
        chosen.append(f"{name}={bound.size} ({bound.why})")
    open_slots = [
        (name, axis)
        for name, shape, _ in specs
        for axis, d in enumerate(shape)
        if d is None and (name, axis) not in fixed
    ]
    session = _session(model)
    plain = {slot: 1 for slot in open_slots}
    trials = list(_candidates(specs, open_slots)) if session is not None else [plain]
    if progress is not None:
        trials = progress.steps(trials, "trying input sizes on onnxruntime")
    taken, refused = None, None
    for trial in trials:
        if session is None:
            break
        try:
            session.run(None, _arrays(specs, fixed, trial, sizes.values, seed))
        except Exception as e:  # noqa: BLE001 - onnxruntime's errors have many types
            refused = refused or first_line(e)  # the plainest sizes' reason
            continue
        taken = trial
        break
    trial = taken or plain
    why = "nothing fixes it; onnxruntime takes it" if taken else "nothing fixes it"
    chosen += [f"{name}[{axis}]={trial[(name, axis)]} ({why})" for name, axis in open_slots]
    feeds = _arrays(specs, fixed, trial, sizes.values, seed)
    return Generated(feeds, chosen, refused=None if taken or session is None else refused)
