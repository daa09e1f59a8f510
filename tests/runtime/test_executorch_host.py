"""Host .pte runner: a CPU-only program runs and matches eager; a delegated one is refused."""

import numpy as np
import pytest
import torch

from recurrent_lowering.runtime import executorch_host


class _Cell(torch.nn.Module):
    def forward(self, x, h):
        return torch.tanh(x + 0.5 * h), torch.sigmoid(h)


def _pte(module, inputs, partitioner=None):
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(
        torch.export.export(module, inputs), partitioner=partitioner or []
    )
    return edge.to_executorch().buffer


def test_cpu_program_matches_eager(tmp_path):
    x, h = torch.randn(1, 5), torch.randn(1, 5)
    pte = _pte(_Cell(), (x, h))
    expected = [t.numpy() for t in _Cell()(x, h)]
    outputs = executorch_host.run_pte(pte, [x.numpy(), h.numpy()])
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want, atol=1e-6)
    path = tmp_path / "cell.pte"
    path.write_bytes(pte)
    np.testing.assert_allclose(
        executorch_host.run_pte(path, [x.numpy(), h.numpy()])[1], expected[1]
    )


def test_delegated_program_is_refused():
    from executorch.backends.arm.tosa import TosaSpecification
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    x = torch.randn(1, 5)
    spec = TosaCompileSpec(TosaSpecification.create_from_string("TOSA-1.0+FP"))
    pte = _pte(torch.nn.Tanh(), (x,), [TOSAPartitioner(spec)])
    with pytest.raises(executorch_host.HostRuntimeError, match="cannot load method 'forward'"):
        executorch_host.run_pte(pte, [x.numpy()])
