"""A learning curve of the cost model: held-out ranking against the number of workloads it was trained on.

For every workload of the database (with 8+ valid records), train a fresh model on a random fraction of the
OTHER workloads (all their records) and score the held-out one, as `hlotune cost-model eval` does with the
fraction 1.  Fractions below 1 are drawn `--reps` times (each held-out workload its own seeded draw).  The
means over the held-out workloads show how fast accuracy grows with the number of training workloads, i.e.
how far more workloads of the same kind could carry it.

    .venv/bin/python benchmarks/cost_model_curve.py logs/s23/pretrain.db --mode packsum --fractions 0.125 0.25 0.5 1
"""

from __future__ import annotations

import argparse
import random
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hlotune.cost_model.metrics import mean_metrics, task_metrics  # noqa: E402
from hlotune.cost_model.model import MODES, CostModel, CostModelWarning, features_of_samples  # noqa: E402
from hlotune.search.cost_model_cli import samples_from_db  # noqa: E402

COLS = ("pairwise_accuracy", "pairwise@1.5x", "peak@1", "peak@5")


def held_out_metrics(samples, feats, keys, others_of, frac: float, rep: int, mode: str) -> dict[str, float]:
    """Mean metrics over `keys`, each scored by a model trained on a `frac` draw of its other workloads."""
    per = {}
    for k in keys:
        others = others_of[k]
        rng = random.Random(zlib.crc32(f"{k}/{rep}/{frac}".encode()))
        chosen = set(rng.sample(others, max(1, int(round(frac * len(others))))))
        train = [i for i, s in enumerate(samples) if s.workload_key in chosen]
        model = CostModel(seed=0, mode=mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CostModelWarning)
            model.fit([samples[i] for i in train], [feats[i] for i in train])
        test = [i for i, s in enumerate(samples) if s.workload_key == k and s.costs]
        per[k] = task_metrics([samples[i].cost for i in test], model.predict_features([feats[i] for i in test]))
    return mean_metrics(per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db", nargs="+", help="databases of measured records (e.g. from make_cost_model_data.py)")
    ap.add_argument("--mode", default="packsum", choices=MODES)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0])
    ap.add_argument("--reps", type=int, default=2, help="draws per fraction below 1")
    a = ap.parse_args(argv)
    samples = [s for spec in a.db for s in samples_from_db(spec)]
    feats = features_of_samples(samples)
    ok = [i for i, f in enumerate(feats) if f is not None]
    samples, feats = [samples[i] for i in ok], [feats[i] for i in ok]
    workloads = sorted({s.workload_key for s in samples})
    keys = [k for k in workloads if sum(1 for s in samples if s.workload_key == k and s.costs) >= 8]
    others_of = {k: [w for w in workloads if w != k] for k in keys}
    print(f"{len(samples)} records, {len(workloads)} workloads, {len(keys)} held out in turn; mode {a.mode}")
    print("| fraction | training workloads | draws | " + " | ".join(COLS) + " |")
    print("|---" * (3 + len(COLS)) + "|")
    for frac in a.fractions:
        runs = [held_out_metrics(samples, feats, keys, others_of, frac, rep, a.mode)
                for rep in range(a.reps if frac < 1 else 1)]
        n = max(1, int(round(frac * (len(workloads) - 1))))
        means = " | ".join(f"{np.mean([r[c] for r in runs]):.3f}" for c in COLS)
        print(f"| {frac:g} | {n} | {len(runs)} | {means} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
