"""`hlotune cost-model train|eval`: train a cost model on tuning databases; evaluate one leave-one-workload-out.

Map:
  samples_from_db(spec, target=None)   tuning records -> cost_model.Sample list (workload and steps parsed)
  lowo_predictions(samples, make_model)   per held-out workload: train on the others, predict its records
  evaluate_lowo(samples, make_model)   the metrics of those predictions per workload
  evaluate_model(model, samples)       per workload metrics of a given (pretrained) model
  remeasure_ceiling(samples, feats)    agreement of separate measurements of identical programs (noise ceiling)
  add_cost_model_parser(subparsers)    the argparse wiring (the lead calls it from cli.py)
"""

from __future__ import annotations

import json
import warnings

import numpy as np

from ..cost_model.metrics import implied_ceiling, mean_metrics, remeasure_agreement, repeat_agreement, task_metrics
from ..cost_model.model import MODES, CostModel, CostModelWarning, RandomModel, Sample, features_of_samples
from ..errors import HlotuneError, InputError


def samples_from_db(spec, target: str | None = None) -> list[Sample]:
    """Every record of the database (valid ones with their costs, failed ones with none) as Samples."""
    from ..database import open_database
    from ..ir.workload import workload_from_json
    from ..schedule_space.steps import Schedule, schedule_from_json

    db = open_database(spec)
    cds: dict[str, object] = {}
    out: list[Sample] = []
    try:
        for r in db.records(target=target):
            if r.workload_key not in cds:
                text = r.workload or db.workload(r.workload_key)
                if not text:
                    continue
                cds[r.workload_key] = workload_from_json(text)
            d = json.loads(r.steps)
            sched = schedule_from_json(d if isinstance(d, dict) else {"workload_key": r.workload_key, "steps": d})
            sched = Schedule(r.workload_key, sched.steps)
            out.append(Sample(r.workload_key, cds[r.workload_key], sched, tuple(r.costs) if r.valid else ()))
    finally:
        db.close()
    return out


class _T:
    def __init__(self, key, compute):
        self.key, self.compute = key, compute


def _by_task(samples: list[Sample]) -> dict[str, list[Sample]]:
    by: dict[str, list[Sample]] = {}
    for s in samples:
        by.setdefault(s.workload_key, []).append(s)
    return by


def _score(model, group: list[Sample]) -> dict[str, float]:
    valid = [s for s in group if s.costs]
    scores = model.predict(_T(valid[0].workload_key, valid[0].compute), [s.schedule for s in valid])
    return task_metrics([s.cost for s in valid], scores)


def evaluate_model(model, samples: list[Sample], min_records: int = 8) -> dict[str, dict[str, float]]:
    """Metrics per workload (with at least `min_records` valid records) of `model` as it is."""
    return {k: _score(model, g) for k, g in _by_task(samples).items()
            if sum(1 for s in g if s.costs) >= min_records}


def lowo_predictions(samples: list[Sample], make_model=None, min_records: int = 8,
                     feats: list | None = None, extra: list[Sample] = (),
                     extra_feats: list | None = None) -> dict[str, tuple[list[int], np.ndarray]]:
    """Leave one workload out: for each workload with `min_records` valid records, train a fresh model on all
    others and predict its valid records: {workload key: (their indices in `samples`, their scores)} (`feats`: the
    samples' features when already computed).  `extra`: more training records, never held out (e.g. measured
    schedules of other workloads; a workload of `samples` among them is dropped while it is held out)."""
    make_model = make_model or (lambda: CostModel(seed=0))
    if feats is None:
        feats = features_of_samples(samples)        # once: they do not depend on the model
    if extra and extra_feats is None:
        extra_feats = features_of_samples(extra)
    out = {}
    for k, g in _by_task(samples).items():
        if sum(1 for s in g if s.costs) < min_records:
            continue
        model = make_model()
        rest = [i for i, s in enumerate(samples) if s.workload_key != k]
        more = [i for i, s in enumerate(extra) if s.workload_key != k]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CostModelWarning)
            model.fit([samples[i] for i in rest] + [extra[i] for i in more],
                      [feats[i] for i in rest] + [extra_feats[i] for i in more])
        test = [i for i, s in enumerate(samples) if s.workload_key == k and s.costs]
        out[k] = (test, model.predict_features([feats[i] for i in test]))
    return out


def evaluate_lowo(samples: list[Sample], make_model=None, min_records: int = 8, feats: list | None = None,
                  extra: list[Sample] = (), extra_feats: list | None = None) -> dict[str, dict[str, float]]:
    """`task_metrics` of every held-out workload's `lowo_predictions` (same arguments)."""
    pred = lowo_predictions(samples, make_model, min_records, feats, extra, extra_feats)
    return {k: task_metrics([samples[i].cost for i in idx], scores) for k, (idx, scores) in pred.items()}


def remeasure_ceiling(samples: list[Sample], feats: list, min_ratio: float = 1.0) -> tuple[float, int, int]:
    """`remeasure_agreement` pooled over workloads: programs are identical when their features are (different
    schedules that lower to the same loops, measured at different times).  Returns (agreement, pairs,
    programs measured twice or more)."""
    good = total = progs = 0
    by: dict[str, dict[bytes, list[float]]] = {}
    for s, f in zip(samples, feats):
        if f is not None and s.costs:
            by.setdefault(s.workload_key, {}).setdefault(np.round(f, 6).tobytes(), []).append(s.cost)
    for groups in by.values():
        multi = [c for c in groups.values() if len(c) >= 2]
        progs += len(multi)
        acc, n = remeasure_agreement(multi, min_ratio)
        if n:
            good, total = good + acc * n, total + n
    return (good / total if total else float("nan")), total, progs


def _cmd_train(a) -> int:
    samples = [s for spec in a.db for s in samples_from_db(spec, a.target)]
    drop = set(a.exclude or ())
    if drop:   # held-out workloads (e.g. the ones a benchmark will tune): by key or by subgraph name
        samples = [s for s in samples if s.workload_key not in drop and s.compute.name not in drop]
    model = CostModel(seed=a.seed, mode=a.mode)
    model.fit(samples)
    if not model.trained:
        raise InputError(f"too few usable records ({len(samples)}) to train a cost model")
    model.save(a.output)
    print(f"trained on {len(samples)} records of {len(_by_task(samples))} workloads -> {a.output}")
    return 0


def _cmd_eval(a) -> int:
    samples = samples_from_db(a.db, a.target)
    feats = None
    if a.model:
        per = evaluate_model(CostModel.load(a.model), samples)
        how = f"model {a.model}"
    elif a.random:
        per = evaluate_model(RandomModel(a.seed), samples)
        how = "random model"
    else:
        feats = features_of_samples(samples)
        extra = [s for spec in a.extra or () for s in samples_from_db(spec, a.target)]
        per = evaluate_lowo(samples, lambda: CostModel(seed=a.seed, mode=a.mode), feats=feats, extra=extra)
        how = "leave one workload out" + (f" (+ {len(extra)} training-only records of {', '.join(a.extra)})"
                                          if extra else "")
    if feats is None:
        feats = features_of_samples(samples)
    ceiling = remeasure_ceiling(samples, feats)
    ceiling15 = remeasure_ceiling(samples, feats, 1.5)
    by = _by_task(samples)
    names = {s.workload_key: s.compute.name for s in samples}
    for k, m in per.items():   # the noise ceiling: one repeat "predicting" the next
        runs = [s.costs for s in by[k] if s.costs]
        m["repeats_agree"] = repeat_agreement(runs)
        m["repeats_agree@1.5x"] = repeat_agreement(runs, 1.5)
    mean = mean_metrics(per)
    if a.json:
        print(json.dumps({"how": how, "records": len(samples), "per_task": per, "mean": mean,
                          "remeasure_agree": ceiling[0], "remeasure_agree@1.5x": ceiling15[0],
                          "remeasure_pairs": ceiling[1], "remeasured_programs": ceiling[2],
                          "implied_ceiling": implied_ceiling(ceiling[0]),
                          "names": {k: names.get(k, "") for k in per}}, indent=1))
        return 0
    print(f"{how}: {len(per)} workloads, {len(samples)} records")
    for k, m in per.items():
        print(f"  {k} ({names.get(k, '')}, {sum(1 for s in by[k] if s.costs)} valid): "
              + "  ".join(f"{n} {v:.3f}" for n, v in m.items()))
    print("mean: " + "  ".join(f"{n} {v:.3f}" for n, v in mean.items()))
    print(f"remeasure_agree {ceiling[0]:.3f}  remeasure_agree@1.5x {ceiling15[0]:.3f}  ({ceiling[2]} programs "
          f"measured separately 2+ times, {ceiling[1]} pairs); implied ceiling of pairwise_accuracy "
          f"{implied_ceiling(ceiling[0]):.3f}")
    print("(pairwise@1.5x: only pairs whose costs differ by 1.5x or more; repeats_agree: the second-last repeat of "
          "each measurement used as the prediction of the last, i.e. the noise ceiling within one measurement; "
          "remeasure_agree: the same between separate measurements of identical programs (schedules that lower "
          "to the same loops), the ceiling for ranking different candidates; implied ceiling: an upper estimate of a "
          "perfect model's pairwise accuracy against one such measurement, which lies between remeasure_agree and "
          "it (metrics.implied_ceiling); benchmarks/label_noise.py measures the agreement directly)")
    return 0


def add_cost_model_parser(subparsers) -> None:
    """Add `cost-model train DB... -o PATH` and `cost-model eval DB [--model PATH]` to `subparsers`."""
    p = subparsers.add_parser("cost-model", help="train / evaluate the learned cost model")
    sub = p.add_subparsers(dest="cost_model_cmd", required=True)
    t = sub.add_parser("train", help="train on one or more tuning databases and save the model")
    t.add_argument("db", nargs="+", help="tuning databases (.db, .jsonl, URL)")
    t.add_argument("-o", "--output", required=True, help="model file to write")
    t.add_argument("--mode", choices=MODES, default="packsum")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--target", default=None, help="only records of this target fingerprint")
    t.add_argument("--exclude", nargs="*", metavar="KEY", help="leave out these workloads (workload keys or "
                                                               "subgraph names), e.g. the ones to be tuned")
    t.set_defaults(func=_guard(_cmd_train))
    e = sub.add_parser("eval", help="pairwise accuracy and peak@k per workload (leave one workload out, or of "
                                    "a saved model with --model)")
    e.add_argument("db")
    e.add_argument("--model", default=None, help="evaluate this saved model instead of leave-one-out training")
    e.add_argument("--random", action="store_true", help="evaluate the random model (baseline)")
    e.add_argument("--extra", nargs="*", metavar="DB", help="more training records for leave-one-out, never held "
                                                            "out (e.g. benchmarks/make_cost_model_data.py --synthetic)")
    e.add_argument("--mode", choices=MODES, default="packsum")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--target", default=None)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_guard(_cmd_eval))


def _guard(fn):
    def run(a) -> int:
        try:
            return fn(a)
        except HlotuneError:
            raise
        except (ValueError, KeyError) as e:
            raise InputError(f"cost-model: {e}") from None
    return run


__all__ = ["add_cost_model_parser", "samples_from_db", "lowo_predictions", "evaluate_lowo", "evaluate_model", "np"]
