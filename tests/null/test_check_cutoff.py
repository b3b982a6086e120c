"""The runner's two early cutoffs, in-process with a fake kernel whose call count and duration are known: a checked
call already CHECK_CUTOFF x `cutoff_s` slow ends the candidate with that one call (when it is over that by less than
COLD_SLACK_S, warm calls decide: a cold parallel call pays for waking threads); a first repeat over `cutoff_s`
ends it after that repeat, unless the checked call was under `cutoff_s` (a disturbed repeat); a candidate near the
best is timed in full."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from hlotune.measure.records import ErrorKind
from hlotune.measure.reference import TaskData
from hlotune.measure.runner import CHECK_CUTOFF, COLD_SLACK_S, TimingConfig, measure_kernel


class FakeKernel:
    """Copies its input to its output, taking `first` seconds on its first `cold` calls and `warm` after."""

    def __init__(self, first: float, warm: float, cold: int = 1):
        buf = SimpleNamespace(shape=(4,), dtype=SimpleNamespace(np=np.dtype(np.float32), value="f32"), name="b")
        self.func = SimpleNamespace(inputs=(buf,), outputs=(buf,))
        self.first, self.warm, self.cold, self.calls = first, warm, cold, 0

    def bind(self, x, out):
        def run():
            self.calls += 1
            end = time.perf_counter() + (self.first if self.calls <= self.cold else self.warm)
            out[...] = x
            while time.perf_counter() < end:
                pass
        return run


DATA = TaskData("t", (np.arange(4, dtype=np.float32),), (np.arange(4, dtype=np.float32),), ((0.0, 0.0),))
TIMING = TimingConfig(warmup_ms=1.0, repeats=3, min_repeat_ms=2.0)


def _measure(kernel, cutoff_s):
    return measure_kernel(kernel, DATA, TimingConfig(**{**TIMING.__dict__, "cutoff_s": cutoff_s}))


def test_hopeless_checked_call_is_the_only_call():
    k = FakeKernel(first=0.02, warm=0.02)
    kind, msg, costs = _measure(k, cutoff_s=0.02 / (2 * CHECK_CUTOFF))
    assert kind is ErrorKind.NONE and msg == ""
    assert k.calls == 1 and len(costs) == 1 and costs[0] >= 0.02


@pytest.mark.parametrize("first, cold", [(0.0012, 1), (0.0006, 3)])
def test_slow_cold_calls_alone_do_not_cut(first, cold):
    # a parallel kernel's first calls wait for its sleeping threads (the cold call up to ~1 ms slower): a cold call
    # over CHECK_CUTOFF x cutoff_s but within COLD_SLACK_S of it, then warm calls near the best: timed in full
    k = FakeKernel(first=first, warm=0.0001, cold=cold)
    kind, _, costs = _measure(k, cutoff_s=0.0002)
    assert 0.0002 * CHECK_CUTOFF < first < 0.0002 * CHECK_CUTOFF + COLD_SLACK_S
    assert kind is ErrorKind.NONE and len(costs) == 3 and max(costs) < first


def test_slow_warm_calls_within_the_slack_still_cut():
    # hopeless when warm too: it stops after the slack's calls, its cost the fastest of them, not the cold one
    k = FakeKernel(first=0.0015, warm=0.0008, cold=1)
    kind, _, costs = _measure(k, cutoff_s=0.0002)
    assert kind is ErrorKind.NONE and len(costs) == 1 and 0.0008 <= costs[0] < 0.0015
    assert 2 <= k.calls <= 2 + COLD_SLACK_S / 0.0008 + 1


def test_slow_first_repeat_stops_after_it():
    # the checked call is within CHECK_CUTOFF x cutoff_s, the warm calls over cutoff_s: one timed repeat.  Every call
    # just over cutoff_s, so a call stretched by other jobs on the cores (up to 2x here) still stays under the
    # checked-call cutoff (a 1.5x margin made this flaky under load)
    k = FakeKernel(first=0.0101, warm=0.0101)
    kind, _, costs = _measure(k, cutoff_s=0.01)
    assert kind is ErrorKind.NONE and len(costs) == 1 and costs[0] >= 0.0101 and k.calls >= 2


def test_one_slow_repeat_after_a_fast_checked_call_is_not_enough():
    # the cold call under cutoff_s, the repeats over it (as when another process disturbs the first repeat): the
    # candidate goes on to the second repeat (and, without cutoff2_s, all three)
    k = FakeKernel(first=0.001, warm=0.003)
    kind, _, costs = _measure(k, cutoff_s=0.002)
    assert kind is ErrorKind.NONE and len(costs) == 3 and min(costs) >= 0.003


@pytest.mark.parametrize("cutoff_s", [0.0, 0.01])
def test_candidate_near_the_best_is_timed_in_full(cutoff_s):
    k = FakeKernel(first=0.004, warm=0.001)   # a cold first call under CHECK_CUTOFF x cutoff_s
    kind, _, costs = _measure(k, cutoff_s)
    assert kind is ErrorKind.NONE and len(costs) == 3 and all(c >= 0.001 for c in costs)


def test_wrong_answer_is_caught_before_any_cutoff():
    k = FakeKernel(first=0.02, warm=0.02)
    bad = TaskData("t", DATA.inputs, (np.ones(4, dtype=np.float32) * 7,), ((0.0, 0.0),))
    kind, msg, costs = measure_kernel(k, bad, TimingConfig(**{**TIMING.__dict__, "cutoff_s": 1e-6}))
    assert kind is ErrorKind.WRONG_ANSWER and costs == () and k.calls == 1


def test_two_slow_repeats_stop_after_the_second():
    k = FakeKernel(first=0.003, warm=0.003)   # under cutoff_s (no one-repeat stop), over cutoff2_s
    kind, _, costs = measure_kernel(k, DATA, TimingConfig(**{**TIMING.__dict__, "cutoff_s": 0.01, "cutoff2_s": 0.002}))
    assert kind is ErrorKind.NONE and len(costs) == 2 and min(costs) >= 0.003
    k = FakeKernel(first=0.003, warm=0.003)   # a possible new best: all three repeats
    kind, _, costs = measure_kernel(k, DATA, TimingConfig(**{**TIMING.__dict__, "cutoff_s": 0.01, "cutoff2_s": 0.005}))
    assert len(costs) == 3
