"""How repeatable are the costs a cost model learns from?  The ceiling of pairwise accuracy on a tuning database.

    HLOTUNE_MEASURE_REALTIME=1 .venv/bin/python benchmarks/label_noise.py logs/s21/pretrain.db --per-task 24 \\
        [--json logs/s21/label_noise.json] [--lowo packrank]

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
`--lowo MODE`: also train a cost model of that mode leave one workload out on the whole database
(`cost_model_cli.lowo_predictions`, as `hlotune cost-model eval --mode MODE`) and score its held-out predictions of
the sampled records against every pass and the best of all timings: how much of the model's error is the noise of
the truth it is scored against.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hlotune.cost_model.metrics import implied_ceiling, pairwise_accuracy  # noqa: E402
from hlotune.cost_model.model import CostModel  # noqa: E402
from hlotune.measure.builder import BuildJob, LocalBuilder  # noqa: E402
from hlotune.measure.reference import task_data  # noqa: E402
from hlotune.measure.runner import LocalRunner, TimingConfig  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.search.cost_model_cli import lowo_predictions, samples_from_db  # noqa: E402
from hlotune.target import Target  # noqa: E402

SHORT = TimingConfig(warmup_ms=2.0, repeats=3, min_repeat_ms=5.0)    # make_cost_model_data.py's timing
LONG = TimingConfig(warmup_ms=5.0, repeats=7, min_repeat_ms=10.0)
PASSES = (("S1", SHORT), ("L1", LONG), ("S2", SHORT), ("L2", LONG))
PAIRS = (("orig", "S1"), ("orig", "S2"), ("S1", "S2"), ("L1", "L2"), ("S1", "L1"), ("S2", "L2"), ("orig", "L1"))


def groups(keys: list[str]) -> dict[str, list[int]]:
    """Positions of each workload key, keys in first-seen order."""
    by: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by.setdefault(k, []).append(i)
    return by


def pick(samples, per_task: int, seed: int) -> list[int]:
    """Positions of a seeded sample of `per_task` valid records per workload, workloads in first-seen order."""
    rng = random.Random(seed)
    valid = [i for i, s in enumerate(samples) if s.costs]
    by = groups([samples[i].workload_key for i in valid])
    return [valid[j] for idx in by.values() for j in rng.sample(idx, min(per_task, len(idx)))]


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
    by = groups([s.workload_key for s in samples])
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
    for idx in groups(keys).values():
        idx = [i for i in idx if math.isfinite(pred[i]) and math.isfinite(truth[i])]
        if len(idx) >= 8:
            per.append(pairwise_accuracy([truth[i] for i in idx], [-pred[i] for i in idx], ratio))
    return float(np.nanmean(per)) if per else float("nan")


def close_pairs(keys: list[str], costs: list[float], within: float = 1.1) -> float:
    """Mean over workloads of the share of pairs whose costs are within `within` of each other."""
    per = []
    for idx in groups(keys).values():
        c = np.array([costs[i] for i in idx if math.isfinite(costs[i])])
        if len(c) >= 8:
            r = np.maximum(c[:, None], c[None, :]) / np.minimum(c[:, None], c[None, :])
            per.append(((r < within).sum() - len(c)) / (len(c) * (len(c) - 1)))
    return float(np.mean(per)) if per else float("nan")


def model_against_passes(keys: list[str], scores: list[float], costs: dict[str, list[float]],
                         orig: list[float]) -> dict[str, float]:
    """`agreement` of a model's scores (higher = faster; NaN: no prediction) with the database's costs, each pass
    and the best of all of them."""
    truths = dict(costs, orig=orig)
    truths["best of all"] = [min(v[i] for v in truths.values()) for i in range(len(orig))]
    pred = [-x for x in scores]   # agreement() takes costs-like predictions; NaN is not finite: left out
    return {name: agreement(keys, pred, t) for name, t in truths.items()}


def lowo_scores(samples, picked: list[int], mode: str) -> list[float]:
    """Held-out scores of the picked samples: each workload predicted by a model trained on all others."""
    score = {i: float(v) for idx, sc in lowo_predictions(samples, lambda: CostModel(seed=0, mode=mode)).values()
             for i, v in zip(idx, sc)}
    return [score.get(i, math.nan) for i in picked]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db", help="tuning database (e.g. one made by make_cost_model_data.py)")
    ap.add_argument("--per-task", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the costs of every pass here")
    ap.add_argument("--lowo", default=None, choices=("packrank", "packsum"),
                    help="score a cost model of this mode, trained leave one workload out, against every pass")
    a = ap.parse_args(argv)
    target = Target.host_cpu()
    every = samples_from_db(a.db, target.fingerprint)
    picked = pick(every, a.per_task, a.seed)
    samples = [every[i] for i in picked]
    orig = [s.cost for s in samples]
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
    if a.lowo:
        got = model_against_passes(keys, lowo_scores(every, picked, a.lowo), costs, orig)
        print("held-out model's pairwise accuracy against: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
