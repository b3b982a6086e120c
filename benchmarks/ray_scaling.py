"""Throughput of distributed measurement (a benchmark, not a test): candidates measured per second on a Ray
cluster started on this machine with 1, 2 and 4 worker nodes (separate processes: a raylet, its builder tasks and
one runner actor each), against the local ProgramMeasurer; and the per-candidate costs of the central parts
(driver dispatch, search, cost model, database) that docs/distributed.md uses to estimate 8 and 64 machines.

    .venv/bin/python benchmarks/ray_scaling.py [--candidates 48] [--workers 1 2 4] [--json out.json]

Candidates: distinct random schedules of the largest subgraph of mlp2, default timing (about 110 ms of warm-up and
timed calls per candidate).  Every worker node announces the host CPU's fingerprint with one runner and one build
slot; the head runs only the driver.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from hlotune.measure.records import MeasureInput  # noqa: E402
from hlotune.measure.runner import TimingConfig  # noqa: E402
from hlotune.schedule_space.task import tasks_from_subgraphs  # noqa: E402
from hlotune.search.space import TaskSpace, sample_random  # noqa: E402
from hlotune.target import Target  # noqa: E402

MODEL = Path(__file__).resolve().parent.parent / "tests" / "data" / "models" / "mlp2" / "mlp2.hlo"
STORE = 80 << 20


def candidates(n: int, seed: int = 0) -> list[MeasureInput]:
    target = Target.host_cpu()
    m = hlotune.load_model(str(MODEL))
    task = max(tasks_from_subgraphs(m.frontend.subgraphs, target), key=lambda t: t.flops)
    scheds = sample_random(TaskSpace(task), random.Random(seed), n, exclude=set())
    return [MeasureInput(task, s) for s in scheds]


def _summary(results, wall: float, cpu: float, n: int) -> dict:
    valid = [r for r in results if r.valid]
    return {"candidates": n, "valid": len(valid), "wall_s": wall, "per_s": n / wall,
            "driver_cpu_ms_per_candidate": 1e3 * cpu / n,
            "build_s_median": statistics.median(r.build_s for r in results),
            "run_s_median": statistics.median(r.run_s for r in results if r.run_s > 0) if valid else None}


def local(warm, inputs, timing) -> dict:
    from hlotune.measure.builder import LocalBuilder
    from hlotune.measure.measurer import ProgramMeasurer
    from hlotune.measure.runner import LocalRunner

    with ProgramMeasurer(LocalBuilder(), LocalRunner(timing)) as m:
        m.measure_batch(warm[:4])                      # start the processes
        t0, c0 = time.perf_counter(), time.process_time()
        res = m.measure_batch(inputs)
        return _summary(res, time.perf_counter() - t0, time.process_time() - c0, len(inputs))


def on_ray(warm, inputs, timing, workers: int) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from hlotune.measure.ray_runner import RayPool, build_resource, run_resource

    fp = Target.host_cpu().fingerprint
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, object_store_memory=STORE,
                                                          include_dashboard=False))
    for _ in range(workers):
        c.add_node(num_cpus=1, object_store_memory=STORE, resources={run_resource(fp): 1, build_resource(fp): 1})
    ray.init(address=c.address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        with RayPool(["cpu"], None, timing=timing) as pool:
            m = pool.measurer(fp)
            m.measure_batch(warm[:4 * workers])        # start every actor and builder process
            t0, c0 = time.perf_counter(), time.process_time()
            res = m.measure_batch(inputs)
            out = _summary(res, time.perf_counter() - t0, time.process_time() - c0, len(inputs))
            out["by_node"] = pool.stats[fp]["by_node"]
            return out
    finally:
        ray.shutdown()
        c.shutdown()


def central(tmp: Path) -> dict:
    """Per batch of 64: search (evolutionary propose) and cost model time from a short real tune; database
    add_many of 64 records (SQLite here; PostgreSQL when HLOTUNE_POSTGRES_URL is set)."""
    from hlotune import config
    from hlotune.database import open_database

    fast = TimingConfig(warmup_ms=1.0, repeats=1, min_repeat_ms=1.0)
    db_path = str(tmp / "central.db")
    rep = hlotune.tune(str(MODEL), db_path, trials=3 * 64 + 8, batch_size=64, timing=fast, seed=0,
                       progress=False, write_log=False, early_stopping=None)
    batches = max(1, (rep.trials - len(rep.subgraphs)) // 64)
    out = {"tune_trials": rep.trials, "search_s_per_batch64": rep.search_s / batches,
           "train_s_per_batch64": rep.train_s / batches}
    recs = list(open_database(db_path).records())[:64]
    for name, spec in (("sqlite", str(tmp / "write.db")), ("postgresql", config.get("postgres_url"))):
        if not spec:
            continue
        db = open_database(spec)
        try:
            times = []
            for k in range(5):
                batch = [_retimed(r, k) for r in recs]   # new uids: stored, not skipped
                t0 = time.perf_counter()
                db.add_many(batch)
                times.append(time.perf_counter() - t0)
            out[f"db_{name}_s_per_batch64"] = statistics.median(times)
        finally:
            db.close()
    return out


def _retimed(r, k: int):
    import dataclasses
    return dataclasses.replace(r, timestamp=r.timestamp + 1000.0 * (k + 1))


def main() -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=48)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-central", action="store_true")
    args = ap.parse_args()
    timing = TimingConfig()
    inputs = candidates(args.candidates + 16)
    warm, inputs = inputs[:16], inputs[16:]
    rows = {"local": local(warm, inputs, timing)}
    print(f"local ProgramMeasurer: {rows['local']['per_s']:.2f} candidates/s", flush=True)
    for w in args.workers:
        rows[f"ray_{w}"] = on_ray(warm, inputs, timing, w)
        print(f"ray, {w} worker node(s): {rows[f'ray_{w}']['per_s']:.2f} candidates/s  {rows[f'ray_{w}']}", flush=True)
    if not args.no_central:
        with tempfile.TemporaryDirectory() as tmp:
            rows["central"] = central(Path(tmp))
        print(f"central: {rows['central']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
