"""GEMM-shaped models with default schedules against numpy and JAX-jit, and before/after a change, in one run.

    .venv/bin/python benchmarks/gemm_check.py [--models matmul,dense_bias_relu,...] [--before-rev HEAD]
        [--schedule SCHEDULE.json] [--rounds 5] [--cpu-time] [--no-jax] [--jax-python /tmp/vb/bin/python]

For each model at bench size (inputs from `common.bench_inputs`): JAX-jit through `run_all.run_jax` (its own
process, its own timing), then in this process numpy (`bench_models.NUMPY_IMPLS`, where there is one),
hlotune compiled with the default schedules of the working tree ("after") and, with --before-rev, with those of
`hlotune/schedule_space/default.py` at that git revision ("before"), every output checked against JAX's (or
numpy's).  --schedule: a schedule (JSON: a database record's steps, {"steps": [...]}) for matmul's one
subgraph, timed as one more side.  The sides are timed in --rounds interleaved rounds (a burst of load from
other jobs then hits all of them); the best median per side is kept.  --cpu-time: time by the calling
thread's CPU time (set HLOTUNE_NUM_THREADS=1 for it: the kernels then run on this thread only), which other
processes on the cores disturb much less than wall time; numpy's OpenBLAS threads are not counted then, so its
column is not comparable in that mode.
Prints one table: ms and GFLOP/s per side, after/before, after/numpy and after/JAX.

Map: load_before(rev) / compile_side(name, entry, args, schedule_fn) / schedule_side(path, entry, args) /
     time_side(fn, clock, min_s) / main
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_models import NUMPY_IMPLS  # noqa: E402
from common import REPO, bench_hlo_path, bench_inputs, compare, load_manifest, warm_malloc  # noqa: E402
from run_all import _load_outs, run_jax  # noqa: E402

MODELS = ("matmul", "dense_bias_relu", "batch_matmul", "mlp2", "transformer_block", "conv2d_bias_relu")
DEFAULT_MODULE = "hlotune.schedule_space.default"


def load_before(rev: str) -> types.ModuleType:
    """`hlotune/schedule_space/default.py` at git revision `rev`, loaded as a module of the package (so its
    relative imports resolve against the working tree's other modules)."""
    src = subprocess.run(["git", "show", f"{rev}:hlotune/schedule_space/default.py"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType(DEFAULT_MODULE + "_before")
    mod.__package__ = "hlotune.schedule_space"
    sys.modules[mod.__name__] = mod
    exec(compile(src, f"<default.py@{rev}>", "exec"), mod.__dict__)  # noqa: S102 - our own file at a revision
    return mod


def compile_with(model: str, default_fn=None):
    """`hlotune.compile(model)` with the default schedules of `default_fn` (e.g. `load_before(rev)`'s) when given."""
    import hlotune
    from hlotune.schedule_space import default

    saved = default.default_schedule
    if default_fn is not None:
        default.default_schedule = default_fn
    try:
        return hlotune.compile(model)
    finally:
        default.default_schedule = saved


def compile_side(name: str, entry: dict, args: list[np.ndarray], default_fn=None) -> dict:
    """Compile the bench HLO with the default schedules (of `default_fn` when given) and run it once."""
    exe = compile_with(str(bench_hlo_path(name, entry)), default_fn)
    outs = [np.asarray(x) for x in exe(*args)]
    return {"fn": lambda: exe(*args), "outs": outs}


def schedule_side(path: str, entry: dict, args: list[np.ndarray]) -> dict:
    """matmul's one subgraph compiled with the schedule in `path` (JSON steps)."""
    import hlotune
    from hlotune.codegen.llvm_cpu import build_cpu
    from hlotune.schedule_space.lower import lower
    from hlotune.schedule_space.steps import step_from_json

    d = json.loads(Path(path).read_text())
    steps = [step_from_json(x) for x in (d["steps"] if isinstance(d, dict) else d)]
    (sg,) = hlotune.load_model(str(bench_hlo_path("matmul", entry))).frontend.subgraphs
    kern = build_cpu(lower(sg.workload.compute, steps))
    out = np.zeros(args[0].shape[:-1] + args[1].shape[-1:], np.float32)
    run = kern.bind(*args, out)
    run()
    return {"fn": run, "outs": [out]}


def time_side(fn, clock, min_s: float) -> float:
    """Median seconds per call of `fn` over at least 5 calls and `min_s` of `clock`, after one warm-up call."""
    fn()
    times: list[float] = []
    start = clock()
    while len(times) < 5 or clock() - start < min_s:
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def _fmt(ms: float | None, flops: float) -> str:
    return "-" if ms is None else f"{ms:.3f} ({flops / ms / 1e6:.0f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--before-rev", default=None, help="git revision of default.py for the 'before' side")
    ap.add_argument("--schedule", default=None, help="a schedule (JSON) for matmul, timed as one more side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.2)
    ap.add_argument("--cpu-time", action="store_true", help="time by this thread's CPU time")
    ap.add_argument("--jax-python", default="/tmp/vb/bin/python")
    ap.add_argument("--no-jax", action="store_true")
    a = ap.parse_args(argv)
    warm_malloc()
    clock = time.thread_time if a.cpu_time else time.perf_counter
    before = load_before(a.before_rev).default_schedule if a.before_rev else None
    manifest = load_manifest()["models"]
    head = ("| model | GFLOP | JAX ms (GFLOP/s) | numpy | before | after | schedule | after/before | after/numpy "
            "| after/JAX | check |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name in a.models.split(","):
        entry = manifest[name]
        args = bench_inputs(name, entry)
        flops = float(entry["bench"]["flops"])
        jax_ms, refs = None, None
        if not a.no_jax:
            with tempfile.TemporaryDirectory(prefix=f"gemm-{name}-") as d:
                tmp = Path(d)
                np.savez(tmp / "in.npz", **{f"arg{i}": x for i, x in enumerate(args)})
                jax = run_jax(name, tmp, a.jax_python, quick=True, timeout=300)
                if jax.get("ok"):
                    jax_ms = jax["timing"]["median_s"] * 1e3
                    refs = _load_outs(tmp / "jax.npz")
        sides: dict[str, dict] = {}
        if name in NUMPY_IMPLS:
            impl = NUMPY_IMPLS[name]
            sides["numpy"] = {"fn": lambda impl=impl, args=args: impl(*args), "outs": [impl(*args)]}
        if before is not None:
            sides["before"] = compile_side(name, entry, args, before)
        sides["after"] = compile_side(name, entry, args)
        if a.schedule and name == "matmul":
            sides["schedule"] = schedule_side(a.schedule, entry, args)
        refs = refs if refs is not None else sides.get("numpy", {}).get("outs")
        checks = {k: compare(v["outs"][:len(refs)], refs)["ok"] for k, v in sides.items() if k != "numpy"} \
            if refs is not None else {}
        for side in sides.values():
            side["ms"] = []
        for _ in range(a.rounds):
            for side in sides.values():
                side["ms"].append(time_side(side["fn"], clock, a.min_seconds) * 1e3)
        best = {k: min(v["ms"]) for k, v in sides.items()}
        aft = best["after"]

        def ratio(x, aft=aft):
            return f"{x / aft:.2f}x" if x else "-"
        ok = " ".join(f"{k}:{'ok' if v else 'FAIL'}" for k, v in checks.items()) or "-"
        lines.append(f"| {name} | {flops / 1e9:.2f} | {_fmt(jax_ms, flops)} | {_fmt(best.get('numpy'), flops)} | "
                     f"{_fmt(best.get('before'), flops)} | {_fmt(aft, flops)} | {_fmt(best.get('schedule'), flops)} | "
                     f"{ratio(best.get('before'))} | {ratio(best.get('numpy'))} | {ratio(jax_ms)} | {ok} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
