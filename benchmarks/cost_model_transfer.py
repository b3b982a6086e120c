"""Cost-model transfer: does a model pretrained on other workloads find a new workload's fast schedules in
fewer trials than a cold (random until it has data) model?

    .venv/bin/python benchmarks/cost_model_transfer.py --db logs/cost_model_data.db [--holdout 6] [--seeds 3]

A simulation over a pool of measured candidates (real tuning of a held-out workload takes minutes per seed on
this 2-core machine, and its timings would be noisy under the other jobs; the pool's timings are fixed, so the
two arms see exactly the same costs).  For each held-out workload W (the `--holdout` workloads with the most
valid records, bigger than `--min-us`):
  1. pretrain: a CostModel on the records of every other workload (saved to a file and loaded back, as
     `hlotune tune --cost-model PATH` does);
  2. search: rounds of `--batch` picks from W's pool of measured schedules: the model scores the unmeasured
     ones, the top `batch - n_random` plus `n_random` random ones (epsilon-greedy, as the evolutionary search)
     are "measured" (their recorded cost), then the model is updated with them (`CostModel.update`);
     arms: pretrained (loaded, warm-started by updates), cold (`CostModel()`, random until MIN_SAMPLES),
     random (no model);
  3. score: trials until the best found is within 90% of the pool's best throughput (cost <= best / 0.9).
Each arm runs with `--seeds` seeds (the random picks and the cold model's random scores).  Prints a table and
the median ratio pretrained / cold.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hlotune.cost_model.model import CostModel, Sample, features_of_samples  # noqa: E402
from hlotune.search.cost_model_cli import samples_from_db  # noqa: E402


class _T:
    def __init__(self, key, compute):
        self.key, self.compute = key, compute


def trials_to_90(costs_in_order: list[float], best: float) -> int:
    """1-based index of the first trial within 90% of `best` throughput (len + 1 if never)."""
    for i, c in enumerate(costs_in_order):
        if c <= best / 0.9:
            return i + 1
    return len(costs_in_order) + 1


def simulate(pool: list[Sample], feats: list, model, seed: int, batch: int, eps: float) -> list[float]:
    """The costs in the order a model-guided search over `pool` measures them."""
    rng = random.Random(seed)
    left = list(range(len(pool)))
    order: list[float] = []
    n_rand = max(1, round(eps * batch))
    while left:
        if model is None:
            pick = rng.sample(left, min(batch, len(left)))
        else:
            sc = model.predict_features([feats[i] for i in left]) if getattr(model, "trained", False) else \
                model.predict(None, left)
            ranked = [left[j] for j in np.argsort(-np.asarray(sc), kind="stable")]
            pick = ranked[: max(0, batch - n_rand)]
            rest = [i for i in left if i not in set(pick)]
            pick += rng.sample(rest, min(len(rest), batch - len(pick)))
        for i in pick:
            left.remove(i)
        order += [pool[i].cost for i in pick]
        if model is not None and hasattr(model, "update"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.update([pool[i] for i in pick])
    return order


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default="logs/cost_model_data.db")
    ap.add_argument("--holdout", type=int, default=6, help="how many held-out workloads")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eps", type=float, default=0.05, help="fraction of random picks per batch")
    ap.add_argument("--min-us", type=float, default=20.0, help="only workloads whose best is at least this slow")
    ap.add_argument("--mode", default="packsum")
    a = ap.parse_args(argv)
    samples = samples_from_db(a.db)
    all_feats = features_of_samples(samples)          # once (they do not depend on the model)
    by: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by.setdefault(s.workload_key, []).append(i)
    cands = [k for k, g in by.items() if min(samples[i].cost for i in g) >= a.min_us * 1e-6]
    cands.sort(key=lambda k: -sum(1 for i in by[k] if samples[i].costs))
    held = cands[: a.holdout]
    print(f"{len(samples)} records, {len(by)} workloads; held out: {len(held)}", flush=True)
    rows = []
    for k in held:
        idx = [i for i in by[k] if samples[i].costs and all_feats[i] is not None]
        pool, feats = [samples[i] for i in idx], [all_feats[i] for i in idx]
        best = min(s.cost for s in pool)
        rest = [i for i, s in enumerate(samples) if s.workload_key != k]
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pre = CostModel(seed=0, mode=a.mode).fit([samples[i] for i in rest], [all_feats[i] for i in rest])
        t_pre = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "pre.json"
            pre.save(path)
            res: dict[str, list[int]] = {"pretrained": [], "cold": [], "random": []}
            for seed in range(a.seeds):
                res["pretrained"].append(trials_to_90(simulate(pool, feats, CostModel.load(path), seed, a.batch,
                                                               a.eps), best))
                res["cold"].append(trials_to_90(simulate(pool, feats, CostModel(seed=seed, mode=a.mode), seed,
                                                         a.batch, a.eps), best))
                res["random"].append(trials_to_90(simulate(pool, feats, None, seed, a.batch, a.eps), best))
        rows.append((f"{pool[0].compute.name} ({k})", len(pool), best, res, t_pre))
        print(f"{k}: pool {len(pool)}, best {best * 1e6:.1f} us, trials to 90%: "
              + "  ".join(f"{arm} {v}" for arm, v in res.items()) + f"  (pretrain {t_pre:.1f} s)", flush=True)
    print("\n| held-out workload | pool | best (us) | pretrained | cold | random |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for k, n, best, res, _ in rows:
        med = {arm: float(np.median(v)) for arm, v in res.items()}
        ratios.append(med["pretrained"] / med["cold"] if med["cold"] else math.nan)
        print(f"| {k} | {n} | {best * 1e6:.1f} | " + " | ".join(
            f"{med[arm]:.0f} ({', '.join(map(str, res[arm]))})" for arm in ("pretrained", "cold", "random")) + " |")
    if ratios:
        print(f"\nmedian over workloads of (median trials pretrained / median trials cold): "
              f"{float(np.nanmedian(ratios)):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
