"""The learned cost model (XGBoost over per-statement features) and a random model with the same interface.

Map:
  Sample                 one measured schedule: workload key, compute definition, schedule, costs (seconds;
                         empty = failed)
  as_samples(items)      Samples from Samples, (Task, Schedule, costs) tuples or objects with .task/.schedule/.costs
  features_of_samples    features of each sample (fast path, batched per workload)
  labels(samples)        normalized throughput: best cost of the task / cost (cost = fastest repeat; failed = 0)
  RandomModel            seeded random scores; fit/update/save are no-ops
  CostModel              XGBoost; `mode` "packsum" (Ansor: a program's score is the sum of its statements'
                         predictions, trained with a custom weighted squared loss on that sum; the default),
                         "reg" (one row per program: sum and max of its statement features, weighted squared
                         loss) or "rank" (the same rows, rank:pairwise per task; slow)
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
Weights: max(label, MIN_WEIGHT), so fast programs count more.  XGBoost runs with one thread (`nthread` 1):
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
from .features import FEATURE_VERSION, NUM_FEATURES

MODES = ("packsum", "rank", "reg")
MODEL_FORMAT = "hlotune-cost-model"
MODEL_VERSION = 1
MIN_SAMPLES = 32
RETRAIN_GROWTH = 0.25
RETRAIN_MIN_NEW = 8
MAX_WARM_TREES = 200
MIN_WEIGHT = 0.1
WARM_ROUNDS = 20

DEFAULT_PARAMS = {"max_depth": 5, "eta": 0.2, "subsample": 1.0, "colsample_bytree": 1.0, "min_child_weight": 5,
                  "gamma": 0.003, "lambda": 1.0, "nthread": 1, "tree_method": "hist"}


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
    if mode == "packsum":
        rows = [f if f.shape[0] else np.zeros((1, NUM_FEATURES)) for f in feats]
        pid = np.concatenate([np.full(r.shape[0], i) for i, r in enumerate(rows)])
        return np.concatenate(rows), pid
    X = np.stack([np.concatenate([f.sum(axis=0), f.max(axis=0)]) if f.shape[0] else np.zeros(2 * NUM_FEATURES)
                  for f in feats])
    return X, np.arange(len(feats))


class CostModel:
    """XGBoost cost model.  `predict` returns scores (higher = faster) for schedules of one task."""

    def __init__(self, seed: int = 0, mode: str = "packsum", rounds: int = 100, params: dict | None = None,
                 min_samples: int = MIN_SAMPLES):
        if mode not in MODES:
            raise InputError(f"cost model mode {mode!r} unknown (one of {', '.join(MODES)})")
        self.seed, self.mode, self.rounds, self.min_samples = seed, mode, rounds, min_samples
        self.params = dict(DEFAULT_PARAMS, **(params or {}))
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
        if self.mode == "packsum":
            dtrain = xgb.DMatrix(X)
            nprog = len(feats)

            def obj(preds, _d):
                s = np.bincount(pid, weights=preds, minlength=nprog)
                g = 2.0 * w * (s - y)
                return g[pid], (2.0 * w)[pid]
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
        """Scores from precomputed features (`batch_features` / `features_of_samples`); -inf where None."""
        out = np.full(len(feats), -np.inf)
        ok = [i for i, f in enumerate(feats) if f is not None]
        if not ok:
            return out
        X, pid = _program_rows([feats[i] for i in ok], self.mode)
        p = self.booster.inplace_predict(X)     # no DMatrix: 3-4x faster than predict(DMatrix(X)), same values
        out[ok] = np.bincount(pid, weights=p, minlength=len(ok)) if self.mode == "packsum" else p
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
