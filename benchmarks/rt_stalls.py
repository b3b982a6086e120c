"""Real-time throttling stalls in timings, with and without hlotune's arrangement (run it under `chrt -r 1`).

Linux lets real-time threads use `sched_rt_runtime_us` of each `sched_rt_period_us` of a core (950 ms of 1 s by
default) and then stops them until the period ends.  A runner timing a batch at SCHED_RR is busy for seconds, so
without care one of its repeats stalls ~50 ms each second.  This script measures that, two ways:

1. a spin probe: one thread at this process's priority runs a ~0.7 ms numpy chunk for `--seconds`, with and
   without `runner.RtPacer` between chunks; it counts chunks over 10 ms (a stall);
2. the real runner: one candidate (batch_matmul's default schedule, bench size) timed `--n` times back to back as
   one batch, beside two spinning processes that stand for a search pipelined with the measurement, in two
   arrangements:
   - "all real-time" (sessions 12-38): the search (the spinners) real-time one priority below the runner, no
     pacing (builders build at normal priority in every arrangement since session 39);
   - "timing only" (now): `tuner._realtime_timing_only` (the runner real-time, the search at normal priority)
     and the runner's RtPacer; and the same without the pacer (setting measure_rt_pace off).
   It counts repeats more than 1.3x the median of all repeats and candidates whose median is over 1.1x.

    chrt -r 1 .venv/bin/python benchmarks/rt_stalls.py [--seconds 8] [--n 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # the spin probe's BLAS threads would spin through its rests
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


ARRANGEMENTS = ("all real-time", "timing only, no pacer", "timing only")


def spin_probe(seconds: float, pace: bool) -> dict:
    from hlotune.measure.runner import RtPacer, rt_budget

    a = np.random.default_rng(0).random((200, 200))
    pacer = RtPacer.for_budget(rt_budget()) if pace else None
    ts = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if pacer is not None:
            pacer(0.001)
        t0 = time.perf_counter()
        for _ in range(3):
            a @ a
        ts.append(time.perf_counter() - t0)
    t = np.array(ts) * 1e3
    return {"chunks": len(t), "median_ms": float(np.median(t)), "max_ms": float(t.max()),
            "stalls": int((t > 10).sum()), "rests": pacer.rests if pacer else 0}


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10000))


def runner_probe(n: int, arrangement: str) -> dict:
    os.environ["HLOTUNE_MEASURE_RT_PACE"] = "1" if arrangement == "timing only" else "0"
    only = arrangement.startswith("timing only")
    import hlotune
    from hlotune.measure.builder import LocalBuilder
    from hlotune.measure.measurer import ProgramMeasurer
    from hlotune.measure.records import MeasureInput
    from hlotune.measure.runner import LocalRunner
    from hlotune.schedule_space.default import default_schedule
    from hlotune.schedule_space.steps import Schedule
    from hlotune.schedule_space.task import tasks_from_subgraphs
    from hlotune.search.tuner import _realtime_timing_only, _restore_search
    from hlotune.target import Target

    target = Target.host_cpu()
    root = Path(__file__).resolve().parents[1]
    m = hlotune.load_model(str(root / "tests/data/models/batch_matmul/batch_matmul.bench.hlo"))
    task = tasks_from_subgraphs(m.frontend.subgraphs, target)[0]
    inp = MeasureInput(task, Schedule(task.key, tuple(default_schedule(task.compute, target))))
    old = None
    with ProgramMeasurer(LocalBuilder(n_workers=1), LocalRunner()) as pm:
        if only:
            old, how = _realtime_timing_only(pm)
        else:
            prio = os.sched_getparam(0).sched_priority
            how = f"runner at {prio + 1}" if prio and pm.runner.set_priority(prio + 1) else "as started"
        pm.measure_batch([inp])
        stop = mp.get_context("fork").Event()
        spinners = [mp.get_context("fork").Process(target=_spin, args=(stop,)) for _ in range(2)]
        for p in spinners:
            p.start()
        t0 = time.perf_counter()
        res = pm.measure_batch([inp] * n)
        wall = time.perf_counter() - t0
        stop.set()
        for p in spinners:
            p.join()
    _restore_search(old, None)
    costs = np.concatenate([r.costs for r in res if r.valid])
    meds = np.array([r.median for r in res if r.valid])
    base = float(np.median(costs))
    return {"arrangement": arrangement, "how": how, "wall_s": wall, "median_us": base * 1e6,
            "repeats_over_1.3x": int((costs > 1.3 * base).sum()), "repeats": len(costs),
            "max_repeat_x": float(costs.max() / base), "medians_over_1.1x": int((meds > 1.1 * base).sum()),
            "candidates": len(meds), "max_median_x": float(meds.max() / base)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runner", choices=ARRANGEMENTS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.runner:
        print(json.dumps(runner_probe(a.n, a.runner)))
        return 0
    pol = os.sched_getscheduler(0)
    print(f"policy {pol} priority {os.sched_getparam(0).sched_priority}; "
          f"sched_rt_runtime_us {open('/proc/sys/kernel/sched_rt_runtime_us').read().strip()}")
    for r in range(a.rounds):
        for pace in (False, True):
            print(f"spin probe (round {r + 1}, pacer {'on' if pace else 'off'}): {spin_probe(a.seconds, pace)}")
    for r in range(a.rounds):
        for arr in ARRANGEMENTS:   # a fresh process each: its own forkserver, builders, runner
            p = subprocess.run([sys.executable, __file__, "--runner", arr, "--n", str(a.n)], capture_output=True,
                               text=True)
            out = p.stdout.strip().splitlines()[-1] if p.returncode == 0 else p.stderr[-2000:]
            print(f"runner (round {r + 1}): {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
