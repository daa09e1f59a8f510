"""Regenerate the small .tosa samples used by tests/runtime/test_tosa_reference.py.

    ./bazelw run //tests/runtime:make_tosa_samples

Both come from `sample_module()` (seeded Linear(4, 3) + tanh) lowered by ExecuTorch 1.5.1's Arm
flow; the INT one also records its I/O quantization parameters in a JSON file.
"""

import json
import os
import pathlib
import shutil
import tempfile

import torch

from recurrent_lowering.backends.executorch_arm import flow

# The source tree's testdata, also under `bazel run` (which starts in the runfiles tree).
HERE = (
    pathlib.Path(os.environ["BUILD_WORKSPACE_DIRECTORY"], "tests/runtime/testdata")
    if "BUILD_WORKSPACE_DIRECTORY" in os.environ
    else pathlib.Path(__file__).parent
)


def sample_module() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    return module, (torch.randn(2, 4),)


def main() -> None:
    module, inputs = sample_module()
    for target, name in (("TOSA-1.0+FP", "linear_tanh_fp"), ("TOSA-1.0+INT", "linear_tanh_int")):
        with tempfile.TemporaryDirectory() as d:
            result = flow.lower(module, inputs, target, artifact_dir=d)
            shutil.copy(result.tosa_files[0], HERE / f"{name}.tosa")
            if result.quantized:
                quant = {
                    "input": [vars(q) for q in result.input_quant],
                    "output": [vars(q) for q in result.output_quant],
                }
                (HERE / f"{name}.quant.json").write_text(json.dumps(quant, indent=1) + "\n")


if __name__ == "__main__":
    main()
