"""One `//tools:lower` call with the time its loop-form layers' steps take, apart.

The CLI's report times stages (`time.stages`); a loop-form layer's step is calibrated and
lowered inside ExecuTorch's partition-and-lower stage, by the loop node's TOSA visitor, so
the report cannot say how much of that stage the steps are. This runs the CLI unchanged
with `loop.step.quantized_step` (the step's PT2E calibration over every timestep sample) and
`loop.step.lower` (the calibrated step through ExecuTorch's to_edge, calibration included)
timed, and prints, after the CLI's own output, one line of JSON: seconds and calls of each.

  ./bazelw run //benchmarks:loop_step_time -- MODEL.onnx --target=ethos-u55-128 \
      --quantization=int16 --calibration=C.npz --report=R.json
"""

from __future__ import annotations

import collections
import json
import sys
import time

from recurrent_lowering.backends.executorch_arm.loop import step
from recurrent_lowering.benchmarks import caller_directory
from recurrent_lowering.tools import lower


def main() -> None:
    seconds, calls = collections.Counter(), collections.Counter()

    def timed(name):
        original = getattr(step, name)

        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start
                calls[name] += 1

        setattr(step, name, run)

    for name in ("quantized_step", "lower"):
        timed(name)
    caller_directory.enter()
    try:
        lower.entry()
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    steps = {
        "calibrate (loop.step.quantized_step)": {
            "s": round(seconds["quantized_step"], 1),
            "calls": calls["quantized_step"],
        },
        "lower, calibration included (loop.step.lower)": {
            "s": round(seconds["lower"], 1),
            "calls": calls["lower"],
        },
    }
    print(json.dumps({"loop steps": steps}))
    sys.exit(code)


if __name__ == "__main__":
    main()
