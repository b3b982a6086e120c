"""Make a cost-model training set: measure random schedules of the fixture subgraphs on this machine.

    .venv/bin/python benchmarks/make_cost_model_data.py -o logs/cost_model_data.db --minutes 35 [--per-task 400]
    .venv/bin/python benchmarks/make_cost_model_data.py -o logs/cost_model_syn.db --synthetic 48 --only-synthetic

Tasks: every distinct workload of the fixture models (`tests/data/models/*`), test-size HLO with at least
MIN_TEST_FLOPS and bench-size HLO with at most MAX_BENCH_FLOPS (the reference output is computed once per
task in numpy at ~5 ns per point, and the slowest candidates of a big task take seconds each).
Schedules: random draws spread evenly over ALL sketches of each task (`search.space.sample_random`, the
default schedule included), seeded by (--seed, workload key, round), so a run is reproducible up to timing.
Measurement: the measurement pipeline (`measure.ProgramMeasurer`: a pool of builder processes, one isolated
runner process; LLVM memory never piles up here), short timing (3 repeats of at least 5 ms: enough to rank),
each candidate's output checked against the reference (--repeats / --min-repeat-ms change the timing;
on a loaded machine more, shorter repeats give a steadier fastest repeat, which the cost model learns from).
Records go to a tuning database (SQLite by default)
through `search.records.to_record`, one transaction per batch.

Rounds: each round visits the tasks in order and measures a batch of `--batch` new schedules of each task
that has fewer than `--per-task` records, so a time-limited run covers every workload evenly.  Resumable:
schedules already in the database are never measured again; running it again continues.  Stops after
`--minutes` (checked between batches) or when every task has `--per-task` records.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from hlotune.database import open_database  # noqa: E402
from hlotune.measure.builder import LocalBuilder  # noqa: E402
from hlotune.measure.measurer import ProgramMeasurer  # noqa: E402
from hlotune.measure.records import MeasureInput  # noqa: E402
from hlotune.measure.runner import LocalRunner, TimingConfig  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.search.records import to_record  # noqa: E402
from hlotune.search.space import TaskSpace, derive_rng, sample_random  # noqa: E402
from hlotune.target import Target  # noqa: E402

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"
MIN_TEST_FLOPS = 8000
MAX_BENCH_FLOPS = 1.2e9
TIMING = TimingConfig(warmup_ms=2.0, repeats=3, min_repeat_ms=5.0)
#: a candidate may take this many times the task's best so far (x ~6 calls) before it is a run_timeout
SLOWDOWN = 20.0


def fixture_tasks(target: Target, names: list[str] | None = None, kinds=("hlo", "bench.hlo")) -> list[Task]:
    """The distinct workloads of the fixtures within the size limits, in a fixed order."""
    manifest = json.loads((MODELS / "manifest.json").read_text())
    seen: dict[str, Task] = {}
    for model in sorted(manifest["models"]):
        if names and model not in names:
            continue
        for kind in kinds:
            path = MODELS / model / f"{model}.{kind}"
            if not path.exists():
                continue
            m = hlotune.load_model(str(path))
            for sg in m.frontend.subgraphs:
                w = sg.workload
                small = kind == "hlo" and w.flops < MIN_TEST_FLOPS
                big = w.flops > MAX_BENCH_FLOPS
                if w.key in seen or small or big:
                    continue
                seen[w.key] = Task(w.key, w.compute, target, w.weight, f"{model}/{kind}/{sg.name}", float(w.flops))
    return list(seen.values())


def synthetic_tasks(target: Target, count: int, seed: int = 0) -> list[Task]:
    """The workloads of `synthetic_workloads.synthetic_hlos(count, seed)` (other shapes of the fixtures' kinds)."""
    from synthetic_workloads import synthetic_hlos

    seen: dict[str, Task] = {}
    for label, text in synthetic_hlos(count, seed):
        for sg in hlotune.load_model(text).frontend.subgraphs:
            w = sg.workload
            if w.key not in seen and MIN_TEST_FLOPS <= w.flops <= MAX_BENCH_FLOPS:
                seen[w.key] = Task(w.key, w.compute, target, w.weight, f"synthetic/{label}/{sg.name}", float(w.flops))
    return list(seen.values())


def _set_timeout(runner: LocalRunner, base: float, best: float) -> None:
    runner.timeout = base if not math.isfinite(best) else min(base, max(2.0, 1.0 + 6 * SLOWDOWN * best))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="logs/cost_model_data.db")
    ap.add_argument("--minutes", type=float, default=30.0, help="time budget (checked between batches)")
    ap.add_argument("--per-task", type=int, default=400, help="stop measuring a task at this many records")
    ap.add_argument("--batch", type=int, default=16, help="schedules per task per round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="builder processes")
    ap.add_argument("--models", nargs="*", default=None, help="only these fixture models")
    ap.add_argument("--max-tasks", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=TIMING.repeats)
    ap.add_argument("--min-repeat-ms", type=float, default=TIMING.min_repeat_ms)
    ap.add_argument("--list", action="store_true", help="list the tasks and exit")
    ap.add_argument("--synthetic", type=int, default=0, metavar="N",
                    help="also N synthetic workloads (benchmarks/synthetic_workloads.py: other shapes)")
    ap.add_argument("--only-synthetic", action="store_true", help="the synthetic workloads only")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    target = Target.host_cpu()
    tasks = [] if a.only_synthetic else fixture_tasks(target, a.models)
    if a.synthetic:
        tasks += synthetic_tasks(target, a.synthetic, a.seed)
    if a.max_tasks:
        tasks = tasks[:a.max_tasks]
    if a.list:
        for t in tasks:
            print(f"{t.key}  {t.flops:12.0f}  {t.name}")
        return 0
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    db = open_database(a.out)
    fp = target.fingerprint
    spaces = {t.key: TaskSpace(t) for t in tasks}
    have = {t.key: db.schedule_keys(t.key, fp) for t in tasks}
    best = {t.key: min((r.median for r in db.records(t.key, target=fp) if r.valid), default=math.inf)
            for t in tasks}
    print(f"{len(tasks)} tasks, up to {a.per_task} schedules each, {sum(map(len, have.values()))} records already "
          f"-> {a.out} ({a.minutes:g} min)", flush=True)
    timing = TimingConfig(warmup_ms=TIMING.warmup_ms, repeats=a.repeats, min_repeat_ms=a.min_repeat_ms)
    runner = LocalRunner(timing, timeout=10.0)
    base_timeout = runner.timeout
    measurer = ProgramMeasurer(LocalBuilder(n_workers=a.workers), runner, seed=0)
    rnd, n_new, exhausted = 0, 0, set()
    try:
        while True:
            todo = [t for t in tasks if len(have[t.key]) < a.per_task and t.key not in exhausted]
            if not todo:
                break
            for t in todo:
                if time.perf_counter() - t_start > a.minutes * 60:
                    raise TimeoutError
                n = min(a.batch, a.per_task - len(have[t.key]))
                rng = derive_rng(a.seed, "cost-model-data", t.key, rnd)
                scheds = sample_random(spaces[t.key], rng, n, have[t.key])
                if not scheds:
                    exhausted.add(t.key)
                    continue
                _set_timeout(runner, base_timeout, best[t.key])
                t0 = time.perf_counter()
                inputs = [MeasureInput(t, s) for s in scheds]
                results = measurer.measure_batch(inputs)
                db.add_many([to_record(i, r) for i, r in zip(inputs, results)])
                have[t.key].update(s.key for s in scheds)
                valid = [r.median for r in results if r.valid]
                best[t.key] = min([best[t.key], *valid])
                n_new += len(scheds)
                kinds: dict[str, int] = {}
                for r in results:
                    if not r.valid:
                        kinds[r.error_kind.value] = kinds.get(r.error_kind.value, 0) + 1
                print(f"[round {rnd} {time.perf_counter() - t_start:7.0f}s] {t.name}: {len(scheds)} measured "
                      f"({len(valid)} valid{'; ' + str(kinds) if kinds else ''}), {len(have[t.key])} total, "
                      f"best {best[t.key] * 1e6:.1f} us, {time.perf_counter() - t0:.1f} s", flush=True)
            rnd += 1
    except (TimeoutError, KeyboardInterrupt):
        print("stopping (time budget or interrupt)", flush=True)
    finally:
        measurer.close()
        db.close()
    print(f"done: {n_new} new records in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
