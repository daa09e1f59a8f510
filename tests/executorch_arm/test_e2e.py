"""End to end for one recurrent family on one Ethos-U target (the Bazel target picks which):
export, quantize (int8), lower with our decomposition, Vela, and the exact TOSA given to Vela
on the TOSA reference model against fp32 torch eager."""

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics
from recurrent_lowering.tests.executorch_arm.e2e_case import case

# SQNR floor: the measured figures are 47-58 dB (docs/results/arm_benchmark.md, tiny models).
MIN_SQNR_DB = 40


def test_export_quantize_lower_vela_numerics(tmp_path):
    name, target = case()
    module, inputs = models.build(name)
    result = flow.lower(module, inputs, target, artifact_dir=tmp_path)
    assert result.quantized
    assert result.num_delegates == 1 and result.vela_delegates == 1
    assert b"vela_bin_stream" in result.pte
    # everything but the program's input quantize and output dequantize is on the NPU
    assert result.cpu_nodes == 2
    summary = result.vela.summary
    assert summary.accelerator.lower().replace("_", "-") == target
    assert summary.cycles > 0
    assert all(op.target == "NPU" for op in result.vela.ops)
    assert result.executorch_vela.cycles == summary.cycles  # the network in the .pte
    numerics = arm_numerics.check(result, module, inputs)
    print(f"{name} on {target}: {summary.cycles} cycles, SQNR {numerics.sqnr_db:.1f} dB")
    assert numerics.sqnr_db > MIN_SQNR_DB
