"""tiny_gru lowered for Ethos-U55-128: a .pte with the Vela command stream, Vela's estimates
for the same TOSA, and the U55-subset TOSA still correct on the reference model."""

import pytest

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics, vela


def test_tiny_gru_u55(tmp_path):
    module, inputs = models.build("tiny_gru")
    result = flow.lower(module, inputs, "ethos-u55-128", artifact_dir=tmp_path)
    assert (result.system_config, result.memory_mode) == (
        "Ethos_U55_High_End_Embedded",
        "Shared_Sram",
    )
    assert result.num_delegates == 1
    assert b"vela_bin_stream" in result.pte  # the delegate payload is Vela's binary stream
    assert result.tosa_files[0].name == "output_tag0_TOSA-1.0+INT+int16+int4+u55.tosa"

    summary = result.vela.summary
    assert summary.accelerator == "Ethos_U55_128"
    assert summary.cycles > 0 and summary.inference_time_s > 0
    assert summary.off_chip_flash_used_bytes > 0  # weights live in flash in Shared_Sram mode
    assert 0 < summary.mac_utilisation < 1
    assert sum(op.cycles for op in result.vela.ops) == summary.cycles
    assert all(op.target == "NPU" for op in result.vela.ops)
    # The estimate is ExecuTorch's own Vela run's (one delegate): a separate Vela run on the
    # dumped TOSA gives the same figures, row for row.
    assert result.vela.output_dir == tmp_path / "output"
    rerun = vela.run_vela(result.tosa_files[0], "ethos-u55-128", output_dir=tmp_path / "rerun")
    assert rerun.summary.cycles == summary.cycles
    assert [(op.name, op.cycles) for op in rerun.ops] == [
        (op.name, op.cycles) for op in result.vela.ops
    ]

    assert arm_numerics.check(result, module, inputs).sqnr_db > 40


def test_an_artifact_dir_with_a_space_is_refused_before_lowering(tmp_path):
    """ExecuTorch joins Vela's arguments with spaces and splits them again, so Vela would
    exit on an unrecognised argument after the whole lowering."""
    module, inputs = models.build("tiny_gru")
    with pytest.raises(ValueError, match="has a space"):
        flow.lower(module, inputs, "ethos-u55-128", tmp_path / "a b", quantization="int8")
    assert not (tmp_path / "a b").exists()
