"""Reading PyTorch's recurrent ops: each becomes the core's description of its layer.

  aten.gru.input / lstm.input / rnn_tanh.input / rnn_relu.input   (output, h_n[, c_n])
  aten.gru_cell / lstm_cell / rnn_tanh_cell / rnn_relu_cell       h' or (h', c')
  recurrent_lowering.layer (layer_op)                             (y, h, c)

`read(node, constant_of)` gives a `RecurrentOp`: the `RecurrentSpec`, the `LayerWeights`
per layer and direction (via `gate_order.from_torch`), and the op's tensor arguments.
Every reader of a recurrent op (the rewrite into elementary ops, the precision cost model,
the report) goes through it, so the arguments are parsed by name in one place. Initial
states that export materialised as `aten.zeros` are treated as absent, so the core can drop
their products. Weights must be constants of the program (parameters, buffers or lifted
constants): `program_constants` and `module_constants` say what a node holds; anything else
is refused with a `SpecError` naming the node and argument.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable, Optional

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature
from torch.fx import Graph, GraphModule, Node

from recurrent_lowering.passes import gate_order
from recurrent_lowering.passes.spec import (
    RELU,
    CellKind,
    Direction,
    IOLayout,
    RecurrentSpec,
    SpecError,
)

from . import layer_op

aten = torch.ops.aten

# op -> (cell kind, activations per direction or None for the cell's defaults)
SEQUENCE_OPS = {
    aten.gru.input: (CellKind.GRU, None),
    aten.lstm.input: (CellKind.LSTM, None),
    aten.rnn_tanh.input: (CellKind.RNN, None),
    aten.rnn_relu.input: (CellKind.RNN, (RELU,)),
}
CELL_OPS = {
    aten.gru_cell.default: (CellKind.GRU, None),
    aten.lstm_cell.default: (CellKind.LSTM, None),
    aten.rnn_tanh_cell.default: (CellKind.RNN, None),
    aten.rnn_relu_cell.default: (CellKind.RNN, (RELU,)),
}
PACKED_OPS = (aten.gru.data, aten.lstm.data, aten.rnn_tanh.data, aten.rnn_relu.data)
LAYER_OPS = (layer_op.OP,)  # a complete description (what nn modules cannot express)
# Module types whose nodes compute a recurrent layer (the Arm quantizer's set_module_type
# gives a region its precision by these).
MODULE_TYPES = (
    layer_op.Layer,
    torch.nn.GRU,
    torch.nn.LSTM,
    torch.nn.RNN,
    torch.nn.GRUCell,
    torch.nn.LSTMCell,
    torch.nn.RNNCell,
)
TARGET_OPS = (
    frozenset(SEQUENCE_OPS) | frozenset(CELL_OPS) | frozenset(PACKED_OPS) | frozenset(LAYER_OPS)
)

_ZERO_FACTORIES = (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default)
_FULL_FACTORIES = (aten.full.default, aten.full_like.default, aten.new_full.default)

ConstantOf = Callable[[Node], Optional[torch.Tensor]]


def has_recurrent_ops(graph: Graph) -> bool:
    """Cheap pre-scan: does `graph` hold any op this module replaces?"""
    return any(graph.find_nodes(op="call_function", target=t) for t in TARGET_OPS)


def recurrent_layers(graph: Graph) -> list[str]:
    """'module path: op' of each recurrent op in `graph`, in graph order (for reports)."""
    return [
        f"{layer_name(n)}: {n.target.__name__}"
        for n in graph.nodes
        if n.op == "call_function" and n.target in TARGET_OPS
    ]


# --- reading an op ----------------------------------------------------------------------------


def _arguments(node: Node) -> dict:
    """The op's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    out = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def is_zeros(n: Optional[Node], constant_of: ConstantOf) -> bool:
    """True when `n` is known to be all zeros (export writes `aten.zeros` for an absent h0)."""
    if n is None:
        return True
    if not isinstance(n, Node):
        return False
    if n.op == "call_function" and n.target in _ZERO_FACTORIES:
        return True
    if n.op == "call_function" and n.target in _FULL_FACTORIES:
        value = n.args[1] if n.target != aten.new_full.default else n.args[2]
        return value == 0
    t = constant_of(n)
    return t is not None and not bool(t.any())


def _weight(node: Node, p: Node, constant_of: ConstantOf, what: str) -> np.ndarray:
    t = constant_of(p) if isinstance(p, Node) else None
    if t is None:
        raise SpecError(
            node.name, what, f"{getattr(p, 'name', p)!r} is not a constant of the program"
        )
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return t.cpu().numpy()


def _val(n: Node):
    return n.meta["val"]


def _static(node: Node, v, what: str) -> int:
    if not isinstance(v, int):
        raise SpecError(node.name, what, f"must be static to unroll, got {v}")
    return v


def _sequence_problem(node: Node, constant_of: ConstantOf):
    """(spec, weights, x, h0, c0) of an aten.{gru,lstm,rnn_*}.input node."""
    cell, acts = SEQUENCE_OPS[node.target]
    a = _arguments(node)
    x, params = a["input"], list(a["params"])
    hx = a["hx"]
    h0, c0 = (hx[0], hx[1]) if cell is CellKind.LSTM else (hx, None)
    layers, bidir, batch_first = int(a["num_layers"]), bool(a["bidirectional"]), a["batch_first"]
    if a["train"] and a["dropout"] and layers > 1:
        raise SpecError(node.name, "dropout", f"dropout={a['dropout']} in training mode")
    dirs = 2 if bidir else 1
    x_shape = _val(x).shape
    if len(x_shape) != 3:
        raise SpecError(node.name, "input", f"expected a 3-D input, got shape {tuple(x_shape)}")
    seq_len = _static(node, x_shape[1 if batch_first else 0], "sequence length")
    base = 4 if a["has_biases"] else 2
    per = len(params) // (layers * dirs)
    if per * layers * dirs != len(params) or per not in (base, base + (cell is CellKind.LSTM)):
        raise SpecError(node.name, "params", f"{len(params)} tensors for {layers}x{dirs}")
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if a["has_biases"] else [])
    names += ["weight_hr"] if per > base else []
    weights = []
    for layer in range(layers):
        row = []
        for d in range(dirs):
            chunk = params[(layer * dirs + d) * per : (layer * dirs + d + 1) * per]
            named = {n: _weight(node, p, constant_of, f"params.{n}") for n, p in zip(names, chunk)}
            row.append(gate_order.from_torch(cell, named))
        weights.append(row)
    w0 = weights[0][0]
    hidden = w0.r.shape[0] // cell.num_gates
    users = _getitem_users(node)
    spec = RecurrentSpec(
        name=node.name,
        cell=cell,
        input_size=int(x_shape[-1]),
        hidden_size=hidden,
        num_layers=layers,
        direction=Direction.BIDIRECTIONAL if bidir else Direction.FORWARD,
        layout=IOLayout(
            batch_first=bool(batch_first), y_directions_axis=False, state_batch_first=False
        ),
        activations=None if acts is None else (acts,) * dirs,
        proj_size=0 if w0.proj is None else int(w0.proj.shape[0]),
        seq_len=seq_len,
        has_initial_h=not is_zeros(h0, constant_of),
        has_initial_c=c0 is not None and not is_zeros(c0, constant_of),
        want_y=0 in users,
        want_h=1 in users,
        want_c=2 in users,
    )
    return (
        spec,
        weights,
        x,
        (h0 if spec.has_initial_h else None),
        (c0 if spec.has_initial_c else None),
        None,
    )


def _layer_problem(node: Node, constant_of: ConstantOf):
    """(spec, weights, x, h0, c0, sequence_lens) of a recurrent_lowering.layer node."""
    a = _arguments(node)
    x = a["x"]
    flat = [_weight(node, p, constant_of, f"weights[{i}]") for i, p in enumerate(a["weights"])]
    spec, weights = layer_op.read(a["description"], flat)
    steps = _val(x).shape[1 if spec.layout.batch_first else 0]
    lens = a["sequence_lens"]
    if lens is not None:
        t = constant_of(lens)
        lens = lens if t is None else t.detach().cpu().numpy().astype(np.int64)
    h0, c0 = a["initial_h"], a["initial_c"]
    users = _getitem_users(node)
    spec = dataclasses.replace(
        spec,
        seq_len=steps if isinstance(steps, int) else None,
        has_initial_h=not is_zeros(h0, constant_of),
        has_initial_c=spec.cell is CellKind.LSTM and not is_zeros(c0, constant_of),
        has_sequence_lens=lens is not None,
        want_y=0 in users,
        want_h=1 in users,
        want_c=spec.cell is CellKind.LSTM and 2 in users,
    )
    if 2 in users and not spec.want_c:
        raise SpecError(spec.name, "outputs", f"{spec.cell.value} has no cell state to read")
    return (
        spec,
        weights,
        x,
        (h0 if spec.has_initial_h else None),
        (c0 if spec.has_initial_c else None),
        lens,
    )


def _cell_problem(node: Node, constant_of: ConstantOf):
    """(spec, weights, x, h0, c0) of an aten.*_cell node, as a one-step sequence."""
    cell, acts = CELL_OPS[node.target]
    a = _arguments(node)
    x, hx = a["input"], a["hx"]
    h0, c0 = (hx[0], hx[1]) if cell is CellKind.LSTM else (hx, None)
    if len(_val(x).shape) != 2:
        raise SpecError(node.name, "input", f"expected [batch, input], got {tuple(_val(x).shape)}")
    named = {
        "weight_ih": a["w_ih"],
        "weight_hh": a["w_hh"],
        "bias_ih": a["b_ih"],
        "bias_hh": a["b_hh"],
    }
    named = {k: _weight(node, v, constant_of, k) for k, v in named.items() if v is not None}
    lw = gate_order.from_torch(cell, named)
    users = _getitem_users(node) if cell is CellKind.LSTM else {1: [node]}
    spec = RecurrentSpec(
        name=node.name,
        cell=cell,
        input_size=int(_val(x).shape[-1]),
        hidden_size=lw.r.shape[0] // cell.num_gates,
        layout=IOLayout(batch_first=False, y_directions_axis=False, state_batch_first=False),
        activations=None if acts is None else (acts,),
        seq_len=1,
        has_initial_h=not is_zeros(h0, constant_of),
        has_initial_c=c0 is not None and not is_zeros(c0, constant_of),
        want_y=False,
        want_h=0 in users if cell is CellKind.LSTM else True,
        want_c=cell is CellKind.LSTM and 1 in users,
    )
    return (
        spec,
        [[lw]],
        x,
        (h0 if spec.has_initial_h else None),
        (c0 if spec.has_initial_c else None),
        None,
    )


def _getitem_users(node: Node) -> dict[int, list[Node]]:
    users: dict[int, list[Node]] = {}
    for u in node.users:
        if u.op == "call_function" and u.target is operator.getitem:
            if u.users:
                users.setdefault(u.args[1], []).append(u)
        else:
            raise SpecError(node.name, "outputs", f"used by {u.name} other than through getitem")
    return users


@dataclasses.dataclass
class RecurrentOp:
    """A recurrent op as the core sees it: its layer's description, weights and inputs
    (None where absent: a zero initial state, no lengths). `sequence_lens` is a node, or
    an int64 array when constant. A cell op is a one-step sequence whose `x` and states
    are [B, .]: `is_cell`."""

    node: Node
    spec: RecurrentSpec
    weights: list  # [layer][direction] LayerWeights
    x: Node
    h0: Optional[Node]
    c0: Optional[Node]
    sequence_lens: object
    is_cell: bool

    @property
    def layer(self) -> str:
        return layer_name(self.node)


def read(node: Node, constant_of: ConstantOf) -> RecurrentOp:
    """The op `node` (one of TARGET_OPS) as the core's description; refuses packed
    sequences and weights that are not constants."""
    if node.target in PACKED_OPS:
        raise SpecError(node.name, "input", "packed sequences (PackedSequence) are not supported")
    if node.target in CELL_OPS:
        problem = _cell_problem
    elif node.target in LAYER_OPS:
        problem = _layer_problem
    else:
        problem = _sequence_problem
    spec, weights, x, h0, c0, lens = problem(node, constant_of)
    return RecurrentOp(node, spec, weights, x, h0, c0, lens, node.target in CELL_OPS)


def module_path(node: Node) -> str:
    """The module path of the layer a recurrent op computes: the innermost module of its
    `nn_module_stack`, as the user named it ("" when export recorded none)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path.replace("L['self'].", "").replace("L__self__", "")


def layer_name(node: Node) -> str:
    """What reports call the layer of a recurrent op: its module path, else the node's name."""
    return module_path(node) or node.name


def written_in_place(n: Node) -> bool:
    """Whether an op writes `n` in place (a state buffer's `copy_`, which export leaves in
    the graph): such a tensor changes between calls, so it is no constant."""
    for user in n.users:
        schema = getattr(user.target, "_schema", None)
        if user.op != "call_function" or schema is None:
            continue
        for a, arg in zip(schema.arguments, user.args):
            if arg is n and a.alias_info is not None and a.alias_info.is_write:
                return True
    return False


def program_constants(ep: ExportedProgram, specs: list) -> ConstantOf:
    """What a placeholder of `ep` holds when it is a constant (a parameter, an unmutated
    buffer, a lifted constant; `specs`: the input specs naming its placeholders), else None."""
    sig = ExportGraphSignature(specs, ep.graph_signature.output_specs)

    def constant_of(n: Node) -> Optional[torch.Tensor]:
        if n.op != "placeholder" or written_in_place(n):
            return None
        if n.name in sig.inputs_to_parameters:
            return ep.state_dict[sig.inputs_to_parameters[n.name]]
        if n.name in sig.inputs_to_buffers:
            target = sig.inputs_to_buffers[n.name]
            if target in sig.buffers_to_mutate.values():
                return None
            return ep.state_dict.get(target, ep.constants.get(target))
        if n.name in sig.inputs_to_lifted_tensor_constants:
            return ep.constants[sig.inputs_to_lifted_tensor_constants[n.name]]
        return None

    return constant_of


def module_constants(gm: GraphModule) -> ConstantOf:
    """What a get_attr node of `gm` holds when it is a tensor nobody writes, else None."""

    def constant_of(n: Node) -> Optional[torch.Tensor]:
        if n.op != "get_attr" or any(
            written_in_place(m) for m in gm.graph.find_nodes(op="get_attr", target=n.target)
        ):
            return None
        obj = gm
        for part in n.target.split("."):
            obj = getattr(obj, part)
        return obj if isinstance(obj, torch.Tensor) else None

    return constant_of
