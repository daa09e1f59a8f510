"""Where FxBuilder's constant tensors live: the weights and constants of a recurrent layer
written into a torch.fx graph.

`ProgramConstants` makes parameter placeholders (state_dict + graph-signature entries, as
torch.export represents parameters) for an ExportedProgram; `ModuleConstants` makes
`get_attr` nodes for a bare GraphModule (what the PT2E quantizer and the Arm
transform-for-annotation passes see). Identical arrays share one constant.
"""

from __future__ import annotations

import abc
import hashlib
from typing import Sequence

import torch
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument
from torch.fx import Graph, GraphModule, Node


def fake_mode_of(graph: Graph):
    """The FakeTensorMode the graph's `meta["val"]`s were made in."""
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in graph.nodes]
    mode = detect_fake_mode([v for v in vals if v is not None])
    if mode is None:
        raise ValueError(
            "graph has no fake tensors in node.meta['val']; run torch.export.export first"
        )
    return mode


def _key(t: torch.Tensor, kind: InputKind) -> tuple:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: hash its bits
        t = t.view(torch.int16)
    data = t.numpy().tobytes()
    return (kind, tuple(t.shape), str(t.dtype), hashlib.sha1(data).hexdigest())


class ConstantSink(abc.ABC):
    """Where a builder's constant tensors live; returns the node that reads one."""

    def __init__(self, graph: Graph, fake_mode):
        self.graph = graph
        self.fake_mode = fake_mode
        self._cache: dict = {}

    def get(self, t: torch.Tensor, name: str, kind: InputKind) -> Node:
        key = _key(t, kind)
        node = self._cache.get(key)
        if node is None or node.graph is not self.graph:
            node = self._cache[key] = self._create(t, name, kind)
            node.meta["val"] = self.fake_mode.from_tensor(t, static_shapes=True)
        return node

    @abc.abstractmethod
    def _create(self, t: torch.Tensor, name: str, kind: InputKind) -> Node: ...


class ProgramConstants(ConstantSink):
    """Lifted constants of an ExportedProgram's graph: placeholders plus signature entries.

    Weights become PARAMETERs (in `state_dict`), other tensors lifted CONSTANT_TENSORs
    (in `constants`). `input_specs` collects the new entries; the caller rebuilds the
    graph signature from them (see decompose.py).
    """

    def __init__(
        self,
        graph: Graph,
        fake_mode,
        state_dict: dict,
        constants: dict,
        old_specs: Sequence[InputSpec],
        prefix: str = "",
    ):
        super().__init__(graph, fake_mode)
        self.state_dict, self.constants, self.prefix = state_dict, constants, prefix
        self.input_specs: dict[str, InputSpec] = {}  # new placeholders only
        self._old_specs = {s.arg.name: s for s in old_specs if isinstance(s.arg, TensorArgument)}

    def _unique_target(self, name: str) -> str:
        base = f"{self.prefix}.{name}" if self.prefix else name
        target, k = base, 0
        while target in self.state_dict or target in self.constants:
            k += 1
            target = f"{base}_{k}"
        return target

    def _anchor(self, kind: InputKind) -> Node:
        """Parameters go before the first non-parameter placeholder, constants before inputs."""
        stop = (
            {InputKind.PARAMETER}
            if kind is InputKind.PARAMETER
            else {InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR}
        )
        for n in self.graph.nodes:
            if n.op != "placeholder":
                return n
            spec = self.input_specs.get(n.name) or self._old_specs.get(n.name)
            if spec is None or spec.kind not in stop:
                return n
        raise AssertionError("graph has no nodes")

    def _create(self, t: torch.Tensor, name: str, kind: InputKind) -> Node:
        target = self._unique_target(name)
        letter = "p" if kind is InputKind.PARAMETER else "c"
        with self.graph.inserting_before(self._anchor(kind)):
            node = self.graph.placeholder(f"{letter}_{target.replace('.', '_')}")
        node.target = node.name
        if kind is InputKind.PARAMETER:
            self.state_dict[target] = torch.nn.Parameter(t, requires_grad=False)
        else:
            self.constants[target] = t
        self.input_specs[node.name] = InputSpec(kind, TensorArgument(node.name), target, None)
        return node


class ModuleConstants(ConstantSink):
    """Attributes of a bare GraphModule read by `get_attr` nodes (PT2E / Arm TFA graphs)."""

    def __init__(self, module: GraphModule, fake_mode, prefix: str = "rl"):
        super().__init__(module.graph, fake_mode)
        self.module, self.prefix = module, prefix

    def _create(self, t: torch.Tensor, name: str, kind: InputKind) -> Node:
        base = f"{self.prefix}_{name}".replace(".", "_")
        attr, k = base, 0
        while hasattr(self.module, attr):
            k += 1
            attr = f"{base}_{k}"
        if kind is InputKind.PARAMETER:
            self.module.register_parameter(attr, torch.nn.Parameter(t, requires_grad=False))
        else:
            self.module.register_buffer(attr, t)
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first is None:  # a graph being traced (FxBuilder.loop's step): append
            return self.graph.get_attr(attr)
        with self.graph.inserting_before(first):
            return self.graph.get_attr(attr)
