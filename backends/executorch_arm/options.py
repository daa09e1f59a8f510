"""What a caller asks of the Arm adapter, and `check`, the one place it is validated.

The command line, the Bazel rule (which runs the command line) and `flow.lower` all describe
a lowering as `Options`; `check` refuses any combination the adapter cannot lower, with a
message naming the options, before anything runs. `precision.candidates` then turns valid
options into the ordered plans to try (plan.py).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from recurrent_lowering.passes.plan import EMISSIONS

from .targets import ETHOS_U_TARGETS, TOSA_TARGETS

QUANTIZATIONS = ("auto", "int8", "int16", "int16_w16", "int16_state")
DECOMPOSITIONS = ("ours", "executorch")  # who decomposes recurrent ops: we or ExecuTorch
WEIGHT_BITS = (4, 5, 6, 7, 8)
DEFAULT_CYCLE_BUDGET = 0.03  # auto: candidates within 3% of each other's cycles are equals
DEFAULT_MIN_SQNR = 30.0  # auto: the accuracy (dB, every output) a candidate must reach


class OptionError(ValueError):
    """A combination of options the target cannot lower; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Options:
    """`target`: "TOSA-1.0+FP", "TOSA-1.0+INT" (extensions such as "+int16" are added as
    the options need them) or an Ethos-U accelerator ("ethos-u55-128").

    `quantization` (INT targets): "auto" chooses int16 activations per region where the
    target gives them within `cycle_budget` (a fraction) of int8's cycles, and beyond it
    where that buys the `min_sqnr` dB on every output that the cheaper candidates miss
    (docs/precision.md); "int8" or "int16" activations; "int16_w16" int16 activations with
    every weight as two int8 parts (about 16-bit weights at twice their MACs);
    "int16_state" keeps the loop form's steps (state and gate arithmetic) in int16, the
    rest int8. `emission`: how
    recurrent layers are written ("auto", "unrolled", "loop"; passes.plan). Weights every
    timestep reads take `recurrent_weight_bits` (4: TOSA INT4). `keep_recurrent_on_cpu`
    leaves recurrent layers on the CPU in float. `system_config` and `memory_mode` are
    Vela's (default: ExecuTorch's for the target). `decomposition="executorch"` lowers
    with ExecuTorch's own recurrent passes (the baseline we measure against).
    `share_state`: a streaming model's final states share their initial states'
    quantization (off only to measure what sharing buys)."""

    target: str
    quantization: str = "auto"
    cycle_budget: Optional[float] = None  # None: DEFAULT_CYCLE_BUDGET
    min_sqnr: Optional[float] = None  # None: DEFAULT_MIN_SQNR
    emission: str = "auto"
    recurrent_weight_bits: int = 8
    keep_recurrent_on_cpu: bool = False
    system_config: Optional[str] = None
    memory_mode: Optional[str] = None
    decomposition: str = "ours"
    share_state: bool = True

    @property
    def is_ethos_u(self) -> bool:
        return self.target.startswith("ethos-u")

    @property
    def quantized(self) -> bool:
        return self.is_ethos_u or "+INT" in self.target

    @property
    def budget(self) -> float:
        return DEFAULT_CYCLE_BUDGET if self.cycle_budget is None else self.cycle_budget

    @property
    def target_sqnr(self) -> float:
        return DEFAULT_MIN_SQNR if self.min_sqnr is None else self.min_sqnr


def _known_target(target: str) -> bool:
    base = "+".join(target.split("+")[:2])  # TOSA-1.0+INT+int16 -> TOSA-1.0+INT
    return target in ETHOS_U_TARGETS or base in TOSA_TARGETS


def check(o: Options) -> Options:
    """`o` if the adapter can lower it, else OptionError naming what cannot be combined."""
    if not _known_target(o.target):
        known = ", ".join((*TOSA_TARGETS, *ETHOS_U_TARGETS))
        raise OptionError(f"unknown target {o.target!r}; choose one of: {known}")
    for name, value, allowed in (
        ("quantization", o.quantization, QUANTIZATIONS),
        ("emission", o.emission, EMISSIONS),
        ("recurrent_weight_bits", o.recurrent_weight_bits, WEIGHT_BITS),
        ("decomposition", o.decomposition, DECOMPOSITIONS),
    ):
        if value not in allowed:
            raise OptionError(f"{name} must be one of {', '.join(map(str, allowed))}: {value!r}")
    if not o.quantized:
        for name, value, default in (
            ("quantization", o.quantization, "auto"),
            ("recurrent_weight_bits", o.recurrent_weight_bits, 8),
        ):
            if value != default:
                raise OptionError(f"{name} {value} applies to INT targets, not {o.target}")
    if o.cycle_budget is not None and o.quantization != "auto":
        raise OptionError("cycle_budget applies to quantization auto")
    if o.min_sqnr is not None and o.quantization != "auto":
        raise OptionError("min_sqnr applies to quantization auto")
    if o.cycle_budget is not None and o.cycle_budget < 0:
        raise OptionError(f"cycle_budget must not be negative, got {o.cycle_budget}")
    _check_vela(o)
    bits, state16 = o.recurrent_weight_bits, o.quantization == "int16_state"
    if o.decomposition == "executorch":
        ours = state16 or o.quantization == "int16_w16"
        if bits != 8 or ours or o.keep_recurrent_on_cpu or o.emission != "auto":
            raise OptionError(
                "ExecuTorch's own recurrent decomposition takes none of recurrent_weight_bits, "
                "int16_state, int16_w16, keep_recurrent_on_cpu or an emission: those are ours"
            )
    if bits != 8 and o.quantization == "int16_w16":
        raise OptionError(
            "int16_w16 writes each weight as two int8 parts; recurrent_weight_bits narrows "
            "them to fewer than 8 bits: choose one"
        )
    if bits == 4 and o.quantization in ("int16", "int16_state"):
        raise OptionError(  # ExecuTorch 1.5.1's CONV2D takes INT4 weights with int8 only
            "4-bit recurrent weights (TOSA INT4) need int8 activations; use 5-7 bits with "
            "int16 activations or int16 state"
        )
    if o.keep_recurrent_on_cpu:
        if o.emission == "loop":
            raise OptionError("recurrent layers kept on the CPU need the unrolled form")
        if bits != 8:
            raise OptionError(
                "recurrent_weight_bits narrows the weights of recurrent layers on the NPU; "
                "keep_recurrent_on_cpu keeps them in float on the CPU"
            )
        if state16:
            raise OptionError("int16 state lives in the loop form's steps, on the NPU")
    if state16 and o.emission == "unrolled":
        raise OptionError("int16 state keeps the loop form's steps in int16; it cannot be unrolled")
    return o


def _check_vela(o: Options) -> None:
    """system_config / memory_mode: Vela's names, for the target's family."""
    chosen = {"system_config": o.system_config, "memory_mode": o.memory_mode}
    if not any(chosen.values()):
        return
    if not o.is_ethos_u:
        raise OptionError(f"system_config and memory_mode are Vela's: not for {o.target}")
    from recurrent_lowering.runtime import vela

    for (key, value), known in zip(chosen.items(), vela.config_names()):
        if value is not None and value not in known:
            raise OptionError(f"{key} {value}: Vela knows {', '.join(known)}")
    family = o.target.split("-")[1].upper()  # "ethos-u55-128" -> "U55"
    if o.system_config is not None and f"_{family}_" not in o.system_config:
        raise OptionError(f"system_config {o.system_config} is not a system config for {o.target}")
