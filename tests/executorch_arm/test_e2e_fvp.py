"""The FVP variant of test_e2e: the .pte runs on a Corstone FVP (300 for U55/U65, 320 for
U85) with ExecuTorch's Arm executor runner. Tagged manual in BUILD; it fails, naming what is
missing, when no FVP or runner is configured (runtime.fvp says how)."""

import numpy as np

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import fvp
from recurrent_lowering.tests.executorch_arm.e2e_case import case


def test_pte_on_fvp(tmp_path):
    name, target = case()
    fvp.find_fvp(target)  # raises FvpNotFoundError with the variables to set
    fvp.find_runner()
    module, inputs = models.build(name)
    result = flow.lower(module, inputs, target, artifact_dir=tmp_path / "lower")
    expected = module(*inputs).detach().numpy()
    run = fvp.run_fvp(
        result.pte,
        [inputs[0].numpy()],
        [(expected.shape, np.float32)],  # q/dq run on the CPU: the program's I/O is float
        target,
        workdir=tmp_path / "fvp",
    )
    assert flow.sqnr_db(expected, run.outputs[0]) > 40
    assert run.log.pmu.npu_cycles and run.log.pmu.npu_cycles > 0
