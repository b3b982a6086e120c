"""The real-time runner's pacer (runner.RtPacer) against a fake clock: Linux throttles real-time threads that use
more than `runtime` of a `period`, so a pacer built from that budget must never let the runner stay busy for longer
than its `busy_s` without a rest of `rest_s`, in any order of timings and idle gaps, while resting as seldom as that
allows; and measure_kernel asks it before every timed stretch with that stretch's expected length."""

from __future__ import annotations

import random

import pytest

from hlotune.measure.runner import RtPacer, TimingConfig, measure_kernel, rt_budget
from tests.null.test_check_cutoff import DATA, FakeKernel


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _sysctl(tmp_path, period: str, runtime: str) -> str:
    (tmp_path / "sched_rt_period_us").write_text(period + "\n")
    (tmp_path / "sched_rt_runtime_us").write_text(runtime + "\n")
    return str(tmp_path / "sched_rt_{}_us")


def test_budget_is_read_from_the_kernel_settings(tmp_path):
    assert rt_budget(_sysctl(tmp_path, "1000000", "950000")) == pytest.approx((1.0, 0.95))
    assert rt_budget(_sysctl(tmp_path, "1000000", "-1")) is None           # throttling off: nothing to pace
    assert rt_budget(str(tmp_path / "missing_{}")) is None
    assert RtPacer.for_budget(None) is None
    p = RtPacer.for_budget((1.0, 0.95))
    assert p.busy_s < 0.95 and p.rest_s > 0.05                             # inside the budget, with margins


@pytest.mark.parametrize("seed", range(5))
def test_no_busy_window_exceeds_the_budget(seed):
    """Random timings (0 to 300 ms, each announced) and idle gaps: in every window of one period, the busy time
    stays under the kernel's runtime; and the pacer does not rest more than about once per busy_s of work."""
    period, runtime = 1.0, 0.95
    t = FakeTime()
    p = RtPacer.for_budget((period, runtime))
    p.clock, p.sleep = t.clock, t.sleep
    rng = random.Random(seed)
    busy: list[tuple[float, float]] = []       # (start, end) of each timed stretch
    for _ in range(400):
        if rng.random() < 0.05:
            p.done()
            t.now += rng.choice([0.001, 0.03, 0.2, 1.5])                    # idle (waiting for the next batch)
        d = rng.choice([0.0, 0.002, 0.034, 0.034, 0.1, 0.3])
        p(d)
        busy.append((t.now, t.now + d))
        t.now += d
    total = sum(e - s for s, e in busy)
    for w0 in [s for s, _ in busy] + [e - period for _, e in busy]:
        used = sum(max(0.0, min(e, w0 + period) - max(s, w0)) for s, e in busy)
        assert used <= runtime, (w0, used)
    assert t.sleeps and all(s == p.rest_s for s in t.sleeps)
    assert len(t.sleeps) <= total / (p.busy_s - 0.3) + 2


def test_first_call_rests_and_an_idle_gap_counts_as_a_rest():
    t = FakeTime()
    p = RtPacer(busy_s=0.8, rest_s=0.07, clock=t.clock, sleep=t.sleep)
    p(0.01)
    assert t.sleeps == [0.07]                  # what ran before the first timing is not known
    t.now += 0.5
    p(0.01)
    assert len(t.sleeps) == 1                  # 0.5 s busy: within the budget
    p.done()
    t.now += 0.1                               # idle longer than a rest
    p(0.5)
    assert len(t.sleeps) == 1                  # a new stretch: 0.5 s fits
    t.now += 0.5
    p(0.25)
    assert len(t.sleeps) == 1                  # 0.5 + 0.25 fits
    t.now += 0.25
    p(0.06)
    assert len(t.sleeps) == 2                  # 0.75 + 0.06 would not: a rest first
    t.now += 0.06
    p(0.034)
    assert len(t.sleeps) == 2                  # after the rest a new stretch


def test_measure_kernel_paces_every_timed_stretch():
    asked: list[float] = []
    k = FakeKernel(first=0.0005, warm=0.0005)
    timing = TimingConfig(warmup_ms=1.0, repeats=3, min_repeat_ms=2.0)
    kind, _, costs = measure_kernel(k, DATA, timing, pace=asked.append)
    assert len(costs) == 3
    # the checked call (length unknown), the warm-up, then each repeat announced at about its length
    assert len(asked) == 2 + 3 and asked[0] == 0.0
    assert all(0.001 <= a <= 0.01 for a in asked[2:]), asked
