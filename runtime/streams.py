"""A streaming model's samples run as a stream: each sample's state inputs are the previous
sample's state outputs.

A streaming model (silero-vad, DTLN, GTCRN: one frame per call) takes its state in and
returns the next one, which its caller feeds back. Calibrating it on samples whose states
are all zeros gives the states the range of a stream's first frame; checking it on such
samples hides how its error grows as its own state comes back. So when a model's inputs
after the first pair up, in order, with its outputs after the first, float inputs of the
same shapes (`pairs`), calibration runs the fp32 model over the samples with the state fed
back, and the numerics check runs both the fp32 reference and the lowered program in their
own closed loops (the program fed its own dequantized state, as the device is).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def pairs(inputs: Sequence, outputs: Sequence) -> list[tuple[int, int]]:
    """(input index, output index) of each state, or [] when the model is not a stream:
    its float inputs after the first and its outputs after the first, in order, one to one,
    with the same shapes."""
    return pairs_of_shapes(
        [(tuple(np.shape(a)), np.issubdtype(np.asarray(a).dtype, np.floating)) for a in inputs],
        [tuple(np.shape(o)) for o in outputs],
    )


def pairs_of_shapes(inputs: Sequence[tuple], outputs: Sequence[tuple]) -> list[tuple[int, int]]:
    """`pairs` from the inputs' (shape tuple, is float) and the outputs' shape tuples: a
    graph's, whose quantizer tells its states from its other inputs the same way."""
    states = [i for i, (_, floating) in enumerate(inputs) if i and floating]
    returned = list(range(1, len(outputs)))
    if not states or len(states) != len(returned):
        return []
    matched = list(zip(states, returned))
    if any(inputs[i][0] != outputs[j] for i, j in matched):
        return []
    return matched


def fed_back(
    run: Callable, samples: Sequence, state: list[tuple[int, int]], until: Callable = None
) -> tuple[list, list]:
    """(the inputs each step took, its outputs): `run(inputs) -> outputs` over `samples`,
    step k's state inputs being step k-1's state outputs (the first step's as given); ended
    after the step whose outputs `until(step, outputs)`, when given, is true of."""
    taken, produced, previous = [], [], None
    for sample in samples:
        inputs = list(sample)
        if previous is not None:
            for i, j in state:  # an output in the input's shape (a TOSA output may be flat)
                inputs[i] = np.reshape(np.asarray(previous[j]), np.shape(np.asarray(inputs[i])))
        outputs = list(run(inputs))
        taken.append(inputs)
        produced.append(outputs)
        previous = outputs
        if until is not None and until(len(produced) - 1, outputs):
            break
    return taken, produced


def stacked(produced: Sequence) -> list:
    """Each output's values over the steps of `fed_back`, stacked on a leading axis."""
    return [np.stack([np.asarray(o[k]) for o in produced]) for k in range(len(produced[0]))]
