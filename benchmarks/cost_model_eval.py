"""Cost-model benchmark: features + prediction throughput on dense_bias_relu (bench size), training time per
update, and ranking metrics (leave one workload out) on a tuning database.

    .venv/bin/python benchmarks/cost_model_eval.py [--db logs/cost_model_data.db] [--n 4000] [--no-lowo]

Throughput: `--n` random schedules drawn from all sketches of the task (`search.space.sample_random`, what
the evolutionary search's initial population is), featurized by the fast path (`batch_features`) and scored
by a trained model (`predict_features`), as the search does each generation.  "cold" = the first batch
(templates are built: one lowering per schedule structure); "warm" = a second batch of new schedules (the
templates of recurring structures are cached, as in later generations and rounds).  Both wall-clock and
CPU time of this process are reported: other jobs share this 2-core machine, so the wall clock varies.
Each phase starts with a `gc.collect()`: a full collection walks every object of this process (the database's
samples and features), ~0.5 s, and where a pending one lands would otherwise decide which figure pays for it.
"search-like": warm generations scored the way the evolutionary search does (`search_like`).
Training: CPU time of a full training and of a warm start (`CostModel.update`) on the database's samples.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from hlotune.cost_model import fast_features  # noqa: E402
from hlotune.cost_model.metrics import mean_metrics  # noqa: E402
from hlotune.cost_model.model import CostModel, RandomModel, features_of_samples  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.search.cost_model_cli import evaluate_lowo, evaluate_model, samples_from_db  # noqa: E402
from hlotune.search.space import TaskSpace, sample_random  # noqa: E402
from hlotune.target import Target  # noqa: E402

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _rate(n: int, t0: tuple[float, float]) -> str:
    w, c = time.perf_counter() - t0[0], time.process_time() - t0[1]
    return f"{n / w:7.0f}/s wall, {n / c:7.0f}/s cpu"


def speed(model: CostModel, n: int) -> None:
    sg = hlotune.load_model(str(MODELS / "dense_bias_relu" / "dense_bias_relu.bench.hlo")).frontend.subgraphs[0]
    w = sg.workload
    task = Task(w.key, w.compute, Target.host_cpu(), 1, "dense_bias_relu", float(w.flops))
    space = TaskSpace(task)
    first = sample_random(space, random.Random(0), n)
    second = sample_random(space, random.Random(1), n, {s.key for s in first})
    print(f"dense_bias_relu bench: {len(space.sketches)} sketches, {len(first)} + {len(second)} schedules, "
          f"{len({fast_features.structure_key(s) for s in first})} structures in the first batch")
    for name, batch in (("cold", first), ("warm", second)):
        gc.collect()        # what setup left for the collector is not this batch's cost
        t0 = _clock()
        feats = fast_features.batch_features(w.compute, batch, w.key)
        rf = _rate(len(batch), t0)
        tf = _clock()
        model.predict_features(feats)
        rp = _rate(len(batch), tf)
        print(f"  {name}: features {rf}; prediction {rp}; features + prediction {_rate(len(batch), t0)}")
    search_like(model, space, w, second)


def search_like(model: CostModel, space: TaskSpace, w, pop: list, gens: int = 4, size: int = 2048) -> None:
    """Warm generations as `EvolutionarySearch` scores them: each generation's children (mutations of the last
    one's, `mutation_prob` 0.85) are featurized in CHUNKS chunks of the population (one `batch_features` call per
    chunk, only the schedules not yet featurized: the feature cache), then the whole population is scored from
    the cache (`predict_features`).  One process (the search forks the chunks over the cores)."""
    from hlotune.search.evolutionary import CHUNKS
    from hlotune.search.space import mutate

    rng = random.Random(5)
    pop = pop[:size]
    cache: dict = {}
    new = 0
    fp = [0.0, 0.0]                                   # wall, cpu of features + prediction
    gc.collect()
    t0 = _clock()
    for _ in range(gens):
        kids = []
        for p in pop:
            sk = space.by_id.get(p.sketch)
            c = mutate(sk, p, rng) if sk is not None and sk.has_holes and rng.random() < 0.85 else None
            kids.append(c or p)
        t1 = _clock()
        m = len(kids)
        for k in range(CHUNKS):
            chunk = kids[m * k // CHUNKS: m * (k + 1) // CHUNKS]
            todo = list({s.key: s for s in chunk if s.key not in cache}.values())
            for s, f in zip(todo, fast_features.batch_features(w.compute, todo, w.key)):
                cache[s.key] = f
            new += len(todo)
        model.predict_features([cache[s.key] for s in kids])
        fp[0] += time.perf_counter() - t1[0]
        fp[1] += time.process_time() - t1[1]
        pop = kids
    n = gens * len(pop)
    print(f"  search-like: {gens} generations of {len(pop)} ({new} new schedules featurized in {CHUNKS} chunks per "
          f"generation, all scored): features + prediction {n / fp[0]:7.0f}/s wall, {n / fp[1]:7.0f}/s cpu "
          f"(of new schedules: {new / fp[1]:.0f}/s cpu); with the mutations {_rate(n, t0)}")


def training(samples, feats) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = CostModel(seed=0)
        t0 = _clock()
        m.fit(samples, feats)
        full = time.process_time() - t0[1]
        n = len(samples) // 4
        m.fit(samples[:-n], feats[:-n])
        m._full_on = len(samples)                 # so the next update is a warm start, not a full retrain
        t0 = _clock()
        m.update(samples[-n:])
        warm = time.process_time() - t0[1]
    print(f"training on {len(samples)} samples: full ({m.rounds} rounds) {full:.2f} s cpu; "
          f"warm start (+{n} samples, 20 rounds, features included) {warm:.2f} s cpu")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="logs/cost_model_data.db")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--no-lowo", action="store_true")
    a = ap.parse_args()
    samples = samples_from_db(a.db)
    t0 = time.perf_counter()
    feats = features_of_samples(samples)
    print(f"{len(samples)} records; features of all: {time.perf_counter() - t0:.1f} s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = CostModel(seed=0).fit(samples, feats)
    speed(model, a.n)
    training(samples, feats)
    print("random:", mean_metrics(evaluate_model(RandomModel(0), samples)))
    if not a.no_lowo:
        print(f"xgboost {CostModel().mode}, leave one workload out:", mean_metrics(evaluate_lowo(samples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
