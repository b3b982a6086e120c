"""Make a cost-model training set: measure random schedules of the fixture subgraphs on this machine.

    .venv/bin/python benchmarks/make_cost_model_data.py -o logs/cost_model_data.db [--per-task 48] [--seed 0]

For every distinct workload of the fixture models (test-size HLO with at least MIN_TEST_FLOPS, bench-size
HLO with at most MAX_BENCH_FLOPS) it draws `--per-task` schedules and measures each one, writing one tuning
record per schedule to the database (SQLite / JSONL / URL, anything `open_database` accepts).

Schedules: the sketch sampler (`schedule_space.sketch.generate_sketches` + `annotate.sample_schedules`) when
it exists, else random split factors of the default schedule (`cost_model.sampling.factor_variants`), a
quarter of them without the parallel annotation, plus the default schedule itself.
Measurement: the measurement pipeline (`hlotune.measure.measure_batch`) when it exists, else in process:
build with LLVM, check the output against the default schedule's, then warm-up and 3 repeats of at
least 2 ms each (cost = seconds per call of each repeat).  Deterministic given --seed (the schedules;
timings are what they are).  Runs are resumable: schedules already in the database are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from hlotune.cost_model.sampling import factor_variants  # noqa: E402
from hlotune.database import Record, open_database  # noqa: E402
from hlotune.errors import HlotuneError  # noqa: E402
from hlotune.ir.workload import workload_to_json  # noqa: E402
from hlotune.schedule_space.default import default_schedule  # noqa: E402
from hlotune.schedule_space.loop_ir import ForKind  # noqa: E402
from hlotune.schedule_space.lower import lower  # noqa: E402
from hlotune.schedule_space.steps import Annotate, Schedule, step_to_json  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.target import Target  # noqa: E402

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"
MIN_TEST_FLOPS = 8000
MAX_BENCH_FLOPS = 1.2e9
MIN_REPEAT_S = 2e-3
REPEATS = 3


def fixture_tasks(target: Target, names: list[str] | None = None) -> list[Task]:
    """The distinct workloads of the fixtures within the size limits, in a fixed order."""
    manifest = json.loads((MODELS / "manifest.json").read_text())
    seen: dict[str, Task] = {}
    for model in sorted(manifest["models"]):
        if names and model not in names:
            continue
        for kind in ("hlo", "bench.hlo"):
            m = hlotune.load_model(str(MODELS / model / f"{model}.{kind}"))
            for sg in m.frontend.subgraphs:
                w = sg.workload
                small = kind == "hlo" and w.flops < MIN_TEST_FLOPS
                big = kind == "bench.hlo" and w.flops > MAX_BENCH_FLOPS
                if w.key in seen or small or big:
                    continue
                seen[w.key] = Task(w.key, w.compute, target, w.weight, f"{model}/{kind}/{sg.name}", float(w.flops))
    return list(seen.values())


def schedules_for(task: Task, n: int, seed: int) -> list[Schedule]:
    """The default schedule, then random ones (sketch sampler when present, else factor variants)."""
    rng = np.random.default_rng(zlib.crc32(f"{task.key}/{seed}".encode()))
    base = tuple(default_schedule(task.compute, task.target))
    out = [Schedule(task.key, base)]
    try:
        from hlotune.schedule_space.annotate import sample_schedules  # type: ignore
        from hlotune.schedule_space.sketch import generate_sketches  # type: ignore
        sketches = generate_sketches(task, task.target)
        for k, sk in enumerate(sketches):
            out += list(sample_schedules(sk, task, rng, max(1, (n - 1) // len(sketches) + (k == 0))))
        return _dedupe(out)[:n]
    except ImportError:
        pass
    no_par = tuple(s for s in base if not (isinstance(s, Annotate) and s.kind is ForKind.PARALLEL))
    n_np = (n - 1) // 4 if no_par != base else 0

    def sane(steps_list) -> list[Schedule]:
        return [x for x in (Schedule(task.key, s) for s in steps_list) if _sane(task.compute, x)]

    par = sane(factor_variants(task.compute, base, rng, 2 * (n - 1 - n_np)))[:n - 1 - n_np]
    nop = sane(factor_variants(task.compute, no_par, rng, 2 * n_np))[:n_np] if n_np else []
    return _dedupe(out + par + nop)[:n]


MAX_UNROLLED = 512   # product of unrolled x vectorized extents of a stage (bigger ones exhaust LLVM's memory)


def _sane(cd, sched: Schedule) -> bool:
    """Whether the unrolled/vectorized part of every stage stays small enough to compile."""
    from hlotune.schedule_space.state import replay
    try:
        st = replay(cd, sched.steps)
    except HlotuneError:
        return False
    for stage in st.stages:
        n = 1
        for it in stage.iters:
            if it.kind in (ForKind.UNROLLED, ForKind.VECTORIZED):
                n *= it.extent
            if it.kind is ForKind.VECTORIZED and it.extent > 64:
                return False
        if n > MAX_UNROLLED:
            return False
    return True


def _dedupe(scheds: list[Schedule]) -> list[Schedule]:
    seen: set[str] = set()
    out = []
    for s in scheds:
        if s.key not in seen:
            seen.add(s.key)
            out.append(s)
    return out


def _inputs(task: Task) -> list[np.ndarray]:
    from hlotune.ir.compute import constant_values
    rng = np.random.default_rng(zlib.crc32(task.key.encode()))
    consts = constant_values(task.compute)
    out = []
    for b in task.compute.inputs:
        if b.name in consts:
            out.append(np.ascontiguousarray(consts[b.name]))
        else:
            out.append((np.abs(rng.standard_normal(b.shape)) + 0.5).astype(b.dtype.np))
    return out


def measure_in_process(task: Task, sched: Schedule, args: list[np.ndarray], ref: list[np.ndarray] | None):
    """(costs, error_kind, message, outputs) of one schedule, built and timed in this process."""
    from hlotune.codegen.llvm_cpu import build_cpu
    try:
        func = lower(task.compute, sched.steps)
    except HlotuneError as e:
        return (), "instantiation", str(e), None
    try:
        kern = build_cpu(func, task.target)
    except HlotuneError as e:
        return (), "compile", str(e), None
    outs = [np.zeros(b.shape, b.dtype.np) for b in func.outputs]
    run = kern.bind(*args, *outs)
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    if ref is not None:
        for o, r in zip(outs, ref):
            if not np.allclose(o, r, rtol=1e-3, atol=1e-3 * max(1.0, float(np.nanmax(np.abs(r))) if r.size else 1.0),
                               equal_nan=True):
                return (), "wrong_answer", "output differs from the default schedule's", None
    k = max(1, int(np.ceil(MIN_REPEAT_S / max(first, 1e-7))))
    costs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(k):
            run()
        costs.append((time.perf_counter() - t0) / k)
    return tuple(costs), "none", "", outs


def record_of(task: Task, sched: Schedule, costs, kind: str, msg: str, build_s: float, wl_json: str) -> Record:
    return Record(workload_key=task.key, workload=wl_json, target=task.target.fingerprint,
                  target_family=task.target.family, steps=json.dumps([step_to_json(s) for s in sched.steps]),
                  schedule_key=sched.key, costs=tuple(costs), error_kind=kind, error_msg=msg[:500], build_s=build_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="logs/cost_model_data.db")
    ap.add_argument("--per-task", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", nargs="*", default=None, help="only these fixture models")
    ap.add_argument("--max-tasks", type=int, default=0)
    a = ap.parse_args(argv)
    target = Target.host_cpu()
    tasks = fixture_tasks(target, a.models)
    if a.max_tasks:
        tasks = tasks[:a.max_tasks]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    db = open_database(a.out)
    print(f"{len(tasks)} tasks, {a.per_task} schedules each -> {a.out}", flush=True)
    for ti, task in enumerate(tasks):
        scheds = schedules_for(task, a.per_task, a.seed)
        have = db.schedule_keys(task.key, target.fingerprint)
        args = _inputs(task)
        wl_json = workload_to_json(task.compute)
        t_task = time.perf_counter()
        _c, kind, msg, ref = measure_in_process(task, scheds[0], args, None)
        recs, best = [], float("inf")
        for s in scheds:
            if s.key in have:
                continue
            t0 = time.perf_counter()
            costs, kind, msg, _ = measure_in_process(task, s, args, ref)
            recs.append(record_of(task, s, costs, kind, msg, time.perf_counter() - t0, wl_json))
            if costs:
                best = min(best, float(np.median(costs)))
        db.add_many(recs)
        print(f"[{ti + 1}/{len(tasks)}] {task.name}: {len(recs)} measured, best {best * 1e6:.1f} us, "
              f"{time.perf_counter() - t_task:.1f} s", flush=True)
    db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
