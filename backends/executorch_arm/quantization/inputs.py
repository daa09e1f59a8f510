"""A model input's int16 range with 6 dB of headroom over what calibration saw.

A program input is quantized on the CPU at the delegate's boundary, so a value beyond its
calibrated range is clipped before anything on the NPU sees it. Calibration audio is
rarely as loud as what the model meets: DTLN's |rfft| input reaches 38 on the benchmark's
calibration (espeak-ng's sentences) and 70 on its held-out recordings, where 22 of 300
frames pass 38. The fp32 model alone with its input clipped at 38 reads 20.6 dB on its
fed-back state (`benchmarks/stream_attribution.py --clip_inputs`); its int16 program read
20.5 on the TOSA reference model, and 34.1 with this headroom. In int16 the range can
spare a bit: every int16 input but a stream's fed-back states is observed over `HEADROOM`
times the range its histogram search finds. An input within the observer's floor (eps,
2^-12 a code: +-8) keeps the floor's range, already wider than its own: madmom's
log-spectra (up to 5.2 and 6.4), whose outputs follow their input's resolution more than
its loudness, and silero-vad's waveform. States keep their calibrated range: they are the
program's own outputs fed back, within what the calibration stream produced, and each bit
of theirs counts in the closed loop.
"""

from __future__ import annotations

from torch.fx import Graph, Node

from recurrent_lowering.runtime import streams

from ..compat.histogram_observer import int16_histogram, widened

HEADROOM = 2.0  # 6 dB, one of int16's bits

_Q_KEY = "quantization_annotation"


def widen_inputs(graph: Graph, states: set) -> int:
    """Give every int16 program input `HEADROOM` but the states: those `states` names and
    those the CLI streams (runtime.streams' rule, on the graph's shapes); how many."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    streamed = {i for i, _ in streams.pairs_of_shapes(*io_shapes(graph, placeholders))}
    count = 0
    for index, node in enumerate(placeholders):
        annotation = node.meta.get(_Q_KEY)
        spec = getattr(annotation, "output_qspec", None)
        if index in streamed or node.name in states or not int16_histogram(spec):
            continue  # a state, not quantized, int8, or in another value's group
        annotation.output_qspec = widened(spec, HEADROOM)
        count += 1
    return count


def io_shapes(graph: Graph, placeholders: list) -> tuple[list, list]:
    """The program inputs' (shape, is float) and its outputs' shapes, from their values."""

    def value(node):
        return node.meta.get("val") if isinstance(node, Node) else None

    def shape(node):
        v = value(node)
        return tuple(v.shape) if hasattr(v, "shape") else None

    inputs = [
        (shape(p), hasattr(value(p), "dtype") and value(p).dtype.is_floating_point)
        for p in placeholders
    ]
    outputs = [shape(o) for o in graph.output_node().args[0]]
    return inputs, outputs
