"""ExecuTorch's Arm quantizers and partitioners, with our recurrent decomposition plugged in.

Public subclasses only; nothing in ExecuTorch is patched:

  Recurrent{TOSA,EthosU}Quantizer.transform_for_annotation
      decomposes recurrent ops (DecomposeRecurrentPass, TFA mode) before ExecuTorch's
      annotation pipeline, so the quantizer annotates our elementary ops and ExecuTorch's
      DecomposeGru/Lstm/RnnPass find nothing left to do (INT flows);
  Recurrent{TOSA,EthosU}Partitioner.transform_for_pre_decomposition
      (the hook `to_edge_transform_and_lower` calls before the core-ATen decompositions)
      runs `decompose_recurrent` first, so torch's own GRU/LSTM decomposition never runs
      (FP flows, or any program that still holds a recurrent op).

`create_quantizer` / `create_partitioner` mirror `executorch.backends.arm.util._factory`.
"""

from __future__ import annotations

from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
from executorch.backends.arm.quantizer import EthosUQuantizer, TOSAQuantizer
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
from torch.export import ExportedProgram
from torch.fx import GraphModule

from .arm_passes import DecomposeRecurrentPass
from .decompose import decompose_recurrent


class _QuantizerHook:
    strategy = "unrolled"

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        DecomposeRecurrentPass(tfa_pass=True, strategy=self.strategy)(model)
        return super().transform_for_annotation(model)


class _PartitionerHook:
    strategy = "unrolled"

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram):
        ep = decompose_recurrent(exported_program, self.strategy)
        return super().transform_for_pre_decomposition(ep)


class RecurrentTOSAQuantizer(_QuantizerHook, TOSAQuantizer):
    """TOSAQuantizer that decomposes GRU/LSTM/RNN with recurrent_lowering first."""


class RecurrentEthosUQuantizer(_QuantizerHook, EthosUQuantizer):
    """EthosUQuantizer that decomposes GRU/LSTM/RNN with recurrent_lowering first."""


class RecurrentTOSAPartitioner(_PartitionerHook, TOSAPartitioner):
    """TOSAPartitioner that decomposes GRU/LSTM/RNN with recurrent_lowering before to_edge."""


class RecurrentEthosUPartitioner(_PartitionerHook, EthosUPartitioner):
    """EthosUPartitioner that decomposes GRU/LSTM/RNN with recurrent_lowering before to_edge."""


def create_quantizer(compile_spec):
    if isinstance(compile_spec, TosaCompileSpec):
        return RecurrentTOSAQuantizer(compile_spec)
    if isinstance(compile_spec, EthosUCompileSpec):
        return RecurrentEthosUQuantizer(compile_spec)
    raise ValueError(f"no recurrent-lowering quantizer for {type(compile_spec).__name__}")


def create_partitioner(compile_spec, additional_checks=None):
    if isinstance(compile_spec, TosaCompileSpec):
        return RecurrentTOSAPartitioner(compile_spec, additional_checks)
    if isinstance(compile_spec, EthosUCompileSpec):
        return RecurrentEthosUPartitioner(compile_spec, additional_checks)
    raise ValueError(f"no recurrent-lowering partitioner for {type(compile_spec).__name__}")
