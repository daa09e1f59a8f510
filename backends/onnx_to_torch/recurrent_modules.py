"""ONNX GRU/LSTM/RNN nodes as torch modules, so they reach the Arm flow as recurrent layers.

On the ONNX -> Ethos-U route (docs/onnx_to_ethos_u.md) a node rewritten into elementary ops
reaches the Arm flow unrolled, as plain MatMuls: ExecuTorch then spends about 40 ms per node
per timestep, and nothing downstream can tell the recurrent weights apart. So every node
with constant float32 or float16 weights becomes a module the torch adapter decomposes
like a torch model's layer (loop form for long sequences,
`--recurrent_weight_bits`, `--keep_recurrent_on_cpu`, h0/h_n sharing):

- a node that nn.GRU/LSTM/RNN computes exactly (what PyTorch exports: GRU with
  linear_before_reset=1, default activations, no clip, no peepholes, forward or
  bidirectional, all sequences full length) becomes that module (`TorchRecurrent`);
- any other (peepholes, linear_before_reset=0, clip, other activations, reverse,
  sequence_lens) becomes `OnnxLayer`: executorch_arm.layer_op's op carrying the core's
  complete description.

`kept_as` says which, or why neither (the node is then rewritten).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Optional

import numpy as np
import torch
from onnx import defs
from torch import nn

from recurrent_lowering.backends.executorch_arm.recurrent_ops import layer_op
from recurrent_lowering.backends.onnx.reader import RECURRENT_OPS, RecurrentNode
from recurrent_lowering.passes import gate_order
from recurrent_lowering.passes.spec import DEFAULT_ACTIVATIONS, RELU, CellKind, Direction

_MODULES = {CellKind.GRU: nn.GRU, CellKind.LSTM: nn.LSTM, CellKind.RNN: nn.RNN}

# the nodes of the model being converted: first output name -> RecurrentNode
_NODES: contextvars.ContextVar = contextvars.ContextVar("torch_recurrent_nodes", default=None)


def key(outputs) -> str:
    """How a node is found again after the rewrite: its first named output."""
    return next(o for o in outputs if o)


TORCH_MODULE, LAYER_OP = "torch module", "layer op"


def kept_as(read: RecurrentNode) -> tuple[Optional[str], Optional[str]]:
    """(TORCH_MODULE or LAYER_OP, None) for a node that travels as a torch op, or (None,
    the reason it cannot)."""
    if read.runtime_weights:
        return None, "weights computed at run time"
    if read.float_dtype not in (np.float32, np.float16):  # fp16: as a torch model's layer
        return None, f"{read.float_dtype} (recurrent layers run here in float32 or float16)"
    return (TORCH_MODULE if expressible(read) is None else LAYER_OP), None


def _full_length(read: RecurrentNode) -> bool:
    lens = read.sequence_lens
    return lens is None or (
        isinstance(lens, np.ndarray)
        and read.spec.seq_len is not None
        and bool(np.all(lens == read.spec.seq_len))
    )


def expressible(read: RecurrentNode) -> Optional[str]:
    """None if an nn.GRU/LSTM/RNN computes the node exactly, else the reason it cannot."""
    spec = read.spec
    if spec.direction is Direction.REVERSE:
        return "direction reverse"
    if spec.clip is not None:
        return "clip"
    if spec.cell is CellKind.GRU and not spec.linear_before_reset:
        return "linear_before_reset=0 (torch's GRU is linear_before_reset=1)"
    if spec.input_forget:
        return "input_forget"
    if any(w.peephole is not None and np.any(w.peephole) for w in read.weights[0]):
        return "peepholes"
    for d in range(spec.num_directions):
        acts = spec.activations_for(d)
        default = DEFAULT_ACTIVATIONS[spec.cell]
        if acts != default and not (spec.cell is CellKind.RNN and acts == (RELU,)):
            return f"activations {[a.name for a in acts]}"
    if len({spec.activations_for(d) for d in range(spec.num_directions)}) > 1:
        return "a different activation per direction"
    if not _full_length(read):
        return "sequence_lens"
    return None


class Selection:
    """A `keep` for rewrite_model: keeps the nodes that travel as torch ops and collects
    them (`kept`: key -> node as read, for onnx_to_torch; `kinds`: node name -> TORCH_MODULE
    or LAYER_OP), and why the others were not (`rewritten`: node name -> reason)."""

    def __init__(self):
        self.kept: dict = {}
        self.kinds: dict = {}
        self.rewritten: dict = {}

    def __call__(self, read: RecurrentNode) -> bool:
        kind, reason = kept_as(read)
        if kind is None:
            self.rewritten[read.spec.name] = reason
            return False
        self.kept[key(read.outputs)] = read
        self.kinds[read.spec.name] = kind
        return True


class TorchRecurrent(nn.Module):
    """One ONNX recurrent node as torch's module, with ONNX's tensor layouts at its edges:
    X [T, B, I] (layout 1: [B, T, I]), Y [T, D, B, H] ([B, T, D, H]), states [D, B, H]
    ([B, D, H]). Returns one value per ONNX output the node lists, in order (None for
    unnamed ones); a tuple unless it lists one."""

    def __init__(self, read: RecurrentNode, listed_outputs: int):
        super().__init__()
        spec = read.spec
        self.cell, self.batch_first = spec.cell, spec.layout.batch_first
        self.directions, self.hidden = spec.num_directions, spec.hidden_size
        self.outputs = tuple(bool(o) for o in read.outputs[:listed_outputs])
        self.has_h0, self.has_c0 = read.initial_h is not None, read.initial_c is not None
        layers = read.weights[0]
        bias = any(w.b_w is not None or w.b_r is not None for w in layers)
        kwargs = dict(bidirectional=self.directions == 2, bias=bias)
        if spec.cell is CellKind.RNN:
            kwargs["nonlinearity"] = "relu" if spec.activations_for(0) == (RELU,) else "tanh"
        self.rnn = _MODULES[spec.cell](spec.input_size, spec.hidden_size, **kwargs)
        with torch.no_grad():
            for d, weights in enumerate(layers):
                params = gate_order.to_torch(spec.cell, weights)
                for name in ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if bias else ()):
                    value = params.get(name)
                    if value is None:  # one of B's halves absent: zeros
                        value = np.zeros(getattr(self.rnn, name + "_l0").shape, np.float32)
                    target = getattr(self.rnn, name + gate_order.torch_suffix(0, d))
                    target.copy_(torch.from_numpy(np.asarray(value, np.float32)))
        self.rnn.to(torch.float16 if read.float_dtype == np.float16 else torch.float32).eval()

    def forward(self, x, *states):
        """`states`: the node's initial_h and initial_c, those it has, in that order."""
        states = list(states)
        initial_h = states.pop(0) if self.has_h0 else None
        initial_c = states.pop(0) if self.has_c0 else None
        if self.batch_first:
            x = x.transpose(0, 1)
            initial_h = None if initial_h is None else initial_h.transpose(0, 1)
            initial_c = None if initial_c is None else initial_c.transpose(0, 1)
        c = None
        if self.cell is CellKind.LSTM:
            state = None
            if initial_h is not None or initial_c is not None:
                like = initial_h if initial_h is not None else initial_c
                state = (
                    torch.zeros_like(like) if initial_h is None else initial_h,
                    torch.zeros_like(like) if initial_c is None else initial_c,
                )
            y, (h, c) = self.rnn(x, state)
        else:
            y, h = self.rnn(x, initial_h)
        steps, batch = y.shape[0], y.shape[1]
        y = y.reshape(steps, batch, self.directions, self.hidden).permute(0, 2, 1, 3)
        if self.batch_first:
            y = y.permute(2, 0, 1, 3)
            h = h.transpose(0, 1)
            c = None if c is None else c.transpose(0, 1)
        values = (y, h, c)[: len(self.outputs)]
        values = tuple(v if wanted else None for v, wanted in zip(values, self.outputs))
        return values if len(values) > 1 else values[0]


class OnnxLayer(nn.Module):
    """Any ONNX recurrent node as layer_op.Layer (the spec's IOLayout is ONNX's, so no
    transposes). Takes the node's X, initial_h, initial_c and a run-time sequence_lens,
    those it has, in that order; returns one value per ONNX output it lists (as
    TorchRecurrent)."""

    def __init__(self, read: RecurrentNode, listed_outputs: int):
        super().__init__()
        self.layer = layer_op.Layer(read.spec, read.weights)
        self.outputs = tuple(bool(o) for o in read.outputs[:listed_outputs])
        self.has_h0, self.has_c0 = read.initial_h is not None, read.initial_c is not None
        lens = read.sequence_lens
        self.runtime_lens = isinstance(lens, str)
        constant = isinstance(lens, np.ndarray) and not _full_length(read)
        self.register_buffer("lens", torch.from_numpy(lens.astype(np.int64)) if constant else None)

    def forward(self, x, *rest):
        rest = list(rest)
        initial_h = rest.pop(0) if self.has_h0 else None
        initial_c = rest.pop(0) if self.has_c0 else None
        lens = rest.pop(0) if self.runtime_lens else self.lens
        values = self.layer(x, initial_h, initial_c, lens)[: len(self.outputs)]
        values = tuple(v if wanted else None for v, wanted in zip(values, self.outputs))
        return values if len(values) > 1 else values[0]


def _convert(node, graph):
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult

    read = (_NODES.get() or {}).get(key(node.output_values))
    if read is None:  # to_torch refuses other recurrent nodes before converting
        raise NotImplementedError(f"{node.operation_type} node {node.name!r} was not read")
    listed = len(node.output_values)
    inputs = [i for i in (read.x, read.initial_h, read.initial_c) if i]
    if expressible(read) is None:
        module = TorchRecurrent(read, listed)
    else:
        module = OnnxLayer(read, listed)
        inputs += [read.sequence_lens] if isinstance(read.sequence_lens, str) else []
    mapping = OnnxMapping(inputs=tuple(inputs), outputs=tuple(node.output_values))
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping)


def register(registry) -> None:
    """Our converter for every version of GRU, LSTM and RNN onnx2torch might look up."""
    for op in RECURRENT_OPS:
        versions = {
            defs.get_schema(op, max_inclusive_version=v).since_version
            for v in range(1, defs.onnx_opset_version() + 1)
            if _has_schema(op, v)
        }
        for version in sorted(versions):
            try:
                registry.add_converter(operation_type=op, version=version)(_convert)
            except ValueError:  # registered already (a second call, or onnx2torch's own)
                pass


def _has_schema(op: str, version: int) -> bool:
    try:
        defs.get_schema(op, max_inclusive_version=version)
        return True
    except Exception:  # defs.SchemaError: no version of `op` up to `version`
        return False


@contextlib.contextmanager
def nodes(reads: dict):
    """Makes `reads` (key -> RecurrentNode) what the converter finds while converting."""
    token = _NODES.set(reads)
    try:
        yield
    finally:
        _NODES.reset(token)
