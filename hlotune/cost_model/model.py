"""The learned cost model (XGBoost over per-statement features) and a random model with the same interface.

Map:
  Sample                 one measured schedule: workload key, compute definition, schedule, costs (seconds;
                         empty = failed)
  as_samples(items)      Samples from Samples, (Task, Schedule, costs) tuples or objects with .task/.schedule/.costs
  labels(samples)        normalized throughput: best median cost of the task / median cost (failed = 0)
  RandomModel            seeded random scores; fit/update/save are no-ops
  CostModel              XGBoost; `mode` "packsum" (Ansor: a program's score is the sum of its statements'
                         predictions, trained with a custom weighted squared loss on that sum) or "rank"
                         (one row per program: sum and max of its statement features, rank:pairwise per task)
    .fit(samples) .update(samples) .predict(task, schedules) .save(path) CostModel.load(path)
  load_model_file(path)  CostModel.load with the checks (corrupt / other format / version -> InputError)

Training rules: until MIN_SAMPLES valid samples of at least 2 distinct costs exist the model stays random
(a warning says so); `update` keeps every sample and retrains when the data grew by RETRAIN_GROWTH since the
last training (else it only stores them); a model loaded from a file (pretrained) is warm-started: new
data continues boosting from the loaded trees (WARM_ROUNDS rounds) instead of starting over.
Weights: max(label, MIN_WEIGHT), so fast programs count more.  Everything is seeded.
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

MODEL_FORMAT = "hlotune-cost-model"
MODEL_VERSION = 1
MIN_SAMPLES = 32
RETRAIN_GROWTH = 0.25
MIN_WEIGHT = 0.1
WARM_ROUNDS = 40

DEFAULT_PARAMS = {"max_depth": 8, "eta": 0.2, "subsample": 1.0, "colsample_bytree": 1.0, "min_child_weight": 2,
                  "gamma": 0.003, "lambda": 1.0, "nthread": 2, "tree_method": "hist"}


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
        return float(np.median(self.costs)) if self.costs else float("inf")


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


def _features(samples: list[Sample]) -> list[np.ndarray | None]:
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

    def __init__(self, seed: int = 0, mode: str = "packsum", rounds: int = 300, params: dict | None = None,
                 min_samples: int = MIN_SAMPLES):
        if mode not in ("packsum", "rank"):
            raise InputError(f"cost model mode {mode!r} unknown (packsum or rank)")
        self.seed, self.mode, self.rounds, self.min_samples = seed, mode, rounds, min_samples
        self.params = dict(DEFAULT_PARAMS, **(params or {}))
        self.booster = None
        self.pretrained = False
        self.samples: list[Sample] = []
        self._feats: list[np.ndarray | None] = []
        self._trained_on = 0
        self._random = RandomModel(seed)

    @property
    def trained(self) -> bool:
        return self.booster is not None

    # ------------------------------------------------------------------ training
    def fit(self, samples) -> CostModel:
        """Train on `samples` (replacing stored data); with too little data, warn and stay random
        (or keep the pretrained trees)."""
        self.samples, self._feats = [], []
        self._add(samples)
        self._train()
        return self

    def update(self, samples) -> CostModel:
        """Add measured samples; retrain when the data grew by RETRAIN_GROWTH since the last training."""
        self._add(samples)
        if not self.trained or self.pretrained or len(self.samples) >= (1 + RETRAIN_GROWTH) * self._trained_on:
            self._train(quiet=True)
        return self

    def _add(self, samples) -> None:
        new = as_samples(samples)
        self.samples += new
        self._feats += _features(new)

    def _train(self, quiet: bool = False) -> None:
        import xgboost as xgb

        keep = [i for i, f in enumerate(self._feats) if f is not None]
        samples = [self.samples[i] for i in keep]
        y = labels(samples)
        if len(samples) < self.min_samples or len(set(np.round(y, 9))) < 2:
            if not quiet:
                warnings.warn(f"cost model: {len(samples)} usable samples (need {self.min_samples} with different "
                              f"costs); predictions stay {'pretrained' if self.trained else 'random'}",
                              CostModelWarning, stacklevel=3)
            return
        feats = [self._feats[i] for i in keep]
        X, pid = _program_rows(feats, self.mode)
        w = np.maximum(y, MIN_WEIGHT)
        params = dict(self.params, seed=self.seed)
        base = self.booster if self.pretrained else None
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
        else:
            order = np.argsort([s.workload_key for s in samples], kind="stable")
            qid = np.unique([s.workload_key for s in samples], return_inverse=True)[1]
            dtrain = xgb.DMatrix(X[order], label=y[order], qid=qid[order])
            params.update(objective="rank:pairwise", lambdarank_pair_method="mean",
                          lambdarank_num_pair_per_sample=8)
            self.booster = xgb.train(params, dtrain, rounds, xgb_model=base)
        self._trained_on = len(self.samples)

    # ------------------------------------------------------------------ prediction
    def predict(self, task, schedules) -> np.ndarray:
        """Scores of `schedules` (of `task`): higher = predicted faster.  Random while untrained;
        -inf for a schedule that does not lower."""
        if not self.trained:
            return self._random.predict(task, schedules)
        feats = batch_features(task.compute, list(schedules), getattr(task, "key", None))
        return self.predict_features(feats)

    def predict_features(self, feats: list[np.ndarray | None]) -> np.ndarray:
        import xgboost as xgb

        out = np.full(len(feats), -np.inf)
        ok = [i for i, f in enumerate(feats) if f is not None]
        if not ok:
            return out
        X, pid = _program_rows([feats[i] for i in ok], self.mode)
        p = self.booster.predict(xgb.DMatrix(X))
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
        m = CostModel(seed=int(doc["seed"]), mode=doc["mode"], rounds=int(doc["rounds"]), params=doc["params"])
        b = xgb.Booster()
        b.load_model(bytearray(base64.b64decode(doc["booster"], validate=True)))
        b.set_param({"nthread": m.params.get("nthread", 2)})
    except (KeyError, TypeError, ValueError, xgb.core.XGBoostError) as e:
        raise InputError(f"corrupt cost model (version {ver}): {str(e).splitlines()[0][:200]}", file=p) from None
    m.booster = b
    m.pretrained = True
    m._trained_on = int(doc.get("trained_on", 0))
    return m
