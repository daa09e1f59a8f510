"""Lower a loop's step once, through ExecuTorch's own Arm flow, into a TOSA template.

The step (state..., x_t) -> (state'...) is a graph of a dozen ops, so ExecuTorch lowers it in
seconds whatever T is. Quantized, it is calibrated on the float inputs of every timestep the
loop saw (loop.op.run_graph records them), so all steps share one set of scales, and each
state output shares its state input's quantization (quantization.states): step t's output
is step t+1's input with no requantization, exactly as a streaming model feeds h_n back as
h0.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from executorch.backends.arm.quantizer import TOSAQuantizer

from ..compat.histogram_observer import HistogramObserver
from ..edge_io import io_mapping
from ..quantization.clip import clip_by_range
from ..quantization.states import share_states
from .op import StepProgram
from .tosa_template import TosaTemplate


class StepLoweringError(RuntimeError):
    """The step did not lower to one fully delegated TOSA graph."""


@dataclasses.dataclass(frozen=True)
class StepTemplate:
    tosa: TosaTemplate
    input_roles: list  # template input k <- step input index (states first, then x_t)
    input_quant: list  # QuantParams | None per template input
    output_roles: list  # template output k -> step output index (the new states)
    output_quant: list


class _StepQuantizer(TOSAQuantizer):
    """The step's quantizer: the Arm annotation, each state output in its state input's
    group (inputs and outputs paired by position), then an int16 clip quantized to its own
    range, as a whole program's (quantization.quantizer)."""

    num_states = 0

    def annotate(self, model):
        model = super().annotate(model)
        states = list(model.graph.find_nodes(op="placeholder"))[: self.num_states]
        share_states(model.graph, [(state.name, i) for i, state in enumerate(states)])
        clip_by_range(model.graph)
        return model


def _example(program: StepProgram) -> tuple:
    if program.samples:
        return program.samples[0]
    shapes = [ph.meta["val"].shape for ph in program.step.graph.find_nodes(op="placeholder")]
    return tuple(torch.zeros(tuple(int(d) for d in s)) for s in shapes)


def _pin(prepared: torch.fx.GraphModule, pins: dict) -> None:
    """Make the observer of step input k report pins[k] (a QuantParams) instead of its own
    estimate. The observer instance is shared with whatever PT2E shares it with (a state
    input's with its state output) and derives from it (a product's bias), so the step's
    structure, and its rescales, stay as they are: only the scale values change."""
    placeholders = list(prepared.graph.find_nodes(op="placeholder"))
    for k, q in pins.items():
        users = [u for u in placeholders[k].users if u.op == "call_module"]
        if len(users) != 1:
            raise StepLoweringError(f"step input {k} has {len(users)} observers, expected one")
        observer = prepared.get_submodule(users[0].target)
        if observer.dtype != getattr(torch, q.dtype):
            continue  # another precision inside the step (int16 state): the boundary rescales
        if not isinstance(observer, HistogramObserver):
            raise StepLoweringError(f"step input {k}: {type(observer).__name__} cannot be pinned")
        observer.pin(q.scale, q.zero_point)


def _quantize(program: StepProgram, compile_spec, example: tuple, pins: dict):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if not program.samples:
        raise StepLoweringError(
            "the loop was never run (loop.op.run_graph), so its step has no calibration"
        )
    quantizer = _StepQuantizer(compile_spec)
    quantizer.num_states = program.num_states
    quantizer.set_global(program.step_config or program.quant_config)
    ep = torch.export.export(program.step, example)
    prepared = prepare_pt2e(ep.module(), quantizer)
    for sample in program.samples:
        prepared(*sample)
    _pin(prepared, pins)
    return convert_pt2e(prepared)


def lower(
    program: StepProgram, tosa_spec, quantized: bool, pins: Optional[dict] = None
) -> StepTemplate:
    """The step of `program` as a TOSA template for `tosa_spec` (a TosaSpecification).
    `pins` maps step inputs to the program's qparams at the loop's boundary (see _pin), so
    the loop needs no rescale there."""
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    spec = TosaCompileSpec(tosa_spec)
    example = _example(program)
    module = _quantize(program, spec, example, pins or {}) if quantized else program.step
    edge = to_edge_transform_and_lower(
        torch.export.export(module, example),
        partitioner=[TOSAPartitioner(spec)],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    ep = edge.exported_program()
    lowered = [m for n, m in ep.graph_module.named_children() if n.startswith("lowered_module")]
    mapping = io_mapping(ep.graph_module.graph, list(ep.graph_signature.user_inputs))
    if len(lowered) != 1 or mapping is None:
        raise StepLoweringError(
            f"the recurrent step did not lower to one TOSA delegate for {tosa_spec} "
            f"({len(lowered)} delegates); lower this layer unrolled instead"
        )
    input_map, output_map, input_quant, output_quant = mapping
    tosa = TosaTemplate(bytes(lowered[0].processed_bytes))
    out_roles: list[Optional[int]] = [None] * len(tosa.outputs)
    for i, k in enumerate(output_map):
        out_roles[k] = i
    return StepTemplate(
        tosa=tosa,
        input_roles=list(input_map),
        input_quant=list(input_quant),
        output_roles=out_roles,
        output_quant=list(output_quant),
    )


def template(
    program: StepProgram, tosa_spec, quantized: bool, pins: Optional[dict] = None
) -> StepTemplate:
    """lower(), cached on the program per (spec, quantized, pins)."""
    key = (str(tosa_spec), quantized, tuple(sorted((pins or {}).items())))
    if key not in program.templates:
        program.templates[key] = lower(program, tosa_spec, quantized, pins)
    return program.templates[key]
