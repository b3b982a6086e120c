"""Ranking metrics of a cost model (per task; the search only ever compares candidates of one task).

Map:
  pairwise_accuracy(costs, scores)    fraction of pairs with different costs that the scores order correctly
                                      (higher score = faster); ties in score count one half
  peak_at_k(costs, scores, k)         best cost / best cost among the k highest scores (1.0 = found the best)
  task_metrics(costs, scores, ks)     both, as a dict
  mean_metrics(per_task)              the unweighted mean over tasks of each metric
"""

from __future__ import annotations

import numpy as np


def pairwise_accuracy(costs, scores) -> float:
    """Over all pairs (i, j) with costs[i] != costs[j]: 1 when the faster one has the higher score, 1/2 on a
    score tie.  NaN with fewer than one such pair.  Failed candidates (cost inf) count as slowest."""
    c = np.asarray(costs, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    faster = c[:, None] < c[None, :]
    n = faster.sum()
    if n == 0:
        return float("nan")
    ds = s[:, None] - s[None, :]
    good = (faster & (ds > 0)).sum() + 0.5 * (faster & (ds == 0)).sum()
    return float(good / n)


def peak_at_k(costs, scores, k: int) -> float:
    """min(costs) / min(costs of the k highest-scoring candidates); ties broken by position (stable)."""
    c = np.asarray(costs, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if c.size == 0 or not np.isfinite(c).any():
        return float("nan")
    top = np.argsort(-s, kind="stable")[:k]
    best_top = c[top].min()
    return float(c.min() / best_top) if np.isfinite(best_top) else 0.0


def task_metrics(costs, scores, ks=(1, 5)) -> dict[str, float]:
    out = {"pairwise_accuracy": pairwise_accuracy(costs, scores)}
    for k in ks:
        out[f"peak@{k}"] = peak_at_k(costs, scores, k)
    return out


def mean_metrics(per_task: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean over tasks of every metric (NaNs skipped)."""
    keys = sorted({k for m in per_task.values() for k in m})
    return {k: float(np.nanmean([m[k] for m in per_task.values() if k in m])) for k in keys} if per_task else {}
