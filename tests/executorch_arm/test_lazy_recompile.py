"""compat.lazy_recompile: while we lower, GraphModules compile their code only when it is
needed; far fewer compilations, the same program."""

from __future__ import annotations

import contextlib

import torch
from executorch.exir.pass_base import ExportPass
from torch.fx import GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.compat import lazy_recompile
from recurrent_lowering.examples import models


def _exported_add():
    class Add(torch.nn.Module):
        def forward(self, x):
            return x + 1.0

    return torch.export.export(Add(), (torch.ones(2),)).graph_module


def test_executorchs_export_pass_builds_a_lazy_module_that_runs_the_same_code():
    graph_module = _exported_add()
    with lazy_recompile.lazy():
        result = ExportPass()(graph_module).graph_module
        # the behaviour relied on: ExecuTorch's passes construct torch.fx.GraphModule
        assert isinstance(result, _LazyGraphModule)
        assert type(result)._needs_recompile()
    assert type(GraphModule(graph_module, graph_module.graph)) is not _LazyGraphModule
    assert result.code == graph_module.code
    x = torch.arange(2.0)
    assert torch.equal(result(x)[0], x + 1.0)


def _lower(monkeypatch, tmp_path, lazy: bool):
    compiled = []
    recompile = GraphModule.recompile

    def counted(self):
        compiled.append(1)
        return recompile(self)

    monkeypatch.setattr(GraphModule, "recompile", counted)
    monkeypatch.setattr(
        lazy_recompile, "lazy", lazy_recompile.lazy if lazy else contextlib.nullcontext
    )
    module, inputs = models.build("tiny_gru")
    result = flow.lower(module, inputs, "TOSA-1.0+INT", artifact_dir=tmp_path)
    monkeypatch.undo()
    return result, len(compiled)


def test_lazy_modules_compile_far_less_and_lower_the_same_program(monkeypatch, tmp_path):
    eager, eager_compiles = _lower(monkeypatch, tmp_path / "eager", lazy=False)
    lazy, lazy_compiles = _lower(monkeypatch, tmp_path / "lazy", lazy=True)
    assert lazy_compiles < eager_compiles / 2, (lazy_compiles, eager_compiles)
    assert lazy.tosa_op_counts == eager.tosa_op_counts
    assert lazy.tosa_files[0].read_bytes() == eager.tosa_files[0].read_bytes()
