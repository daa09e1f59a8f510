"""The repository imports as the `recurrent_lowering` package inside Bazel."""

import importlib


def test_core_imports_under_repository_name():
    spec = importlib.import_module("recurrent_lowering.passes.spec")
    assert spec.CellKind.GRU.num_gates == 3
