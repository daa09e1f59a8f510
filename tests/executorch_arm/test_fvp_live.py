"""tiny_gru on a real Corstone-300 FVP (Ethos-U55-128): outputs close to fp32 eager and the NPU
PMU cycle count reported. Tagged manual in BUILD; skipped when no FVP/runner is configured."""

import numpy as np
import pytest

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import fvp
from recurrent_lowering.runtime.metrics import sqnr_db


def test_tiny_gru_on_corstone300(tmp_path):
    try:
        fvp.find_fvp("ethos-u55-128")
        fvp.find_runner()
    except fvp.FvpNotFoundError as e:
        pytest.skip(str(e))
    module, inputs = models.build("tiny_gru")
    result = flow.lower(module, inputs, "ethos-u55-128", artifact_dir=tmp_path / "lower")
    expected = module(*inputs).detach().numpy()
    run = fvp.run_fvp(
        result.pte,
        [inputs[0].numpy()],
        [(expected.shape, np.float32)],  # q/dq run on the CPU: the program's I/O is float
        "ethos-u55-128",
        workdir=tmp_path / "fvp",
    )
    assert sqnr_db(expected, run.outputs[0]) > 40
    assert run.log.pmu.npu_cycles and run.log.pmu.npu_cycles > 0
