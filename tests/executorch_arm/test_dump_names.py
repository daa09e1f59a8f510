"""compat.dump_names: a delegate fed directly by another's output gets a dumped .tosa of its
own. A transformer encoder before a GRU, int16 on ethos-u55-128: the attention's int16
bmms run on the CPU, which cuts three delegates, one fed by another directly. ExecuTorch's
naming gave two of them one file: two files for three delegates, the numerics check ran
the wrong .tosa ("TOSA graph takes 2 inputs, got 1") and Vela's figures missed one."""

from __future__ import annotations

import torch
from executorch.backends.arm.tosa.backend import arm_get_first_delegation_tag

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.runtime import arm_numerics, delegate_run


class EncoderGru(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.gru = torch.nn.GRU(16, 16, batch_first=True)

    def forward(self, x):
        return self.gru(self.encoder(x))[0]


def test_each_delegate_has_its_own_tosa_and_the_program_checks_against_torch():
    model = EncoderGru().eval()
    generator = torch.Generator().manual_seed(1)
    samples = [(torch.randn(1, 10, 16, generator=generator),) for _ in range(5)]
    result = flow.lower(
        model,
        samples[0],
        "ethos-u55-128",
        quantization="int16",
        calibration_inputs=samples[:4],
        run_vela=False,
        verify=False,
    )
    lowered = [
        m for n, m in result.program_module.named_children() if n.startswith("lowered_module")
    ]
    assert len(lowered) == 3
    files = [delegate_run.tosa_file_for(m, result.tosa_files) for m in lowered]
    assert len(set(files)) == len(result.tosa_files) == 3
    # What dump_names relies on: ExecuTorch's own naming reads a placeholder's foreign tag.
    graphs = [m.original_module.graph_module for m in lowered]
    assert any(arm_get_first_delegation_tag(g) != delegate_run.delegation_tag(g) for g in graphs)
    checked = arm_numerics.check(result, model, samples[4])  # held out; TOSA vs torch eager
    assert checked.sqnr_db > 30  # 40.6 dB measured through the CLI
