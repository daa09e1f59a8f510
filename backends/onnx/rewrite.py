"""Replace every ONNX GRU/LSTM/RNN node of a model with elementary ops.

Each node (also inside If/Loop/Scan bodies) is read into a core spec, the core emits
the recurrence through `OnnxBuilder`, and the emitted nodes take the original node's
place; Identity nodes carry the original output names, so consumers, graph outputs
and value_info stay valid. Constant weights become new initializers of the top-level
graph; the constants only the replaced nodes used are then removed. Runtime weights (graph
inputs or computed values) are read where they are. Nothing else changes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from typing import Callable, Optional

import onnx
import onnx.inliner
from onnx import TensorProto

from recurrent_lowering import passes
from recurrent_lowering.passes.plan import EMISSIONS, Plan
from recurrent_lowering.passes.spec import SpecError

from .builder import ConstantPool, Names, OnnxBuilder
from .folding import Scope
from .reader import OnnxReadError, RecurrentNode, is_recurrent, read_node

# "portable": plain ops any runtime or converter takes. "onnxruntime": `auto` picks Scan
# for every length and Scan bodies read their weights unpacked (OnnxBuilder), the fastest
# forms measured under onnxruntime at batch 1 (docs/onnx.md).
TUNINGS = ("portable", "onnxruntime")


def _graphs_of(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _all_graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for sub in _graphs_of(node):
            yield from _all_graphs(sub)


def _all_names(model: onnx.ModelProto) -> set:
    names = set()
    for g in _all_graphs(model.graph):
        names.add(g.name)
        names.update(i.name for i in g.input)
        names.update(o.name for o in g.output)
        names.update(v.name for v in g.value_info)
        names.update(t.name for t in g.initializer)
        for n in g.node:
            names.add(n.name)
            names.update(n.input)
            names.update(n.output)
    return names


def _shape_of(value_info: onnx.ValueInfoProto):
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return t.elem_type, None
    return t.elem_type, tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)


def _known_types(model: onnx.ModelProto) -> dict:
    """name -> (elem_type, shape) from shape inference over all graphs. Sibling subgraphs
    may each define a value of one name: where their types differ the name's shape (and
    element type, if that differs too) is unknown, which the rewrite handles as dynamic."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - fall back to what the model declares
        inferred = model
    types: dict = {}

    def note(name, found):
        known = types.setdefault(name, found)
        if known != found:
            types[name] = (known[0] if known[0] == found[0] else None, None)

    for g in _all_graphs(inferred.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type"):
                note(vi.name, _shape_of(vi))
        for t in g.initializer:
            note(t.name, (t.data_type, tuple(t.dims)))
    return types


def _check_inputs(read: RecurrentNode, builder: OnnxBuilder, types: dict):
    """X and the initial states against the weights, where their types are known: an
    inconsistent model gets an error naming the node and input, not a rewritten model
    that fails in the runtime. Returns X's static batch size or None."""
    spec = read.spec
    label = spec.name
    float_name = onnx.helper.tensor_dtype_to_np_dtype(builder.float_type).name
    x_shape = builder.shape(read.x)
    batch_axis = 0 if spec.layout.batch_first else 1
    batch = x_shape[batch_axis] if x_shape else None
    if x_shape and x_shape[2] is not None and x_shape[2] != spec.input_size:
        raise OnnxReadError(label, "X", f"has input size {x_shape[2]}; W takes {spec.input_size}")
    directions_axis = 1 if spec.layout.state_batch_first else 0
    expected = [None, None, spec.hidden_size]
    expected[directions_axis], expected[1 - directions_axis] = spec.num_directions, batch
    for attribute, name in (
        ("X", read.x),
        ("initial_h", read.initial_h),
        ("initial_c", read.initial_c),
    ):
        elem, shape = types.get(name, (None, None)) if name else (None, None)
        if elem is not None and elem != builder.float_type:
            found = onnx.helper.tensor_dtype_to_np_dtype(elem).name
            raise OnnxReadError(label, attribute, f"is {found}, the weights {float_name}")
        if attribute != "X" and shape is not None:
            fits = len(shape) == 3 and all(
                e is None or d is None or d == e for d, e in zip(shape, expected)
            )
            if not fits:
                want = "[" + ", ".join("?" if e is None else str(e) for e in expected) + "]"
                raise OnnxReadError(label, attribute, f"has shape {list(shape)}; expected {want}")
    return batch


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise ValueError("model has no default-domain opset import")


def _prefix(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./:-]", "_", label)


def _plan(emission: str, opset: int, linear_mode: str, tune_for: str) -> Plan:
    """ONNX's plan: onnxruntime fuses a Gemm with the activation after it (FusedGemm), so
    one product per activation group (GRU [r|z] and n, LSTM [i|f|o] and g) beats one
    product and a Split; it pays per node, so a sequence's steps are one Reshape and one
    Split (Reshape takes its shape as an input from opset 5), the slices of one value one
    Split, and a step's x_t + h R^T one Gemm (Gemm-7's C broadcasts one way). `auto`
    unrolls a static length for any runtime, and loops (a Scan) at every length for
    onnxruntime."""
    return Plan(
        emission=emission,
        auto_unroll_max_steps=0 if tune_for == "onnxruntime" else None,
        split_products=True,
        row_views="any" if opset >= 5 else None,
        merge_slices=True,
        fuse_linear_add=linear_mode == "gemm" and opset >= 7,
    )


class _Rewriter:
    def __init__(
        self,
        model,
        emission,
        activation_defaults,
        linear_mode,
        require_constant_weights,
        tune_for,
        keep=None,
    ):
        if emission not in EMISSIONS:
            raise ValueError(f"emission must be one of {EMISSIONS}, got {emission!r}")
        if tune_for not in TUNINGS:
            raise ValueError(f"tune_for must be one of {TUNINGS}, got {tune_for!r}")
        self.tune_for = tune_for
        self.model = model
        self.require_constant_weights = require_constant_weights
        self.emission = emission
        self.activation_defaults = activation_defaults
        self.linear_mode = linear_mode
        self.opset = _default_opset(model)
        self.types = _known_types(model)
        self.names = Names(_all_names(model))
        self.pool = ConstantPool(self.names, "rl")
        self.replaced_inputs: list = []  # weight names the removed nodes consumed
        self.count = 0
        self.keep = keep

    def run(self) -> int:
        self._graph(self.model.graph, Scope(self.model.graph, self.model.opset_import))
        used = {i for g in _all_graphs(self.model.graph) for n in g.node for i in n.input}
        new = [t for t in self.pool.initializers if t.name in used]
        self.model.graph.initializer.extend(new)
        if self.model.ir_version < 4:  # IR 3: every initializer is also a graph input
            self.model.graph.input.extend(
                onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in new
            )
        if self.count:
            _remove_dead(self.model, self.replaced_inputs)
        return self.count

    def _graph(self, graph: onnx.GraphProto, scope: Scope):
        new_nodes, changed = [], False
        for node in graph.node:
            for sub in _graphs_of(node):
                self._graph(sub, scope.child(sub))
            replaced = None
            if is_recurrent(node):
                replaced = self._replace(node, scope)
            if replaced is not None:
                new_nodes.extend(replaced)
                self.count += 1
                changed = True
            else:
                kept = onnx.NodeProto()
                kept.CopyFrom(node)
                new_nodes.append(kept)
        if changed:
            del graph.node[:]
            graph.node.extend(new_nodes)

    def _declare(self, builder: OnnxBuilder, name: str, default_type: int, default_shape):
        elem, shape = self.types.get(name, (None, None))
        builder.declare(name, elem or default_type, shape if shape is not None else default_shape)
        return name

    def _replace(self, node: onnx.NodeProto, scope: Scope) -> Optional[list]:
        """The nodes replacing `node`, or None if `keep` keeps it."""
        read = read_node(
            node,
            scope.value,
            self.activation_defaults,
            require_constant_weights=self.require_constant_weights,
            value_type=lambda name: self.types.get(name, (None, None)),
        )
        spec = read.spec
        if self.opset < 7:  # Add/Mul-6 broadcast only with attributes, one way
            raise OnnxReadError(
                spec.name,
                "opset",
                f"opset {self.opset} predates the implicit broadcasting the rewrite emits; "
                "convert the model to opset 7 or later first "
                "(onnx.version_converter.convert_version)",
            )
        builder = OnnxBuilder(
            _prefix(spec.name),
            read.float_dtype,
            self.opset,
            self.names,
            self.pool,
            self.linear_mode,
            unpack_loop_weights=self.tune_for == "onnxruntime",
        )
        float_type = builder.float_type
        for name, shape in read.runtime_weights.items():
            self._declare(builder, name, float_type, shape)
        batch_first = spec.layout.batch_first
        x_shape = (None, None, spec.input_size)
        x = self._declare(builder, read.x, float_type, x_shape)
        if builder.shape(x) is not None and len(builder.shape(x)) != 3:
            raise OnnxReadError(spec.name, "X", f"must have rank 3, got shape {builder.shape(x)}")
        batch = _check_inputs(read, builder, self.types)
        time_axis = 1 if batch_first else 0
        steps = builder.static_dim(x, time_axis)
        spec = dataclasses.replace(spec, seq_len=steps)
        plan = _plan(self.emission, self.opset, self.linear_mode, self.tune_for)
        if plan.emission_of(spec) == "unrolled" and steps is None:
            raise OnnxReadError(
                spec.name,
                "X",
                "unrolling needs a static sequence length; the loop form takes a dynamic one",
            )
        if self.keep is not None and self.keep(dataclasses.replace(read, spec=spec)):
            return None
        state_shape = (batch, spec.num_directions, spec.hidden_size)
        if not batch_first:
            state_shape = (spec.num_directions, batch, spec.hidden_size)
        h0 = c0 = None
        if read.initial_h:
            h0 = self._declare(builder, read.initial_h, float_type, state_shape)
        if read.initial_c:
            c0 = self._declare(builder, read.initial_c, float_type, state_shape)
        seq = read.sequence_lens
        if isinstance(seq, str):
            seq = self._declare(builder, seq, TensorProto.INT32, (None,))
            seq = builder.cast(seq, TensorProto.INT64)  # the core compares with int64 steps
        try:
            out = passes.emit(
                builder,
                spec,
                read.weights,
                x,
                h0,
                c0,
                sequence_lens=seq,
                plan=plan,
                shapes={"x": builder.shape(x), "h0": builder.shape(h0), "c0": builder.shape(c0)},
            )
        except SpecError:
            raise
        except NotImplementedError as e:
            raise OnnxReadError(spec.name, "opset", f"needs an op this opset lacks: {e}") from e
        for emitted, name in zip((out.y, out.h, out.c), read.outputs):
            if name:
                if emitted is None:
                    raise OnnxReadError(spec.name, "outputs", f"the core did not emit {name!r}")
                builder.nodes.append(
                    onnx.helper.make_node(
                        "Identity", [emitted], [name], name=self.names.new(f"{builder.prefix}/out")
                    )
                )
        self.replaced_inputs.extend(i for i in list(node.input)[1:4] + list(node.input)[7:8] if i)
        if not isinstance(read.sequence_lens, str) and len(node.input) > 4 and node.input[4]:
            self.replaced_inputs.append(node.input[4])
        return builder.nodes


def _remove_dead(model: onnx.ModelProto, candidates: list) -> None:
    """Drop initializers and deterministic nodes that only fed the replaced nodes."""
    graphs = list(_all_graphs(model.graph))
    kept_names = {i.name for g in graphs for i in g.input} | {o.name for o in model.graph.output}
    pending = list(dict.fromkeys(candidates))
    removed = set()
    while pending:
        uses = {}
        for g in graphs:
            for n in g.node:
                for i in n.input:
                    uses[i] = uses.get(i, 0) + 1
            for o in g.output:
                uses[o.name] = uses.get(o.name, 0) + 1
        next_pending = []
        for name in pending:
            if uses.get(name) or name in kept_names:
                continue
            for g in graphs:
                inits = [t for t in g.initializer if t.name == name]
                for t in inits:
                    g.initializer.remove(t)
                    removed.add(name)
                for n in list(g.node):
                    if name in n.output and not any(_graphs_of(n)):
                        if all(not uses.get(o) for o in n.output):
                            g.node.remove(n)
                            removed.update(n.output)
                            next_pending.extend(i for i in n.input if i)
        pending = list(dict.fromkeys(next_pending))
    for g in graphs:
        for vi in [v for v in g.value_info if v.name in removed]:
            g.value_info.remove(vi)


def rewrite_model(
    model: onnx.ModelProto,
    emission: str = "auto",
    activation_defaults: str = "onnxruntime",
    linear_mode: str = "gemm",
    require_constant_weights: bool = False,
    tune_for: str = "portable",
    keep: Optional[Callable[[RecurrentNode], bool]] = None,
) -> onnx.ModelProto:
    """A copy of `model` without GRU/LSTM/RNN nodes (but those `keep` keeps).

    emission: "unrolled" (static T), "loop" (one ONNX Scan per direction), or "auto"
    (unrolled when the node's sequence length is static, else the loop form).
    activation_defaults: "onnxruntime" or "onnx", whose alpha/beta defaults apply when a
    node omits them (they differ for Affine, ThresholdedRelu and ScaledTanh).
    W, R, B, P computed at run time (graph inputs, as in ONNX's node tests) are arranged
    with graph ops; `require_constant_weights=True` refuses them instead, for routes that
    need constant weights (e.g. conversion to a torch program).
    tune_for: "portable" (plain ops for any runtime or converter) or "onnxruntime": `auto`
    then picks Scan at every length, and each Scan reads its constant weights through
    Optional -> OptionalGetElement (opset 15+) so that onnxruntime runs its unpacked
    GEMV, faster for batch-1 steps (docs/onnx.md).
    keep: called with each recurrent node as read (its static T in `spec.seq_len`); True
    leaves the node as it is (e.g. for a converter that has a better form for it).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out = _inline_functions_with_recurrent_nodes(out)
    _Rewriter(
        out, emission, activation_defaults, linear_mode, require_constant_weights, tune_for, keep
    ).run()
    return out


def _function_nodes(function: onnx.FunctionProto):
    for node in function.node:
        yield node
        for sub in _graphs_of(node):
            for g in _all_graphs(sub):
                yield from g.node


def _inline_functions_with_recurrent_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Model-local functions holding a recurrent node (or calling one that does) are inlined,
    so that the rewrite reaches their nodes; the others stay functions."""
    calls = {
        (f.domain, f.name): {(n.domain, n.op_type) for n in _function_nodes(f)}
        for f in model.functions
    }
    chosen = {
        key for key, f in zip(calls, model.functions) if any(map(is_recurrent, _function_nodes(f)))
    }
    grown = True
    while grown:
        callers = {key for key, called in calls.items() if called & chosen} - chosen
        chosen |= callers
        grown = bool(callers)
    if not chosen:
        return model
    return onnx.inliner.inline_selected_functions(model, sorted(chosen), exclude=False)


def count_recurrent_nodes(model: onnx.ModelProto) -> int:
    """Recurrent nodes in the graph, its subgraphs and the model's local functions."""
    in_graphs = sum(1 for g in _all_graphs(model.graph) for n in g.node if is_recurrent(n))
    return in_graphs + sum(
        1 for f in model.functions for n in _function_nodes(f) if is_recurrent(n)
    )


def rewrite_file(src: str, dst: str, **options) -> int:
    """Rewrite the model at `src` into `dst`; returns the number of nodes replaced.

    `src` is only read. `dst` appears complete or not at all: the model is written to a
    temporary file next to it and renamed into place.
    """
    model = onnx.load(src)
    before = count_recurrent_nodes(model)
    rewritten = rewrite_model(model, **options)
    directory = os.path.dirname(os.path.abspath(dst))
    fd, tmp = tempfile.mkstemp(prefix=".rl-", suffix=".onnx", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(rewritten.SerializeToString())
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return before
