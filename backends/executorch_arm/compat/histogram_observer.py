"""torchao's HistogramObserver, with its min/max search done on Python floats: same qparams;
and qparams that can be pinned.

The Arm quantizer observes activations with HistogramObserver, whose `calculate_qparams`
searches the histogram for the range of least L2 error. The search walks the quantile
bounds in steps of 1e-5 and, at each, scans bins by indexing a torch tensor, a few
microseconds a comparison: 46 ms per observer on GTCRN's 1,059, 48 s of its 56 s
quantization. Here the scans are binary searches over the cumulative histogram (a list of
its float32 values, compared in float32 as torch compares a 0-dim float32 tensor with a
Python float), and the walk is otherwise the same: 7.4 s for the same observers, every
scale and zero point equal (tests/executorch_arm/test_histogram_observer.py pins that).

A loop step observes its weights as activations (the recurrent matrix is an mm operand),
once per timestep: NSNet2's 1200x400 matrix, 396 calibration steps, a histc and an aminmax
over 480,000 values each time, 85 s of its 135 s lowering. An observer seeing the same
tensor again, unchanged, within the range it already has, adds the histogram it computed
for it the first time: the sum torchao makes, in the same order, without recounting.

When an observation widens the range, torchao moves the old histogram into the new bins
(`_upscale_histogram`): it splits each bin into 128 points and `bucketize`s all 262,144 of
them against the 2,049 new bounds, 0.6 ms of a 1 ms call; a loop step's calibration widens
on about one observation in six (madmom's BLSTM: 23,000 times). The points are sorted, so
here the bounds are searched among the points instead (2,049 binary searches) and the
points' buckets counted from where each bound falls: the same bucket per point, the same
weighted bincount, the same histogram, bit for bit (pinned by a test).

Most observations fall within the range already seen. torchao's forward still makes about
fifteen tensor ops of each (two-way min and max, equality tests, a fresh histogram copied
back): 54 us a call on 400 values against 25 here, where such an observation is an aminmax
and a histc added in place to the histogram, the same sum (GTCRN's quantization, 1,059
observers over 120 frames: 41.4 -> 29.0 s). The first observation, one that widens the
range, and a non-finite one go through torchao's forward.

Even so, a call costs some 40 us of bookkeeping beside its histc (an aminmax, two reads of
the range, a thread-count switch), and a loop step's calibration makes about 150,000 of them
(madmom's BLSTM: 800 samples x 31 observers x 6 steps). `calibrate` runs a module over its
samples with the observers only recording what they see, then has each observe its record
in order (`_replay`): the extremes of all of it in one aminmax per shape, then the same
histc, sums and torchao widenings as call by call, so the same histogram (pinned by a test).

auto simulates several candidates, each calibrated on the same samples, so most observers
of a later candidate replay the very values an earlier one's did from the same (empty)
state. A replay is keyed by a blake2b digest of the observer's state and of every value it
recorded, in order (a fraction of a histc's time), and one seen before takes that one's
resulting histogram and range (`_replays`): the madmom BGRU on ethos-u85-256 (three
candidates simulated) has 98 of its 197 replays so, predict 24.1 -> 20.0 s, the same
program. A replay with a non-finite value is never taken (torchao's forward warns of it).

Each observation runs on one intra-op thread. torch.histc splits even 400 values over the
threads, each counting into its own 2048 bins, then joins them: on a 2-core machine with
another process busy, the join waits for a descheduled thread, 3 to 12 ms a call against
0.02 ms on one thread (NSNet2's step: 16,000 calls, 40 to 80 s). The counts are integers,
so the histogram is the same whatever the threads.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import math
import weakref

import numpy as np
import torch
from torchao.quantization.pt2e import observer
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from ..threads import one_thread


class HistogramObserver(observer.HistogramObserver):
    _pinned = None  # (scale, zero_point) tensors that calculate_qparams returns, if pinned
    _last = None  # (weakref to the last input, its _version, (min_val, max_val), its histc)
    _recorded = None  # [(input, its _version)] while `calibrate` records

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if self._recorded is not None:  # inside `calibrate`: replayed in order later
            self._recorded.append((x_orig, x_orig._version))
            return x_orig
        with one_thread():  # torch.histc's per-thread bins (../threads.py)
            return self._observe(x_orig)

    def _replay(self) -> None:
        """Observe what was recorded, in order, as `_observe` would have one by one: the
        extremes of all of them found in a few batched ops, then per observation a histc
        added to the histogram while within the range, torchao's forward when not (the
        same sums in the same order: the same histogram). A replay of the same values from
        the same state as one before (`_replays`) takes that one's result."""
        recorded, self._recorded = self._recorded, []
        self._last = None
        for x, version in recorded:
            if x._version != version:
                raise RuntimeError("an observed tensor changed after it was observed")
        extremes = _extremes(recorded)
        # a non-finite value goes through torchao's forward, which warns of it: never taken
        finite = all(e is None or all(map(math.isfinite, e)) for e in extremes)
        key = _replay_key(self, recorded) if finite else None
        if key is not None and key in _replays:
            _replays.move_to_end(key)
            self._set_state(*_replays[key])
            return
        self._observe_all(recorded, extremes)
        if key is not None:
            _replays[key] = self._state()
            while len(_replays) > _REPLAYS_KEPT:
                _replays.popitem(last=False)

    def _state(self) -> tuple:
        return tuple(t.clone() for t in (self.min_val, self.max_val, self.histogram))

    def _set_state(self, *values) -> None:
        """min_val, max_val and histogram set in place (the buffers other nodes share)."""
        for mine, value in zip((self.min_val, self.max_val, self.histogram), values):
            mine.resize_(value.shape)
            mine.copy_(value)

    def _observe_all(self, recorded: list, extremes: list) -> None:
        """`_replay`'s observations, `extremes` those of `_extremes(recorded)`."""
        bounds, last = None, None
        with one_thread():
            for (x, _), e in zip(recorded, extremes):
                if x.numel() == 0:
                    continue
                if bounds is None:
                    bounds = (self.min_val.item(), self.max_val.item())
                finite = e is not None and all(math.isfinite(v) for v in e)
                if finite and bounds[0] <= e[0] and e[1] <= bounds[1]:
                    if last is None or last[0] is not x:  # else: the same tensor again
                        last = (x, torch.histc(x.detach(), self.bins, *bounds))
                    self.histogram.add_(last[1])
                else:
                    super().forward(x)
                    bounds, last = None, None

    def _observe(self, x_orig: torch.Tensor) -> torch.Tensor:
        """torchao's forward, its common case in three tensor ops. An observation within the
        range already seen adds `histc(x, bins, min, max)` to the histogram, torchao's sum;
        the first, one that widens the range, a non-finite one or another dtype go through
        torchao's own forward. An input seen last time, unchanged (same tensor object, same
        version) and the range unchanged since, adds the histogram computed for it then."""
        if x_orig.numel() == 0:
            return x_orig
        bounds = (self.min_val.item(), self.max_val.item())
        last = self._last
        if last is not None and last[0]() is x_orig and last[1:3] == (x_orig._version, bounds):
            self.histogram.add_(last[3])
            return x_orig
        self._last = None
        x = x_orig.detach()
        low, high = (float(v) for v in torch.aminmax(x))
        plain = x.dtype == torch.float32 and math.isfinite(low) and math.isfinite(high)
        if not (plain and bounds[0] <= low and high <= bounds[1]):
            return super().forward(x_orig)
        # torchao's new_min == current_min and new_max == current_max
        update = torch.histc(x, self.bins, min=bounds[0], max=bounds[1])
        self.histogram.add_(update)
        self._last = (weakref.ref(x_orig), x_orig._version, bounds, update)
        return x_orig

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_last", None)  # a weakref: not picklable, and only a cache
        state.pop("_recorded", None)
        return state

    def pin(self, scale: float, zero_point: int) -> None:
        """Report these qparams whatever was observed (a loop step's input takes the
        program's scale at the loop's boundary)."""
        self._pinned = (torch.tensor([scale]), torch.tensor([zero_point]))

    def calculate_qparams(self):
        if self._pinned is not None:
            return self._pinned
        return super().calculate_qparams()

    def _upscale_histogram(self, histogram, orig_min, orig_max, update_min, update_max):
        """torchao's, with `bucketize(points, bounds, right=True) - 1` computed from the sorted
        points' side: a point's bucket is the number of bounds at or below it, less one."""
        n = self.bins * self.upsample_rate
        points = torch.linspace(orig_min, orig_max, n + 1, device=orig_min.device)[:-1]
        points = points.to(histogram.device) + 0.5 * ((orig_max - orig_min) / n)
        bounds = torch.linspace(update_min, update_max, self.bins + 1, device=update_min.device)
        bounds = bounds.to(histogram.device)
        if not (
            bool((points[1:] >= points[:-1]).all()) and bool((bounds[1:] >= bounds[:-1]).all())
        ):
            return super()._upscale_histogram(histogram, orig_min, orig_max, update_min, update_max)
        first = torch.searchsorted(points, bounds)  # the first point at or past each bound
        buckets = torch.cumsum(torch.bincount(first, minlength=n + 1)[:n], 0) - 1
        buckets.clamp_(0, self.bins - 1)
        weights = histogram.repeat_interleave(self.upsample_rate) / self.upsample_rate
        return torch.bincount(buckets, weights=weights, minlength=self.bins)

    def _non_linear_param_search(self) -> tuple[torch.Tensor, torch.Tensor]:
        """torchao's search (NormMinimization's non-linear search), the same steps."""
        assert self.histogram.size()[0] == self.bins, "bins mismatch"
        bin_width = (self.max_val - self.min_val) / self.bins
        total = torch.sum(self.histogram).item()
        cumulative = torch.cumsum(self.histogram, dim=0).tolist()  # non-decreasing
        stepsize = 1e-5
        alpha, beta = 0.0, 1.0
        start_bin, end_bin = 0, self.bins - 1
        norm_min = float("inf")
        while alpha < beta:
            next_alpha = alpha + stepsize
            next_beta = beta - stepsize
            if start_bin == end_bin:
                left = right = start_bin
            else:
                # first bin from start_bin on whose sum reaches next_alpha's quantile, last
                # bin from end_bin back whose sum stays within next_beta's (torch's scans)
                low = float(np.float32(next_alpha * total))
                high = float(np.float32(next_beta * total))
                left = min(max(bisect.bisect_left(cumulative, low), start_bin), end_bin)
                right = max(min(bisect.bisect_right(cumulative, high) - 1, end_bin), start_bin)
            next_start_bin, next_end_bin = start_bin, end_bin
            if (left - start_bin) > (end_bin - right):
                next_start_bin = left
                alpha = next_alpha
            else:
                next_end_bin = right
                beta = next_beta
            if next_start_bin == start_bin and next_end_bin == end_bin:
                continue
            norm = self._compute_quantization_error(next_start_bin, next_end_bin)
            if norm > norm_min:
                break
            norm_min = norm
            start_bin, end_bin = next_start_bin, next_end_bin
        new_min = self.min_val + bin_width * start_bin
        new_max = self.min_val + bin_width * (end_bin + 1)
        return new_min, new_max


def _extremes(recorded: list) -> list:
    """(min, max) as Python floats of each recorded float32 tensor, else None: one aminmax
    per shape over the distinct tensors stacked (a tensor observed again, a weight, counted
    once); min and max are exact, so the same as each tensor's own aminmax."""
    found: dict = {}
    groups: dict = collections.defaultdict(list)
    for x, _ in recorded:
        if x.dtype == torch.float32 and x.numel() and id(x) not in found:
            found[id(x)] = None
            groups[tuple(x.shape)].append(x)
    for xs in groups.values():
        stacked = torch.stack([x.detach() for x in xs]).reshape(len(xs), -1)
        lows, highs = torch.aminmax(stacked, dim=1)
        for x, low, high in zip(xs, lows.tolist(), highs.tolist()):
            found[id(x)] = (low, high)
    return [found.get(id(x)) for x, _ in recorded]


# Replays by what they observed (`_replay_key`) -> the observer's state after it, most
# recent last (the module docstring says why).
_replays: collections.OrderedDict = collections.OrderedDict()
_REPLAYS_KEPT = 20_000  # about 8 kB each (2048 float32 bins)


def _replay_key(o: HistogramObserver, recorded: list):
    """A digest of the observer's state, its parameters and every recorded value in order,
    or None when one is not a float32 tensor on the CPU: equal digests, equal observations
    (blake2b, 32 bytes: a collision is not a practical concern)."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(repr((type(o).__name__, o.bins, o.upsample_rate, len(recorded))).encode())
    for t in (o.min_val, o.max_val, o.histogram):
        if t.dtype != torch.float32 or t.device.type != "cpu":
            return None
        digest.update(repr(tuple(t.shape)).encode())
        digest.update(t.detach().contiguous().numpy())
    seen: dict = {}  # id -> index of the first recording of that tensor
    for k, (x, _) in enumerate(recorded):
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        first = seen.setdefault(id(x), k)
        if first != k:  # the same tensor again (a weight): its index, not its bytes
            digest.update(b"again %d;" % first)
            continue
        digest.update(repr(tuple(x.shape)).encode())
        digest.update(x.detach().contiguous().numpy())
    return digest.digest()


def calibrate(module: torch.nn.Module, samples, run=None, budget: int = 1 << 28) -> None:
    """Run `module` on each sample (a tuple of its inputs; `run(module, *sample)` if given)
    with its HistogramObservers recording what they see instead of observing it call by
    call, and have them observe it all, in order (`_replay`), whenever the records reach
    about `budget` bytes and at the end: the histograms, so the qparams, of observing call
    by call, at a fraction of the time."""
    observers = [m for m in module.modules() if isinstance(m, HistogramObserver)]
    for o in observers:
        o._recorded = []
    try:
        held = 0
        for sample in samples:
            marks = [len(o._recorded) for o in observers]
            if run is None:
                module(*sample)
            else:
                run(module, *sample)
            for o, mark in zip(observers, marks):
                held += sum(x.numel() * x.element_size() for x, _ in o._recorded[mark:])
            if held >= budget:
                for o in observers:
                    o._replay()
                held = 0
        for o in observers:
            o._replay()
    finally:
        for o in observers:
            o._recorded = None


def int16_histogram(spec) -> bool:
    """`spec` is an int16 symmetric activation spec our HistogramObserver observes: one
    `capped` and `widened` take."""
    return (
        isinstance(spec, QuantizationSpec)
        and spec.dtype == torch.int16
        and spec.qscheme in (torch.per_tensor_symmetric, None)
        and getattr(spec.observer_or_fake_quant_ctr, "p", None) is not None
        and spec.observer_or_fake_quant_ctr.p.func is HistogramObserver
    )


class CappedHistogramObserver(HistogramObserver):
    """A symmetric observer whose scale is at most `max_scale`: the values beyond
    max_scale * quant_max saturate (quantization.table_inputs: a table's input)."""

    def __init__(self, *args, max_scale: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_scale = max_scale

    def calculate_qparams(self):
        scale, zero_point = super().calculate_qparams()
        if self._pinned is None:
            scale = torch.clamp(scale, max=self.max_scale)
        return scale, zero_point

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_scale={self.max_scale}"


def _observed_by(spec, observer_class, what: str, **keywords):
    """`spec`, observed by our HistogramObserver, observed by `observer_class` with the same
    arguments and `keywords`; TypeError naming `what` for any other observer."""
    partial = spec.observer_or_fake_quant_ctr.p
    if partial.func is not HistogramObserver:
        raise TypeError(f"cannot {what} of {partial.func.__name__}")
    ctr = observer_class.with_args(*partial.args, **partial.keywords, **keywords)
    return dataclasses.replace(spec, observer_or_fake_quant_ctr=ctr)


def capped(spec, max_scale: float):
    """`spec` (observed by our HistogramObserver) with its scale at most `max_scale`."""
    return _observed_by(spec, CappedHistogramObserver, "cap the scale", max_scale=max_scale)


class WidenedHistogramObserver(HistogramObserver):
    """An observer whose range is `factor` times the one its histogram search finds where
    that range is above eps's floor; a range under the floor keeps it, already wider
    (quantization.inputs: a model input's headroom)."""

    def __init__(self, *args, factor: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.factor = factor

    def calculate_qparams(self):
        if self._pinned is not None or self.min_val == float("inf"):
            return super().calculate_qparams()  # pinned, or nothing observed
        return widened_qparams(self, self.factor)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, factor={self.factor}"


def widened_qparams(o: HistogramObserver, factor: float) -> tuple:
    """torchao's qparams of `o` (observed, not pinned) with the range `factor` times wider,
    unless its scale is at eps's floor: that range is already wider and kept."""
    low, high = o._non_linear_param_search()  # torchao's qparams, searched once
    scale, zero_point = o._calculate_qparams(low, high)
    if scale <= o.eps:
        return scale, zero_point
    return o._calculate_qparams(low * factor, high * factor)


def widened(spec, factor: float):
    """`spec` (observed by our HistogramObserver) with its range `factor` times wider."""
    return _observed_by(spec, WidenedHistogramObserver, "widen the range", factor=factor)


def _faster(spec):
    """`spec` with torchao's HistogramObserver replaced by ours, other specs unchanged."""
    ctr = getattr(spec, "observer_or_fake_quant_ctr", None)
    partial = getattr(ctr, "p", None)
    if partial is None or partial.func is not observer.HistogramObserver:
        return spec
    faster = HistogramObserver.with_args(*partial.args, **partial.keywords)
    return dataclasses.replace(spec, observer_or_fake_quant_ctr=faster)


def faster(config):
    """A quantization config whose activation observers are ours."""
    return dataclasses.replace(
        config,
        input_activation=_faster(config.input_activation),
        output_activation=_faster(config.output_activation),
    )
