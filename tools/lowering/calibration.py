"""--calibration and --evaluation samples, read and checked against the model's inputs before
anything is lowered: a wrong count or shape would otherwise surface as a traceback deep in
export or conversion, or worse, lower a model for the calibration's shape instead of the
model's. Every target uses them: NPU targets to quantize and check numerics, aten and onnx
to check numerics on the user's data instead of random inputs.

A flag names one or more .npz files (comma-separated). In each, an array is one model
input, by name (or, when none is named after an input, in the .npz's order); an array
with one axis more than the input holds one sample per entry of its first axis, and an
array without it is the same in every sample of its file. Every sample has the same
shapes where the program is static (the NPU targets, an unrolled rewrite); elsewhere
(`--target onnx` in loop form) each sample may have its own, as onnxruntime would take them.
`held_out` splits what quantization calibrates on from what the numerics check measures."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import LoweringError, first_line


def load(path, names: Sequence[str] | None = None) -> list | None:
    """The arrays of the .npz at `path` (None without one), in the order `_keys` gives."""
    if path is None:
        return None
    try:
        samples = np.load(path)
    except Exception as e:
        raise LoweringError(f"{path}: not a readable .npz ({e})") from e
    keys = _keys(path, list(samples.files), names)
    try:
        arrays = [samples[k] for k in keys]
    except Exception as e:
        raise LoweringError(f"{path}: not a readable .npz ({e})") from e
    if not arrays:
        raise LoweringError(f"{path}: holds no arrays")
    return arrays


def _keys(path, files: list, names: Sequence[str] | None) -> list:
    """`names` when the .npz names every one of them and nothing else, its own order when
    it names none of them (np.savez's arr_0, arr_1, ...). Some names matching and others
    not is a typo, not an order: refused, naming both, rather than every array fed by
    position."""
    if not names or not set(names) & set(files):
        return files
    missing = [n for n in names if n not in files]
    unknown = [k for k in files if k not in names]
    problems = [f"no array for model input(s) {', '.join(missing)}"] if missing else []
    problems += [f"array(s) {', '.join(unknown)} name no model input"] if unknown else []
    if problems:
        raise LoweringError(
            f"{path}: {'; '.join(problems)} (the inputs: {', '.join(names)}); name each array "
            "after its input"
        )
    return list(names)


STATIC = "an NPU program is static, every sample takes the same shapes"


def _paths(paths) -> list:
    if paths is None:
        return []
    if isinstance(paths, (list, tuple)):
        return list(paths)
    return [p for p in str(paths).split(",") if p]


def load_samples(paths, specs: Sequence[tuple], static: str | None = STATIC) -> list[list] | None:
    """The samples of the .npz files `paths` (a list, or one comma-separated string), each a
    list of one array per model input (`specs`: (name, shape, ...) per input), checked;
    None without files. `static`: why every sample must take the first one's shapes (the
    refusal's reason), or None where each may take its own."""
    files = _paths(paths)
    if not files:
        return None
    shape_specs = [spec[:2] for spec in specs]
    samples: list = []
    origins: list = []  # "file: sample k" of each sample, for the messages
    for path in files:
        arrays = load(path, [spec[0] for spec in specs])
        if len(arrays) != len(specs):
            names = ", ".join(spec[0] for spec in specs)
            raise LoweringError(
                f"{path}: {len(arrays)} arrays for {len(specs)} model inputs ({names})"
            )
        counts = {
            len(a)
            for a, (_, shape) in zip(arrays, shape_specs)
            if np.ndim(a) == len(shape) + 1 and len(shape) >= 0
        }
        if len(counts) > 1:
            raise LoweringError(
                f"{path}: arrays hold different numbers of samples ({sorted(counts)}) along "
                "their first axis"
            )
        count = counts.pop() if counts else 1
        for k in range(count):
            sample = [
                a[k] if np.ndim(a) == len(shape) + 1 else a
                for a, (_, shape) in zip(arrays, shape_specs)
            ]
            check(path, sample, shape_specs)
            samples.append(sample)
            origins.append(f"{path}: sample {k}")
    first = [np.shape(a) for a in samples[0]]
    for sample, origin in zip(samples[1:] if static else [], origins[1:]):
        if [np.shape(a) for a in sample] != first:
            raise LoweringError(
                f"{origin} has shapes {[list(np.shape(a)) for a in sample]}, "
                f"{origins[0]} {[list(s) for s in first]}: {static}"
            )
    return samples


# `accepted`'s `failing` for a torch model run eagerly.
TORCH_EAGER = "the model fails in torch eager"


def accepted(run, samples: list, failing: str) -> list:
    """`run(sample)` for each of `samples`, the input model run as the reference, refusing
    in one line the samples it fails on (an index past an embedding's table, say) before
    quantization or the numerics check meets them as an internal error. `failing`: who
    fails, for the message."""
    outputs = []
    for k, sample in enumerate(samples):
        try:
            outputs.append(run(sample))
        except Exception as e:  # noqa: BLE001 - a model's failures have many types
            raise LoweringError(
                f"{failing} on sample {k} of --calibration and --evaluation (in the order "
                f"given): {type(e).__name__}: {first_line(e)}"
            ) from e
    return outputs


def held_out(calibration: list, evaluation: list | None) -> tuple[list, list, str | None]:
    """(samples to calibrate on, samples to measure on, the report's warning or None).
    Without --evaluation the last quarter of several calibration samples (at least one) is
    held out; a single sample serves both, which flatters the figures."""
    if evaluation is not None:
        return calibration, evaluation, None
    if len(calibration) > 1:
        held = max(1, len(calibration) // 4)
        return calibration[:-held], calibration[-held:], None
    return (
        calibration,
        calibration,
        "numerics measured on the sample quantization was calibrated on, which flatters them "
        "(pass --evaluation, or several --calibration samples to hold some out)",
    )


def _fits(d, g: int) -> bool:
    """d: a static size, None (any) or (lowest, highest or None) for a dynamic one."""
    if d is None:
        return True
    if isinstance(d, tuple):
        return d[0] <= g and (d[1] is None or g <= d[1])
    return d == g


def _describe(d) -> str:
    if d is None:
        return "?"
    if isinstance(d, tuple):
        return f"{d[0]}..{'' if d[1] is None else d[1]}"
    return str(d)


def check(path, arrays: Sequence, specs: Sequence[tuple]) -> None:
    """`specs`: (input name, shape) per model input; a dynamic dimension is None or its
    (lowest, highest or None) range."""
    names = ", ".join(name for name, _ in specs)
    if len(arrays) != len(specs):
        raise LoweringError(f"{path}: {len(arrays)} arrays for {len(specs)} model inputs ({names})")
    for k, (array, (name, shape)) in enumerate(zip(arrays, specs)):
        got = tuple(array.shape)
        fits = len(got) == len(shape) and all(_fits(d, g) for d, g in zip(shape, got))
        if not fits:
            want = "[" + ", ".join(_describe(d) for d in shape) + "]"
            raise LoweringError(
                f"{path}: array {k} has shape {list(got)}; model input '{name}' takes {want}"
            )
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise LoweringError(
                f"{path}: array {k} (model input '{name}') holds NaN or inf; samples must be finite"
            )


def _dimension(d, ranges: dict):
    """A static size, or a dynamic one's (lowest, highest or None) from the program's ranges."""
    if isinstance(d, int):
        return d
    bounds = ranges.get(d.node.expr)
    if bounds is None:
        return None
    upper = bounds.upper
    return (int(bounds.lower), int(upper) if upper.is_finite else None)


def torch_input_specs(source) -> list[tuple]:
    """(name, shape, torch dtype) of a torch model's inputs; a dynamic dimension is its
    (lowest, highest or None) range, or None when the program has none for it."""
    if source.example_inputs is not None and source.path is None:  # a bundled example
        return [
            (f"input {k}", tuple(t.shape), t.dtype) for k, t in enumerate(source.example_inputs)
        ]
    signature = source.program.graph_signature
    specs = []
    for node in source.program.graph.nodes:
        if node.op == "placeholder" and node.name in signature.user_inputs:
            value = node.meta["val"]
            ranges = source.program.range_constraints
            shape = tuple(_dimension(d, ranges) for d in value.shape)
            specs.append((node.name, shape, value.dtype))
    return specs


def dynamic_warning(specs: Sequence[tuple], how: str) -> str | None:
    """The report's warning when dynamic input dimensions get a fixed size (`how`: "set
    to 1"), else None."""
    dynamic = [spec[0] for spec in specs if any(not isinstance(d, int) for d in spec[1])]
    if not dynamic:
        return None
    return (
        f"dynamic dimensions of {', '.join(dynamic)} {how} (an NPU program is "
        "static; pass --calibration to choose)"
    )
