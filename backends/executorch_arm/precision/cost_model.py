"""`--quantization auto`: int16 activations in each region where the target gives them cheaply.

Two regions: the recurrent layers (projection, steps, outputs) and the rest of the program
(conv/FC front-ends, heads). Candidates, most accurate first: all int16 with weights in two
int8 parts (weighed for accuracy only, candidates.reaching), all int16, recurrent int16
with the rest int8, the loop form's steps alone in int16 (for accuracy only too), all
int8. The first of int16, recurrent int16 and int8 whose estimated cycles are within
`budget` of all-int8's wins; an operator the target's Vela runs in int8 only
(plan.INT8_ONLY) stays int8 in an int16 rest (the estimates leave it out, int8's too). The
estimate is a model of Vela, so choosing costs no extra lowering (weights in two parts:
each split product counted twice):

    product of a matrix with one vector (a recurrent step's with R, an FC at T=1):
        MACs * vector_mac[bits]
    other products (conv, linear, matmul, a layer's input projection over all steps):
        max(MACs * mac[bits], weight bytes streamed * weight_byte)
    a recurrent step's gate arithmetic (the same in both precisions on fitted targets):
        gates x hidden size * gate_element
    an activation after a product in int16 (ReLU, clamp: Vela fuses it only in int8):
        elements * activation16
    a rescale between the int8 rest and int16 recurrent layers:  elements * rescale

with constants per target fitted against Vela's per-layer table (precision/costs.json,
written by `benchmarks/precision_costs.py`). On Ethos-U55 a step
streams R from flash, so its MACs hide behind the weight traffic and int16 is nearly free;
on Ethos-U85 (weights in SRAM) the same MACs at half rate cost about 1.6x.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import operator
import pathlib
from typing import Optional

import torch
from torch.fx import Node

from ..plan import INT8_ONLY, step_product, target_family
from ..quantization import transposed
from ..recurrent_ops import aten as aten_ops
from ..recurrent_ops import cell_chains

COSTS_FILE = pathlib.Path(__file__).with_name("costs.json")
CANDIDATES = (  # (name, rest, recurrent layers), most accurate first
    ("int16_w16", "int16", "int16"),
    ("int16", "int16", "int16"),
    ("int16_recurrent", "int8", "int16"),
    ("int16_state", "int8", "int8"),
    ("int8", "int8", "int8"),
)
# Candidates whose weights are two int8 parts (quantization.weight_parts): twice the
# products, for accuracy only, so never chosen for cycles alone.
WEIGHT_PARTS = {"int16_w16": 2}
# Candidates with the loop form's steps (state, gates and the product with R) in int16 in
# an int8 program (plan.state_bits 16), weighed for accuracy only: NSNet2 on ethos-u85-256
# reaches 30 dB so at 0.92x int16_recurrent's cycles (docs/results/real_model_accuracy.md).
STEPS16 = {"int16_state"}
ACCURACY_ONLY = {*WEIGHT_PARTS, *STEPS16}
aten = torch.ops.aten
_PRODUCTS = {
    aten.linear.default,
    aten.conv1d.default,
    aten.conv2d.default,
    aten.matmul.default,
    aten.mm.default,
    aten.bmm.default,
}
_ACTIVATIONS = {
    aten.relu.default,
    aten.relu_.default,
    aten.hardtanh.default,
    aten.hardtanh_.default,
    aten.clamp.default,
}
MOVES = {  # ops that move values without arithmetic
    aten.view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.flatten.using_ints,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.unsqueeze.default,
    aten.contiguous.default,
    aten.clone.default,
}


class CostModelError(ValueError):
    """No fitted costs for a target; the message names the targets that have them."""


@dataclasses.dataclass
class Product:
    macs: int
    weight_bytes: int  # streamed from the weights' memory each time the product runs
    gate_elems: int = 0  # a recurrent step's: the gate arithmetic's width after it
    vector: bool = False  # one input vector (a step's product with R, an FC at T=1)
    step: bool = False  # a recurrent step's product with R (or an LSTM's projection of h)
    constant: bool = True  # its weight a constant (a linear's or a convolution's)


@dataclasses.dataclass
class Features:
    """What the cost model needs of a program, per region."""

    recurrent: list = dataclasses.field(default_factory=list)  # Product each
    rest: list = dataclasses.field(default_factory=list)  # Product each
    activation_elems: int = 0  # outputs of ReLU/clamp after products of the rest
    boundary_elems: int = 0  # values crossing between the rest's ops and recurrent layers
    rest_ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The chosen precision per region, with the model's cycles for every candidate."""

    name: str
    rest: str
    recurrent: str
    estimates: dict  # candidate name -> estimated cycles
    budget: float
    fallback: Optional[str] = None  # why the first choice gave way to int8
    int8_only: Optional[str] = None  # what an int16 rest keeps in int8 on this target
    why: Optional[str] = None  # why auto did not weigh at all (plain int8)
    weighed: tuple = ()  # the candidates the target and program allow, most accurate first
    # Accuracy (candidates.reaching): the SQNR (dB) a fake-quantized simulation predicts per
    # output for each candidate simulated, the target, and whether the choice was made for
    # accuracy beyond the budget (then no cycle overrun gives it up) or none reached it.
    # name -> [dB per output] (a judge.Bound where the simulation stopped at a certain miss)
    predicted: dict = dataclasses.field(default_factory=dict)
    min_sqnr: Optional[float] = None
    for_accuracy: bool = False
    short: Optional[str] = None  # no candidate reached min_sqnr: the limiting output
    # Verification (candidates.widening): the SQNR the TOSA reference model measured per
    # output for each candidate lowered, and why a wider one was lowered after the first.
    measured: dict = dataclasses.field(default_factory=dict)  # name -> [dB per output]
    widened: Optional[str] = None
    # Why a choice Vela measured over its budget stayed: int8, lowered after it, measured
    # `int8_cycles`, more than the budget allows under it
    refit: Optional[str] = None
    int8_cycles: Optional[int] = None

    @property
    def int8_estimate(self) -> float:
        return self.estimates["int8"]

    def report(self) -> dict:
        if self.why is not None:
            return {"choice": self.name, "why": self.why}
        recurrent = f"{self.recurrent}, steps int16" if self.name in STEPS16 else self.recurrent
        report = {
            "choice": self.name,
            "regions": {"recurrent layers": recurrent, "rest": self.rest},
            "budget": self.budget,
            "estimated_cycles": {k: round(v) for k, v in self.estimates.items()},
        }
        if self.predicted:
            report["min_sqnr"] = self.min_sqnr
            report["predicted_sqnr_db"] = {
                k: [round(x, 2) for x in v] for k, v in self.predicted.items()
            }
            # judge.Bound: simulated until certain to miss min_sqnr, its figures upper bounds
            stopped = {
                k: f"upper bounds after {v.seen} of {v.of} samples"
                for k, v in self.predicted.items()
                if getattr(v, "seen", None) is not None
            }
            if stopped:
                report["predicted_stopped"] = stopped
        if self.measured:
            report["measured_sqnr_db"] = {
                k: [round(x, 2) for x in v] for k, v in self.measured.items()
            }
        if self.widened:
            report["widened"] = self.widened
        if self.refit:
            report.update(refit=self.refit, int8_cycles=self.int8_cycles)
        if self.short:
            report["short"] = self.short
        if self.int8_only:
            report["int8_only"] = self.int8_only
        if self.fallback:
            report["fallback"] = self.fallback
        return report


def load_costs(target: str, path: pathlib.Path = COSTS_FILE) -> dict:
    family = target_family(target)
    costs = json.loads(path.read_text())["targets"]
    if target in costs:
        return costs[target]
    if family in costs:
        return costs[family]
    raise CostModelError(
        f"no fitted int16 costs for {target} (fitted: {', '.join(sorted(costs))}); "
        "pass --quantization int8 or int16, or fit it with benchmarks/precision_costs.py"
    )


def _numel(node) -> int:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return int(math.prod(val.shape)) if isinstance(val, torch.Tensor) else 0


def _shape(node) -> tuple:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else ()


def _recurrent_products(op: aten_ops.RecurrentOp) -> list:
    """Per layer and direction of a recurrent op: a projection over all steps and T products
    with R (and an LSTM's projection of h, with proj_size)."""
    matrices = []
    for row in op.weights:
        for w in row:
            matrices.append((w.w.shape, w.r.shape))
            if w.proj is not None:
                matrices.append((None, w.proj.shape))
    return _steps(op.spec.seq_len or 1, matrices)


def _steps(steps: int, matrices) -> list:
    """A projection over all steps (W; none for an LSTM's projection of h) and one product a
    step (R, or the projection), per (W, R) shapes."""
    products = []
    for w, r in matrices:
        gates = r[0] if w is not None else 0  # an LSTM's projection has no gates after it
        if w is not None:
            products.append(Product(steps * math.prod(w), math.prod(w)))
        products += [Product(math.prod(r), math.prod(r), gates, vector=True, step=True)] * steps
    return products


def _product(node: Node) -> Product:
    out = _numel(node)
    if node.target in (aten.linear.default,):
        w = _shape(node.args[1])
        return Product(out * w[1], w[0] * w[1], vector=out == w[0])
    if node.target in (aten.conv1d.default, aten.conv2d.default):
        w = _shape(node.args[1])
        return Product(out * math.prod(w[1:]), math.prod(w), vector=out == w[0])
    k = _shape(node.args[0])[-1]
    return Product(out * k, 0, constant=False)


def _root(node):
    while isinstance(node, Node) and node.op == "call_function" and node.target in MOVES:
        node = node.args[0]
    return node


def _is_recurrent(node) -> bool:
    node = _root(node)
    if isinstance(node, Node) and node.target is operator.getitem:
        node = node.args[0]
    return isinstance(node, Node) and node.target in aten_ops.TARGET_OPS


def features(ep: torch.export.ExportedProgram) -> Features:
    """The cost model's view of an exported (float, aten) program."""
    f = Features()
    constant_of = aten_ops.program_constants(ep, ep.graph_signature.input_specs)
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in aten_ops.TARGET_OPS:
            op = aten_ops.read(node, constant_of)
            f.recurrent += _recurrent_products(op)
            source = _root(op.x)
            if isinstance(source, Node) and source.op == "call_function":
                f.boundary_elems += _numel(op.x)
        elif node.target in _PRODUCTS:
            f.rest.append(_product(node))
            if _is_recurrent(node.args[0]):
                f.boundary_elems += _numel(node.args[0])
        elif node.target in _ACTIVATIONS:
            f.activation_elems += _numel(node)
        if node.target not in aten_ops.TARGET_OPS and not transposed.takes(node):
            f.rest_ops[node.target] += 1  # (a transposed convolution of stride 1 is a conv)
    return f


def int8_only(f: Features, target: str) -> Optional[str]:
    """What of this program's rest `target`'s Vela runs in int8 only (plan.INT8_ONLY), kept
    int8 in an int16 rest; None when there is nothing."""
    family = target_family(target)
    ops = sorted(str(op) for op in INT8_ONLY.get(family, {}).values() if f.rest_ops[op])
    if not ops:
        return None
    return f"Vela refuses {', '.join(ops)} in int16 on {family}: kept int8 in an int16 rest"


def _cycles(
    products,
    bits: str,
    costs: dict,
    parts: int = 1,
    steps_split: bool = True,
    step_bits: Optional[str] = None,
) -> float:
    """`step_bits`: the steps' products with R in these activations instead of `bits`."""
    weight, gates = costs["weight_byte"], costs["gate_element"]

    def times(p: Product) -> int:
        return parts if p.constant and (steps_split or not p.step) else 1

    def cycles(p: Product) -> float:
        b = step_bits if p.step and step_bits else bits
        if p.vector:
            return p.macs * costs["vector_mac"][b]
        return max(p.macs * costs["mac"][b], p.weight_bytes * weight)

    return sum(times(p) * cycles(p) + p.gate_elems * gates for p in products)


def estimate(
    f: Features,
    rest: str,
    recurrent: str,
    costs: dict,
    parts: int = 1,
    steps_split: bool = True,
    step_bits: Optional[str] = None,
) -> float:
    """Cycles of the program with its rest and recurrent layers in these activations, its
    constant weights in `parts` int8 parts (each part a product of its own; a step's R too
    when `steps_split`, a weight of the step's product: plan.step_product), the steps'
    products with R in `step_bits` when given."""
    cycles = _cycles(f.recurrent, recurrent, costs, parts, steps_split, step_bits)
    cycles += _cycles(f.rest, rest, costs, parts)
    if rest == "int16":
        cycles += f.activation_elems * costs["activation16"]
    if (rest != recurrent or step_bits) and f.recurrent:
        cycles += f.boundary_elems * costs["rescale"]
    return cycles


def choose(
    f: Features,
    costs: dict,
    budget: float,
    int8_only: Optional[str] = None,
    steps_split: bool = True,
    steps16: bool = True,
) -> Choice:
    """The most accurate candidate within `budget` of all-int8's estimated cycles, of those
    not weighed for accuracy alone (ACCURACY_ONLY; STEPS16 only when `steps16`, the loop
    form allowed, and the program has recurrent layers). `int8_only` (what an int16 rest keeps in
    int8 on the target) goes into the choice's report; those operators and their rescales
    are not in the estimate (neither are they in int8's)."""
    estimates = {
        name: estimate(
            f,
            rest,
            rec,
            costs,
            WEIGHT_PARTS.get(name, 1),
            steps_split,
            "int16" if name in STEPS16 else None,
        )
        for name, rest, rec in CANDIDATES
    }
    limit = estimates["int8"] * (1 + budget)
    weighed = tuple(
        name
        for name, rest, rec in CANDIDATES
        if (name not in STEPS16 or (steps16 and f.recurrent)) and (f.recurrent or rest == rec)
    )
    for name, rest, rec in CANDIDATES:
        if name in weighed and name not in ACCURACY_ONLY and estimates[name] <= limit:
            return Choice(name, rest, rec, estimates, budget, int8_only=int8_only, weighed=weighed)
    raise AssertionError("int8 is always within its own budget")


def fixed_reason(target: str, recurrent_weight_bits: int, keep_recurrent_on_cpu: bool):
    """Why `auto` is plain int8 for these options, or None when it chooses."""
    if not target.startswith("ethos-u"):
        return f"{target} has no cycle cost to weigh"
    if recurrent_weight_bits == 4:
        return "4-bit recurrent weights (TOSA INT4) take int8 activations only"
    if keep_recurrent_on_cpu:
        return "recurrent layers kept on the CPU run in float"
    return None


def choose_for(
    module: torch.nn.Module, example_inputs, target: str, budget: float, steps16: bool = True
) -> Choice:
    """Export `module` (float) and choose its precision per region for `target`
    (`steps16`: whether the steps-in-int16 candidates may be weighed)."""
    costs = load_costs(target)
    ep = torch.export.export(module, tuple(example_inputs))
    cell_chains.fuse(ep.graph)  # the layers decompose will see
    f = features(ep)
    steps_split = step_product(target, 8) != "matmul"  # auto's recurrent weights are 8-bit
    return choose(f, costs, budget, int8_only(f, target), steps_split, steps16)
