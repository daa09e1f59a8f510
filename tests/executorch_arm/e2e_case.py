"""One end-to-end case per Bazel target (see BUILD: e2e_<family>_<target>): a small model of
one recurrent family lowered for one Ethos-U target, export -> quantize -> lower -> Vela ->
numerics. The case comes from the environment the target sets."""

from __future__ import annotations

import os

FAMILIES = {"gru": "tiny_gru", "lstm": "tiny_lstm", "rnn": "tiny_rnn"}
TARGETS = ("ethos-u55-128", "ethos-u65-256", "ethos-u85-256")


def case() -> tuple[str, str]:
    """(model name, target) from RL_E2E_FAMILY and RL_E2E_TARGET."""
    family, target = os.environ["RL_E2E_FAMILY"], os.environ["RL_E2E_TARGET"]
    if family not in FAMILIES or target not in TARGETS:
        raise ValueError(f"unknown e2e case {family!r} x {target!r}")
    return FAMILIES[family], target
