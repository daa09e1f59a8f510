"""End to end for one recurrent family on one Ethos-U target, from ONNX (the Bazel target
picks which): the npu_model action read the .onnx, converted its recurrent node (rewritten, or
as a torch module), quantized to int8, lowered with our decomposition and ran Vela; this test
reads what it wrote. The numerics in the report are the TOSA given to Vela, run on the TOSA
reference model, against onnxruntime on the .onnx."""

import json

from recurrent_lowering.runtime import tosa_flatbuffer, vela
from recurrent_lowering.tests.onnx_ethos_u.e2e_case import case

# SQNR floor: the nine cases measured 36.3-39.5 dB (random calibration inputs).
MIN_SQNR_DB = 30


def test_onnx_model_lowered_for_ethos_u():
    c = case()
    report = json.loads(c.lowered(".report.json").read_text())
    assert report["target"] == c.target
    assert b"vela_bin_stream" in c.lowered(".pte").read_bytes()
    # every recurrent node reached the NPU; only the program's input quantize and output
    # dequantizes stay on the CPU
    assert report["ops"]["delegated"] > 0
    assert set(report["ops"]["cpu_reasons"]) == {"q/dq at delegate boundary"}, report["ops"]
    assert report["vela"]["delegates"] == 1
    summary = vela.parse_summary_csv(c.lowered(".vela_summary.csv"))
    assert summary.accelerator.lower().replace("_", "-") == c.target
    assert summary.cycles == report["vela"]["cycles"] > 0
    assert tosa_flatbuffer.count_ops(c.lowered(".tosa"), include_constants=False) > 0
    numerics = report["numerics"]
    assert numerics["reference"] == "TOSA reference model vs onnxruntime on the input model (fp32)"
    assert numerics["conversion_max_abs_err"] <= 1e-5  # the converted torch module, fp32
    print(f"{c.family} on {c.target}: {summary.cycles} cycles, SQNR {numerics['sqnr_db']:.1f} dB")
    assert MIN_SQNR_DB < numerics["sqnr_db"] < 80  # the upper bound: really int8
