"""auto's simulation (precision.accuracy) runs a converted module many times, its weights
dequantized once and the module compiled after its first run (loop.op.run_graph's
`constants`), with the same outputs as a plain run."""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import torch
from torch.fx import Node

from recurrent_lowering.backends.executorch_arm import compat, flow
from recurrent_lowering.backends.executorch_arm.loop.op import run_graph
from recurrent_lowering.backends.executorch_arm.options import Options
from recurrent_lowering.backends.executorch_arm.precision import (
    accuracy,
    candidates,
    cost_model,
    judge,
)
from recurrent_lowering.backends.executorch_arm.quantization import quantizer
from recurrent_lowering.runtime import metrics
from recurrent_lowering.tests.executorch_arm.sequence_output import SequenceOutput


class _ConvGru(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.gru = torch.nn.GRU(8, 8, batch_first=True)

    def forward(self, x):
        return self.gru(self.conv(x).transpose(1, 2))[0]


def _converted(tmp_path, module, samples):
    options = Options("TOSA-1.0+INT", quantization="int8")
    plan = candidates.candidates(options, module, samples[0])[0]
    with compat.lowering():
        spec = flow.compile_spec(plan.target, pathlib.Path(tmp_path), None, None)
        return flow.quantize(module, samples[0], quantizer.create(spec, plan), samples)


def test_weights_are_dequantized_once_and_the_outputs_do_not_change(tmp_path):
    torch.manual_seed(0)
    module = _ConvGru().eval()
    samples = [(torch.randn(1, 4, 6),) for _ in range(4)]
    converted = _converted(tmp_path, module, samples)
    constants: dict = {}
    for (x,) in samples:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plain = accuracy.flat(run_graph(converted, x, record=False))
            kept = accuracy.flat(run_graph(converted, x, record=False, constants=constants))
        assert not [w for w in caught if "op.py" in w.filename], [str(w.message) for w in caught]
        assert len(plain) == len(kept) and all((p == k).all() for p, k in zip(plain, kept))
    compiled = [m for key, m in constants.items() if not isinstance(key, Node)]
    assert len(compiled) == 1  # runs after the first are the compiled module's
    assert "dequantize_per_channel" not in compiled[0].code  # its weights folded in
    assert "quantize_per_tensor" in compiled[0].code
    held = [n for n in constants if isinstance(n, Node) and n.op == "call_function"]
    targets = {str(n.target) for n in held}
    assert "quantized_decomposed.dequantize_per_channel.default" in targets, targets
    inputs = {n for n in converted.graph.nodes if n.op == "placeholder"}
    for n in held:  # nothing that depends on the input is kept
        seen, todo = set(), list(n.all_input_nodes)
        while todo:
            m = todo.pop()
            assert m not in inputs, n
            if m not in seen:
                seen.add(m)
                todo.extend(m.all_input_nodes)
    simulated = accuracy.outputs(
        accuracy.of_module(converted, converted=True), accuracy.Evaluation(samples)
    )
    reference = accuracy.outputs(accuracy.of_module(module), accuracy.Evaluation(samples))
    assert len(simulated) == len(reference) == 1
    error = simulated[0] - reference[0]
    assert (error**2).mean() < 1e-2 * (reference[0] ** 2).mean()  # int8: above 20 dB


def test_a_loop_runs_its_quantized_step_and_the_prediction_is_the_measurement(
    tmp_path, monkeypatch
):
    """A GRU over 16 steps (the loop form) in int8 on ethos-u85-256: the simulation runs
    the quantized, pinned step the lowering lowers (loop.step.simulated), so auto's
    prediction equals the TOSA reference model's measurement; with the float step it was
    4 dB optimistic (33.34 predicted, 29.36 measured)."""
    torch.manual_seed(0)
    model = SequenceOutput(torch.nn.GRU(8, 16, batch_first=True)).eval()
    calibration = [(torch.randn(1, 16, 8),) for _ in range(4)]
    held_out = accuracy.Evaluation([(torch.randn(1, 16, 8),) for _ in range(4)])
    kw = dict(calibration_inputs=calibration, evaluation=held_out, min_sqnr=20.0)
    result = flow.lower(model, calibration[0], "ethos-u85-256", tmp_path / "q", **kw)
    choice = result.precision
    assert choice.name == "int8" and len(result.loop_programs) == 1
    predicted, measured = choice.predicted["int8"][0], choice.measured["int8"][0]
    assert abs(predicted - measured) < 0.1, (predicted, measured)

    float_steps = accuracy.of_module
    monkeypatch.setattr(
        accuracy, "of_module", lambda m, converted=False, tosa_spec=None: float_steps(m, converted)
    )
    result = flow.lower(model, calibration[0], "ethos-u85-256", tmp_path / "f", **kw)
    assert result.precision.predicted["int8"][0] > measured + 2


def test_a_simulation_stops_once_its_candidate_is_certain_to_miss():
    """Judge.predict(plan, at_least): the SQNR over all samples is at most the reference's
    energy over the error so far, so a simulation under `at_least` after its first sample
    stops there with those bounds (judge.Bound), each at least the full run's figure; one
    that never falls under it runs every sample and gives the full run's figures. A plan
    simulated again reuses its conversion, and simulates as a fresh one does."""
    torch.manual_seed(0)
    module = _ConvGru().eval()
    samples = [(torch.randn(1, 4, 6),) for _ in range(5)]
    plan = candidates.candidates(Options("TOSA-1.0+INT", quantization="int8"), module, samples[0])[
        0
    ]
    converted = flow._converted(module, samples[0], samples)
    conversions = []

    def convert(p):
        conversions.append(p)
        return converted(p)

    judging = judge.Judge(module, convert, accuracy.Evaluation(samples), flow._key)
    exact = judging.predict(plan)
    assert not isinstance(exact, judge.Bound) and 20 < exact[0] < 100, exact
    bound = judging.predict(plan, at_least=200.0)
    assert isinstance(bound, judge.Bound) and (bound.seen, bound.of) == (1, 5)
    assert all(b >= e for b, e in zip(bound, exact)), (bound, exact)
    assert judging.predict(plan, at_least=0.0) == exact
    assert len(conversions) == 1  # simulated again, the plan's conversion is reused
    fresh = judge.Judge(module, converted, accuracy.Evaluation(samples), flow._key)
    assert fresh.predict(plan, at_least=0.0) == exact  # as a fresh conversion simulates
    choice = cost_model.Choice(
        "int8", "int8", "int8", {"int8": 1.0}, 0.03, predicted={"int8": bound}
    )
    assert choice.report()["predicted_stopped"] == {"int8": "upper bounds after 1 of 5 samples"}


def test_an_integer_output_beside_floating_ones_is_not_judged_by_sqnr():
    """A class index's SQNR weighs a flip by how far apart the two classes' numbers are:
    beside floating outputs it reads inf to auto (metrics.judged), its simulation does not
    stop on it, and the report gives its share of equal elements instead."""
    logits = np.array([[0.5, -1.0, 2.0], [1.5, 0.2, -0.3]], np.float32)
    classes, flipped = np.array([2, 0], np.int64), np.array([2, 2], np.int64)
    figures = metrics.judged_sqnr_per_output([logits, classes], [logits + 0.01, flipped])
    assert figures[0] == metrics.sqnr_db(logits, logits + 0.01) and figures[1] == np.inf
    alone = metrics.judged_sqnr_per_output([classes], [flipped])  # nothing else to judge
    assert alone == metrics.sqnr_per_output([classes], [flipped]) and alone[0] < 10
    record: list = []
    until = judge._certain_miss([logits[None], classes[None]], 30.0, record)
    assert not until(0, [logits + 0.01, flipped]) and record[1] == np.inf
    assert until(0, [logits + 1.0, classes])  # the floating output misses
