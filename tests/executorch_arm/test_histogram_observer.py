"""histogram_observer.HistogramObserver gives torchao's qparams exactly (its search is the
same walk over faster scans), for int8 and int16, on tame, heavy-tailed, outlier, constant
and one-sided activations; quantization_config uses it for activations only."""

from __future__ import annotations

import pytest
import torch
from torchao.quantization.pt2e import observer

from recurrent_lowering.backends.executorch_arm.compat import histogram_observer
from recurrent_lowering.backends.executorch_arm.plan import quantization_config

INT16 = dict(dtype=torch.qint32, quant_min=-32768, quant_max=32767)


def _inputs():
    torch.manual_seed(0)
    return {
        "normal": [torch.randn(4000)],
        "heavy tail": [torch.randn(8000) ** 3],
        "outlier": [torch.cat([torch.randn(3000), torch.tensor([40.0])])],
        "zeros": [torch.zeros(64)],
        "one-sided, two batches": [torch.rand(500), torch.rand(700) * 3],
    }


@pytest.mark.parametrize("kwargs", [{}, INT16], ids=["int8", "int16"])
@pytest.mark.parametrize("name", list(_inputs()))
def test_same_qparams_as_torchao(name, kwargs):
    ours, theirs = (
        histogram_observer.HistogramObserver(**kwargs),
        observer.HistogramObserver(**kwargs),
    )
    for x in _inputs()[name]:
        ours(x)
        theirs(x)
    scale, zero_point = ours.calculate_qparams()
    expected_scale, expected_zero_point = theirs.calculate_qparams()
    assert torch.equal(scale, expected_scale) and torch.equal(zero_point, expected_zero_point)


def test_the_search_is_ours():
    """The equality above would hold trivially were torchao's search the one running: ours
    (and the capped one's) overrides it."""
    theirs = observer.HistogramObserver._non_linear_param_search
    for cls in (histogram_observer.HistogramObserver, histogram_observer.CappedHistogramObserver):
        assert cls._non_linear_param_search is not theirs


def test_a_widened_range_moves_the_histogram_as_torchao_does():
    """_upscale_histogram equals torchao's bit for bit: integer and fractional counts, ranges
    from 1e-4 to 1e2, widened on either side or both, or not at all."""
    ours, theirs = histogram_observer.HistogramObserver(), observer.HistogramObserver()
    g = torch.Generator().manual_seed(0)
    for k in range(200):
        counts = torch.rand(2048, generator=g) * 100
        counts = torch.floor(counts) if k % 3 == 0 else counts
        low, high = torch.randn(2, generator=g).sort().values * 10.0 ** (k % 7 - 4)
        width = high - low
        new_low = low - torch.rand(1, generator=g)[0] * width * (k % 5)
        new_high = high + torch.rand(1, generator=g)[0] * width * (k % 4) * 0.1
        args = (counts, low, high, new_low, new_high)
        assert torch.equal(ours._upscale_histogram(*args), theirs._upscale_histogram(*args)), k


def test_a_widening_stream_gives_torchao_qparams():
    """Observations that widen the range again and again (a loop step's first timesteps)."""
    torch.manual_seed(1)
    xs = [torch.randn(50) * (1 + 0.05 * k) + 0.01 * k for k in range(120)]
    for kwargs in ({}, INT16):
        ours = histogram_observer.HistogramObserver(**kwargs)
        theirs = observer.HistogramObserver(**kwargs)
        for x in xs:
            ours(x)
            theirs(x)
        assert torch.equal(ours.histogram, theirs.histogram)
        assert all(map(torch.equal, ours.calculate_qparams(), theirs.calculate_qparams()))


def test_the_configs_observe_activations_with_it():
    for activations in ("int8", "int16"):
        config = quantization_config(activations)
        for spec in (config.input_activation, config.output_activation):
            ctr = spec.observer_or_fake_quant_ctr
            assert ctr.p.func is histogram_observer.HistogramObserver
            assert ctr.p.keywords["eps"] > 0  # ExecuTorch's arguments kept
        assert config.weight.observer_or_fake_quant_ctr.p.func is not (
            histogram_observer.HistogramObserver
        )


def _weight_every_step():
    """A loop step's weight observed once per timestep (the same tensor), activations in
    between, the weight changed in place halfway (its range grows): the repeat cache must
    add the same histogram torchao recounts, and recount after the change."""
    torch.manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(300, 40) * 0.1, requires_grad=False)
    for t in range(40):
        yield weight
        if t % 7 == 3:
            yield torch.randn(1, 40) * (1 + t / 10)
        if t == 20:
            with torch.no_grad():
                weight.mul_(1.5)


@pytest.mark.parametrize("kwargs", [{}, INT16], ids=["int8", "int16"])
def test_a_repeated_input_gives_torchao_histogram(kwargs):
    ours = histogram_observer.HistogramObserver(**kwargs)
    theirs = observer.HistogramObserver(**kwargs)
    for x in _weight_every_step():
        ours(x)
    for x in _weight_every_step():
        theirs(x)
    assert torch.equal(ours.histogram, theirs.histogram)
    assert torch.equal(ours.min_val, theirs.min_val) and torch.equal(ours.max_val, theirs.max_val)
    assert all(
        torch.equal(a, b) for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams())
    )


def _mixed_stream():
    """A constant first (torchao's one-value histogram), then observations within the range,
    widening it on either side, on a bound exactly, an empty one, one with an inf, and a
    tensor seen again unchanged, then changed in place."""
    g = torch.Generator().manual_seed(2)
    again = torch.randn(30, generator=g)
    yield torch.full((5,), 0.25)
    for k in range(300):
        scale = 1 + (k % 37 == 0) * k / 20
        yield torch.randn(int(torch.randint(1, 200, (1,), generator=g)), generator=g) * scale
        if k % 11 == 0:
            yield again
        if k % 53 == 0:
            yield torch.tensor([])
        if k == 100:
            yield torch.tensor([1.0, float("inf"), -2.0])
        if k == 150:
            again.mul_(3.0)
        if k % 29 == 0:
            yield torch.tensor([1.0, -1.0]) * (k / 40)


@pytest.mark.parametrize("kwargs", [{}, INT16], ids=["int8", "int16"])
def test_each_observation_leaves_torchao_histogram(kwargs):
    """Ours takes a shorter path for observations within the range: after each one of the
    stream, histogram and range equal torchao's bit for bit."""
    ours = histogram_observer.HistogramObserver(**kwargs)
    theirs = observer.HistogramObserver(**kwargs)
    with pytest.warns(UserWarning, match="inf"):
        for k, x in enumerate(_mixed_stream()):
            ours(x)
            theirs(x)
            assert torch.equal(ours.histogram, theirs.histogram), k
            assert torch.equal(ours.min_val, theirs.min_val), k
            assert torch.equal(ours.max_val, theirs.max_val), k
    assert all(map(torch.equal, ours.calculate_qparams(), theirs.calculate_qparams()))


def test_it_restores_the_thread_count():
    threads = torch.get_num_threads()
    ours = histogram_observer.HistogramObserver()
    torch.set_num_threads(2)
    try:
        ours(torch.randn(100))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


class _Observed(torch.nn.Module):
    """Three observers as a prepared step has them: an input, a weight seen every call (the
    same tensor), and a value computed from the input."""

    def __init__(self, cls, kwargs):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(40, 30) * 0.1, requires_grad=False)
        self.observers = torch.nn.ModuleList(cls(**kwargs) for _ in range(3))

    def forward(self, x):
        x = self.observers[0](x)
        self.observers[1](self.weight)
        return self.observers[2](torch.tanh(x) * x.numel())


@pytest.mark.parametrize("kwargs", [{}, INT16], ids=["int8", "int16"])
@pytest.mark.parametrize("budget", [1 << 28, 4000], ids=["one replay", "many replays"])
def test_calibrate_gives_the_histograms_of_observing_one_by_one(kwargs, budget):
    """calibrate records and replays; each observer ends with torchao's histogram, range and
    qparams for the same stream observed call by call (the mixed stream: a constant first,
    widenings on either side, empty inputs, an inf, inputs of many sizes)."""
    torch.manual_seed(3)
    ours = _Observed(histogram_observer.HistogramObserver, kwargs)
    torch.manual_seed(3)
    theirs = _Observed(observer.HistogramObserver, kwargs)
    stream = [(x,) for x in _mixed_stream() if x is not None]
    with pytest.warns(UserWarning, match="inf"):
        histogram_observer.calibrate(ours, stream, budget=budget)
        for sample in stream:
            theirs(*sample)
    for a, b in zip(ours.observers, theirs.observers):
        assert torch.equal(a.histogram, b.histogram)
        assert torch.equal(a.min_val, b.min_val) and torch.equal(a.max_val, b.max_val)
        assert all(map(torch.equal, a.calculate_qparams(), b.calculate_qparams()))
    assert all(o._recorded is None for o in ours.observers)  # observing call by call again


def test_calibrate_refuses_an_input_changed_after_it_was_observed():
    """It keeps references, not copies: a tensor changed in place before the replay would be
    observed with its new values, so it is an error, not a silently different histogram."""
    x = torch.randn(10)

    def run(module, sample):
        module(sample)
        sample.mul_(2.0)

    with pytest.raises(RuntimeError, match="changed after it was observed"):
        histogram_observer.calibrate(histogram_observer.HistogramObserver(), [(x,)], run)


def test_a_second_calibration_on_the_same_values_takes_the_first_ones_histograms(monkeypatch):
    """auto's candidates calibrate on the same samples: an observer replaying the values
    another replayed from the same state takes its result (no observation), which equals
    observing them; other values, or the same from another state, are observed."""
    stream = [(x,) for x in _mixed_stream() if x is not None and torch.isfinite(x).all()]
    first = _Observed(histogram_observer.HistogramObserver, {})
    histogram_observer.calibrate(first, stream)
    observed = []
    real = histogram_observer.HistogramObserver._observe_all
    monkeypatch.setattr(
        histogram_observer.HistogramObserver,
        "_observe_all",
        lambda self, *args: observed.append(self) or real(self, *args),
    )
    again = _Observed(histogram_observer.HistogramObserver, {})
    again.weight = first.weight  # the same weight values, another tensor
    histogram_observer.calibrate(again, stream)
    assert observed == []
    for a, b in zip(first.observers, again.observers):
        assert torch.equal(a.histogram, b.histogram)
        assert torch.equal(a.min_val, b.min_val) and torch.equal(a.max_val, b.max_val)
        assert a.histogram.data_ptr() != b.histogram.data_ptr()  # its own buffers
    histogram_observer.calibrate(again, stream)  # from the state the first replay left
    assert len(observed) == len(again.observers)
    changed = [(x * 1.5,) for (x,) in stream]
    fresh = _Observed(histogram_observer.HistogramObserver, {})
    fresh.weight = first.weight
    histogram_observer.calibrate(fresh, changed)
    theirs = _Observed(observer.HistogramObserver, {})
    theirs.weight = first.weight
    for sample in changed:
        theirs(*sample)
    # the input's and the computed value's observers observe; the weight's sees its values again
    assert observed[len(again.observers) :] == [fresh.observers[0], fresh.observers[2]]
    for a, b in zip(fresh.observers, theirs.observers):
        assert torch.equal(a.histogram, b.histogram)
