"""Runs `bazel test //...` in tests/consumer, a workspace that depends on this one."""

import os
import pathlib
import subprocess
import sys


def main() -> int:
    workspace = pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "WORKSPACE")
    consumer = workspace.resolve().parent / "tests" / "consumer"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEST_", "BUILD_", "RUNFILES"))}
    cmd = [
        "bazel",
        "--output_user_root=/tmp/recurrent_lowering_consumer_bazel",
        "--max_idle_secs=120",
        "test",
        "//...",
    ]
    result = subprocess.run(cmd, cwd=consumer, env=env)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
