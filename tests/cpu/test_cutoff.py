"""Early cutoff of hopeless candidates: a candidate whose first timed repeat is already `cutoff` times slower than
its task's best (given to the runner with `set_best`) stops after that repeat and is valid with that one repeat; a
fast one is timed in full.  Real kernels through the real builder and runner process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hlotune
from hlotune.measure.builder import LocalBuilder
from hlotune.measure.measurer import ProgramMeasurer
from hlotune.measure.records import MeasureInput
from hlotune.measure.runner import LocalRunner, TimingConfig
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.steps import Schedule
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.target import Target
from tests.conftest import model_path

TARGET = Target.host_cpu()
TIMING = TimingConfig(warmup_ms=1.0, repeats=3, min_repeat_ms=2.0)


@pytest.fixture(scope="module")
def task():
    m = hlotune.load_model(model_path("mlp2", "bench.hlo"))
    return next(t for t in tasks_from_subgraphs(m.frontend.subgraphs, TARGET) if t.name == "max.3")


@pytest.mark.parametrize("cutoff", [3.0, 0.0])
def test_slow_candidate_stops_after_one_repeat(task, cutoff):
    naive = MeasureInput(task, Schedule(task.key, ()))                                  # no steps: slow
    tiled = MeasureInput(task, Schedule(task.key, tuple(default_schedule(task.compute, TARGET))))
    with ProgramMeasurer(LocalBuilder(n_workers=1, timeout=20), LocalRunner(TIMING, timeout=20, cutoff=cutoff)) as m:
        ref, slow0 = m.measure_batch([tiled, naive])   # no best known yet: both timed in full
        assert ref.valid and slow0.valid and len(ref.costs) == len(slow0.costs) == 3
        assert slow0.median > 30 * ref.median, "the naive schedule is expected to be far slower"
        # a best between the two, far from both (a loaded machine can stretch one repeat several times)
        best = slow0.median / (10 * max(cutoff, 3.0))
        m.runner.set_best({task.key: best, "another-task": 1e-9})
        slow, fast = m.measure_batch([naive, tiled])
    assert slow.valid and fast.valid and slow.error_kind.value == "none"
    assert len(fast.costs) == 3                        # a candidate near the best is timed in full
    if cutoff:
        assert len(slow.costs) == 1 and slow.median > cutoff * best
    else:                                              # 0: the cutoff is off
        assert len(slow.costs) == 3


_PROBE = "from hlotune.measure.runner import LocalRunner\nr = LocalRunner()\nprint(r.realtime())\nr.close()\n"


def _may_use_realtime() -> bool:
    p = subprocess.run([sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))"],
                       capture_output=True)
    return p.returncode == 0


@pytest.mark.parametrize("on", ["1", "0"])
def test_runner_reports_real_time_priority(on):
    """What `tune_pipeline=auto` asks the CPU runner: whether its process really got SCHED_RR."""
    env = dict(os.environ, HLOTUNE_MEASURE_REALTIME=on)
    p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-500:]
    assert p.stdout.split()[-1] == str(on == "1" and _may_use_realtime())


def test_only_the_runner_stays_real_time_under_a_real_time_tuner():
    """A tuner started under chrt gives its runner its real-time priority (every thread of the runner process) and
    puts itself at normal priority for the run: with the search real-time too, the kernel's RT throttling stalled
    the timing itself (runner.RtPacer)."""
    import threading

    from hlotune.search.tuner import _realtime_timing_only, _restore_search

    seen = {}
    runner = LocalRunner(TIMING)
    runner.start()   # from this (normal) thread: the forkserver's later children must not inherit real-time

    def threads(pid):
        return {(os.sched_getscheduler(int(t)), os.sched_getparam(int(t)).sched_priority)
                for t in os.listdir(f"/proc/{pid}/task")}

    def body():
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        except (AttributeError, OSError):
            seen["skip"] = True
            return
        try:
            old, how = _realtime_timing_only(ProgramMeasurer(LocalBuilder(n_workers=1), runner))
            seen["how"], seen["search"] = how, os.sched_getscheduler(0)
            seen["runner"] = threads(runner._worker.proc.pid)
            _restore_search(old, None)
            seen["after"] = os.sched_getscheduler(0)
        finally:
            runner.close()
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    th = threading.Thread(target=body)   # only this thread is real-time, for a moment
    th.start()
    th.join()
    runner.close()
    if seen.get("skip"):
        pytest.skip("this user may not use SCHED_RR")
    assert "real-time priority 1" in seen["how"]
    assert seen["search"] == os.SCHED_OTHER and seen["after"] == os.SCHED_RR
    assert seen["runner"] == {(os.SCHED_RR, 1)}


_BUILDER_PROBE = """
import os
os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
from hlotune.measure.builder import LocalBuilder
b = LocalBuilder(n_workers=1)
b._ensure_pool()
pid = b._workers[0].proc.pid
print(sorted({os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}), os.sched_getscheduler(0))
b.close()
"""


def test_builders_build_at_normal_priority_under_a_real_time_parent():
    """Building never needs real-time priority, and a real-time builder spends the cores' real-time budget that the
    runner's timings live in: a pool started by a real-time process (its forkserver real-time too) still builds at
    SCHED_OTHER."""
    if not _may_use_realtime():
        pytest.skip("this user may not use SCHED_RR")
    p = subprocess.run([sys.executable, "-c", _BUILDER_PROBE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-500:]
    assert p.stdout.split("\n")[-2] == f"[{os.SCHED_OTHER}] {os.SCHED_RR}"
