"""One ONNX end-to-end case per Bazel target (see BUILD: e2e_<family>_<target>): the model
make_e2e_model.py writes for a recurrent family, lowered for one Ethos-U target by the
npu_model action `e2e_<family>_<target>_lowered`. The case comes from the environment the
target sets; its files are runfiles named after it."""

from __future__ import annotations

import dataclasses
import os
import pathlib

# family -> the ONNX operator; GRU keeps the node's default linear_before_reset=0, which
# torch's GRU is not, so it takes the rewrite route, LSTM and RNN become torch modules.
FAMILIES = {"gru": "GRU", "lstm": "LSTM", "rnn": "RNN"}
TARGETS = ("ethos-u55-128", "ethos-u65-256", "ethos-u85-256")
PACKAGE = pathlib.Path("tests/onnx_ethos_u")  # runfiles are relative to the workspace root


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    target: str

    @property
    def model(self) -> pathlib.Path:
        return PACKAGE / f"e2e_{self.family}.onnx"

    def lowered(self, suffix: str) -> pathlib.Path:
        """A file of the npu_model target, e.g. lowered(".pte")."""
        return PACKAGE / f"e2e_{self.family}_{self.target}_lowered{suffix}"


def case() -> Case:
    """The case of RL_E2E_FAMILY and RL_E2E_TARGET."""
    family, target = os.environ["RL_E2E_FAMILY"], os.environ["RL_E2E_TARGET"]
    if family not in FAMILIES or target not in TARGETS:
        raise ValueError(f"unknown e2e case {family!r} x {target!r}")
    return Case(family, target)
