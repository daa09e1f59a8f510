"""tiny_gru, decomposed by us before quantization, through ExecuTorch's Arm flow to
TOSA-1.0+INT: one delegate with only the input quantize and output dequantize on the CPU,
and int8 numerics on the TOSA reference model close to fp32 eager."""

import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.emission.decompose import decompose_recurrent
from recurrent_lowering.backends.executorch_arm.exported import as_module
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics


def test_tiny_gru_int_decomposed_before_quantization(tmp_path):
    module, inputs = models.build("tiny_gru")
    ours_module = as_module(decompose_recurrent(torch.export.export(module, inputs)))
    result = flow.lower(ours_module, inputs, "TOSA-1.0+INT", artifact_dir=tmp_path)
    assert result.quantized
    assert result.num_delegates == 1
    assert result.cpu_nodes <= 2  # quantize the input, dequantize the output
    assert result.input_quant[0] is not None and result.output_quant[0] is not None
    numerics = arm_numerics.check(result, module, inputs)
    print(f"tiny_gru INT: {result.edge_nodes} edge nodes, SQNR {numerics.sqnr_db:.1f} dB")
    assert numerics.sqnr_db > 40
