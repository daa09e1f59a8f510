"""Replace recurrent ops by what the core writes (ExportedProgram or GraphModule).

A loop of cell calls is first read back as the layer it computes (recurrent_ops.cell_chains).
Each op is read into the core's description (recurrent_ops.aten.read); `passes.emit` writes
the math through an `FxBuilder`, and the op's outputs (and their `getitem` users) are
rewired to the emitted values.

`decompose_recurrent(ep)` works on the ExportedProgram's own graph (no `.module()`,
so none of torch 2.13's `_guards_fn` call_modules) and returns a new program whose
signature lists the new weights as parameters. `decompose_graph_module(gm)` does the
same on a bare GraphModule with `get_attr` weights (PT2E / Arm annotation graphs).
"""

from __future__ import annotations

import copy
from typing import Callable, Optional

from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)
from torch.fx import Graph, GraphModule, Node

from recurrent_lowering import passes
from recurrent_lowering.passes.plan import Plan
from recurrent_lowering.passes.spec import CellKind

from ..plan import core_plan
from ..recurrent_ops import aten as aten_ops
from ..recurrent_ops import cell_chains
from ..recurrent_ops.aten import ConstantOf
from .fx_builder import PLAIN, FxBuilder, ProductForm
from .fx_constants import ConstantSink, ModuleConstants, ProgramConstants, fake_mode_of


def _core(emission: "str | Plan") -> Plan:
    """A core plan, or the Arm adapter's for an emission ("auto", "unrolled", "loop")."""
    return emission if isinstance(emission, Plan) else core_plan(emission)


# --- rewriting ------------------------------------------------------------------------------


def _shape(v) -> Optional[tuple]:
    """A node's static shape for the core: dims that are symbols become None."""
    if not isinstance(v, Node):
        return None
    return tuple(d if isinstance(d, int) else None for d in v.meta["val"].shape)


def _replace(
    graph: Graph,
    node: Node,
    sink: ConstantSink,
    constant_of: ConstantOf,
    plan: Plan,
    products: ProductForm = PLAIN,
) -> list[Node]:
    """Emit `node`'s math before it, rewire its users, erase it; returns the emitted nodes."""
    op = aten_ops.read(node, constant_of)
    spec, weights, x, h0, c0, lens = op.spec, op.weights, op.x, op.h0, op.c0, op.sequence_lens
    is_cell = op.is_cell
    dtype = x.meta["val"].dtype
    b = FxBuilder(graph, sink, meta_from=node, dtype=dtype, products=products, layer=op.layer)
    with graph.inserting_before(node):
        if is_cell:  # one step of a sequence: [B, I] -> [1, B, I], states [1, B, H]
            x, h0, c0 = (None if v is None else b.unsqueeze(v, 0) for v in (x, h0, c0))
        shapes = {"x": _shape(x), "h0": _shape(h0), "c0": _shape(c0)}
        if is_cell:
            out = passes.emit_step(b, spec, weights, x, h0, c0, plan=plan, shapes=shapes)
        else:
            out = passes.emit(b, spec, weights, x, h0, c0, lens, plan=plan, shapes=shapes)
        results = {0: out.y, 1: out.h, 2: out.c}
        if is_cell:
            results = {0: out.h, 1: out.c} if spec.cell is CellKind.LSTM else {0: out.h}
            results = {k: None if v is None else b.squeeze(v, 0) for k, v in results.items()}
    if is_cell and spec.cell is not CellKind.LSTM:
        node.replace_all_uses_with(results[0])
    else:
        for u in list(node.users):
            if u.users:
                u.replace_all_uses_with(results[u.args[1]])
            graph.erase_node(u)
    args = [a for a in node.all_input_nodes]
    graph.erase_node(node)
    _erase_dead(graph, args)
    return b.nodes


def _erase_dead(graph: Graph, nodes: list[Node]) -> None:
    """Erase producers left without users (export's `aten.zeros` states), recursively."""
    todo = list(nodes)
    while todo:
        n = todo.pop()
        if n.graph is graph and not n.users and n.op == "call_function" and not n.is_impure():
            todo.extend(n.all_input_nodes)
            graph.erase_node(n)


# --- ExportedProgram -------------------------------------------------------------------------


def decompose_recurrent(
    ep: ExportedProgram, emission: "str | Plan" = "unrolled", products: ProductForm = PLAIN
) -> ExportedProgram:
    """A copy of `ep` with every recurrent op replaced by what the core writes.

    The new weights are PARAMETERs of the returned program (in its state_dict), so
    `.module()`, torch.export.save/load, the PT2E quantizer and ExecuTorch's passes
    treat them as weights. Returns `ep` itself when it holds no recurrent op. `emission`:
    "auto", "unrolled" or "loop" with the Arm adapter's tunings (plan.core_plan), or a core
    Plan.
    """
    if not aten_ops.has_recurrent_ops(ep.graph):
        return ep
    old_placeholders = ep.graph.find_nodes(op="placeholder")
    ep = copy.deepcopy(ep)
    gm, graph = ep.graph_module, ep.graph
    # deepcopy may rename placeholders (`input` -> `input_1`): specs follow by position
    old_specs = [
        InputSpec(s.kind, TensorArgument(n.name), s.target, s.persistent)
        if isinstance(s.arg, TensorArgument)
        else s
        for s, n in zip(ep.graph_signature.input_specs, graph.find_nodes(op="placeholder"))
    ]
    assert len(old_specs) == len(old_placeholders)
    state_dict, constants = dict(ep.state_dict), dict(ep.constants)
    cell_chains.fuse(graph)
    sink = ProgramConstants(graph, fake_mode_of(graph), state_dict, constants, old_specs)
    constant_of = aten_ops.program_constants(ep, old_specs)
    replaced_args: set[Node] = set()
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in aten_ops.TARGET_OPS:
            replaced_args.update(n for n in node.all_input_nodes if n.op == "placeholder")
            sink.prefix = aten_ops.module_path(node)
            _replace(graph, node, sink, constant_of, _core(emission), products)

    # Drop weights nobody reads any more (the recurrent ops' own parameters).
    by_name = {s.arg.name: s for s in old_specs if isinstance(s.arg, TensorArgument)}
    for n in replaced_args:
        spec = by_name.get(n.name)
        if n.users or spec is None or spec.kind is InputKind.USER_INPUT:
            continue
        # (mutable buffers never get here: they are not constants, so _weight refused them)
        state_dict.pop(spec.target, None)
        constants.pop(spec.target, None)
        graph.erase_node(n)

    input_specs = []
    for n in graph.find_nodes(op="placeholder"):
        input_specs.append(by_name.get(n.name) or sink.input_specs[n.name])
    outputs = graph.output_node().args[0]
    output_specs = [
        OutputSpec(s.kind, TensorArgument(o.name), s.target)
        if isinstance(s.arg, TensorArgument)
        else s
        for s, o in zip(ep.graph_signature.output_specs, outputs)
    ]
    gm.recompile()
    return ExportedProgram(
        root=gm,
        graph=graph,
        graph_signature=ExportGraphSignature(input_specs, output_specs),
        state_dict=state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=ep.module_call_graph,
        example_inputs=ep.example_inputs,
        constants=constants,
        verifiers=ep.verifiers,
    )


# --- bare GraphModule ------------------------------------------------------------------------


def decompose_graph_module(
    gm: GraphModule,
    emission: "str | Plan" = "unrolled",
    allowed: Callable[[Node], bool] = lambda n: True,
    products: ProductForm = PLAIN,
) -> bool:
    """Replace the recurrent ops of a GraphModule in place (weights as get_attr); True if any."""
    graph = gm.graph
    cell_chains.fuse(graph, allowed)
    nodes = [
        n
        for n in graph.nodes
        if n.op == "call_function" and n.target in aten_ops.TARGET_OPS and allowed(n)
    ]
    if not nodes:
        return False
    sink = ModuleConstants(gm, fake_mode_of(graph))
    constant_of = aten_ops.module_constants(gm)
    for node in nodes:
        weights = [n for n in node.all_input_nodes if n.op == "get_attr"]
        _replace(graph, node, sink, constant_of, _core(emission), products)
        for w in weights:
            if not w.users:
                graph.erase_node(w)
    graph.lint()
    gm.recompile()
    return True
