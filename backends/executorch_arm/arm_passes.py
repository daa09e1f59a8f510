"""Our decomposition as ExecuTorch Arm passes, scheduled where DecomposeGru/Lstm/RnnPass run.

ExecuTorch 1.5.1 runs its recurrent decompositions in the quantizer's
transform-for-annotation (TFA) pipeline, on a bare GraphModule whose weights are
`get_attr` nodes. The passes here do the same job through `decompose_graph_module`:

  DecomposeGruRecurrentPass   aten.gru.input, aten.gru_cell            (replaces DecomposeGruPass)
  DecomposeLstmRecurrentPass  aten.lstm.input, aten.lstm_cell          (replaces DecomposeLstmPass)
  DecomposeRnnRecurrentPass   aten.rnn_{tanh,relu}.input and _cell     (replaces DecomposeRnnPass)

They are `ArmOpTargetedPass`es: a graph without their ops is skipped by a node-table
lookup, before any retracing. In TFA mode they respect `allowed_to_transform` (nodes the
quantizer leaves in float keep their op). They compute every new node's fake `val`
themselves, so no ExportPass retrace follows.

`RecurrentArmPassManager` is an `ArmPassManager` whose `add_pass` puts ours in the slot
of each ExecuTorch recurrent pass, so every pipeline it builds (TFA or backend) runs
ours in their place.
"""

from __future__ import annotations

from typing import Set, Type

import torch
from executorch.backends.arm._passes import (
    DecomposeGruPass,
    DecomposeLstmPass,
    DecomposeRnnPass,
)
from executorch.backends.arm._passes.arm_pass import ArmOpTargetedPass
from executorch.backends.arm._passes.arm_pass_manager import ArmPassManager
from executorch.exir.pass_base import ExportPass
from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

from .decompose import CELL_OPS, LAYER_OPS, SEQUENCE_OPS, decompose_graph_module
from .fx_builder import PLAIN, ProductForm

aten = torch.ops.aten


class DecomposeRecurrentPass(ArmOpTargetedPass):
    """Replace `target_ops` with what the core writes (hoisted input projection, one
    recurrent linear per step and direction; see recurrent_lowering.passes)."""

    _passes_required_after: Set[Type[ExportPass]] = set()
    check_allowed_to_transform = True
    target_ops = tuple(SEQUENCE_OPS) + tuple(CELL_OPS) + LAYER_OPS

    def __init__(
        self,
        tfa_pass: bool = False,
        strategy: str = "unrolled",
        *args,
        products: ProductForm = PLAIN,
        **kwargs,
    ):
        super().__init__(tfa_pass, *args, **kwargs)
        self.strategy, self.products = strategy, products

    def call(self, graph_module: GraphModule) -> PassResult:
        targets = set(self.target_ops)
        modified = decompose_graph_module(
            graph_module,
            self.strategy,
            allowed=lambda n: n.target in targets and self.allowed_to_transform(n.meta),
            products=self.products,
        )
        return PassResult(graph_module, modified)


class DecomposeGruRecurrentPass(DecomposeRecurrentPass):
    """GRU: r, z = sigmoid(x W_rz + h R_rz + b), n = tanh(x W_n + b_in + r * (h R_n + b_hn)),
    h' = n + z * (h - n)."""

    target_ops = (aten.gru.input, aten.gru_cell.default)


class DecomposeLstmRecurrentPass(DecomposeRecurrentPass):
    """LSTM: i, f, o = sigmoid(.), g = tanh(.), c' = f * c + i * g, h' = o * tanh(c')
    (times W_hr with proj_size)."""

    target_ops = (aten.lstm.input, aten.lstm_cell.default)


class DecomposeRnnRecurrentPass(DecomposeRecurrentPass):
    """Elman RNN: h' = tanh or relu(x W + h R + b)."""

    target_ops = (
        aten.rnn_tanh.input,
        aten.rnn_relu.input,
        aten.rnn_tanh_cell.default,
        aten.rnn_relu_cell.default,
    )


# ExecuTorch's pass -> ours, slot for slot.
REPLACEMENTS = {
    DecomposeGruPass: DecomposeGruRecurrentPass,
    DecomposeLstmPass: DecomposeLstmRecurrentPass,
    DecomposeRnnPass: DecomposeRnnRecurrentPass,
}


class RecurrentArmPassManager(ArmPassManager):
    """An ArmPassManager that runs our recurrent passes where ExecuTorch's would run."""

    strategy = "unrolled"
    products = PLAIN

    def add_pass(self, pipeline_pass):
        ours = REPLACEMENTS.get(type(pipeline_pass))
        if ours is not None:
            pipeline_pass = ours(
                tfa_pass=pipeline_pass.is_tfa_pass, strategy=self.strategy, products=self.products
            )
        return super().add_pass(pipeline_pass)
