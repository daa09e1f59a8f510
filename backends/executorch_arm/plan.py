"""How the Arm adapter lowers recurrent layers for one target: decided and checked here once.

The flow, the quantizer and partitioner hooks, the decomposition and the CLI all read an
ArmPlan instead of deciding again: the form of the layers ("auto" unrolls a stack of at
most AUTO_UNROLL_MAX_STEPS steps and loops beyond, where a loop lowers several times
faster at about the same Vela cycles, docs/arm_loop_form.md), the recurrent product's form
per target, the bit widths, and which combinations of them a target takes.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from recurrent_lowering.passes.plan import STRATEGIES, Plan

from . import weight_precision
from .fx_builder import ProductForm

AUTO_UNROLL_MAX_STEPS = 8  # T x layers x directions


class PlanError(ValueError):
    """A combination of options the target cannot lower; the message says which and why."""


def _loop_takes(spec):
    """Why the loop form cannot take a stack (FxBuilder.loop carries h and c of one shape
    and reads one sequence: no masks)."""
    if spec.proj_size:
        return "proj_size"
    return "sequence_lens" if spec.has_sequence_lens else None


def core_plan(strategy: str) -> Plan:
    """The core's passes for the Arm adapter: one input projection per direction (Vela
    copies a column slice of a shared one), a loop's initial h in its ys (one copy less
    per step on Ethos-U), steps as row blocks of 2-D views and loops reading their rows in
    place (Vela copies reshapes with other readers)."""
    return Plan(
        strategy=strategy,
        auto_unroll_max_steps=AUTO_UNROLL_MAX_STEPS,
        loop_takes=_loop_takes,
        split_projections=True,
        loop_initial_in_ys=True,
        row_views="static",
        loop_rows=True,
    )


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    """`target`: a TOSA spec string (with the extensions it needs, e.g. "+int16") or an
    Ethos-U accelerator ("ethos-u85-256"). `activations`: "int8" or "int16" (ExecuTorch's
    a16w8) for the whole program, or for all but the recurrent layers when
    `recurrent_activations` names theirs (the projection, the steps and the layer's outputs;
    the quantizer rescales at the boundary). `state_bits` 16 keeps a loop's steps (state and
    gate arithmetic) in int16.
    `recurrent_weight_bits` < 8 narrows the weights every step reads (4: TOSA INT4)."""

    target: str
    strategy: str = "auto"
    activations: str = "int8"
    state_bits: int = 8
    recurrent_weight_bits: int = 8
    keep_recurrent_on_cpu: bool = False
    recurrent_activations: Optional[str] = None

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise PlanError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        for name in ("activations", "recurrent_activations"):
            value = getattr(self, name)
            if value not in ("int8", "int16") and (value, name) != (None, "recurrent_activations"):
                raise PlanError(f"{name} must be int8 or int16, got {value!r}")
        if self.state_bits not in (8, 16):
            raise PlanError(f"state_bits must be 8 or 16, got {self.state_bits}")
        bits = self.recurrent_weight_bits
        weight_precision.check_bits(bits)
        tosa = self.target.startswith("TOSA")
        wide = {
            "activations='int16'": self.activations == "int16",
            "recurrent_activations='int16'": self.recurrent_activations == "int16",
            "state_bits=16": self.state_bits == 16,
        }
        for what, given in wide.items():
            if given and tosa and "+int16" not in self.target:
                raise PlanError(f"{what} needs TOSA's int16 extension: target {self.target}+int16")
        if bits == 4:
            if tosa and "+int4" not in self.target:
                raise PlanError(f"4-bit recurrent weights are TOSA INT4: target {self.target}+int4")
            if any(wide.values()):  # ExecuTorch 1.5.1's CONV2D takes INT4 weights with int8 only
                raise PlanError(
                    "4-bit recurrent weights (TOSA INT4) need int8 activations; use 5-7 bits "
                    "with int16 activations or int16 state"
                )
        if self.keep_recurrent_on_cpu:
            if self.recurrent_activations is not None:
                raise PlanError("recurrent layers kept on the CPU run in float: no precision")
            if self.strategy == "loop":
                raise PlanError("recurrent layers kept on the CPU need the unrolled form")
            if bits != 8:
                raise PlanError(
                    "recurrent_weight_bits narrows the weights of recurrent layers on the NPU; "
                    "keep_recurrent_on_cpu keeps them in float on the CPU"
                )
        if self.state_bits == 16 and (self.keep_recurrent_on_cpu or self.strategy == "unrolled"):
            raise PlanError(
                "int16 state keeps the loop form's steps in int16; it cannot be combined with "
                "the unrolled form or recurrent layers kept on the CPU"
            )

    @property
    def recurrent_precision(self) -> str:
        """The recurrent layers' activation precision."""
        return self.recurrent_activations or self.activations

    @property
    def layer_strategy(self) -> str:
        """The form recurrent layers take: the CPU runtime has portable kernels for
        elementary ops only, not for a loop node; int16 state lives in loop steps."""
        if self.keep_recurrent_on_cpu:
            return "unrolled"
        return "loop" if self.state_bits == 16 else self.strategy

    @property
    def products(self) -> ProductForm:
        """The recurrent product that gives the fewest Vela cycles
        (docs/results/arm_benchmark.md): on Ethos-U85 a MATMUL with R on the left (Vela
        runs a per-step CONV at about 12 MACs/cycle there, the MATMUL at about 20);
        elsewhere, and for weights of fewer than 8 bits (a MATMUL's R is an int8 feature
        map), the CONV form."""
        u85 = self.target.lower().startswith("ethos-u85")
        return ProductForm("matmul" if u85 and self.recurrent_weight_bits == 8 else "linear")

    def core(self) -> Plan:
        return core_plan(self.layer_strategy)


def quantization_config(activations: str):
    """ExecuTorch's symmetric per-channel config for int8 or int16 (a16w8) activations,
    observed by histogram_observer's HistogramObserver (torchao's, searching faster)."""
    from executorch.backends.arm.quantizer import arm_quantizer

    from .histogram_observer import faster

    configs = {
        "int8": arm_quantizer.get_symmetric_quantization_config,
        "int16": arm_quantizer.get_symmetric_a16w8_quantization_config,
    }
    if activations not in configs:
        raise ValueError(f"activations must be one of {sorted(configs)}, got {activations!r}")
    return faster(configs[activations](is_per_channel=True))


def tosa_target(target: str, activations: str, state_bits: int, weight_bits: int) -> str:
    """The TOSA spec a plain "TOSA-1.0+INT" needs for these options (every Ethos-U compile
    spec has the extensions already)."""
    if target != "TOSA-1.0+INT":
        return target
    extensions = []
    if activations == "int16" or state_bits == 16:
        extensions.append("int16")
    if weight_bits == 4:
        extensions.append("int4")
    return "+".join([target, *extensions])
