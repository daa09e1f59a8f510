"""tiny_gru through ExecuTorch's Arm flow to TOSA-1.0+INT: int8 I/O with q/dq on the CPU, and
the dumped .tosa on the TOSA reference model close to fp32 eager."""

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics

# Measured: 57.8 dB for tiny_gru on its calibration input (ExecuTorch, gru_a: 44.6 dB,
# docs/results/executorch_baseline.md).
MIN_SQNR_DB = 40.0


def test_tiny_gru_int(tmp_path):
    module, inputs = models.build("tiny_gru")
    result = flow.lower(module, inputs, "TOSA-1.0+INT", artifact_dir=tmp_path)
    assert result.quantized and result.num_delegates == 1
    assert result.cpu_nodes == 2  # quantize the input, dequantize the output
    assert "quantize" in result.times and result.times["lower"] > 0
    (in_q,), (out_q,) = result.input_quant, result.output_quant
    assert in_q.dtype == "int8" and out_q.dtype == "int8"
    assert 0 < in_q.scale < 1 and 0 < out_q.scale < 1
    # INT8 graphs rescale around every elementwise op: many more ops than compute
    assert result.tosa_op_counts["RESCALE"] > 20
    assert result.tosa_ops > result.tosa_compute_ops > 0

    numerics = arm_numerics.check(result, module, inputs)
    assert numerics.sqnr_db > MIN_SQNR_DB
    assert numerics.max_abs_err < 10 * out_q.scale
