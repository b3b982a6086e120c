"""Cost-model benchmark: features + prediction throughput on dense_bias_relu, and ranking metrics
(leave one workload out) on a tuning database.

    .venv/bin/python benchmarks/cost_model_eval.py [--db logs/cost_model_data.db] [--n 10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from hlotune.cost_model.metrics import mean_metrics  # noqa: E402
from hlotune.cost_model.model import CostModel, RandomModel  # noqa: E402
from hlotune.cost_model.sampling import factor_variants  # noqa: E402
from hlotune.schedule_space.default import default_schedule  # noqa: E402
from hlotune.schedule_space.steps import Schedule  # noqa: E402
from hlotune.search.cost_model_cli import evaluate_lowo, evaluate_model, samples_from_db  # noqa: E402
from hlotune.target import Target  # noqa: E402

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"


def speed(model: CostModel, n: int) -> float:
    sg = hlotune.load_model(str(MODELS / "dense_bias_relu" / "dense_bias_relu.bench.hlo")).frontend.subgraphs[0]
    cd = sg.workload.compute
    vs = [Schedule(sg.workload.key, s) for s in factor_variants(cd, default_schedule(cd, Target.host_cpu()),
                                                                  np.random.default_rng(0), n)]

    class T:
        key, compute = sg.workload.key, cd
    model.predict(T, vs[:10])
    t0 = time.perf_counter()
    model.predict(T, vs)
    return len(vs) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="logs/cost_model_data.db")
    ap.add_argument("--n", type=int, default=10000)
    a = ap.parse_args()
    samples = samples_from_db(a.db)
    print(f"{len(samples)} records")
    model = CostModel(seed=0).fit(samples)
    print(f"features + prediction: {speed(model, a.n):.0f} candidates/s")
    print("random:", mean_metrics(evaluate_model(RandomModel(0), samples)))
    print("xgboost packsum, leave one workload out:", mean_metrics(evaluate_lowo(samples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
