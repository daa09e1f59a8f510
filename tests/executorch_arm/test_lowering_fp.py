"""tiny_gru, decomposed by us before lowering, through ExecuTorch's Arm flow to TOSA-1.0+FP,
against ExecuTorch's own decomposition of the same model: fully delegated, exact on the TOSA
reference model, and a smaller edge graph."""

import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.emission.decompose import decompose_recurrent
from recurrent_lowering.backends.executorch_arm.exported import as_module
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics


def test_tiny_gru_fp_ours_vs_executorch(tmp_path):
    module, inputs = models.build("tiny_gru")
    ours_module = as_module(decompose_recurrent(torch.export.export(module, inputs)))
    ours = flow.lower(ours_module, inputs, "TOSA-1.0+FP", artifact_dir=tmp_path / "ours")
    assert ours.num_delegates == 1 and ours.cpu_nodes == 0  # the whole graph is delegated
    numerics = arm_numerics.check(ours, module, inputs)
    assert numerics.max_abs_err <= 1e-5
    assert arm_numerics.check(ours, module, (inputs[0] * -0.5,)).max_abs_err <= 1e-5

    theirs = flow.lower(
        module,
        inputs,
        "TOSA-1.0+FP",
        artifact_dir=tmp_path / "executorch",
        decomposition="executorch",
    )
    assert theirs.num_delegates == 1 and theirs.cpu_nodes == 0
    print(
        f"tiny_gru FP edge nodes: ours {ours.edge_nodes}, ExecuTorch {theirs.edge_nodes}; "
        f"TOSA compute ops: ours {ours.tosa_compute_ops}, ExecuTorch {theirs.tosa_compute_ops}"
    )
    assert ours.edge_nodes < theirs.edge_nodes
    assert ours.tosa_compute_ops <= theirs.tosa_compute_ops
