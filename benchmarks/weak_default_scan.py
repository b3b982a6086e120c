"""Which fused subgraphs of the fixture models have a default schedule that random (or evolutionary) search beats?

    .venv/bin/python benchmarks/weak_default_scan.py [--kinds hlo bench.hlo] [--trials 48] [--out logs/scan]

For every fused subgraph (deduplicated by workload key) of every fixture model: measure the default schedule
(one trial of `tune_model`), skip it when one call takes longer than `--max-default-ms` (its search comparison
would take hours), else continue the same database with random search up to `--trials` trials.  Prints one
line per subgraph (default, best, default/best) and writes `<out>/scan.json`; a stopped scan resumes from it.
This is how issue 6's comparison subgraphs are picked: a default within a few per cent of the best of random
trials leaves nothing for any policy to find, so every policy ties there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from benchmarks.common import MODELS_DIR  # noqa: E402
from benchmarks.search_compare import TUNE_TIMING, one_subgraph_model  # noqa: E402
from hlotune.database import open_database  # noqa: E402
from hlotune.schedule_space.task import tasks_from_subgraphs  # noqa: E402
from hlotune.search.tuner import tune_model  # noqa: E402
from hlotune.target import Target  # noqa: E402


def _tune(label: str, sg, db_path: Path, target: Target, trials: int, budget: float, policy: str):
    db = open_database(str(db_path))
    try:
        return tune_model(one_subgraph_model(label, sg), db, target, trials=trials, time_budget=budget, seed=0,
                          policy=policy, batch_size=16, timing=TUNE_TIMING, progress=False, write_log=False,
                          early_stopping=None, db_location=str(db_path)).subgraphs[0]
    finally:
        db.close()


def scan(a) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "scan.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    target = Target.host_cpu()
    seen: set[str] = {v["workload_key"] for v in state.values()}
    for model in sorted(os.listdir(MODELS_DIR)):
        for kind in a.kinds:
            path = MODELS_DIR / model / f"{model}.{kind}"
            if not path.exists() or (a.models and model not in a.models):
                continue
            for sg in hlotune.load_model(str(path)).frontend.subgraphs:
                label = f"{model}.{kind.split('.')[0]}.{sg.name}"
                tasks = tasks_from_subgraphs((sg,), target)
                if not tasks or label in state or tasks[0].key in seen:
                    continue
                seen.add(tasks[0].key)
                t0 = time.perf_counter()
                db_path = out / f"{label}.db"
                s = _tune(label, sg, db_path, target, 1, a.budget, a.policy)
                row = {"workload_key": tasks[0].key, "default_s": s.default_s, "best_s": s.best_s, "trials": 1}
                if s.default_s and s.default_s * 1e3 <= a.max_default_ms:
                    s = _tune(label, sg, db_path, target, a.trials, a.budget, a.policy)
                    row.update(best_s=s.best_s, trials=s.trials, valid=s.valid)
                row["wall_s"] = time.perf_counter() - t0
                state[label] = row
                tmp = state_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(state, indent=1))
                os.replace(tmp, state_path)
                ratio = row["default_s"] / row["best_s"] if row["default_s"] and row["best_s"] else float("nan")
                d_ms, b_ms = 1e3 * (row["default_s"] or 0), 1e3 * (row["best_s"] or 0)
                print(f"{label:45s} default {d_ms:9.4f} ms  best {b_ms:9.4f} ms  x{ratio:5.2f}"
                      f"  ({row['trials']} trials, {row['wall_s']:.0f} s)", flush=True)
    return state


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", nargs="+", default=["hlo", "bench.hlo"], help="fixture files: hlo (test size), bench.hlo")
    p.add_argument("--models", nargs="*", default=[], help="only these fixture models (default: all)")
    p.add_argument("--trials", type=int, default=48, help="trials per subgraph (the default is trial 1)")
    p.add_argument("--budget", type=float, default=90.0, help="seconds of tuning per subgraph at most")
    p.add_argument("--max-default-ms", type=float, default=2.0, help="skip subgraphs whose default is slower")
    p.add_argument("--policy", default="random", help="random (a weak default) or evolutionary (a beatable one)")
    p.add_argument("--out", default="logs/scan")
    scan(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
