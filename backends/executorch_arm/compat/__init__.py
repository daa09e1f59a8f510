"""Everything the Arm adapter extends or changes in ExecuTorch, torchao and tosa_serializer.

What the rest of the adapter uses of these libraries is their public API: subclasses of
ExecuTorch's quantizers and partitioners, its operator-support and node-visitor registries,
torchao's annotations and observers. What reaches further lives here, written against the
versions in VERSIONS (`check_versions` refuses others):

  provenance.py          drops torch.fx `from_node` records in ExecuTorch's Arm pass pipeline
  permute_propagation.py ExecuTorch's permute propagation, shapes refreshed in place
  clamp_table.py         an int8 clamp folded into the TABLE after it; identity clamps dropped
  conv_int16_readers.py  on U55/U65, an int16 convolution's accumulator read once (Vela)
      (these four are passes inserted into ExecuTorch's Arm pass pipeline, only while one
      of our lowerings runs: `lowering()`; pass_insertions.py)
  histogram_observer.py  torchao's HistogramObserver with its private range search replaced
  compile_specs.py       the debug-dump path dropped from a lowered module's compile specs
  factory.py             ExecuTorch's own quantizer and partitioner factory (the baseline)
  edge_ops.py            edge-dialect operators (ExecuTorch's private `exir.dialects._ops`)
  logs.py                ExecuTorch's Ethos-U backend logger held at WARNING while lowering
  lazy_recompile.py      torch.fx GraphModules built while lowering compile their code lazily
  dump_names.py          each delegate's dumped .tosa named by its own tag, not an input's

docs/arm.md ("What is extended in ExecuTorch") says what each changes and why.
"""

from __future__ import annotations

import contextlib
import importlib.metadata

VERSIONS = {"executorch": "1.5.1", "torchao": "0.18.0", "tosa-tools": "2026.5.0"}


class CompatError(RuntimeError):
    """An installed library is not the version this package was written against."""


def check_versions() -> None:
    for package, version in VERSIONS.items():
        found = importlib.metadata.version(package)
        if found != version:
            raise CompatError(
                f"{package} {found} is installed; recurrent_lowering's Arm adapter extends "
                f"{package} {version} (backends/executorch_arm/compat) and needs that version"
            )


@contextlib.contextmanager
def lowering():
    """The extensions one of our lowerings runs with, installed for the block and removed
    after it: ExecuTorch's own flow run later in the process sees none of them."""
    from ..loop import tosa as loop_tosa
    from . import (
        clamp_table,
        conv_int16_readers,
        dump_names,
        lazy_recompile,
        logs,
        pass_insertions,
        permute_propagation,
        provenance,
    )

    check_versions()
    loop_tosa.register()  # the loop node's support check and TOSA visitor (our op only)
    insertions = [
        *provenance.insertions(),
        *clamp_table.insertions(),
        *permute_propagation.insertions(),
        *conv_int16_readers.insertions(),
    ]
    with (
        pass_insertions.installed(insertions),
        logs.vela_quiet(),
        lazy_recompile.lazy(),
        dump_names.own_names(),
    ):
        yield
