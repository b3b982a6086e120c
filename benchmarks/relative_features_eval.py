"""Leave-one-workload-out metrics with workload-relative feature columns (session 9, issue #5; not kept).

Each statement row gets its features minus the column-wise median (or mean) of all statement rows of its
workload, appended (`append`) or in place of the originals (`replace`); the model is then evaluated like
`hlotune cost-model eval`.

    .venv/bin/python benchmarks/relative_features_eval.py logs/cost_model_rt.db packrank append
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import hlotune.cost_model.model as cm
from hlotune.cost_model.metrics import mean_metrics
from hlotune.search.cost_model_cli import evaluate_lowo, samples_from_db


def relative(samples, feats, variant: str) -> list:
    """The features with workload-relative columns (see the module docstring)."""
    by: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by.setdefault(s.workload_key, []).append(i)
    out = list(feats)
    for idx in by.values():
        rows = [feats[i] for i in idx if feats[i] is not None and feats[i].shape[0]]
        if not rows:
            continue
        allr = np.concatenate(rows)
        ref = allr.mean(axis=0) if variant == "mean" else np.median(allr, axis=0)
        for i in idx:
            f = feats[i]
            if f is not None:
                out[i] = f - ref if variant == "replace" else np.concatenate([f, f - ref], axis=1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("mode", choices=cm.MODES)
    ap.add_argument("variant", choices=("none", "append", "replace", "mean"))
    a = ap.parse_args()
    t0 = time.time()
    samples = samples_from_db(a.db)
    feats = cm.features_of_samples(samples)
    if a.variant != "none":
        feats = relative(samples, feats, a.variant)
        cm.NUM_FEATURES = next(f.shape[1] for f in feats if f is not None)   # rows of programs without statements
    res = evaluate_lowo(samples, make_model=lambda: cm.CostModel(seed=0, mode=a.mode), feats=feats)
    print(a.mode, a.variant, json.dumps(mean_metrics(res)), f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
