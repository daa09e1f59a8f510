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

from recurrent_lowering.runtime.quantization import QuantParams

from ..compat.histogram_observer import HistogramObserver, calibrate
from ..edge_io import io_mapping, quant_params
from ..quantization.clip import clip_by_range
from ..quantization.states import share_states
from ..quantization.table_inputs import cap_table_inputs
from ..quantization.weight_parts import split as split_weights
from .op import LoopArgs, StepProgram, program_of
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
    range and a sigmoid/tanh's input at a scale its table follows, as a whole program's
    (quantization.quantizer); with `weight_parts` 2 its weights in two int8 parts."""

    num_states = 0
    weight_parts = 1

    def transform_for_annotation(self, model):
        if self.weight_parts == 2:
            split_weights(model, self.global_config.weight.quant_max)
        return super().transform_for_annotation(model)

    def annotate(self, model):
        model = super().annotate(model)
        states = list(model.graph.find_nodes(op="placeholder"))[: self.num_states]
        share_states(model.graph, [(state.name, i) for i, state in enumerate(states)])
        clip_by_range(model.graph)
        cap_table_inputs(model.graph)
        return model


def _example(program: StepProgram) -> tuple:
    if program.samples:
        return program.samples[0]
    vals = [ph.meta["val"] for ph in program.step.graph.find_nodes(op="placeholder")]
    return tuple(torch.zeros(tuple(int(d) for d in v.shape), dtype=v.dtype) for v in vals)


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
    quantizer.weight_parts = program.weight_parts
    quantizer.set_global(program.step_config or program.quant_config)
    ep = torch.export.export(program.step, example)
    prepared = prepare_pt2e(ep.module(), quantizer)
    calibrate(prepared, program.samples)
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
    module = quantized_step(program, tosa_spec, pins or {}) if quantized else program.step
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


def _covers(outer: Optional[QuantParams], inner: Optional[QuantParams]) -> bool:
    """Whether `outer`'s real range holds `inner`'s, to within 1% of it (two observers of
    the same values differ by about that much)."""
    if outer is None or inner is None:
        return True

    def bounds(q):
        return (q.qmin - q.zero_point) * q.scale, (q.qmax - q.zero_point) * q.scale

    (lo, hi), (lo_in, hi_in) = bounds(outer), bounds(inner)
    slack = 0.01 * (hi - lo)
    return lo - slack <= lo_in and hi_in <= hi + slack


def pins(program: StepProgram, loop: LoopArgs, x_q, h_q, out_q) -> dict:
    """The step inputs pinned to the loop's boundary qparams (QuantParams or None: x_t's,
    h0's, the loop result's), so the loop needs no rescale there: x_t at the projection's
    scale; a lone h at the result's, unless the initial h reaches beyond the result's range
    (a user's h0: pinned, the step would clip it). One policy for the lowering
    (loop.tosa.LoopVisitor) and its simulation (`simulated`)."""
    n = program.num_states
    chosen = {n: x_q}
    if (n == 1 or not loop.final_c) and _covers(out_q, h_q):
        chosen[0] = out_q
    return {k: q for k, q in chosen.items() if q is not None}


def _qparams(node, target) -> Optional[QuantParams]:
    """The qparams of a converted graph's quantize/dequantize_per_tensor `node` (`target`),
    else None."""
    if node is None or getattr(node, "target", None) != target:
        return None
    return quant_params(node)


def boundary(node) -> tuple:
    """(quantized, pins) of a converted graph's loop `node`, read from the q/dq around it:
    what its lowering (loop.tosa.LoopVisitor) will ask loop.step for, from the same qparams
    folded into the edge node."""

    qd = torch.ops.quantized_decomposed
    x_q = _qparams(node.args[0], qd.dequantize_per_tensor.default)
    if x_q is None:
        return False, {}
    h_q = _qparams(node.args[1], qd.dequantize_per_tensor.default)
    out = next((u for u in node.users if u.target == qd.quantize_per_tensor.default), None)
    out_q = _qparams(out, qd.quantize_per_tensor.default)
    return True, pins(program_of(node), LoopArgs.of(node), x_q, h_q, out_q)


def simulated(node, tosa_spec):
    """The step a converted graph's loop `node` runs in simulation: the quantized step its
    lowering will lower (same calibration, same pins, read from the q/dq around the node),
    cached on the program; the float step when the loop is not quantized. (A float step
    there made NSNet2's int8 simulation on ethos-u85-256 32.4 dB where TOSA measures 23.6.)"""
    program = program_of(node)
    quantized, chosen = boundary(node)
    return quantized_step(program, tosa_spec, chosen) if quantized else program.step


def quantized_step(program: StepProgram, tosa_spec, pins: dict):
    """The program's step PT2E-quantized for `tosa_spec` with `pins`, cached on the program:
    the simulation (`simulated`) and the lowering (`lower`) share one calibration."""
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

    key = ("quantized", str(tosa_spec), tuple(sorted(pins.items())))
    if key not in program.templates:
        spec = TosaCompileSpec(tosa_spec)
        program.templates[key] = _quantize(program, spec, _example(program), pins)
    return program.templates[key]


def template_key(tosa_spec, quantized: bool, pins: Optional[dict]) -> tuple:
    """The key of lower(program, tosa_spec, quantized, pins) in program.templates."""
    return (str(tosa_spec), quantized, tuple(sorted((pins or {}).items())))


def template(
    program: StepProgram, tosa_spec, quantized: bool, pins: Optional[dict] = None
) -> StepTemplate:
    """lower(), cached on the program per template_key. An entry may be a promise of one
    being lowered in another process (loop.prefetch): its result, else lowered here."""
    key = template_key(tosa_spec, quantized, pins)
    found = program.templates.get(key)
    if found is not None and not isinstance(found, StepTemplate):
        found = found.result()  # None: the other process failed; lowered here, as ever
    program.templates[key] = found or lower(program, tosa_spec, quantized, pins)
    return program.templates[key]
