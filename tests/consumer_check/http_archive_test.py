"""A workspace set up from the README alone: http_archive of a release archive (a file://
URL here) under the name the README gives it (`rl`), its one set-up step (`bazel fetch
//...`), then `bazel test //...` offline: the archive deleted, no repository cache, and
Bazel's HTTP(S) downloads sent to a proxy that refuses them.

The WORKSPACE and .bazelrc are the README's code blocks with the placeholders filled in. The
pinned environment is offered the way a machine that made it once offers it (workspaces.py),
so the set-up step runs no pip here. The workspace's own py_test runs on its own Python
toolchain and checks that it is not the pinned environment: recurrent_lowering's toolchain
takes over nothing unless registered, while npu_model still lowers in that environment.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import sys
import tempfile

from workspaces import Workspace, nested_env, offer_environment, source_root

SECTION = "## Using it from your own Bazel workspace"
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens

OWN_TOOLCHAIN = """
# The workspace's own Python (not part of the README): the system's python3.
register_toolchains("//:system_python")
"""

ROOT_BUILD = """load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "system_runtime",
    interpreter_path = "/usr/bin/python3",
    python_version = "PY3",
    stub_shebang = "#!/usr/bin/python3",
)

py_runtime_pair(name = "system_pair", py3_runtime = ":system_runtime")

toolchain(
    name = "system_python",
    toolchain = ":system_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

py_test(
    name = "own_python_test",
    size = "small",
    srcs = ["own_python_test.py"],
    python_version = "PY3",
)
"""

OWN_PYTHON_TEST = """import sys

# The system's interpreter, not a virtualenv (the pinned environment is one).
assert sys.prefix == sys.base_prefix, (sys.prefix, sys.base_prefix)
print("own python:", sys.executable)
"""

MODELS_BUILD = """load("@rl//tools:defs.bzl", "npu_model", "npu_model_test")

npu_model(name = "kws_onnx", model = "kws_gru.onnx", target = "onnx")

npu_model(name = "kws_aten", model = "kws_gru.pt2", target = "aten")

npu_model_test(name = "kws_onnx_exact", max_abs_err = "1e-5", model = ":kws_onnx")

npu_model_test(name = "kws_aten_exact", max_abs_err = "1e-5", model = ":kws_aten")
"""


def readme_blocks(readme: str) -> dict[str, str]:
    """The section's code blocks by their first line (`# WORKSPACE`, `# .bazelrc`, ...)."""
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S)
    return {block.split("\n", 1)[0]: block for block in blocks}


def main() -> int:
    repo = source_root()
    sys.path.insert(0, str(repo / "bazel"))
    import release_archive

    blocks = readme_blocks((repo / "README.md").read_text())
    with tempfile.TemporaryDirectory(prefix="http-archive-") as tmp:
        tmp = pathlib.Path(tmp)
        archive = tmp / "recurrent_lowering.tar.gz"
        sha256 = release_archive.write(repo, archive)
        workspace = (
            blocks["# WORKSPACE"]
            .replace("<sha256 of the archive>", sha256)
            .replace("<URL of recurrent_lowering.tar.gz>", archive.as_uri())
        )
        assert sha256 in workspace and archive.as_uri() in workspace, "README placeholders moved"
        root = tmp / "consumer"
        (root / "models").mkdir(parents=True)
        (root / "WORKSPACE").write_text(workspace + OWN_TOOLCHAIN)
        (root / ".bazelrc").write_text(blocks["# .bazelrc"])
        (root / "BUILD.bazel").write_text(ROOT_BUILD)
        (root / "own_python_test.py").write_text(OWN_PYTHON_TEST)
        (root / "models" / "BUILD.bazel").write_text(MODELS_BUILD)
        for name in ("kws_gru.onnx", "kws_gru.pt2"):
            shutil.copy(repo / "tests" / "consumer" / "models" / name, root / "models" / name)
        envs = tmp / "envs"
        offer_environment(repo, repo, envs)
        consumer = Workspace(root, tmp / "output_base", nested_env(envs))
        try:
            assert consumer.bazel("fetch", "//...") == 0, "the set-up step failed"
            # Offline from here: the archive is gone, no repository cache, and Bazel's
            # downloads go through a proxy that refuses every connection.
            archive.unlink()
            consumer.env.update(http_proxy=DEAD_PROXY, https_proxy=DEAD_PROXY)
            code = consumer.bazel("test", "--repository_cache=", "//...")
            assert code == 0, "building and testing after the set-up step failed"
            report_path = root / "bazel-bin" / "models" / "kws_aten.report.json"
            report = json.loads(report_path.read_text())
            assert report["ops"]["recurrent_layers"], report
        finally:
            consumer.shutdown()
    print("http_archive consumer: set up from the README, built and tested offline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
