"""The learned cost model (XGBoost over per-statement features) and a random model with the same interface.

Map:
  Sample                 one measured schedule: workload key, compute definition, schedule, costs (seconds;
                         empty = failed)
  as_samples(items)      Samples from Samples, (Task, Schedule, costs) tuples or objects with .task/.schedule/.costs
  features_of_samples    features of each sample (fast path, batched per workload)
  labels(samples)        normalized throughput: best cost of the task / cost (cost = fastest repeat; failed = 0)
  RandomModel            seeded random scores; fit/update/save are no-ops
  CostModel              XGBoost; `mode` "packsum" (the default; Ansor: a program's score is the sum of its
                         statements' predictions, trained with a weighted squared loss against the normalized
                         throughput), "packrank" (the same sums trained with a weighted pairwise logistic loss
                         within each task: `pair_weights`, `_pair_objective`; better held-out pairwise accuracy,
                         not yet the tuner's default: see docs/cost_model.md), "reg" (one row
                         per program: sum and max of its statement features, weighted squared loss) or "rank"
                         (the same rows, rank:pairwise per task; slow)
  pair_weights(y)        packrank's weights of the pairs of one task (fast programs and far-apart pairs count more)
  monotone_constraints(mode)   XGBoost's monotone constraints of every mode: the score may only fall as a program's
                         estimated time rises (the est_* columns of features.MONOTONE_DECREASING; feature version 5)
    .fit(samples, feats=None) .update(samples) .predict(task, schedules) .predict_features(feats)
    .save(path) CostModel.load(path)
  load_model_file(path)  CostModel.load with the checks (corrupt / other format / version -> InputError)

Training rules: until MIN_SAMPLES valid samples of at least 2 distinct costs exist the model stays random
(a warning says so).  `update` keeps every sample and trains when the data grew by RETRAIN_GROWTH (and by at
least RETRAIN_MIN_NEW samples) since the last training: a warm start (WARM_ROUNDS more trees fitted on all
the data, continuing from the current ones) while the data is less than twice what the last full training
saw, else a full retrain (`rounds` trees from scratch).  A model loaded from a file (pretrained) is always
warm-started, so its trees keep what they learned on other workloads, until MAX_WARM_TREES trees were added;
then it is retrained from scratch on the local data.  Labels: per task, best cost / cost (the cost of a sample
is its fastest repeat: on a shared machine other jobs only slow repeats down); failed candidates get 0.
packsum weights: max(label, MIN_WEIGHT), so fast programs count more; packrank weighs each pair (i faster
than j) by max(y_i, y_j) x min(|log2(y_i / y_j)|, PAIR_LOG_CAP) x (the LambdaRank discount change of the pair
in the current ranking, recomputed every round, + PAIR_DISCOUNT_FLOOR), normalized per task, and its scores are
reported as 2^(score / RANK_SCALE) (a throughput-like scale; the ranking is the same).
XGBoost runs with one thread (`nthread` 1):
training happens between measurements and other jobs share the cores; with two threads on this 2-core
machine under load it was several times slower.  Everything is seeded.
"""

from __future__ import annotations

import base64
import json
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .fast_features import batch_features
from .features import FEATURE_NAMES, FEATURE_VERSION, MONOTONE_DECREASING, NUM_FEATURES

MODES = ("packrank", "packsum", "rank", "reg")
MODEL_FORMAT = "hlotune-cost-model"
MODEL_VERSION = 1
MIN_SAMPLES = 32
RETRAIN_GROWTH = 0.25
RETRAIN_MIN_NEW = 8
MAX_WARM_TREES = 200
MIN_WEIGHT = 0.1
WARM_ROUNDS = 20
PAIR_LOG_CAP = 2.0
PAIR_TOP_POWER = 1.0
RANK_SCALE = 2.2
PAIR_DISCOUNT = True       # LambdaRank: weigh pairs by the change of the rank discount 1/log2(2 + rank)
PAIR_DISCOUNT_FLOOR = 0.05   # plus this, so pairs far down the ranking still count
PAIR_GROUP = 512

DEFAULT_PARAMS = {"max_depth": 5, "eta": 0.2, "subsample": 1.0, "colsample_bytree": 1.0, "min_child_weight": 5,
                  "gamma": 0.003, "lambda": 1.0, "nthread": 1, "tree_method": "hist"}


def monotone_constraints(mode: str) -> str:
    """XGBoost's monotone_constraints for `mode`'s rows: -1 (the score may only fall as the column rises) on the
    estimate columns of `features.MONOTONE_DECREASING`, 0 elsewhere; "reg" / "rank" rows hold each column twice
    (sum, max).  Measured (docs/cost_model.md, session 15): with the constraint the estimate columns raise held-out
    peak@5 by 0.01-0.05 on two sets; on a snapshot without it they left peak@5 level (0.874 -> 0.875, 0.902 with)."""
    one = ["-1" if n in MONOTONE_DECREASING else "0" for n in FEATURE_NAMES]
    return "(" + ",".join(one if mode in ("packsum", "packrank") else one + one) + ")"


class CostModelWarning(UserWarning):
    """The model could not be trained (too little data) and stays random."""


@dataclass(frozen=True)
class Sample:
    workload_key: str
    compute: Any
    schedule: Any
    costs: tuple[float, ...]

    @property
    def cost(self) -> float:
        """The fastest repeat (seconds; inf when failed): on a shared machine other jobs only ever slow a
        repeat down, so the minimum is the least disturbed estimate (the database's "best" uses medians)."""
        return float(min(self.costs)) if self.costs else float("inf")


def as_samples(items) -> list[Sample]:
    """Samples from Sample objects, (task, schedule, costs) tuples or objects with .task/.schedule/.costs;
    `costs` may be a number, a sequence (median used) or empty/None (a failed candidate)."""
    out = []
    for it in items:
        if isinstance(it, Sample):
            out.append(it)
            continue
        if isinstance(it, tuple):
            task, sched, costs = it
        else:
            task, sched, costs = it.task, it.schedule, it.costs
        if costs is None:
            costs = ()
        elif np.isscalar(costs):
            costs = (float(costs),)
        out.append(Sample(task.key, task.compute, sched, tuple(float(c) for c in costs)))
    return out


def labels(samples: list[Sample]) -> np.ndarray:
    """Normalized throughput per sample: best cost of its task / its cost (failed: 0)."""
    best: dict[str, float] = {}
    for s in samples:
        best[s.workload_key] = min(best.get(s.workload_key, float("inf")), s.cost)
    return np.array([best[s.workload_key] / s.cost if np.isfinite(s.cost) and s.cost > 0 else 0.0
                     for s in samples])


def features_of_samples(samples: list[Sample]) -> list[np.ndarray | None]:
    """Features of each sample, computed in batches per workload (fast path)."""
    out: list[np.ndarray | None] = [None] * len(samples)
    by: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by.setdefault(s.workload_key, []).append(i)
    for key, idx in by.items():
        feats = batch_features(samples[idx[0]].compute, [samples[i].schedule for i in idx], key)
        for i, f in zip(idx, feats):
            out[i] = f
    return out


class RandomModel:
    """Seeded random scores; the baseline and the state of a model with too little data."""

    trained = False

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def fit(self, samples) -> RandomModel:
        return self

    def update(self, samples) -> RandomModel:
        return self

    def predict(self, task, schedules) -> np.ndarray:
        return self.rng.random(len(schedules))

    def save(self, path) -> None:
        raise InputError("a random cost model has nothing to save", file=str(path))


def _program_rows(feats: list[np.ndarray], mode: str) -> tuple[np.ndarray, np.ndarray]:
    """packsum: all statement rows + their program index; rank: one row per program (sum, max)."""
    if mode in ("packsum", "packrank"):
        rows = [f if f.shape[0] else np.zeros((1, NUM_FEATURES)) for f in feats]
        pid = np.concatenate([np.full(r.shape[0], i) for i, r in enumerate(rows)])
        return np.concatenate(rows), pid
    X = np.stack([np.concatenate([f.sum(axis=0), f.max(axis=0)]) if f.shape[0] else np.zeros(2 * NUM_FEATURES)
                  for f in feats])
    return X, np.arange(len(feats))


def _packed_rows(feats: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """`_program_rows` of packsum / packrank for prediction: the same rows and program indices in one
    concatenation and one repeat (no per-program arrays)."""
    counts = np.fromiter((f.shape[0] for f in feats), dtype=np.int64, count=len(feats))
    if counts.all():
        X = np.concatenate(feats)
    else:
        X = np.concatenate([f if f.shape[0] else np.zeros((1, NUM_FEATURES)) for f in feats])
        counts = np.maximum(counts, 1)
    return X, np.repeat(np.arange(len(feats)), counts)


def pair_weights(y: np.ndarray) -> np.ndarray:
    """(n, n) weights of the ordered pairs (i faster than j) of one task's normalized throughputs `y`:
    max(y_i, y_j) (pairs with a fast program count more: the search needs the top of the ranking) x
    min(|log2(y_i / y_j)|, PAIR_LOG_CAP) (pairs within the timing noise count little; failed programs, y = 0,
    count as 2^-10), normalized to sum to n (every program of every task weighs alike)."""
    yy = np.maximum(y, 2.0 ** -10)
    W = (y[:, None] > y[None, :]) * np.maximum(yy[:, None], yy[None, :]) ** PAIR_TOP_POWER * \
        np.minimum(np.abs(np.log2(yy[:, None] / yy[None, :])), PAIR_LOG_CAP)
    tot = W.sum()
    return W * (len(y) / tot) if tot > 0 else W


def _pair_objective(y: np.ndarray, keys: list[str], pid: np.ndarray, seed: int, eta: float = 0.3):
    """packrank: gradient and hessian of sum over tasks and weighted pairs (i faster than j) of
    log(1 + exp(s_j - s_i)), s = a program's score (the sum of its statement predictions), per statement row.
    With PAIR_DISCOUNT (LambdaRank), each round multiplies a pair's weight by |1/log2(2 + r_i) - 1/log2(2 + r_j)|
    + PAIR_DISCOUNT_FLOOR (r: the places of i and j in the task's current ranking), renormalized per task: swaps
    near the top of the ranking count most (peak@k), as LambdaMART does for NDCG, and the floor keeps the order
    further down (pairwise accuracy).
    Tasks with more than PAIR_GROUP programs are split into random groups of at most that size (pairs within a
    group only), so a step costs O(n PAIR_GROUP), not O(n^2)."""
    rng = np.random.default_rng(seed)
    by: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by.setdefault(k, []).append(i)
    parts = []
    for idx in by.values():
        idx = np.asarray(idx)
        if len(idx) > PAIR_GROUP:
            idx = rng.permutation(idx)
            chunks = np.array_split(idx, -(-len(idx) // PAIR_GROUP))
        else:
            chunks = [idx]
        for c in chunks:
            if len(c) >= 2:
                parts.append((c, pair_weights(y[c])))
    nprog = len(y)
    rows = np.bincount(pid, minlength=nprog)   # statement rows per program (`_row_hessian`)

    def obj(preds, _d):
        s = np.bincount(pid, weights=preds, minlength=nprog)
        g = np.zeros(nprog)
        h = np.zeros(nprog)
        for idx, W in parts:
            ss = s[idx]
            if PAIR_DISCOUNT:   # LambdaRank: pairs that swap places near the top of the current ranking count more
                D = 1.0 / np.log2(2.0 + np.argsort(np.argsort(-ss, kind="stable"), kind="stable"))
                W = W * (np.abs(D[:, None] - D[None, :]) + PAIR_DISCOUNT_FLOOR)
                W *= len(idx) / max(W.sum(), 1e-12)
            r = 1.0 / (1.0 + np.exp(np.clip(ss[:, None] - ss[None, :], -50, 50)))   # sigmoid(s_j - s_i)
            gw = W * r
            g[idx] += gw.sum(axis=0) - gw.sum(axis=1)
            hw = W * r * (1.0 - r)
            h[idx] += hw.sum(axis=1) + hw.sum(axis=0)
        return g[pid], _row_hessian(np.maximum(h, 1e-6), rows, pid, eta)
    return obj


#: the program-level hessian scaled by max(1, rows x eta) per statement row (`_row_hessian`; off: unscaled)
ROW_HESSIAN = True


def _row_hessian(h: np.ndarray, rows: np.ndarray, pid: np.ndarray, eta: float) -> np.ndarray:
    """Per statement row, the hessian of its program's loss.  A program's score is the sum of its R rows'
    predictions, so the rows' Newton steps add up: with rows sharing a leaf a program moves R x eta of its own
    Newton step per round, and from R x eta above 2 the training oscillates and diverges to NaN (seen with
    22-statement programs, session 9).  Scaling the hessian by max(1, R x eta) caps that at one step; programs of
    R <= 1 / eta rows (5 at eta 0.2: every fixture's) train exactly as before."""
    return (h * np.maximum(1.0, rows * eta))[pid] if ROW_HESSIAN else h[pid]


class CostModel:
    """XGBoost cost model.  `predict` returns scores (higher = faster) for schedules of one task."""

    def __init__(self, seed: int = 0, mode: str = "packsum", rounds: int = 100, params: dict | None = None,
                 min_samples: int = MIN_SAMPLES):
        if mode not in MODES:
            raise InputError(f"cost model mode {mode!r} unknown (one of {', '.join(MODES)})")
        self.seed, self.mode, self.rounds, self.min_samples = seed, mode, rounds, min_samples
        self.params = {**DEFAULT_PARAMS, "monotone_constraints": monotone_constraints(mode), **(params or {})}
        self.booster = None
        self.pretrained = False
        self.samples: list[Sample] = []
        self._feats: list[np.ndarray | None] = []
        self._trained_on = 0      # samples behind the model (a loaded model: what it was pretrained on)
        self._local_on = 0        # local samples at the last training
        self._full_on = 0         # local samples at the last training from scratch
        self._warm_trees = 0      # trees added by warm starts since then
        self.train_count = 0
        self._random = RandomModel(seed)

    @property
    def trained(self) -> bool:
        return self.booster is not None

    # ------------------------------------------------------------------ training
    def fit(self, samples, feats: list | None = None) -> CostModel:
        """Train on `samples` (replacing stored data; `feats`: their features when already computed, e.g. by
        `features_of_samples`); with too little data, warn and stay random (or keep the pretrained trees)."""
        if feats is not None:
            self.samples, self._feats = as_samples(samples), list(feats)
        else:
            self.samples, self._feats = [], []
            self._add(samples)
        self._train()
        return self

    def update(self, samples) -> CostModel:
        """Add measured samples and train when the data grew by RETRAIN_GROWTH (and at least RETRAIN_MIN_NEW
        samples) since the last training: a warm start (WARM_ROUNDS more trees on all data) while the data is
        less than twice what the last full training saw, or always for a pretrained model (until its warm
        trees pass MAX_WARM_TREES); else a full retrain from scratch."""
        self._add(samples)
        n, last = len(self.samples), self._local_on
        if not self.trained or (n >= (1 + RETRAIN_GROWTH) * last and n - last >= RETRAIN_MIN_NEW):
            full = not self.trained or (not self.pretrained and n >= 2 * self._full_on) or \
                self._warm_trees >= MAX_WARM_TREES
            self._train(quiet=True, warm=not full)
        return self

    def _add(self, samples) -> None:
        new = as_samples(samples)
        self.samples += new
        self._feats += features_of_samples(new)

    def _train(self, quiet: bool = False, warm: bool = False) -> None:
        import xgboost as xgb

        keep = [i for i, f in enumerate(self._feats) if f is not None]
        samples = [self.samples[i] for i in keep]
        y = labels(samples)
        w = np.maximum(y, MIN_WEIGHT)
        need = RETRAIN_MIN_NEW if self.pretrained else self.min_samples   # a pretrained model adapts early
        if len(samples) < need or len(set(np.round(y, 9))) < 2:
            if not quiet:
                warnings.warn(f"cost model: {len(samples)} usable samples (need {need} with different "
                              f"costs); predictions stay {'pretrained' if self.trained else 'random'}",
                              CostModelWarning, stacklevel=3)
            return
        feats = [self._feats[i] for i in keep]
        X, pid = _program_rows(feats, self.mode)
        params = dict(self.params, seed=self.seed)
        base = self.booster if (warm or self.pretrained) and self.booster is not None and \
            self._warm_trees < MAX_WARM_TREES else None
        rounds = WARM_ROUNDS if base is not None else self.rounds
        if self.mode in ("packsum", "packrank"):
            dtrain = xgb.DMatrix(X)
            nprog = len(feats)
            rows = np.bincount(pid, minlength=nprog)   # statement rows per program (see `_row_hessian`)
            eta = float(params.get("eta", 0.3))
            if self.mode == "packrank":
                obj = _pair_objective(y, [s.workload_key for s in samples], pid, self.seed, eta)
            else:
                def obj(preds, _d):
                    s = np.bincount(pid, weights=preds, minlength=nprog)
                    g = 2.0 * w * (s - y)
                    return g[pid], _row_hessian(2.0 * w, rows, pid, eta)
            params.update(base_score=0.0, disable_default_eval_metric=1)
            self.booster = xgb.train(params, dtrain, rounds, obj=obj, xgb_model=base)
        elif self.mode == "reg":
            dtrain = xgb.DMatrix(X, label=y, weight=w)
            params.update(objective="reg:squarederror")
            self.booster = xgb.train(params, dtrain, rounds, xgb_model=base)
        else:
            order = np.argsort([s.workload_key for s in samples], kind="stable")
            qid = np.unique([s.workload_key for s in samples], return_inverse=True)[1]
            dtrain = xgb.DMatrix(X[order], label=y[order], qid=qid[order])
            params.update(objective="rank:pairwise", lambdarank_pair_method="mean",
                          lambdarank_num_pair_per_sample=8)
            self.booster = xgb.train(params, dtrain, rounds, xgb_model=base)
        self._trained_on = self._local_on = len(self.samples)
        if base is None:
            self._full_on, self._warm_trees, self.pretrained = len(self.samples), 0, False
        else:
            self._warm_trees += rounds
        self.train_count += 1

    # ------------------------------------------------------------------ prediction
    def predict(self, task, schedules) -> np.ndarray:
        """Scores of `schedules` (of `task`): higher = predicted faster.  Random while untrained;
        -inf for a schedule that does not lower."""
        if not self.trained:
            return self._random.predict(task, schedules)
        feats = batch_features(task.compute, list(schedules), getattr(task, "key", None))
        return self.predict_features(feats)

    def predict_features(self, feats: list[np.ndarray | None]) -> np.ndarray:
        """Scores from precomputed features (`batch_features` / `features_of_samples`); -inf where None; random
        while untrained (as `predict`)."""
        out = np.full(len(feats), -np.inf)
        ok = [i for i, f in enumerate(feats) if f is not None]
        if not ok:
            return out
        if not self.trained:
            out[ok] = self._random.predict(None, ok)
            return out
        if self.mode in ("packsum", "packrank"):
            X, pid = _packed_rows([feats[i] for i in ok])
        else:
            X, pid = _program_rows([feats[i] for i in ok], self.mode)
        p = self.booster.inplace_predict(X)     # no DMatrix: 3-4x faster than predict(DMatrix(X)), same values
        out[ok] = np.bincount(pid, weights=p, minlength=len(ok)) if self.mode in ("packsum", "packrank") else p
        if self.mode == "packrank":     # log-odds -> a throughput-like scale (the search selects in proportion)
            out[ok] = np.exp2(np.clip(out[ok] / RANK_SCALE, -60.0, 60.0))
        return out

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write the model (header JSON + the booster) to `path`."""
        if self.booster is None:
            raise InputError("the cost model is untrained (random); nothing to save", file=str(path))
        raw = bytes(self.booster.save_raw(raw_format="ubj"))
        doc = {"format": MODEL_FORMAT, "version": MODEL_VERSION, "feature_version": FEATURE_VERSION,
               "num_features": NUM_FEATURES, "mode": self.mode, "seed": self.seed, "rounds": self.rounds,
               "params": self.params, "trained_on": self._trained_on,
               "booster": base64.b64encode(raw).decode("ascii")}
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)

    @staticmethod
    def load(path) -> CostModel:
        """Read a model written by `save`; InputError naming the file and the version when it is corrupt
        or incompatible.  The loaded model is warm-started by later fit/update calls."""
        return load_model_file(path)


def load_model_file(path) -> CostModel:
    import xgboost as xgb

    p = str(path)
    try:
        with open(p, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as e:
        raise InputError(f"cannot read cost model: {e.strerror}", file=p) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"not a hlotune cost model (corrupt JSON: {e})", file=p) from None
    if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
        raise InputError(f"not a hlotune cost model (format {doc.get('format') if isinstance(doc, dict) else None!r})",
                         file=p)
    ver, fver = doc.get("version"), doc.get("feature_version")
    if ver != MODEL_VERSION or fver != FEATURE_VERSION or doc.get("num_features") != NUM_FEATURES:
        raise InputError(f"cost model version {ver} / feature version {fver} ({doc.get('num_features')} features) is "
                         f"incompatible with this hlotune (version {MODEL_VERSION}, feature version {FEATURE_VERSION}, "
                         f"{NUM_FEATURES} features)", file=p)
    try:
        m = CostModel(seed=int(doc["seed"]), mode=doc["mode"], rounds=int(doc["rounds"]),
                      params=dict(doc["params"], nthread=DEFAULT_PARAMS["nthread"]))
        b = xgb.Booster()
        b.load_model(bytearray(base64.b64decode(doc["booster"], validate=True)))
        b.set_param({"nthread": m.params.get("nthread", 1)})
    except (KeyError, TypeError, ValueError, xgb.core.XGBoostError) as e:
        raise InputError(f"corrupt cost model (version {ver}): {str(e).splitlines()[0][:200]}", file=p) from None
    m.booster = b
    m.pretrained = True
    m._trained_on = int(doc.get("trained_on", 0))
    return m


_features = features_of_samples
