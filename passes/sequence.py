"""`emit`: a recurrent layer stack written through a builder, in one call.

    spec + weights --program.build--> program --plan.lower--> program --translate--> builder

The adapters call this; passes/program.py, unroll.py, loop.py and tunings.py hold the
steps, which a caller may also run one by one (to inspect or count the program).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import numpy as np

from .builder import Builder, Value, is_constant
from .plan import Plan, lower
from .program import build
from .spec import LayerWeights, RecurrentSpec, SpecError
from .translate import translate
from .validate import validate


@dataclasses.dataclass
class Outputs:
    """Y, Y_h, Y_c in the spec's IOLayout; None for outputs the spec does not want."""

    y: Optional[Value] = None
    h: Optional[Value] = None
    c: Optional[Value] = None


def emit(
    builder: Builder,
    spec: RecurrentSpec,
    weights: Sequence[Sequence[LayerWeights]],
    x: Value,
    initial_h: Optional[Value] = None,
    initial_c: Optional[Value] = None,
    sequence_lens: Union[None, np.ndarray, Value] = None,
    emission: str = "unrolled",
    plan: Optional[Plan] = None,
    shapes: Optional[dict] = None,
) -> Outputs:
    """Emit a recurrent layer stack through `builder`.

    weights[layer][direction] are canonical LayerWeights; x, initial_h, initial_c are builder
    values in the spec's IOLayout; sequence_lens is None, a numpy int array (constant) or a
    builder value. emission: "unrolled" (needs spec.seq_len) or "loop" (needs SCAN), or a
    `plan` with the target's tunings. `shapes`: the static shapes of "x" and "h0" (and
    "c0"), dims None where unknown, which tunings that depend on sizes need.
    """
    if plan is None:
        try:
            plan = Plan(emission=emission)
        except ValueError as e:
            raise SpecError(spec.name, "emission", str(e)) from e
    form = plan.emission_of(spec)
    validate(builder, spec, weights, initial_h, initial_c, sequence_lens, form)
    runtime_lens = sequence_lens is not None and not is_constant(sequence_lens)
    program = build(
        spec,
        weights,
        builder.dtype,
        shapes=shapes,
        sequence_lens="input" if runtime_lens else sequence_lens,
    )
    program = lower(program, dataclasses.replace(plan, emission=form))
    bindings = {"x": x, "h0": initial_h, "c0": initial_c, "sequence_lens": sequence_lens}
    return Outputs(*translate(builder, program.outputs, bindings))


def emit_step(
    builder: Builder,
    spec: RecurrentSpec,
    weights: Sequence[Sequence[LayerWeights]],
    x_t: Value,
    h: Optional[Value] = None,
    c: Optional[Value] = None,
    plan: Optional[Plan] = None,
    shapes: Optional[dict] = None,
) -> Outputs:
    """One timestep with explicit state in and out (streaming): x_t is X with T = 1 in the
    spec's layout, h and c the states in the spec's state layout (None: zero). Returns
    this step's Y and the new states; feed them back as h and c for the next step."""
    spec = dataclasses.replace(
        spec, seq_len=1, has_initial_h=h is not None, has_initial_c=c is not None
    )
    plan = dataclasses.replace(plan or Plan(), emission="unrolled")
    return emit(builder, spec, weights, x_t, h, c, None, plan=plan, shapes=shapes)
