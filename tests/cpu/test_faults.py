"""Fault injection: candidates that segfault, hang, allocate without bound, raise or return wrong values,
in the runner and in the builders.  The batch completes, each fault has its kind, the others are valid,
and the measurer keeps working for the next batch."""

from __future__ import annotations

import time

import hlotune
from hlotune.measure.builder import LocalBuilder
from hlotune.measure.measurer import FaultHook, ProgramMeasurer
from hlotune.measure.records import ErrorKind, MeasureInput
from hlotune.measure.runner import LocalRunner, TimingConfig
from hlotune.schedule_space.steps import Schedule, Split
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.target import Target
from tests.conftest import model_path

TARGET = Target.host_cpu()
FAST = TimingConfig(warmup_ms=1.0, repeats=2, min_repeat_ms=2.0)
EXPECTED = {
    "segfault": (ErrorKind.RUNTIME, "SIGSEGV"),
    "hang": (ErrorKind.RUN_TIMEOUT, "longer than"),
    "oom": (ErrorKind.RUNTIME, "MemoryError"),
    "raise": (ErrorKind.RUNTIME, "injected fault"),
    "wrong": (ErrorKind.WRONG_ANSWER, "differ"),
    "build_segfault": (ErrorKind.COMPILE, "SIGSEGV"),
    "build_hang": (ErrorKind.BUILD_TIMEOUT, "longer than"),
    "build_raise": (ErrorKind.COMPILE, "injected fault"),
}


def _candidates(n: int) -> list[MeasureInput]:
    m = hlotune.load_model(model_path("mlp2"))
    dot = next(t for t in tasks_from_subgraphs(m.frontend.subgraphs, TARGET) if t.name == "dot_general.3")
    scheds = [()] + [(Split("dot_general_3", a, (f,)),) for a in ("i0", "i1") for f in (1, 2, 4, 8, 3, 5, 6, 7)]
    return [MeasureInput(dot, Schedule(dot.key, s)) for s in scheds[:n]]


def test_every_fault_is_survived_and_classified():
    faults = list(EXPECTED)
    inputs = _candidates(2 * len(faults) + 1)
    # faulty candidates interleaved with good ones; one fault is given by schedule key, not index
    hook = {2 * k + 1: f for k, f in enumerate(faults[:-1])}
    hook[inputs[2 * len(faults) - 1].schedule.key] = faults[-1]
    # timeouts with room for a good candidate's build and run on a loaded machine (1.5 / 2.0 s failed under load)
    runner = LocalRunner(FAST, timeout=3.0, memory_bytes=256 << 20)
    builder = LocalBuilder(n_workers=2, timeout=4.0)
    with ProgramMeasurer(builder, runner, fault_hook=FaultHook.of(hook)) as m:
        t0 = time.perf_counter()
        res = m.measure_batch(inputs)
        elapsed = time.perf_counter() - t0
        for i, r in enumerate(res):
            fault = m.fault_hook.fault_for(i, inputs[i].schedule.key)
            if fault is None:
                assert r.valid, (i, str(r))
                continue
            kind, text = EXPECTED[fault]
            assert r.error_kind is kind and text in r.error_msg, (fault, str(r))
            assert not r.valid and r.costs == ()
        assert builder.restarts >= 2 and runner.restarts >= 2   # crashed / hung workers were replaced
        assert elapsed < 30
        # the next batch, without faults, is measured normally by the replacement processes
        m.fault_hook = None
        again = m.measure_batch(inputs[:6])
        assert all(r.valid for r in again), [str(r) for r in again]


def test_unknown_fault_name_is_rejected():
    import pytest
    with pytest.raises(ValueError, match="unknown fault"):
        FaultHook.of({0: "explode"})
