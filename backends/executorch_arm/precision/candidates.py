"""The plans one lowering tries, in order: where precision candidates and the budget are
decided.

`candidates(options, module, example_inputs)` checks the options (options.check) and returns
the ArmPlans to lower, first choice first: one plan for an explicit precision; for
`quantization="auto"` the cost model's choice (cost_model.choose_for) and, when that is
wider than int8, all-int8 after it. `reaching(options, plans, predict)` then holds auto's
choice to the accuracy target: a choice whose predicted SQNR misses `min_sqnr` on some
output gives way to the cheapest wider candidate that reaches it, or, when none does, to
the most accurate (or a cheaper one within SAME_DB of it) within REASONABLE times int8's
cycles. `flow.lower_first` lowers the
first that fits:
`misfit` says why a lowered plan does not (Vela measured it over its budget by more than
the cost model's error), `fell_back` what replaces a plan that failed to lower, and `refit`
keeps a misfit whose int8 fallback, lowered, measured more cycles than the budget allows.
The lowered choice is then verified: when the TOSA reference model measures an output under
the target its simulation promised, `widening` names the one wider candidate to lower after
it, and `settled` keeps whichever of the two measures better (a second lowering only on a
miss).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from ..options import Options, check
from ..plan import ArmPlan, tosa_target
from . import cost_model
from .cost_model import Choice
from .judge import Bound

# The cost model's int8 estimate was up to 25% off Vela on the fitted targets (ethos-u85-256
# gru_a: 36,603 estimated, 49,094 measured); beyond that the choice was a misprediction.
MODEL_SLACK = 1.25
# A candidate beyond this many times int8's estimated cycles is not weighed for accuracy
# (int16_w16 on ethos-u85-256: about 3x, int16's MACs at half rate, twice).
REASONABLE = 4.0
# Where no candidate reaches the target, one predicted within this many dB of the most
# accurate at its worst output is as good (the simulation follows the TOSA reference model
# within 0.3 dB on most real models, 1.9 on madmom's BLSTM), and the cheapest of those goes:
# the BLSTM on ethos-u55-128, int16_w16 predicted at 20.3 dB for 1.76x int16's cycles, int16
# at 19.7.
SAME_DB = 1.0
# Each candidate's place among them, the most accurate first.
_RANK = {name: k for k, (name, _, _) in enumerate(cost_model.CANDIDATES)}


def _plan(
    o: Options,
    activations: str,
    recurrent: Optional[str],
    state_bits: int,
    choice,
    name: Optional[str] = None,
):
    """The plan of these options in this precision (`name`: a candidate's or a
    quantization's, for its weight parts)."""
    widest = "int16" if "int16" in (activations, recurrent) else "int8"
    return ArmPlan(
        target=tosa_target(o.target, widest, state_bits, o.recurrent_weight_bits),
        emission=o.emission,
        quantize=o.quantized,
        activations=activations,
        recurrent_activations=recurrent if recurrent != activations else None,
        state_bits=state_bits,
        recurrent_weight_bits=o.recurrent_weight_bits,
        weight_parts=cost_model.WEIGHT_PARTS.get(name or o.quantization, 1),
        keep_recurrent_on_cpu=o.keep_recurrent_on_cpu,
        decomposition=o.decomposition,
        share_state=o.share_state,
        system_config=o.system_config,
        memory_mode=o.memory_mode,
        precision=choice,
    )


def _candidate(o: Options, name: str, choice=None) -> ArmPlan:
    """The plan of auto's candidate `name` for these options."""
    _, rest, recurrent = next(c for c in cost_model.CANDIDATES if c[0] == name)
    state_bits = 16 if name in cost_model.STEPS16 else 8
    return _plan(o, rest, recurrent, state_bits, choice, name)


def fixed_reason(o: Options) -> Optional[str]:
    """Why `auto` is plain int8 for these options, or None when it weighs candidates."""
    if o.decomposition != "ours":
        return "the quantizer is ExecuTorch's"
    return cost_model.fixed_reason(o.target, o.recurrent_weight_bits, o.keep_recurrent_on_cpu)


def candidates(o: Options, module, example_inputs) -> list[ArmPlan]:
    """The plans to try for `o`, first choice first (see the module docstring)."""
    check(o)
    if not o.quantized:
        return [_plan(o, "int8", None, 8, None)]
    if o.quantization != "auto":
        state16 = o.quantization == "int16_state"
        activations = "int16" if o.quantization in ("int16", "int16_w16") else "int8"
        return [_plan(o, activations, None, 16 if state16 else 8, None)]
    why = fixed_reason(o)
    choice = None
    if why is None:
        try:
            steps16 = o.emission != "unrolled"  # int16 steps are loop steps (plan.core)
            choice = cost_model.choose_for(module, example_inputs, o.target, o.budget, steps16)
        except cost_model.CostModelError as e:
            why = str(e)
    if choice is None:
        choice = Choice("int8", "int8", "int8", {}, o.budget, why=why)
    first = _candidate(o, choice.name, choice)
    if choice.name == "int8":
        return [first]
    return [first, _plan(o, "int8", None, 8, None)]


def _worst(scores: list) -> float:
    return min(scores) if scores else float("inf")


def reaching(o: Options, plans: list, predict, ahead=None) -> list[ArmPlan]:
    """`plans` (candidates') with auto's choice held to `o.target_sqnr` on every output, as
    `predict(plan, at_least) -> [dB per output]` (a simulation, which may stop once the plan
    is certain to miss `at_least`: a judge.Bound) says. The choice stands when it reaches
    the target (whether its int8 fallback would is asked only if Vela measures it over the
    budget: `holds`); else the wider candidates (up to REASONABLE x int8) are simulated,
    the most accurate first (`_simulated_wider`), and the cheapest that reaches it goes. A
    choice made for accuracy has no fallback on cycles; when none reaches the target, the
    most accurate goes first, its choice naming the output that limits it. `ahead(plans)`,
    when given, hears first of the plans that may be simulated after the choice
    (`may_simulate`). A choice stopped as certain to miss is simulated again only when none
    reaches the target and its bound is within SAME_DB of the most accurate, until it is
    certain to miss that too (`_doubt`)."""
    first = plans[0]
    choice = first.precision
    if choice is None or choice.why is not None:
        return plans
    if ahead is not None:
        ahead(may_simulate(o, choice))
    target = o.target_sqnr
    # Stopped at a certain miss only if wider ones may answer it; else its figures decide.
    alone = _wider_order(o, choice)[0] is None
    predicted = {choice.name: predict(first, None if alone else target)}
    chosen = dataclasses.replace(choice, predicted=predicted, min_sqnr=target)
    if _worst(predicted[choice.name]) >= target:  # whether int8 would too: `holds`
        return [dataclasses.replace(first, precision=chosen), *plans[1:]]
    tried = {choice.name: first, **_simulated_wider(o, choice, predicted, predict)}
    doubt = _doubt(predicted, choice.name, tried, target)
    if doubt is not None:
        predicted[choice.name] = predict(first, doubt)
    best = _best(choice, predicted, tried, target)
    plan = dataclasses.replace(tried[best], precision=_for_accuracy(chosen, best, target))
    return [plan, *plans[1:]] if best == choice.name else [plan, plans[-1]]


def _doubt(predicted: dict, name: str, names, target: float) -> Optional[float]:
    """Where `_best` needs more of candidate `name` than its Bound (none of `names` reaches
    the target, and its bound is within SAME_DB of the most accurate of the rest), the
    figure it must be certain to miss for `_best` to pass it over: that one's worst less
    SAME_DB. Else None. (GTCRN on ethos-u85-256: int8 stopped at 19.9 dB, the most accurate
    at 20.1; int8 run in full measured 1.5.)"""
    if not isinstance(predicted[name], Bound):
        return None
    rest = [_worst(predicted[n]) for n in names if n != name]
    if any(w >= target for w in rest):
        return None
    close = max(rest, default=-float("inf")) - SAME_DB  # with nothing else: in full
    return close if _worst(predicted[name]) >= close else None


def _wider(choice: Choice) -> list:
    """The candidates more accurate than `choice`'s that it weighed, cheapest first, up to
    REASONABLE x int8's estimated cycles."""
    wider = [
        c
        for c in cost_model.CANDIDATES
        if c[0] in choice.weighed and c[0] in choice.estimates and _RANK[c[0]] < _RANK[choice.name]
    ]
    within = [c for c in wider if choice.estimates[c[0]] <= REASONABLE * choice.int8_estimate]
    return sorted(within, key=lambda c: choice.estimates[c[0]])


def _limiting(scores: list) -> tuple:
    k = scores.index(min(scores))
    return k, scores[k]


def _best(choice: Choice, predicted: dict, names, target: float) -> str:
    """Of the candidates `names` (simulated into `predicted`), the cheapest predicted to
    reach `target`, else the cheapest within SAME_DB of the most accurate."""
    reach = [n for n in names if _worst(predicted[n]) >= target]
    if reach:
        return min(reach, key=lambda n: choice.estimates[n])
    best = max(_worst(predicted[n]) for n in names)
    close = [n for n in names if _worst(predicted[n]) >= best - SAME_DB]
    return min(close, key=lambda n: choice.estimates[n])


def _wider_order(o: Options, choice: Choice) -> tuple:
    """`choice`'s wider candidates as `_simulated_wider` asks for them: (the most accurate,
    or None; those estimated cheaper than it, the cheapest first, then the others most
    accurate first; the most accurate whole-weight one when the most accurate has its
    weights in two parts, else None)."""
    narrowed = o.recurrent_weight_bits != 8  # weights in two parts are 8-bit each
    wider = [c for c in _wider(choice) if not (narrowed and c[0] in cost_model.WEIGHT_PARTS)]
    widest = next((c for c in cost_model.CANDIDATES if c in wider), None)
    if widest is None:
        return None, [], None
    cost = choice.estimates
    cheaper = [c for c in wider if cost[c[0]] < cost[widest[0]]]  # in cost order
    cheaper = cheaper[:1] + [c for c in cost_model.CANDIDATES if c in cheaper[1:]]
    whole = None
    if widest[0] in cost_model.WEIGHT_PARTS:
        parts = cost_model.WEIGHT_PARTS
        whole = next((c for c in cost_model.CANDIDATES if c in wider and c[0] not in parts), None)
    return widest, cheaper, whole


def _at_least(o: Options, candidate, cheaper: list, whole) -> Optional[float]:
    """How far a wider candidate is simulated: until certain to miss the target for the
    cheaper ones, whose miss is all `_simulated_wider` needs; in full (None) for the most
    accurate and the whole-weight one, whose figures answer a miss of the most accurate."""
    return o.target_sqnr if candidate in cheaper and candidate != whole else None


def may_simulate(o: Options, choice: Choice) -> list[tuple]:
    """(plan, at_least) of the plans `reaching` may simulate after auto's weighed `choice`,
    most likely first (the most accurate, then the cheaper ones in the order asked), the
    whole-weight one that a miss of the most accurate asks for last: a second process may
    simulate them while the choice is simulated (precision.judge), the last taken first by
    a caller waiting for the first. `at_least` as `_simulated_wider` asks: the target for
    the cheaper ones, whose miss is all it needs to know, None (in full) for the others."""
    widest, cheaper, whole = _wider_order(o, choice)
    if widest is None:
        return []
    order = [widest, *(c for c in cheaper if c != whole), whole]
    return [(_candidate(o, c[0]), _at_least(o, c, cheaper, whole)) for c in filter(None, order)]


def _simulated_wider(o: Options, choice: Choice, predicted: dict, predict) -> dict:
    """The plans of `choice`'s wider candidates (`_wider`) simulated into `predicted` (unless
    there already): name -> plan. The most accurate of them first: when it misses the
    target, the narrower ones would too (a candidate is taken to be no more accurate than
    one wider everywhere it is), and it is the answer alone, but for weights in two parts,
    which widen the weights alone: the most accurate whole-weight candidate is simulated
    beside it (where 8-bit weights are not what limits a model, it is as accurate for half
    the products: DTLN, int16 20.3 dB, int16_w16 19.9). When the first reaches the target,
    the cheapest of those estimated cheaper than it is simulated: reaching the target too,
    it is the answer; else the others, most accurate first, each while it is estimated
    cheaper than the cheapest reaching so far, up to the first that misses (those narrower
    than a miss would miss too: madmom's BGRU on ethos-u85-256, int16_state and int16 short
    of the target, int16_recurrent between them is not simulated). Those cheaper ones
    are simulated until certain to miss (`predict`'s `at_least`): one reaches already; but
    the whole-weight one, in full, as `may_simulate` hands it to a second process, so the
    report's figures do not depend on the cores."""
    tried = {}

    def reaches(candidate, at_least=None) -> bool:
        name = candidate[0]
        tried[name] = _candidate(o, name)
        if name not in predicted:
            predicted[name] = predict(tried[name], at_least)
        return _worst(predicted[name]) >= o.target_sqnr

    widest, cheaper, whole = _wider_order(o, choice)
    if widest is None:
        return tried
    if not reaches(widest):
        if whole is not None:
            reaches(whole)
        return tried

    if not cheaper or reaches(cheaper[0], _at_least(o, cheaper[0], cheaper, whole)):
        return tried
    cost, best = choice.estimates, widest[0]
    for candidate in cheaper[1:]:
        if _RANK[candidate[0]] > _RANK[cheaper[0][0]]:
            break  # narrower than the cheapest, which missed
        if cost[candidate[0]] >= cost[best]:
            continue
        if not reaches(candidate, _at_least(o, candidate, cheaper, whole)):
            break
        best = candidate[0]
    return tried


def _for_accuracy(choice: Choice, name: str, target: float, **fields) -> Choice:
    """`choice` turned to candidate `name` for accuracy (with `fields`), its `short` naming
    the output that limits it when its prediction misses `target`."""
    _, rest, recurrent = next(c for c in cost_model.CANDIDATES if c[0] == name)
    scores = fields.get("predicted", choice.predicted)[name]
    short = None
    if _worst(scores) < target:
        k, low = _limiting(scores)
        short = f"output {k} at {low:.1f} dB"
    return dataclasses.replace(
        choice, name=name, rest=rest, recurrent=recurrent, for_accuracy=True, short=short, **fields
    )


def measured_as(plan: ArmPlan, measured: list) -> ArmPlan:
    """`plan` with its choice carrying what the TOSA reference model measured of it."""
    choice = plan.precision
    both = {**choice.measured, choice.name: list(measured)}
    return dataclasses.replace(plan, precision=dataclasses.replace(choice, measured=both))


def missed(o: Options, plan: ArmPlan) -> bool:
    """Whether the TOSA reference model measured (`measured_as`) an output of auto's
    lowered choice under `o.target_sqnr` that widening could still answer: the choice was
    weighed, did not fall back, and was not already the most accurate predicted (`short`)."""
    choice = plan.precision
    if choice is None or choice.why is not None or choice.fallback or choice.short:
        return False
    measured = choice.measured.get(choice.name)
    return bool(measured) and _worst(measured) < o.target_sqnr


def widening(o: Options, plan: ArmPlan, predict) -> Optional[ArmPlan]:
    """The plan to lower after `plan`, auto's lowered choice, when the TOSA reference model
    measured (`measured_as`) an output of it under `o.target_sqnr` that its simulation said
    would reach it (NSNet2 on ethos-u85-256, int8: 32.0 dB predicted, 23.7 measured): the
    cheapest wider candidate (`_wider`) predicted to reach the target, else the one
    predicted most accurate when that prediction beats the measurement. None when the
    measurement reaches the target, or the choice fell back, was not weighed, or was
    already the most accurate predicted (`short`)."""
    if not missed(o, plan):
        return None
    choice, target = plan.precision, o.target_sqnr
    measured = choice.measured[choice.name]
    predicted = dict(choice.predicted)
    tried = _simulated_wider(o, choice, predicted, predict)
    if not tried:
        return None
    best = _best(choice, predicted, tried, target)
    if _worst(predicted[best]) <= _worst(measured):
        return None
    k, worst = _limiting(measured)
    said = choice.predicted.get(choice.name) or []
    why = f"{choice.name} measured {worst:.1f} dB on output {k} on the TOSA reference model"
    why += f", under the {target:g} dB target"
    if k < len(said):
        why += f" (predicted {said[k]:.1f})"
    chosen = _for_accuracy(choice, best, target, predicted=predicted, widened=why)
    return dataclasses.replace(tried[best], precision=chosen)


def settled(first: ArmPlan, second: ArmPlan) -> ArmPlan:
    """Of auto's first choice and the wider candidate `widening` lowered after it, both
    measured (`measured_as`), the one whose worst output measures higher, its choice
    carrying both measurements and why it was widened."""
    a, b = first.precision, second.precision
    measured = {**a.measured, **b.measured}
    if _worst(measured[b.name]) > _worst(measured[a.name]):
        return dataclasses.replace(second, precision=dataclasses.replace(b, measured=measured))
    k, worst = _limiting(measured[b.name])
    why = f"{b.widened}; {b.name} measured {worst:.1f} dB on output {k}, no better: {a.name} kept"
    kept = dataclasses.replace(a, measured=measured, predicted=b.predicted, widened=why)
    return dataclasses.replace(first, precision=kept)


def holds(plan: ArmPlan, fallback: ArmPlan, predict) -> ArmPlan:
    """`plan`, a choice that reached its target and that Vela measured over its budget
    (`misfit`), made for accuracy when its int8 `fallback`, simulated now, would miss the
    target (madmom's onsets BRNN on ethos-u55-128: int16 predicted 33.3 dB at its worst
    output, int8 20.6); then the cycles are what the target costs and it stays."""
    choice = plan.precision
    if (
        choice is None
        or choice.min_sqnr is None
        or choice.for_accuracy
        or "int8" in choice.predicted
    ):
        return plan
    predicted = {**choice.predicted, "int8": predict(fallback, choice.min_sqnr)}
    needed = _worst(predicted["int8"]) < choice.min_sqnr
    chosen = dataclasses.replace(choice, predicted=predicted, for_accuracy=needed)
    return dataclasses.replace(plan, precision=chosen)


def unwidened(first: ArmPlan, wider: ArmPlan, why: str) -> ArmPlan:
    """`first`, measured under the target, when the candidate `widening` named after it
    could not be lowered (`why`): its choice says so."""
    said = f"{wider.precision.widened}; {why}: {first.precision.name} kept"
    chosen = dataclasses.replace(first.precision, widened=said)
    return dataclasses.replace(first, precision=chosen)


def misfit(plan: ArmPlan, measured_cycles: Optional[int]) -> Optional[str]:
    """Why a lowered auto plan does not fit: Vela measured more than its budget allows over
    int8 by a margin the cost model's error does not explain (ethos-u85-256 stream_gru: int16
    chosen at 3,561 estimated cycles, 13,650 measured); None if it fits."""
    choice = plan.precision
    if choice is None or choice.name == "int8" or choice.for_accuracy or measured_cycles is None:
        return None
    limit = choice.int8_estimate * (1 + choice.budget) * MODEL_SLACK
    if measured_cycles <= limit:
        return None
    return f"{choice.name} measured {measured_cycles:,} cycles, over the budget"


def refit(first: ArmPlan, first_cycles: int, fallback_cycles: Optional[int]) -> Optional[ArmPlan]:
    """`first`, a choice `misfit` judged over its budget against int8's estimate, when its
    int8 fallback, lowered, measured so many cycles that `first` is within the budget of
    them after all (an LSTM(8, 16) over 20 steps on ethos-u55-128: int8 and int16 both
    estimated 28,435 cycles, int16 measured 42,372 and int8 47,394), its choice saying so;
    else None (the fallback stands)."""
    choice = first.precision
    if fallback_cycles is None or first_cycles > fallback_cycles * (1 + choice.budget):
        return None
    why = (
        f"{choice.name} measured {first_cycles:,} cycles, over the budget on int8's estimate; "
        f"int8 measured {fallback_cycles:,}: {choice.name} kept"
    )
    chosen = dataclasses.replace(choice, refit=why, int8_cycles=fallback_cycles)
    return dataclasses.replace(first, precision=chosen)


def did_not_lower(plan: ArmPlan, error: BaseException) -> str:
    """Why `plan` gave way, in one line: ExecuTorch's pass failures list every pass run
    before the failing one (dropped) and carry the cause in `__cause__` (kept)."""

    def line(e: BaseException) -> str:
        text = str(e).strip()
        text = text.splitlines()[0] if text else type(e).__name__
        return re.sub(r" after the following passes: \[.*?\]", "", text)

    why = line(error)
    if error.__cause__ is not None:
        why += f" ({line(error.__cause__)})"
    if len(why) > 300:
        why = why[:297] + "..."
    return f"{plan.precision.name} did not lower: {why}"


def fell_back(first: ArmPlan, fallback: ArmPlan, why: str) -> ArmPlan:
    """`fallback` (all-int8) carrying `first`'s choice with the reason it gave way."""
    choice = first.precision
    int8 = dataclasses.replace(
        choice, name="int8", rest="int8", recurrent="int8", fallback=why, short=None
    )
    return dataclasses.replace(fallback, precision=int8)
