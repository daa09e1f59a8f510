"""Up-front checks: every inconsistency becomes a SpecError naming the layer and attribute."""

from __future__ import annotations

from typing import Sequence

from . import activations
from . import weights as wa
from .builder import POSITIONS, SCAN, SELECT, Builder, is_constant
from .plan import FORMS
from .spec import CellKind, LayerWeights, RecurrentSpec, SpecError


def validate(
    builder: Builder,
    spec: RecurrentSpec,
    weights: Sequence[Sequence[LayerWeights]],
    initial_h,
    initial_c,
    sequence_lens,
    emission: str,
) -> None:
    name = spec.name

    def fail(attribute: str, message: str):
        raise SpecError(name, attribute, message)

    if not isinstance(spec.cell, CellKind):
        fail("cell", f"expected a CellKind, got {spec.cell!r}")
    for attr in ("input_size", "hidden_size", "num_layers"):
        if int(getattr(spec, attr)) < 1:
            fail(attr, f"must be at least 1, got {getattr(spec, attr)}")
    lstm = spec.cell is CellKind.LSTM
    if spec.proj_size and not lstm:
        fail("proj_size", f"only LSTM has a projection, not {spec.cell.value}")
    if spec.proj_size < 0:
        fail("proj_size", f"must be >= 0, got {spec.proj_size}")
    if spec.input_forget and not lstm:
        fail("input_forget", f"only LSTM has input_forget, not {spec.cell.value}")
    if (spec.has_initial_c or spec.want_c) and not lstm:
        fail(
            "initial_c" if spec.has_initial_c else "want_c", f"{spec.cell.value} has no cell state"
        )
    if spec.clip is not None and not spec.clip > 0:
        fail("clip", f"must be positive, got {spec.clip}")
    if spec.seq_len is not None and spec.seq_len < 1:
        fail("seq_len", f"must be at least 1, got {spec.seq_len}")

    # activations: one tuple per direction, each the cell's count, parameters resolved
    if spec.activations is not None:
        if len(spec.activations) != spec.num_directions:
            fail(
                "activations",
                f"expected one tuple per direction ({spec.num_directions}), "
                f"got {len(spec.activations)}",
            )
    for d in range(spec.num_directions):
        acts = spec.activations_for(d)
        if len(acts) != spec.cell.num_activations:
            fail(
                "activations",
                f"{spec.cell.value} takes {spec.cell.num_activations} activations "
                f"per direction, got {len(acts)} for direction {d}",
            )
        for act in acts:
            why = activations.check(act, builder.capabilities)
            if why:
                fail("activations", why)

    # runtime values agree with the spec's flags
    for attr, flag, value in (
        ("initial_h", spec.has_initial_h, initial_h),
        ("initial_c", spec.has_initial_c, initial_c),
        ("sequence_lens", spec.has_sequence_lens, sequence_lens),
    ):
        if flag != (value is not None):
            given = "a value was" if value is not None else "none was"
            fail(attr, f"spec says has_{attr}={flag} but {given} given")

    # emission and capabilities
    if emission not in FORMS:
        fail("emission", f"unknown emission {emission!r}; known: {', '.join(FORMS)}")
    if emission == "unrolled" and spec.seq_len is None:
        fail("seq_len", "unrolled emission needs a static sequence length")
    if emission == "loop" and SCAN not in builder.capabilities:
        fail("emission", "loop emission needs scan, which this builder lacks")
    if sequence_lens is not None:
        if is_constant(sequence_lens):
            lens = sequence_lens
            if lens.ndim != 1 or lens.dtype.kind not in "iu":
                fail(
                    "sequence_lens",
                    f"expected a 1-D integer array, got {lens.dtype}{list(lens.shape)}",
                )
            if spec.seq_len is not None and (
                lens.min(initial=0) < 0 or lens.max(initial=0) > spec.seq_len
            ):
                fail(
                    "sequence_lens", f"lengths must lie in [0, {spec.seq_len}], got {lens.tolist()}"
                )
        run_time_loop = emission == "loop" and spec.seq_len is None  # compared at run time
        if (run_time_loop or not is_constant(sequence_lens)) and SELECT not in builder.capabilities:
            fail(
                "sequence_lens",
                "runtime sequence lengths need select (less/where), which this builder lacks",
            )
        if run_time_loop and POSITIONS not in builder.capabilities:
            fail(
                "sequence_lens",
                "masking a loop of run-time length needs positions (a range), which this "
                "builder lacks",
            )

    # weights: [layer][direction], canonical shapes
    if len(weights) != spec.num_layers:
        fail("weights", f"expected {spec.num_layers} layers, got {len(weights)}")
    G, H, out = spec.cell.num_gates, spec.hidden_size, spec.output_size
    for layer, row in enumerate(weights):
        if len(row) != spec.num_directions:
            fail(f"weights[{layer}]", f"expected {spec.num_directions} directions, got {len(row)}")
        for d, lw in enumerate(row):
            where = f"weights[{layer}][{d}]"
            expected = {
                "w": (G * H, spec.layer_input_size(layer)),
                "r": (G * H, out),
                "b_w": (G * H,),
                "b_r": (G * H,),
                "peephole": (3, H),
                "proj": (spec.proj_size, H),
            }
            for field, shape in expected.items():
                a = getattr(lw, field)
                if a is None:
                    if field in ("w", "r") or (field == "proj" and spec.proj_size):
                        fail(f"{where}.{field}", "missing")
                    continue
                if field == "peephole" and not lstm:
                    fail(f"{where}.peephole", f"only LSTM has peepholes, not {spec.cell.value}")
                if field == "proj" and not spec.proj_size:
                    fail(f"{where}.proj", "given but proj_size is 0")
                got = wa.shape(a)  # None: a runtime value of unknown shape
                if got is not None and got != shape:
                    fail(f"{where}.{field}", f"expected shape {list(shape)}, got {list(got)}")
