"""The cost model's estimate columns (feature version 5): a hand-computed roofline time, the workload's ideal time,
the order they give two schedules of a memory-bound subgraph, and the model's monotone constraint on them."""

import math
import random
import warnings

import numpy as np
import pytest

import hlotune
from hlotune.cost_model import features as F
from hlotune.cost_model.fast_features import batch_features
from hlotune.cost_model.model import CostModel, CostModelWarning, Sample
from hlotune.ir.workload import bytes_moved, flops
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.steps import Schedule
from hlotune.schedule_space.task import Task
from hlotune.search.space import TaskSpace, sample_random
from hlotune.target import Target
from tests.conftest import model_path
from tests.null.test_features import _matmul_func

COL = {n: i for i, n in enumerate(F.FEATURE_NAMES)}


def _subgraph(model: str, kind: str = "hlo", i: int = 0):
    return hlotune.load_model(str(model_path(model, kind))).frontend.subgraphs[i].workload


def test_estimate_columns_hand_computed():
    """C[8, 16] += A[8, 32] B[32, 16], i parallel, j vectorized (16): the estimate from the counts by hand."""
    ideal = -20.0
    x = F.features_of_func(_matmul_func(), ideal)[0]
    threads, vbits, _, _ = F.machine()
    lanes = min(16, max(1, vbits // 32))
    thr = threads * 8 / (threads * math.ceil(8 / threads))              # 8 parallel iterations on the threads
    t_cmp = 2 * 8 * 32 * 16 / (lanes * thr) / F.EST_OPS_PER_S            # a multiply-add counts 2
    uniq = (8 * 16 + 8 * 32 + 32 * 16) * 4                                # C, A, B once: all fits L2
    lines = (2 * 4096 / 16 + 4096 / 16 + 4096 / 16) * 64                  # C read+written, A, B: 16 floats a line
    mem = max(uniq, min(lines, lines / 4096 + uniq))                      # the whole nest fits L2 (4096 executions)
    t_mem = mem / ((F.EST_PAR_BW if thr > 1 else 1.0) * F.EST_BYTES_PER_S)
    est = max(t_cmp, t_mem) + F.EST_LAUNCH_S                              # one parallel launch
    lg = lambda v: math.log2(1e-12 + v)  # noqa: E731
    assert x[COL["est_compute"]] == pytest.approx(lg(t_cmp))
    assert x[COL["est_memory"]] == pytest.approx(lg(t_mem))
    assert x[COL["est_stmt"]] == pytest.approx(lg(est))
    assert x[COL["est_prog"]] == pytest.approx(lg(est))                 # one statement
    assert x[COL["est_rel_stmt"]] == pytest.approx(lg(est) - ideal)
    assert x[COL["est_rel_memory"]] == pytest.approx(lg(t_mem) - ideal)


def test_ideal_time_and_relative_columns():
    """ideal_log2 = log2 of the longer of FLOPs at the ideal rate and bytes at the ideal bandwidth; every est_rel_*
    column is its est_* column minus it, in the fast path as in the exact one."""
    w = _subgraph("dense_bias_relu")
    threads = F.machine()[0]
    want = math.log2(max(flops(w.compute) / (F.EST_IDEAL_FLOPS_PER_S * threads),
                         bytes_moved(w.compute) / (F.EST_BYTES_PER_S * F.EST_PAR_BW)))
    assert F.ideal_log2(w.compute) == pytest.approx(want)
    task = Task(w.key, w.compute, Target.host_cpu(), 1, "dbr", float(w.flops))
    scheds = sample_random(TaskSpace(task), random.Random(0), 24)
    for X in batch_features(w.compute, scheds, w.key):
        assert X is not None and X.shape[1] == F.NUM_FEATURES
        for a, b in (("est_rel_stmt", "est_stmt"), ("est_rel_prog", "est_prog"), ("est_rel_compute", "est_compute"),
                     ("est_rel_memory", "est_memory")):
            np.testing.assert_allclose(X[:, COL[a]], X[:, COL[b]] - want, atol=1e-9)
        # (each est_stmt carries the 1e-12 s floor of the logarithm once: a few 1e-6 in log2 for microsecond programs)
        np.testing.assert_allclose(X[:, COL["est_prog"]], np.log2(np.exp2(X[:, COL["est_stmt"]]).sum()), atol=1e-4)


def test_estimate_orders_a_memory_bound_subgraph():
    """relu_chain at its bench size (10M elements): the default schedule (parallel, vectorized) is estimated faster
    than the same subgraph with no schedule at all (one serial scalar loop)."""
    w = _subgraph("relu_chain", "bench.hlo")
    dflt = Schedule(w.key, tuple(default_schedule(w.compute)))
    plain = Schedule(w.key, ())
    Xd, Xp = batch_features(w.compute, [dflt, plain], w.key)
    assert Xd[0, COL["est_prog"]] < Xp[0, COL["est_prog"]] - 0.3
    assert Xd[0, COL["est_compute"]] < Xp[0, COL["est_compute"]] - 2.0     # 16 or 8 lanes x 2 threads


def _random_label_model(constraints: str | None):
    w = _subgraph("dense_bias_relu")
    task = Task(w.key, w.compute, Target.host_cpu(), 1, "dbr", float(w.flops))
    scheds = sample_random(TaskSpace(task), random.Random(3), 96)
    rng = np.random.default_rng(0)
    samples = [Sample(w.key, w.compute, s, (float(rng.uniform(1e-6, 1e-3)),)) for s in scheds]
    params = None if constraints is None else {"monotone_constraints": constraints}
    m = CostModel(seed=0, params=params, min_samples=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CostModelWarning)
        m.fit(samples)
    assert m.trained
    return m, [f for f in batch_features(w.compute, scheds, w.key) if f is not None]


def _raises_with_estimate(m, feats) -> int:
    """Programs whose score rises when their estimate columns rise (everything else equal)."""
    base = m.predict_features(feats)
    worse = 0
    for d in (0.5, 2.0, 8.0):
        moved = []
        for X in feats:
            Y = X.copy()
            for n in F.MONOTONE_DECREASING:
                Y[:, COL[n]] += d
            moved.append(Y)
        worse += int((m.predict_features(moved) > base + 1e-9).sum())
    return worse


def test_model_score_never_rises_with_the_estimate():
    """Trained on random labels (so nothing but the constraint makes it monotone), the model's score of a program
    never rises when its estimates rise; the same model without the constraint does rise for some."""
    m, feats = _random_label_model(None)
    assert "-1" in m.params["monotone_constraints"]
    assert _raises_with_estimate(m, feats) == 0
    free, feats = _random_label_model("()")
    assert _raises_with_estimate(free, feats) > 0
