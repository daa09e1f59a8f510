"""One lowering of the Arm adapter, fully decided: an ArmPlan.

`precision.candidates` makes the plans from checked Options (options.py); the flow lowers a
plan, and the quantizer, the partitioner and the decomposition read it instead of deciding
again: the target (with the TOSA extensions its bit widths need), the precision of each
region, the recurrent product's form per target, and the core plan (`core`), whose
`emission_of` decides unrolled or loop per layer stack.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from recurrent_lowering.passes import activations
from recurrent_lowering.passes.plan import Plan

from .emission.fx_builder import ProductForm

AUTO_UNROLL_MAX_STEPS = 8  # T x layers x directions

# Modules whose operator Vela 5.1.0 refuses in int16 on a target family, as ExecuTorch
# 1.5.1 lowers it ("Non-passthrough operation (Conv2D) could not run on NPU" for an int16
# TRANSPOSE_CONV2D; ethos-u85 takes it; tests/executorch_arm/test_int8_only.py lowers one):
# in an int16 region they stay int8, with a rescale on each edge (ArmPlan.int8_only).
INT8_ONLY = {
    family: {
        torch.nn.ConvTranspose1d: torch.ops.aten.conv_transpose1d.default,
        torch.nn.ConvTranspose2d: torch.ops.aten.conv_transpose2d.input,
    }
    for family in ("ethos-u55", "ethos-u65")
}


@dataclasses.dataclass(frozen=True)
class ArmPlan:
    """`target`: a TOSA spec string with the extensions the plan needs ("+int16", "+int4")
    or an Ethos-U accelerator. `activations`: "int8" or "int16" (ExecuTorch's a16w8) for the
    whole program, or for all but the recurrent layers when `recurrent_activations` names
    theirs (projection, steps and outputs; the quantizer rescales at the boundary).
    `state_bits` 16 keeps the loop form's steps (state and gate arithmetic) in int16.
    `recurrent_weight_bits` < 8 narrows the weights every step reads (4: TOSA INT4).
    `weight_parts` 2 writes every constant weight of a product as two int8 parts, hi + lo
    (quantization.weight_parts): about 15-bit weights at twice the weights' MACs.
    `precision` is what `--quantization auto` weighed for this plan (precision.Choice)."""

    target: str
    emission: str = "auto"
    quantize: bool = True
    activations: str = "int8"
    recurrent_activations: Optional[str] = None
    state_bits: int = 8
    recurrent_weight_bits: int = 8
    weight_parts: int = 1
    keep_recurrent_on_cpu: bool = False
    decomposition: str = "ours"
    share_state: bool = True
    system_config: Optional[str] = None
    memory_mode: Optional[str] = None
    precision: Optional[object] = None

    @property
    def is_ethos_u(self) -> bool:
        return self.target.startswith("ethos-u")

    @property
    def ours(self) -> bool:
        return self.decomposition == "ours"

    @property
    def recurrent_precision(self) -> str:
        """The recurrent layers' activation precision."""
        return self.recurrent_activations or self.activations

    @property
    def int8_only(self) -> dict:
        """Module type -> its aten operator, for the modules this target runs in int8 only
        (INT8_ONLY), when the plan has an int16 region: the quantizer keeps them int8."""
        if not self.quantize or "int16" not in (self.activations, self.recurrent_precision):
            return {}
        return INT8_ONLY.get(target_family(self.target), {})

    @property
    def products(self) -> ProductForm:
        """The recurrent product that gives the fewest Vela cycles
        (docs/results/arm_benchmark.md): on Ethos-U85 a MATMUL with R on the left (Vela
        runs a per-step CONV at about 12 MACs/cycle there, the MATMUL at about 20);
        elsewhere, and for weights of fewer than 8 bits (a MATMUL's R is an int8 feature
        map), the CONV form."""
        return ProductForm(step_product(self.target, self.recurrent_weight_bits))

    def core(self) -> Plan:
        """The core's passes for this plan: one input projection per direction (Vela copies
        a column slice of a shared one), a loop's initial h in its ys (one copy less per
        step on Ethos-U), steps as row blocks of 2-D views and loops reading their rows in
        place (Vela copies reshapes with other readers). What the loop form cannot take
        (`loop_takes`) is unrolled; int16 state lives in loop steps, so then every stack
        loops."""
        no_select = target_family(self.target) in NO_SELECT
        return core_plan(
            self.emission, self.keep_recurrent_on_cpu, self.state_bits == 16, no_select=no_select
        )


def target_family(target: str) -> str:
    """A target's family, "ethos-u55" for "ethos-u55-128"; a TOSA target is its own."""
    return target.lower().rsplit("-", 1)[0] if target.startswith("ethos-u") else target


def step_product(target: str, recurrent_weight_bits: int) -> str:
    """A recurrent step's product with R on `target` (ArmPlan.products): "matmul", R a
    feature map in the activations' precision (so weights in two parts leave it whole), or
    "linear", R a weight."""
    u85 = target.lower().startswith("ethos-u85")
    return "matmul" if u85 and recurrent_weight_bits == 8 else "linear"


# Targets whose TOSA subset has no SELECT nor comparisons (ExecuTorch's u55 subset): a step
# with a select would leave it on the CPU and the step would not be one delegate.
NO_SELECT = ("ethos-u55", "ethos-u65")


def core_plan(
    emission: str,
    keep_on_cpu: bool = False,
    loop_always: bool = False,
    no_loop: Optional[str] = None,
    no_select: bool = False,
) -> Plan:
    """The core plan of the Arm adapter (see ArmPlan.core); `no_loop` says why the program
    can hold no loop node at all (a .pt2 saved for other tools); `no_select`, that the
    target runs no select on its NPU (NO_SELECT)."""

    def loop_takes(spec):  # FxBuilder.loop carries h and c of one shape, one sequence
        if no_loop:
            return no_loop
        if keep_on_cpu:  # the CPU runtime has kernels for elementary ops, not a loop node
            return "recurrent layers kept on the CPU"
        selecting = activations.selecting(spec) if no_select else None
        if selecting:  # a loop's step must lower to one delegate (loop.step)
            return f"{selecting}, whose select this target runs on the CPU"
        if spec.proj_size:
            return "proj_size"
        return "sequence_lens" if spec.has_sequence_lens else None

    return Plan(
        emission=emission,
        auto_unroll_max_steps=0 if loop_always else AUTO_UNROLL_MAX_STEPS,
        loop_takes=loop_takes,
        split_projections=True,
        loop_initial_in_ys=True,
        row_views="static",
        loop_rows=True,
    )


def quantization_config(activations: str):
    """ExecuTorch's symmetric per-channel config for int8 or int16 (a16w8) activations,
    observed by compat's HistogramObserver (torchao's, searching faster)."""
    from executorch.backends.arm.quantizer import arm_quantizer

    from .compat.histogram_observer import faster

    configs = {
        "int8": arm_quantizer.get_symmetric_quantization_config,
        "int16": arm_quantizer.get_symmetric_a16w8_quantization_config,
    }
    if activations not in configs:
        raise ValueError(f"activations must be one of {sorted(configs)}, got {activations!r}")
    return faster(configs[activations](is_per_channel=True))


def tosa_target(target: str, activations: str, state_bits: int, weight_bits: int) -> str:
    """The TOSA spec a TOSA target needs for these options (every Ethos-U compile spec has
    the extensions already)."""
    if not target.startswith("TOSA"):
        return target
    extensions = target.split("+")[2:]
    if (activations == "int16" or state_bits == 16) and "int16" not in extensions:
        extensions.append("int16")
    if weight_bits == 4 and "int4" not in extensions:
        extensions.append("int4")
    return "+".join([*target.split("+")[:2], *extensions])
