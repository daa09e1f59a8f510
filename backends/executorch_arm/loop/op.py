"""`recurrent_lowering::loop`: a recurrent layer direction's time loop as a single graph node.

ExecuTorch's Arm passes cost about 40 ms per node, so an unrolled layer (T copies of the
step) spends its lowering time there. In the loop form the core's loop body becomes a small
GraphModule (a `StepProgram`, written by FxBuilder.loop) and the program holds one `loop`
node per layer direction, so quantization, `to_edge` and the Arm passes see one node. The
TOSA for the node is written by loop.tosa from the step lowered once and copied T times.

    loop(xs [T0, B, G] or its view [T0*B, G], h [B, H], c [B, H] or None,
         first, steps, reverse, initial_in_ys, final_c) -> [T (+1), B, H]

The steps read rows first .. first + steps - 1 of xs (the loop starts after a peeled first
step without a sliced copy of the projection). The result holds h after every step in time
order (the layer's Y, of which the last step, or the first when reversed, is h_n; with
`initial_in_ys` the given h too, as the first row or the last when reversed), then c_n when
`final_c`.

The StepProgram travels with the node, in `node.meta["custom"]` (which torch.export and
ExecuTorch's passes carry over, as they do the Arm quantizer's own annotations): nothing
is registered anywhere. The node is a lowering-time form, never saved; it runs eagerly
only through `run_graph`, which also records each step's float inputs for the step's own
quantization (calibration): one set of scales for every timestep.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch.fx import GraphModule, Interpreter, Node

_LIB = torch.library.Library("recurrent_lowering", "DEF")
_LIB.define(
    "loop(Tensor xs, Tensor h, Tensor? c, int first, int steps, bool reverse, "
    "bool initial_in_ys, bool final_c) -> Tensor"
)

OP = torch.ops.recurrent_lowering.loop.default
EDGE_NAME = "recurrent_lowering.loop.default"  # the edge op's __name__ (node visitors' key)
META_KEY = "recurrent_lowering_loop"  # node.meta["custom"][META_KEY]: the StepProgram


def is_loop(node: Node) -> bool:
    """A loop node, before `to_edge` (the torch op) or after it (the edge op)."""
    if node.op != "call_function":
        return False
    return node.target == OP or getattr(node.target, "__name__", None) == EDGE_NAME


@dataclasses.dataclass(eq=False)
class StepProgram:
    """One step of a layer direction: step(h, [c], x_t) -> (h', [c']), plus what lowering
    learns about it (calibration samples, the quantization config, lowered templates)."""

    step: GraphModule
    num_states: int
    samples: list = dataclasses.field(default_factory=list)  # tuples of step inputs
    max_samples: int = 4096
    quant_config: Optional[object] = None  # the Arm QuantizationConfig the layer was given
    step_config: Optional[object] = None  # the step's own config (int16 state), else quant_config
    weight_parts: int = 1  # 2: the step's weights in two int8 parts (quantization.weight_parts)
    # loop.step's cache: TOSA templates and quantized steps, per spec and pins
    templates: dict = dataclasses.field(default_factory=dict)

    def record(self, inputs: tuple) -> None:
        if len(self.samples) < self.max_samples:
            self.samples.append(tuple(t.detach().clone() for t in inputs))


@dataclasses.dataclass(frozen=True)
class LoopArgs:
    """The loop node's arguments by name."""

    xs: object
    h: object
    c: object
    first: int
    steps: int
    reverse: bool
    initial_in_ys: bool
    final_c: bool

    @classmethod
    def of(cls, node: Node) -> "LoopArgs":
        return cls(*node.args)


def attach(node: Node, program: StepProgram) -> None:
    custom = dict(node.meta.get("custom") or {})
    custom[META_KEY] = program
    node.meta["custom"] = custom


def program_of(node: Node) -> StepProgram:
    program = (node.meta.get("custom") or {}).get(META_KEY)
    if program is None:
        raise ValueError(
            f"{node.name}: a recurrent_lowering.loop node without its step program (it was "
            "made by another process or lost its node metadata)"
        )
    return program


def run(p: StepProgram, args: LoopArgs, record: bool = True, step=None) -> torch.Tensor:
    """The loop's value: every step's h in time order, then c_n if `final_c`; each step by
    `step` (default: the program's float step)."""
    step = step or p.step
    h, c = args.h, args.c
    states = [h] if c is None else [h, c]
    xs = args.xs
    if xs.dim() == 2:  # the [T0*B, G] view of the projection
        xs = xs.reshape(-1, h.shape[0], xs.shape[-1])
    steps = range(args.steps)
    ys: list = [None] * args.steps
    for t in reversed(steps) if args.reverse else steps:
        inputs = (*states, xs[args.first + t])
        if record:
            p.record(inputs)
        states = list(step(*inputs))  # the step returns its new states as a tuple
        ys[t] = states[0]
    if args.initial_in_ys:
        ys = ys + [h] if args.reverse else [h] + ys
    return torch.stack(ys + (states[1:] if args.final_c else []), 0)


def _constant(n: Node, constants: dict) -> bool:
    """Whether `n`'s value depends on the module's constants alone (a weight, its
    dequantization): then it is the same on every run."""
    if n.op == "get_attr":
        return True
    if n.op != "call_function" or n.target is OP:
        return False
    schema = getattr(n.target, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    return all(a in constants for a in n.all_input_nodes)


class _Runner(Interpreter):
    def __init__(self, module: GraphModule, record: bool, constants: Optional[dict], step_of):
        super().__init__(module)
        self.record, self.constants, self.step_of = record, constants, step_of

    def call_function(self, target, args, kwargs):
        if target is OP:
            node = self.current_node
            step = self.step_of(node) if self.step_of else None
            return run(program_of(node), LoopArgs(*args), self.record, step)
        return super().call_function(target, args, kwargs)

    def run_node(self, n: Node):
        self.current_node = n
        if self.constants is None:
            return super().run_node(n)
        if n in self.constants:
            return self.constants[n]
        value = super().run_node(n)
        if _constant(n, self.constants):
            self.constants[n] = value
        return value


def run_graph(
    module: GraphModule,
    *inputs,
    record: bool = True,
    constants: Optional[dict] = None,
    step_of=None,
):
    """`module` run eagerly, its loop nodes through their step programs, which record the
    steps' inputs unless `record` is False (PT2E calibration of a program in the loop
    form). `constants`, a dict kept across runs, keeps the values computed from the
    module's constants alone (a converted module dequantizes its weights on every run: half
    of silero-vad's simulation time), and after the first run the module compiled with them
    folded in: torch.fx's Interpreter spends longer per node than most of the nodes take
    (silero-vad's simulation, 400 frames of about 360 nodes). `step_of(node)` gives the step
    a loop node runs (loop.step.simulated: the quantized step), else its float step."""
    key = (_COMPILED, record, step_of)
    if constants is not None and key in constants:
        return constants[key](*inputs)
    value = _Runner(module, record, constants, step_of).run(*inputs)
    if constants is not None:
        constants[key] = _compiled(module, constants, record, step_of)
    return value


_COMPILED = "compiled"  # constants[(_COMPILED, record, step_of)]: run_graph's compiled module


def _compiled(module: GraphModule, constants: dict, record: bool, step_of) -> GraphModule:
    """`module` as a GraphModule of plain Python that computes what _Runner does, node for
    node: each loop node a call of `run` on its program, the values `constants` holds that
    a non-constant node reads as attributes (the nodes only they read dropped), each
    per-tensor quantize and dequantize computed as its kernel does (_quantize)."""
    graph = torch.fx.Graph()
    copies: dict = {}
    graph.output(graph.graph_copy(module.graph, copies))
    compiled = GraphModule(module, graph)
    folded = {}
    direct = _direct()
    for n, copy in copies.items():
        if n.op == "call_function" and n.target is OP:
            step = step_of(n) if step_of else None
            copy.target = _loop_call(program_of(n), record, step)
        elif n.op == "call_function" and n in constants:
            value = constants[n]
            if isinstance(value, torch.Tensor) and any(u not in constants for u in n.users):
                name = f"_folded_{len(folded)}"
                compiled.register_buffer(name, value)
                with graph.inserting_before(copy):
                    folded[copy] = graph.get_attr(name)
                copy.replace_all_uses_with(folded[copy])
        elif n.op == "call_function" and n.target in direct:
            copy.target = direct[n.target]
    dropped = {copies[n] for n in constants if isinstance(n, Node) and n.op == "call_function"}
    for copy in reversed(list(graph.nodes)):
        if copy in dropped and not copy.users:
            graph.erase_node(copy)
    compiled.recompile()
    return compiled


def _direct() -> dict:
    """The quantize/dequantize_per_tensor ops (registered once PT2E is imported) to
    _quantize and _dequantize."""
    qd = torch.ops.quantized_decomposed
    try:
        return {
            qd.quantize_per_tensor.default: _quantize,
            qd.dequantize_per_tensor.default: _dequantize,
        }
    except AttributeError:  # nothing was quantized in this process
        return {}


def _quantize(x, scale, zero_point, quant_min, quant_max, dtype):
    """quantized_decomposed.quantize_per_tensor's computation on a float32 tensor, without
    the dispatcher's round trip to its Python kernel (most of the op's time on small
    tensors)."""
    rounded = torch.round(x * (1.0 / scale)) + zero_point
    return torch.clamp(rounded, quant_min, quant_max).to(dtype)


def _dequantize(q, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    """quantized_decomposed.dequantize_per_tensor's computation (see _quantize)."""
    return (q.to(out_dtype or torch.float32) - zero_point) * scale


def _loop_call(program: StepProgram, record: bool, step):
    """A loop node's call in the compiled module: its step compiled in turn (run_graph with
    constants of its own: a quantized step dequantizes its weights at every timestep)."""
    step = step or program.step
    constants: dict = {}

    def compiled_step(*inputs):
        return run_graph(step, *inputs, record=False, constants=constants)

    def loop(*args):
        return run(program, LoopArgs(*args), record, compiled_step)

    return loop


@torch.library.impl(_LIB, "loop", "CompositeExplicitAutograd")
def _loop(xs, h, c, first, steps, reverse, initial_in_ys, final_c):
    raise RuntimeError(
        "recurrent_lowering.loop runs through its step program: call loop.op.run_graph(module, "
        "*inputs) instead of module(*inputs)"
    )


@torch.library.register_fake("recurrent_lowering::loop")
def _loop_fake(xs, h, c, first, steps, reverse, initial_in_ys, final_c):
    rows = steps + initial_in_ys + (c is not None and final_c)
    return h.new_empty((rows, *h.shape))
