"""tiny_gru through the Arm flow (our decomposition) to TOSA-1.0+FP: fully delegated, the .tosa on
the TOSA reference model matches fp32 torch eager."""

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics, metrics, tosa_flatbuffer


def test_tiny_gru_fp(tmp_path):
    module, inputs = models.build("tiny_gru")
    result = flow.lower(module, inputs, "TOSA-1.0+FP", artifact_dir=tmp_path)
    assert not result.quantized
    assert result.num_delegates == 1 and result.cpu_nodes == 0
    assert result.pte[4:8] == b"ET12"  # ExecuTorch program flatbuffer identifier
    assert [f.name for f in result.tosa_files] == ["output_tag0_TOSA-1.0+FP.tosa"]
    assert result.tosa_ops == tosa_flatbuffer.count_ops(result.tosa_files[0])
    # our decomposition (the default): one sigmoid for r and z per step, one for the head
    assert result.tosa_op_counts["SIGMOID"] == 4 + 1
    assert result.edge_nodes > 0 and result.times["lower"] > 0
    assert result.input_quant == [None] and result.output_quant == [None]

    numerics = arm_numerics.check(result, module, inputs)
    assert numerics.max_abs_err <= 1e-5
    assert numerics.sqnr_db > 100

    # a different input: the graph is not specialised to the example
    other = (inputs[0] * -0.5,)
    assert arm_numerics.check(result, module, other).max_abs_err <= 1e-5


def test_sqnr():
    ref = np.array([1.0, -1.0, 2.0])
    assert metrics.sqnr_db(ref, ref) == float("inf")
    assert metrics.sqnr_db(ref, ref * 1.1) == pytest.approx(20.0)  # noise = 1% of the signal


def test_exported_module_from_a_pt2(tmp_path):
    """A module loaded from a .pt2 (it refuses .eval()) goes through the flow too."""
    import torch

    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Sigmoid())
    x = torch.randn(1, 3)
    torch.export.save(torch.export.export(module, (x,)), tmp_path / "m.pt2")
    loaded = torch.export.load(tmp_path / "m.pt2").module(check_guards=False)
    result = flow.lower(loaded, (x,), "TOSA-1.0+FP", artifact_dir=tmp_path / "art")
    assert arm_numerics.check(result, loaded, (x,)).max_abs_err <= 1e-6


class _StatefulLstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 8, batch_first=True)

    def forward(self, x, h, c):
        y, (h_n, c_n) = self.lstm(x, (h, c))
        return y, h_n, c_n


def test_one_tensor_given_for_two_inputs(tmp_path):
    """h0 = c0 = zeros as the example inputs: the program still takes h and c apart
    (torch.export alone would make them one input, and a later h != c would read c for h)."""
    torch.manual_seed(0)
    module = _StatefulLstm().eval()
    zeros = torch.zeros(1, 1, 8)
    result = flow.lower(module, (torch.randn(1, 5, 4), zeros, zeros), "TOSA-1.0+FP", tmp_path)
    assert result.input_map == [0, 1, 2]
    x, h, c = torch.randn(1, 5, 4), torch.randn(1, 1, 8), torch.randn(1, 1, 8)
    numerics = arm_numerics.check(result, module, (x, h, c))
    assert numerics.max_abs_err <= 1e-5


class _DictOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(4, 8, batch_first=True)

    def forward(self, x):
        y, h = self.gru(x)
        return {"y": y, "h_n": h}


def test_dict_output(tmp_path):
    """A module returning a dict: checked output by output in the program's order."""
    torch.manual_seed(0)
    module = _DictOutput().eval()
    result = flow.lower(module, (torch.randn(1, 6, 4),), "TOSA-1.0+FP", tmp_path)
    x = torch.randn(1, 6, 4)
    numerics = arm_numerics.check(result, module, (x,))
    assert [r.shape for r in numerics.reference] == [(1, 6, 8), (1, 1, 8)]
    assert numerics.max_abs_err <= 1e-5
