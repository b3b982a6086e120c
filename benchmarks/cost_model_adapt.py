"""How well a pretrained cost model ranks a run's later candidates after learning its first ones (offline).

For each tuning database (one task each, records in measured order), load the pretrained model, warm-start it on
the first n records in the tuner's warm-up parts (8, 8, 16, 16, 16), then rank the run's remaining valid records:
pairwise accuracy, peak@1, peak@5 and top8 (the best latency over the best among the model's top 8: what one
warm-up part of 8 would find).  Means over the databases, per kind of run (evolutionary / random / optuna) and n.

Variants change the model's training constants (`--set WARM_ROUNDS=40`, `--set P.min_child_weight=1` for an
XGBoost parameter of the warm trees) or multiply the scores by 2^(-k est_prog), the analytic estimate
(`--prior K`).  The records' costs are the run's own in-run timings.

    .venv/bin/python benchmarks/cost_model_adapt.py --model logs/s26/scratch/pretrained.json \\
        logs/s26/scratch/*-evolutionary-s*.db logs/s26/scratch/*-random-s*.db [--set NAME=VALUE ...] [--prior K]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hlotune.cost_model.model as M  # noqa: E402
from hlotune.cost_model.features import FEATURE_NAMES  # noqa: E402
from hlotune.cost_model.metrics import task_metrics  # noqa: E402
from hlotune.search.cost_model_cli import samples_from_db  # noqa: E402

PARTS = ((0, 8), (8, 16), (16, 32), (32, 48), (48, 64))


def kind_of(path: str) -> str:
    return next((k for k in ("evolutionary", "random", "optuna") if f"-{k}-" in Path(path).name), "other")


def apply_sets(sets: list[str]) -> dict:
    """Module constants set in place; returns the XGBoost parameter overrides (P.name=value)."""
    params = {}
    for kv in sets:
        name, _, val = kv.partition("=")
        if name.startswith("P."):
            params[name[2:]] = int(val) if val.isdigit() else float(val)
        elif hasattr(M, name):
            setattr(M, name, type(getattr(M, name))(float(val)))
        else:
            raise SystemExit(f"unknown setting {name!r}")
    return params


def adapted(model_path: str, samples: list, n: int, params: dict | None = None):
    """The pretrained model warm-started on a run's first n records in the tuner's warm-up parts."""
    model = M.CostModel.load(model_path)
    model.params.update(params or {})
    for a, b in PARTS:
        if b <= n:
            model.update(samples[a:b])
    return model


def one_run(samples: list, feats: list, model_path: str, n: int, params: dict, prior: float) -> dict:
    """The metrics of one run's records after n (the records of one database and their features)."""
    model = adapted(model_path, samples, n, params)
    rest = [i for i in range(n, len(samples)) if samples[i].costs and feats[i] is not None]
    if len(rest) < 8:
        return {}
    p = model.predict_features([feats[i] for i in rest])
    if prior:
        est = np.array([feats[i][0, FEATURE_NAMES.index("est_prog")] for i in rest])
        p = np.log2(np.maximum(p, 1e-3)) - prior * est
    costs = np.array([samples[i].cost for i in rest])
    out = task_metrics(list(costs), p)
    out["top8"] = float(costs.min() / costs[np.argsort(-p, kind="stable")[:8]].min())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dbs", nargs="+")
    ap.add_argument("--model", required=True, help="the pretrained model (never trained on these tasks)")
    ap.add_argument("--n", type=int, nargs="+", default=[8, 16, 32], help="records learnt before ranking")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--prior", type=float, default=0.0, metavar="K")
    a = ap.parse_args(argv)
    params = apply_sets(a.set)
    warnings.simplefilter("ignore")
    res: dict[tuple[str, int], list[dict]] = {}
    for path in a.dbs:
        samples = samples_from_db(path)
        feats = M.features_of_samples(samples)
        for n in a.n:
            m = one_run(samples, feats, a.model, n, params, a.prior)
            if m:
                res.setdefault((kind_of(path), n), []).append(m)
    label = " ".join(a.set + ([f"prior={a.prior}"] if a.prior else [])) or "as shipped"
    cols = ("pairwise_accuracy", "peak@1", "peak@5", "top8")
    print(f"{label}: mean over runs of " + ", ".join(cols))
    for (kind, n), ms in sorted(res.items()):
        means = " ".join(f"{np.mean([m[c] for m in ms]):.3f}" for c in cols)
        print(f"  {kind:12s} n={n:3d} runs={len(ms):2d} {means}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
