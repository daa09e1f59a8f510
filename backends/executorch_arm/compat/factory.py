"""ExecuTorch's own Arm quantizer and partitioner for a compile spec (its recurrent passes:
the baseline we measure against), from its private `util._factory`."""

from __future__ import annotations


def executorch_quantizer(compile_spec):
    from executorch.backends.arm.util._factory import create_quantizer

    return create_quantizer(compile_spec)


def executorch_partitioner(compile_spec):
    from executorch.backends.arm.util._factory import create_partitioner

    return create_partitioner(compile_spec)
