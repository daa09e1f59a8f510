"""The example consumer workspace (tests/consumer/), built and tested with a nested Bazel.

It checks what a team depending on this repository relies on: `bazel test //...` passes
with sandboxed actions; a second build re-runs no lowering action; changing one model
re-runs only that model's action; a threshold set beyond what a model reaches fails.
The workspace is copied to a temporary directory so the checked-in model stays untouched.
This script lives in a directory of its own: Python puts a script's directory first on
sys.path, and tests/ holds packages (tests/onnx) named like the libraries imported here.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import onnx


class Consumer:
    def __init__(self, repo: pathlib.Path, root: pathlib.Path):
        self.root = root / "consumer"
        shutil.copytree(
            repo / "tests" / "consumer",
            self.root,
            ignore=shutil.ignore_patterns("bazel-*"),
        )
        workspace = self.root / "WORKSPACE"
        workspace.write_text(workspace.read_text().replace('path = "../.."', f'path = "{repo}"'))
        self.output_base = root / "output_base"
        self.events = root / "events.json"
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("TEST_", "BUILD_", "RUNFILES"))
        }

    def bazel(self, *args: str) -> int:
        cmd = ["bazel", f"--output_base={self.output_base}", "--max_idle_secs=60", *args]
        print("$", " ".join(cmd), flush=True)
        return subprocess.run(cmd, cwd=self.root, env=self.env).returncode

    def lowering_actions(self, *targets: str) -> list[str]:
        """Builds `targets` and returns the labels whose NpuLower action ran."""
        code = self.bazel(
            "build",
            "--build_event_publish_all_actions",
            f"--build_event_json_file={self.events}",
            *targets,
        )
        assert code == 0, f"bazel build failed ({code})"
        ran = []
        for line in self.events.read_text().splitlines():
            event = json.loads(line)
            action = event.get("action")
            if action and action.get("type") == "NpuLower":
                ran.append(event["id"]["actionCompleted"]["label"])
        return ran


def main() -> int:
    runfile = pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "WORKSPACE")
    repo = runfile.resolve().parent
    with tempfile.TemporaryDirectory(prefix="consumer-") as tmp:
        consumer = Consumer(repo, pathlib.Path(tmp))
        try:
            assert consumer.bazel("test", "//...") == 0, (
                "bazel test //... failed in the consumer workspace"
            )
            models = ("//models:kws_gru_onnx", "//models:kws_gru_u55")
            ran = consumer.lowering_actions(*models)
            assert ran == [], f"a second build re-ran lowering: {ran}"

            path = consumer.root / "models" / "kws_gru.onnx"
            model = onnx.load(str(path))
            model.doc_string = "changed"
            onnx.save(model, str(path))
            ran = consumer.lowering_actions(*models)
            assert ran == ["//models:kws_gru_onnx"], f"expected only the ONNX model, ran {ran}"

            code = consumer.bazel("test", "//models:kws_gru_u55_too_strict")
            assert code == 3, f"a threshold beyond the model's SQNR must fail the test ({code})"
        finally:
            consumer.bazel("shutdown")
    print("consumer example: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
