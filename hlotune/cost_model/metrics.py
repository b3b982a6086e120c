"""Ranking metrics of a cost model (per task; the search only ever compares candidates of one task).

Map:
  pairwise_accuracy(costs, scores, min_ratio)   fraction of pairs with different costs (at least min_ratio
                                      apart) that the scores order correctly (higher = faster); score ties: 1/2
  repeat_agreement(costs_lists)       second-last repeat as the prediction of the last: the noise ceiling
                                      within one measurement
  remeasure_agreement(groups)         the same between independent measurements of identical programs
  implied_ceiling(q)                  upper estimate of a perfect model's pairwise accuracy against one measurement,
                                      given that two independent measurements agree on a fraction q of the pairs
                                      (the accuracy itself lies between q and it)
  peak_at_k(costs, scores, k)         best cost / best cost among the k highest scores (1.0 = found the best)
  task_metrics(costs, scores, ks)     both, as a dict (plus pairwise accuracy on pairs >= 1.5x apart)
  mean_metrics(per_task)              the unweighted mean over tasks of each metric
"""

from __future__ import annotations

import numpy as np


def pairwise_accuracy(costs, scores, min_ratio: float = 1.0) -> float:
    """Over all pairs (i, j) with costs[i] != costs[j] (with `min_ratio` > 1: only pairs whose costs differ by
    at least that factor, i.e. beyond the timing noise): 1 when the faster one has the higher score, 1/2 on a
    score tie.  NaN with fewer than one such pair.  Failed candidates (cost inf) count as slowest."""
    c = np.asarray(costs, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    faster = c[:, None] * min_ratio < c[None, :] if min_ratio > 1.0 else c[:, None] < c[None, :]
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


def task_metrics(costs, scores, ks=(1, 5), min_ratio: float = 1.5) -> dict[str, float]:
    """pairwise_accuracy (all pairs), pairwise_accuracy@{min_ratio}x (pairs at least that far apart) and
    peak@k for each k."""
    out = {"pairwise_accuracy": pairwise_accuracy(costs, scores)}
    if min_ratio > 1.0:
        out[f"pairwise@{min_ratio:g}x"] = pairwise_accuracy(costs, scores, min_ratio)
    for k in ks:
        out[f"peak@{k}"] = peak_at_k(costs, scores, k)
    return out


def mean_metrics(per_task: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean over tasks of every metric (NaNs skipped)."""
    keys = sorted({k for m in per_task.values() for k in m})
    return {k: float(np.nanmean([m[k] for m in per_task.values() if k in m])) for k in keys} if per_task else {}


def repeat_agreement(costs_lists, min_ratio: float = 1.0) -> float:
    """`pairwise_accuracy` of the second-last repeat used as a prediction (score = -that repeat) against the last
    repeat as the truth, over candidates with at least two repeats: how well a perfect model could do when the
    truth is one noisy measurement (the noise ceiling of the metric).  NaN with too few."""
    runs = [c for c in costs_lists if len(c) >= 2]
    if len(runs) < 2:
        return float("nan")
    return pairwise_accuracy([c[-1] for c in runs], [-c[-2] for c in runs], min_ratio)


def remeasure_agreement(groups, min_ratio: float = 1.0) -> tuple[float, int]:
    """How often two independent measurements order a pair of programs alike: `groups` holds, per program
    measured at least twice (e.g. different schedules that lower to identical code), the costs of its separate
    measurements.  Over all pairs of groups (A, B), the order of (A[0], B[0]) is taken as the prediction of
    the order of (A[1], B[1]) (pairs whose second costs are tied, or less than `min_ratio` apart, skipped).
    Returns (agreement, pairs); NaN with none.  Unlike `repeat_agreement`, this includes what changes between
    measurements (other processes, frequency, memory placement), so it is the ceiling that matters for
    ranking different candidates."""
    g = [(float(x[0]), float(x[1])) for x in groups if len(x) >= 2]
    if len(g) < 2:
        return float("nan"), 0
    a = np.array(g)
    first, second = a[:, 0], a[:, 1]
    faster2 = second[:, None] * min_ratio < second[None, :] if min_ratio > 1.0 else second[:, None] < second[None, :]
    n = int(faster2.sum())
    if n == 0:
        return float("nan"), 0
    d1 = first[:, None] - first[None, :]
    good = (faster2 & (d1 < 0)).sum() + 0.5 * (faster2 & (d1 == 0)).sum()
    return float(good / n), n


def implied_ceiling(q: float) -> float:
    """An upper estimate of a perfect model's pairwise accuracy against one noisy measurement, from q, the agreement
    of two independent measurements (`remeasure_agreement`, benchmarks/label_noise.py).  If each measurement orders
    pair i like the true costs with probability p_i, two of them agree on it with p_i^2 + (1 - p_i)^2 <= p_i, so the
    perfect model's accuracy, mean(p_i), lies between q and (1 + sqrt(2q - 1)) / 2, the value returned (Jensen: that
    is p when every pair is alike; close pairs, p_i near 1/2, pull the truth toward q).  NaN for NaN; 1/2 for
    q <= 1/2."""
    if q != q:
        return float("nan")
    return float((1.0 + np.sqrt(max(2.0 * float(q) - 1.0, 0.0))) / 2.0)
