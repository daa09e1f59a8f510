"""The core's `Builder`, writing ATen nodes into a torch.fx graph (ExportedProgram or GraphModule).

Ops are the ones ExecuTorch's Arm backend keeps and its quantizer annotates, as in
its own `DecomposeGruPass`:

  linear      aten.linear (kept whole by the Arm partitioner, FP and INT)
  elementwise aten.add/sub/mul/div.Tensor, sigmoid, tanh, relu, exp, log, abs, clamp
  select      aten.lt.Tensor / lt.Scalar / gt.Scalar, aten.where.self
  shape       aten.slice.Tensor, cat, squeeze.dims, unsqueeze, permute

Every new node gets `meta["val"]` computed by running its op on the arguments' fake
tensors in the graph's own fake mode (symbolic batch sizes stay symbolic), plus the
provenance keys (`stack_trace`, `nn_module_stack`, ...) of the node it replaces and the
layer it computes (origin.py).

Weights go through a `ConstantSink` (fx_constants.py): parameter placeholders of an
ExportedProgram, or `get_attr` nodes of a bare GraphModule.

Scalar constants stay Python numbers where ATen takes a Scalar operand
(`add(x, 0.5)`), so no 0-d tensors reach the backend.

Timesteps are rows: `unstack` takes step t of the hoisted projection [T, B, X] as rows
t*B:(t+1)*B of its 2-D view [T*B, X], and `stack` concatenates the [B, H] step outputs as
rows and views them back, so a step's values stay 2-D with no per-step reshape.

`ProductForm` holds the choices that depend on the target (its ArmPlan sets them, plan.py):
`recurrent_product="linear"` writes x W^T as aten.linear (a per-step CONV2D on Ethos-U: the
right form on U55, where R streams from flash either way); "matmul" writes a one-row x (the
recurrent product h R^T at batch 1) as aten.mm(W, x^T), W on the left, where x^T and the
result's transpose back are views (a MATMUL on U85, which runs it at about 20 MACs/cycle
against a per-step CONV's 12; on U55 the MATMUL form is 2.3x slower).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import torch
from executorch.backends.arm.constants import DISALLOW_TFA_META_KEY
from torch.export.graph_signature import InputKind
from torch.fx import Graph, GraphModule, Node
from torch.utils import _pytree as pytree

from recurrent_lowering.passes.builder import (
    LOOP_ROWS,
    SCAN,
    SCAN_WITH_INITIAL,
    SELECT,
    Builder,
    is_constant,
)
from recurrent_lowering.passes.spec import SpecError
from recurrent_lowering.passes.translate import translate_body

from . import origin
from .fx_constants import ConstantSink, ModuleConstants

aten = torch.ops.aten

# Provenance copied from the replaced node onto every node emitted for it.
PROVENANCE_KEYS = (
    "stack_trace",
    "nn_module_stack",
    "source_fn_stack",
    "torch_fn",
    "custom",
    "fwd_nn_module_stack",
    DISALLOW_TFA_META_KEY,  # the Arm quantizer's "leave this node in float" mark
)


@dataclasses.dataclass(frozen=True)
class ProductForm:
    """How FxBuilder writes what the core asks for (see the module docstring)."""

    recurrent_product: str = "linear"  # "linear" | "matmul"

    def __post_init__(self):
        if self.recurrent_product not in ("linear", "matmul"):
            raise ValueError(
                f"recurrent_product must be 'linear' or 'matmul', got {self.recurrent_product!r}"
            )


PLAIN = ProductForm()  # aten.linear everywhere


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A 0-d constant, kept as a Python number until an op needs a tensor."""

    value: float


class FxBuilder(Builder):
    """Emits ATen call_function nodes at the graph's current insertion point."""

    capabilities = frozenset({SELECT, SCAN, SCAN_WITH_INITIAL, LOOP_ROWS})

    def __init__(
        self,
        graph: Graph,
        constants: ConstantSink,
        meta_from: Optional[Node] = None,
        dtype: torch.dtype = torch.float32,
        products: ProductForm = PLAIN,
        layer: Optional[str] = None,
    ):
        self.graph, self.sink, self.torch_dtype = graph, constants, dtype
        self.products = products
        # numpy float dtype the core folds constants in (read by passes.sequence)
        self.dtype = np.float64 if dtype == torch.float64 else np.float32
        self.fake_mode = constants.fake_mode
        self.meta = {}
        self.layer = meta_from.name if meta_from is not None else "loop"  # names errors
        if meta_from is not None:
            self.meta = {k: meta_from.meta[k] for k in PROVENANCE_KEYS if k in meta_from.meta}
        self.origin_layer = layer
        if layer is not None:  # every node says which layer it computes (origin.py)
            self.meta["custom"] = origin.tagged(self.meta.get("custom"), layer=layer)
        self.nodes: list[Node] = []  # every call_function emitted, in order
        self._n_weights = 0

    # --- plumbing -----------------------------------------------------------------------
    def call(self, target, *args, **kwargs) -> Node:
        """One ATen node with provenance and a fake `val`."""
        node = self.graph.call_function(target, args, kwargs)
        node.meta.update(self.meta)
        fake_args, fake_kwargs = pytree.tree_map_only(Node, lambda n: n.meta["val"], (args, kwargs))
        with self.fake_mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        self.nodes.append(node)
        return node

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        a = np.asarray(array)
        t = torch.from_numpy(np.ascontiguousarray(a).copy())
        return t.to(self.torch_dtype) if t.is_floating_point() else t

    def _weight(self, array: np.ndarray, role: str) -> Node:
        self._n_weights += 1
        return self.sink.get(self._tensor(array), f"{role}_{self._n_weights}", InputKind.PARAMETER)

    def _node(self, v: Any) -> Node:
        """A tensor node for a value that may still be a Scalar."""
        if isinstance(v, Scalar):
            t = torch.tensor([v.value], dtype=self.torch_dtype)
            return self.sink.get(t, "scalar", InputKind.CONSTANT_TENSOR)
        return v

    # --- constants and linear algebra -----------------------------------------------------
    def constant(self, array, name=""):
        a = np.asarray(array)
        if a.ndim == 0 and a.dtype.kind == "f":
            return Scalar(float(a))
        return self.sink.get(self._tensor(a), name or "const", InputKind.CONSTANT_TENSOR)

    def linear(self, x, weight, bias=None, role=None):
        name = "weight" if role is None else str(role)
        for what, a in (("weight", weight), ("bias", bias)):
            if a is not None and not is_constant(a):
                # decompose.py already refuses non-constant parameters, naming the node
                raise SpecError(name, what, "runtime weights are not supported in torch programs")
        w = self._weight(weight, name)
        if role is not None and role.per_step:
            origin.tag(w, layer=self.origin_layer, per_step=True)  # quantization.weights
        x = self._node(x)
        if self.products.recurrent_product == "matmul" and self._one_row(x):
            return self._matmul_left(x, w, bias)
        b = None if bias is None else self._weight(bias, f"{name}_b")
        return self.call(aten.linear.default, x, w, b)

    @staticmethod
    def _shape(n: Node) -> tuple:
        return tuple(n.meta["val"].shape)

    def _view(self, n: Node, shape) -> Node:
        return self.call(aten.view.default, n, [int(d) for d in shape])

    def _one_row(self, x: Node) -> bool:
        return all(isinstance(d, int) and d == 1 for d in self._shape(x)[:-1])

    def _matmul_left(self, x: Node, w: Node, bias):
        """x W^T for a one-row x as (W x^T)^T = mm(W [out, in], x^T [in, 1]); with one row,
        x^T and the transpose back are views."""
        shape = self._shape(x)
        y = self.call(aten.mm.default, w, self._view(x, [shape[-1], 1]))
        y = self._view(y, [*shape[:-1], self._shape(w)[0]])
        if bias is not None:
            y = self.call(aten.add.Tensor, y, self.constant(np.asarray(bias), "bias"))
        return y

    def _binary(self, op, a, b, commutes: bool):
        if isinstance(a, Scalar) and isinstance(b, Scalar):
            return Scalar(float(op(torch.tensor(a.value), torch.tensor(b.value))))
        if isinstance(a, Scalar) and commutes:
            a, b = b, a
        return self.call(op, self._node(a), b.value if isinstance(b, Scalar) else b)

    def add(self, a, b):
        return self._binary(aten.add.Tensor, a, b, True)

    def sub(self, a, b):
        return self._binary(aten.sub.Tensor, a, b, False)

    def mul(self, a, b):
        return self._binary(aten.mul.Tensor, a, b, True)

    def div(self, a, b):
        return self._binary(aten.div.Tensor, a, b, False)

    def sigmoid(self, x):
        return self.call(aten.sigmoid.default, self._node(x))

    def tanh(self, x):
        return self.call(aten.tanh.default, self._node(x))

    def relu(self, x):
        return self.call(aten.relu.default, self._node(x))

    def exp(self, x):
        return self.call(aten.exp.default, self._node(x))

    def log(self, x):
        return self.call(aten.log.default, self._node(x))

    def abs(self, x):
        return self.call(aten.abs.default, self._node(x))

    def clamp(self, x, lo, hi):
        return self.call(aten.clamp.default, self._node(x), lo, hi)

    # --- shape ------------------------------------------------------------------------------
    def slice(self, x, axis, start, end):
        return self.call(aten.slice.Tensor, self._node(x), axis, start, end)

    def concat(self, xs, axis):
        return self.call(aten.cat.default, [self._node(x) for x in xs], axis)

    def squeeze(self, x, axis):
        return self.call(aten.squeeze.dims, self._node(x), [axis])

    def unsqueeze(self, x, axis):
        return self.call(aten.unsqueeze.default, self._node(x), axis)

    def transpose(self, x, perm):
        return self.call(aten.permute.default, self._node(x), list(perm))

    def reshape(self, x, shape):
        return self._view(self._node(x), shape)

    def split(self, x, axis, sizes):
        """Row blocks: slices (views) along `axis`, equal ones when `sizes` is a count."""
        x = self._node(x)
        if isinstance(sizes, int):
            size = self._shape(x)[axis] // sizes
            sizes = [size] * sizes
        return super().split(x, axis, sizes)

    # --- loops ------------------------------------------------------------------------------
    def loop(self, loop, carried, xs, outer, used=None):
        """One `recurrent_lowering::loop` node running the body as a GraphModule (loop.op).
        `used`: the results anything reads (c_n read by nobody is not returned)."""
        from ..loop import op as loop_op

        carried = [self._node(v) for v in carried]
        if len(xs) != 1 or len(carried) not in (1, 2):
            raise SpecError(
                self.layer, "sequence_lens", "the loop form takes one input sequence without masks"
            )
        xs = self._node(xs[0])
        h_shape = self._shape(carried[0])
        if any(self._shape(v) != h_shape for v in carried):
            raise SpecError(self.layer, "proj_size", "the loop form needs h and c of one shape")
        rows = loop.rows_per_step
        step_x = xs.meta["val"][:rows] if rows else xs.meta["val"][0]
        step = self._step_module(loop.body, carried, step_x, outer)
        steps = loop.steps_of(self._shape(xs))
        final_c = len(carried) > 1 and (used is None or 1 in used)
        c = carried[1] if len(carried) > 1 else None
        reverse, initial = loop.reverse, loop.initial_in_ys
        node = self.call(
            loop_op.OP, xs, carried[0], c, loop.first, steps, reverse, initial, final_c
        )
        loop_op.attach(node, loop_op.StepProgram(step, len(carried)))
        y_rows = steps + initial  # rows of Y in the result
        ys = self.slice(node, 0, 0, y_rows) if final_c else node
        last = 0 if reverse else y_rows - 1
        final = [self.squeeze(self.slice(ys, 0, last, last + 1), 0)]
        if final_c:
            final.append(self.squeeze(self.slice(node, 0, y_rows, y_rows + 1), 0))
        elif len(carried) > 1:
            final.append(None)  # c_n: read by nobody
        return final, [ys]

    def _step_module(self, body, carried: list, step_x, outer: dict) -> GraphModule:
        """The loop body as a GraphModule (state..., x_t) -> (state'...). The loop's result
        holds each step's h: a step's y must be its new h, or absent (Y unread, e.g. a
        classifier on h_n only)."""
        module = GraphModule(torch.nn.Module(), Graph())
        graph = module.graph
        inputs = []
        for i, val in enumerate([*(v.meta["val"] for v in carried), step_x]):
            ph = graph.placeholder("x_t" if i == len(carried) else f"state{i}")
            ph.meta["val"] = val
            inputs.append(ph)
        b = FxBuilder(
            graph,
            ModuleConstants(module, self.fake_mode, prefix="step"),
            dtype=self.torch_dtype,
            products=self.products,
            layer=self.origin_layer,
        )
        new, ys = translate_body(body, b, inputs, outer)
        new = [b._node(v) for v in new]
        if len(ys) > 1 or (ys and b._node(ys[0]) is not new[0]):
            raise SpecError(self.layer, "Y", "the loop form needs each step's output to be its h")
        graph.output(tuple(new))
        module.recompile()
        return module

    # --- selection --------------------------------------------------------------------------
    def less(self, a, b):
        if isinstance(a, Scalar) and not isinstance(b, Scalar):
            return self.call(aten.gt.Scalar, b, a.value)
        if isinstance(b, Scalar) and not isinstance(a, Scalar):
            return self.call(aten.lt.Scalar, a, b.value)
        return self.call(aten.lt.Tensor, self._node(a), self._node(b))

    def where(self, cond, a, b):
        return self.call(aten.where.self, self._node(cond), self._node(a), self._node(b))
