"""The FVP variant of test_e2e: the lowered .pte runs on a Corstone FVP (300 for U55/U65, 320
for U85) with ExecuTorch's Arm executor runner, against onnxruntime on the .onnx. Tagged
manual in BUILD; it fails, naming what is missing, when no FVP or runner is configured
(runtime.fvp says how)."""

import numpy as np
import onnx
import onnxruntime as ort

from recurrent_lowering.runtime import fvp
from recurrent_lowering.tests.onnx_ethos_u import models
from recurrent_lowering.tests.onnx_ethos_u.e2e_case import case

MIN_SQNR_DB = 30


def sqnr_db(reference, actual) -> float:
    noise = np.sum((reference - actual) ** 2)
    return float(10 * np.log10(np.sum(reference**2) / noise)) if noise else float("inf")


def test_pte_on_fvp(tmp_path):
    c = case()
    fvp.find_fvp(c.target)  # raises FvpNotFoundError with the variables to set
    fvp.find_runner()
    model = onnx.load(str(c.model))
    x = models.sample_input(model)
    session = ort.InferenceSession(str(c.model), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"X": x})
    run = fvp.run_fvp(
        c.lowered(".pte"),
        [x],
        [(e.shape, np.float32) for e in expected],  # q/dq run on the CPU: the I/O is float
        c.target,
        workdir=tmp_path / "fvp",
    )
    for reference, actual in zip(expected, run.outputs):
        assert sqnr_db(reference, actual) > MIN_SQNR_DB
    assert run.log.pmu.npu_cycles and run.log.pmu.npu_cycles > 0
