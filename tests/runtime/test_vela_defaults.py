"""runtime.vela's per-target defaults are the ones ExecuTorch 1.5.1's EthosUCompileSpec uses
(importing ExecuTorch is slow, hence a separate, medium test)."""

import pytest

from recurrent_lowering.runtime import vela


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"])
def test_defaults_match_executorch_compile_spec(target):
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    spec = EthosUCompileSpec(target)
    assert f"--system-config={vela.default_config(target)[0]}" in spec.compiler_flags
    assert f"--memory-mode={vela.default_config(target)[1]}" in spec.compiler_flags
