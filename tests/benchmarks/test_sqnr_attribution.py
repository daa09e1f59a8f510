"""tools/sqnr_attribution on tiny_gru: bypassing no quantize reproduces the converted model,
bypassing all of them gives fp32 eager, and every activation quantize falls in a role (a
rounding one or a re-quantize after it)."""

import numpy as np
import pytest
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.benchmarks import sqnr_attribution as sa
from recurrent_lowering.examples import models
from recurrent_lowering.runtime.metrics import sqnr_db


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(module, inputs, converted GraphModule) for tiny_gru with our decomposition."""
    module, inputs = models.build("tiny_gru")
    spec = flow.compile_spec("TOSA-1.0+INT", tmp_path_factory.mktemp("tosa"), None, None)
    qf = sa.quantizer_for("ours", "TOSA-1.0+INT")
    return module, inputs, sa.quantize(module, inputs, spec, qf)


def _quantizes(gm):
    return {n.name for n in gm.graph.nodes if sa._is(n, sa._Q) or sa._is(n, sa._Q_CH)}


def test_bypass_all_or_nothing(converted):
    module, inputs, gm = converted
    with torch.no_grad():
        eager, converted = module(*inputs).numpy(), gm(*inputs).numpy()
        kept = sa.bypass(gm, _quantizes(gm))(*inputs).numpy()
        none = sa.bypass(gm, set())(*inputs).numpy()
    np.testing.assert_array_equal(kept, converted)
    np.testing.assert_allclose(none, eager, atol=1e-6)
    assert np.max(np.abs(converted - eager)) > 1e-4  # the quantization does change the output


def test_every_activation_quantize_is_in_a_role(converted):
    _, _, gm = converted
    chains = sa.lossy_quantizes(gm)
    covered = [n.name for chain in chains.values() for n in chain]
    activations = {n.name for n in gm.graph.nodes if sa._is(n, sa._Q)}
    assert set(covered) == activations
    roles = {sa.role(q) for q in chains}
    assert "x>linear" in roles  # the program input feeds the hoisted projection
    assert any(r.endswith(">output") for r in roles)


def test_attribution_floor_is_not_below_all(converted):
    module, inputs, gm = converted
    with torch.no_grad():
        reference = module(*inputs).numpy()
    r = sa.pooled([sa.attribute(gm, inputs, reference)])
    # fewer rounding quantizes, no more noise; on tiny_gru the output's own rounding (T = 4
    # values on a 0.002 grid) absorbs the internal noise, so the floor may equal the total
    assert r["floor_io_and_weights"] >= r["all"]
    assert r["weights_only"] > r["all"] + 10
    assert abs(r["all"] - sqnr_db(reference, gm(*inputs).detach().numpy())) < 1e-6
