"""The tree shows the architecture: the CLI alone in tools/, benchmarks and research scripts
in benchmarks/ (each a Bazel target), the bundled models in examples/."""

import ast
import importlib
import re

import pytest

from recurrent_lowering.tests.smoke import source_tree

CLI = {
    "tools/BUILD.bazel",
    "tools/__init__.py",
    "tools/check_report.py",
    "tools/defs.bzl",
    "tools/lower.py",
    "tools/npu_action.py",
}


def test_core_imports_under_repository_name():
    spec = importlib.import_module("recurrent_lowering.passes.spec")
    assert spec.CellKind.GRU.num_gates == 3


def test_tools_holds_the_cli_only():
    files = set(source_tree.tracked("tools/"))
    assert {f for f in files if not f.startswith("tools/lowering/")} == CLI
    assert all(f.endswith(".py") for f in files if f.startswith("tools/lowering/"))


def _runnable(path: str) -> bool:
    tree = ast.parse((source_tree.root() / path).read_text())
    return any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
    )


def _binaries(build: str) -> set[str]:
    """The srcs of every py_binary in a BUILD file, and the scripts it exports to the rules
    that run them as actions (tools/npu_action.py)."""
    text = (source_tree.root() / build).read_text()
    blocks = re.findall(r"py_binary\((.*?)\n\)", text, re.S)
    exported = re.findall(r"exports_files\(\[(.*?)\]\)", text, re.S)
    return {src for block in blocks for src in re.findall(r'srcs = \["([^"]+)"\]', block)} | {
        src for block in exported for src in re.findall(r'"([^"]+\.py)"', block)
    }


@pytest.mark.parametrize("package", ["benchmarks", "tools", "examples"])
def test_every_runnable_script_is_a_bazel_target(package):
    scripts = {
        path.removeprefix(package + "/")
        for path in source_tree.tracked(f"{package}/*.py")
        if _runnable(path)
    }
    assert scripts == _binaries(f"{package}/BUILD.bazel")


def test_examples_are_the_clis_bundled_models():
    models = importlib.import_module("recurrent_lowering.examples.models")
    assert {"tiny_gru", "gru_a", "big_gru", "stream_gru"} <= set(models.MODELS)


def test_every_test_file_is_a_bazel_test():
    """A test file no py_pytest names is never run by the test command."""
    missing = []
    for path in source_tree.tracked("tests/**/test_*.py"):
        package, name = path.rsplit("/", 1)
        build = source_tree.root() / package / "BUILD.bazel"
        text = build.read_text() if build.exists() else ""
        if f'"{name}"' not in text:  # a py_pytest's srcs, or a comprehension making them
            missing.append(path)
    assert not missing
