"""How repeatable are the costs a cost model learns from?  The ceiling of pairwise accuracy on a tuning database.

    HLOTUNE_MEASURE_REALTIME=1 .venv/bin/python benchmarks/label_noise.py logs/s21/pretrain.db --per-task 24 \\
        [--json logs/s21/label_noise.json] [--scores SCORES.pkl]

Takes a seeded sample of `--per-task` valid records of every workload in the database, builds each schedule once,
and times all of them in four passes on one runner process: S1 and S2 with the timing of
`make_cost_model_data.py` (3 repeats of >= 5 ms), L1 and L2 with a longer one (7 repeats of >= 10 ms); each pass
visits a task's candidates in a new random order.  Reported, as the mean over workloads (as `hlotune cost-model
eval` averages):
- agreement: the pairwise accuracy of one measurement's order taken as the prediction of another's (all pairs
  with different costs; and only pairs 1.5x or more apart), between the database's own cost ("orig") and the
  passes, and between the passes;
- the ceiling of the metric: a perfect model (the unknown true costs) scored against one measurement reaches
  between q, the agreement of two independent measurements, and `metrics.implied_ceiling(q)` =
  (1 + sqrt(2q - 1)) / 2 (each pair ordered right with probability p_i by each measurement: two agree with
  p_i^2 + (1 - p_i)^2, which is at most p_i);
- the share of pairs within 10 % of each other (the pairs only a low-noise measurement can order).
`--scores`: a pickle {workload key: (costs, scores)} of held-out predictions (costs: the database's, in
`samples_from_db` order of the valid records) to score against the passes too: how much of a model's error is the
noise of the truth it is scored against.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hlotune.cost_model.metrics import implied_ceiling, pairwise_accuracy  # noqa: E402
from hlotune.measure.builder import BuildJob, LocalBuilder  # noqa: E402
from hlotune.measure.reference import task_data  # noqa: E402
from hlotune.measure.runner import LocalRunner, TimingConfig  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.search.cost_model_cli import samples_from_db  # noqa: E402
from hlotune.target import Target  # noqa: E402

SHORT = TimingConfig(warmup_ms=2.0, repeats=3, min_repeat_ms=5.0)    # make_cost_model_data.py's timing
LONG = TimingConfig(warmup_ms=5.0, repeats=7, min_repeat_ms=10.0)
PASSES = (("S1", SHORT), ("L1", LONG), ("S2", SHORT), ("L2", LONG))
PAIRS = (("orig", "S1"), ("orig", "S2"), ("S1", "S2"), ("L1", "L2"), ("S1", "L1"), ("S2", "L2"), ("orig", "L1"))


def pick(db: str, per_task: int, seed: int, target: Target):
    """(samples, their database costs): a seeded sample of valid records per workload, in first-seen order."""
    by: dict[str, list] = {}
    for s in samples_from_db(db, target.fingerprint):
        if s.costs:
            by.setdefault(s.workload_key, []).append(s)
    rng = random.Random(seed)
    out = [s for group in by.values() for s in rng.sample(group, min(per_task, len(group)))]
    return out, [s.cost for s in out]


def time_passes(samples, target: Target, seed: int, log=print) -> dict[str, list[float]]:
    """Build every sample once, then time all of them in each of PASSES; inf where a run failed."""
    tasks = {s.workload_key: Task(s.workload_key, s.compute, target, 1, s.compute.name) for s in samples}
    t0 = time.perf_counter()
    builder = LocalBuilder(n_workers=2)
    try:
        builds = builder.build([BuildJob(s.compute, tuple(s.schedule.steps), target, f"m_{i}")
                                for i, s in enumerate(samples)])
    finally:
        builder.close()
    log(f"built {len(samples)} candidates in {time.perf_counter() - t0:.0f} s")
    data = {k: task_data(t, 0) for k, t in tasks.items()}
    by: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by.setdefault(s.workload_key, []).append(i)
    rng = random.Random(seed)
    runner = LocalRunner(SHORT, timeout=20.0)
    out: dict[str, list[float]] = {}
    try:
        for name, timing in PASSES:
            runner.timing = timing
            t1 = time.perf_counter()
            costs = [math.inf] * len(samples)
            for key, idx in by.items():
                for i in rng.sample(idx, len(idx)):
                    r = runner.run_one(data[key], builds[i])
                    costs[i] = min(r.costs) if r.valid else math.inf
            out[name] = costs
            log(f"pass {name}: {time.perf_counter() - t1:.0f} s")
    finally:
        runner.close()
    return out


def agreement(keys: list[str], pred: list[float], truth: list[float], ratio: float = 1.0) -> float:
    """Mean over workloads (8+ finite pairs of values) of the pairwise accuracy of -pred against truth."""
    per = []
    for k in dict.fromkeys(keys):
        idx = [i for i, kk in enumerate(keys) if kk == k and math.isfinite(pred[i]) and math.isfinite(truth[i])]
        if len(idx) >= 8:
            per.append(pairwise_accuracy([truth[i] for i in idx], [-pred[i] for i in idx], ratio))
    return float(np.nanmean(per)) if per else float("nan")


def close_pairs(keys: list[str], costs: list[float], within: float = 1.1) -> float:
    """Mean over workloads of the share of pairs whose costs are within `within` of each other."""
    per = []
    for k in dict.fromkeys(keys):
        c = np.array([costs[i] for i, kk in enumerate(keys) if kk == k and math.isfinite(costs[i])])
        if len(c) >= 8:
            r = np.maximum(c[:, None], c[None, :]) / np.minimum(c[:, None], c[None, :])
            per.append(((r < within).sum() - len(c)) / (len(c) * (len(c) - 1)))
    return float(np.mean(per)) if per else float("nan")


def model_against_passes(keys, orig, costs, scores_path: str) -> dict[str, float]:
    """Held-out scores (pickle of {key: (database costs, scores)}) scored against each pass and the best of all."""
    sc = pickle.loads(Path(scores_path).read_bytes())
    lookup = {(k, float(c)): float(s) for k, (cs, ss) in sc.items() for c, s in zip(cs, ss)}
    pred = [-lookup.get((k, float(c)), math.nan) for k, c in zip(keys, orig)]   # agreement() negates pred
    truths = dict(costs, orig=orig)
    truths["best of all"] = [min(v[i] for v in truths.values()) for i in range(len(orig))]
    ok = [i for i, p in enumerate(pred) if math.isfinite(p)]
    sub = lambda xs: [xs[i] for i in ok]   # noqa: E731
    return {name: agreement(sub(keys), sub(pred), sub(t)) for name, t in truths.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db", help="tuning database (e.g. one made by make_cost_model_data.py)")
    ap.add_argument("--per-task", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the costs of every pass here")
    ap.add_argument("--scores", default=None, help="held-out predictions to score against every pass (pickle)")
    a = ap.parse_args(argv)
    target = Target.host_cpu()
    samples, orig = pick(a.db, a.per_task, a.seed, target)
    keys = [s.workload_key for s in samples]
    print(f"{len(samples)} records of {len(set(keys))} workloads from {a.db}", flush=True)
    costs = time_passes(samples, target, a.seed, log=lambda m: print(m, flush=True))
    if a.json:
        Path(a.json).write_text(json.dumps({"keys": keys, "orig": orig, **costs}))
    allc = dict(costs, orig=orig)
    print("\n| measurements | agreement q (all pairs) | agreement (pairs >= 1.5x apart) | implied_ceiling(q) |")
    print("|---|---|---|---|")
    for x, y in PAIRS:
        q = agreement(keys, allc[x], allc[y])
        print(f"| {x} vs {y} | {q:.3f} | {agreement(keys, allc[x], allc[y], 1.5):.3f} | {implied_ceiling(q):.3f} |")
    print(f"\npairs within 10 % of each other (S1): {close_pairs(keys, costs['S1']):.3f}")
    if a.scores:
        got = model_against_passes(keys, orig, costs, a.scores)
        print("held-out model's pairwise accuracy against: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
