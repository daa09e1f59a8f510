"""The debug-dump path of a lowered module's compile specs, dropped before the .pte is written."""

from __future__ import annotations


def drop_artifact_path(lowered_modules) -> None:
    """The dump directory is where this run wrote its debug files, not part of the program:
    left in the compile specs, the .pte would embed it (a fresh temporary name each run).
    ExecuTorch keeps the specs in `_compile_specs`, its key in `_DEBUG_ARTIFACT_KEY`."""
    from executorch.backends.arm.common.arm_compile_spec import ArmCompileSpec

    for module in lowered_modules:
        module._compile_specs = [
            spec for spec in module.compile_specs if spec.key != ArmCompileSpec._DEBUG_ARTIFACT_KEY
        ]
