"""Does this host time in slow phases, and would a second timing visit per candidate make labels agree better?

    chrt -r 1 .venv/bin/python benchmarks/timing_phases.py probe [--seconds 4] [--window-ms 20]
    chrt -r 1 .venv/bin/python benchmarks/timing_phases.py visits LABEL DB [--n 40] [--passes 6]

`probe`: times a numpy 64x64 matmul (no hlotune code) in back-to-back windows and prints each window's time per
call over the fastest window's.  Stretches of windows above 1.0 are phases in which the host runs this process
slower; a single window far above 1.0 is a stop of the whole vCPU (the window's wall time includes it).

`visits`: takes the `--n` fastest distinct schedules of one tuning database of `search_compare.py` subgraph LABEL,
and times all of them in `--passes` (even) passes on one runner process, with the tuner's timing of that script
(3 repeats of >= 5 ms, its early cutoffs against the database's best).  It reports the pairwise agreement
(`metrics.pairwise_accuracy`) between two separate measurements' labels (each schedule's fastest repeat, as the
cost model learns it) for one visit per measurement (a pass against a pass three later) and for two visits
(the repeats of two consecutive passes pooled, against the next two): how much a second visit, after the rest of
the batch, would cut the label noise of near-best candidates.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_compare import SUBGRAPHS, TUNE_TIMING, load_subgraph, schedule_of  # noqa: E402
from hlotune.cost_model.metrics import pairwise_accuracy  # noqa: E402
from hlotune.database import open_database  # noqa: E402
from hlotune.measure.builder import LocalBuilder  # noqa: E402
from hlotune.measure.measurer import ProgramMeasurer  # noqa: E402
from hlotune.measure.records import MeasureInput  # noqa: E402
from hlotune.measure.runner import LocalRunner  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.target import Target  # noqa: E402


def probe(seconds: float, window_ms: float) -> list[float]:
    """Time per call of each window, over the fastest window's."""
    a = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    out, end = [], time.time() + seconds
    while time.time() < end:
        t0, n = time.perf_counter_ns(), 0
        while time.perf_counter_ns() - t0 < window_ms * 1e6:
            for _ in range(50):
                a @ a
            n += 50
        out.append((time.perf_counter_ns() - t0) / n)
    best = min(out)
    return [x / best for x in out]


def best_schedules(label: str, db_path: str, n: int):
    row = next(r for r in SUBGRAPHS if r[0] == label)
    sg = load_subgraph(row[1], row[2], row[3])
    task = Task(sg.workload.key, sg.workload.compute, Target.host_cpu(), 1, label, float(sg.workload.flops))
    db = open_database(db_path)
    recs = sorted((r for r in db.records() if r.median), key=lambda r: r.median)
    db.close()
    seen, pick = set(), []
    for r in recs:
        if r.schedule_key not in seen and len(pick) < n:
            seen.add(r.schedule_key)
            pick.append(r)
    return task, [schedule_of(r) for r in pick], pick[0].median


def visits(label: str, db_path: str, n: int, passes: int) -> dict:
    task, scheds, best = best_schedules(label, db_path, n)
    m = ProgramMeasurer(LocalBuilder(n_workers=2), LocalRunner(TUNE_TIMING, timeout=20.0), seed=0)
    m.runner.set_best({task.key: best})
    runs = []
    try:
        for _ in range(passes):
            res = m.measure_batch([MeasureInput(task, s) for s in scheds])
            runs.append([list(r.costs) if r.valid else [] for r in res])
    finally:
        m.close()
    ok = [i for i in range(len(scheds)) if all(p[i] for p in runs)]

    def label_of(*ps):
        return np.array([min(c for p in ps for c in runs[p][i]) for i in ok])

    one = [pairwise_accuracy(label_of(p + 3), -label_of(p)) for p in range(passes - 3)]
    two = [pairwise_accuracy(label_of(p + 2, p + 3), -label_of(p, p + 1)) for p in range(0, passes - 3, 2)]
    return {"schedules": len(ok), "one_visit": float(np.mean(one)), "two_visits": float(np.mean(two))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--window-ms", type=float, default=20.0)
    v = sub.add_parser("visits")
    v.add_argument("label", choices=[r[0] for r in SUBGRAPHS])
    v.add_argument("db")
    v.add_argument("--n", type=int, default=40)
    v.add_argument("--passes", type=int, default=6)
    a = ap.parse_args(argv)
    if a.cmd == "probe":
        r = probe(a.seconds, a.window_ms)
        print(" ".join(f"{x:.2f}" for x in r))
        print(f"{len(r)} windows of {a.window_ms:g} ms: {sum(x > 1.1 for x in r)} over 1.1x, "
              f"{sum(x > 2 for x in r)} over 2x (a vCPU stop), median {np.median(r):.2f}")
    else:
        if a.passes < 4 or a.passes % 2:
            raise SystemExit("--passes: an even number, 4 or more")
        r = visits(a.label, a.db, a.n, a.passes)
        print(f"{a.label}: {r['schedules']} schedules; pairwise agreement of two measurements' labels: one visit "
              f"{r['one_visit']:.3f}, two visits {r['two_visits']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
