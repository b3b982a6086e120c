"""Per-call overhead of CPU executables: the old Python glue walk against the call plan (and the
transpose(dot) fold), interleaved in one run, with JAX-jit of the same run beside them.

    .venv/bin/python benchmarks/overhead_check.py [--models a,b] [--rounds 7] [--jax-python /tmp/vb/bin/python]
        [--seconds 0.25] [--json out.json] [--size {bench,test}]

Arms (settings changed for this process only, each model compiled once per arm):
  old     cpu_call_plan=off, fold_dot_transpose=off  (the glue program walked in Python per call)
  plan    cpu_call_plan=on,  fold_dot_transpose=off
  new     cpu_call_plan=on,  fold_dot_transpose=on   (the defaults)
Each round times every arm in turn (old, plan, new; the order rotates per round) for `--seconds`;
a row reports the median over rounds of each arm's per-round median, the best single call, and
ratios computed within the run.  JAX runs (benchmarks/run_all.py `run_jax`, a subprocess of the side
venv) before every JAX_EVERY-th round and after the last; its fastest median (and best call) counts.
Every arm's outputs are checked against JAX's (or the reference interpreter's without JAX).  Run nice'd
on a shared machine: ratios matter, not absolute times; under load, the best calls say more than the
medians.  `--profile` also times each kernel of the new arm alone (`Executable.profile`).

Map: ARMS / compile_arm / time_arm / model_and_inputs / run_model / main
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODELS_DIR, bench_hlo_path, bench_inputs, compare, load_manifest, warm_malloc  # noqa: E402
from run_all import run_jax  # noqa: E402

import hlotune  # noqa: E402
from hlotune import config  # noqa: E402

MODELS = ("mlp_train_step", "mlp2", "batch_matmul", "transformer_block", "softmax", "relu_chain")
ARMS = {"old": {"cpu_call_plan": False, "fold_dot_transpose": False},
        "plan": {"cpu_call_plan": True, "fold_dot_transpose": False},
        "new": {"cpu_call_plan": True, "fold_dot_transpose": True}}
JAX_EVERY = 3   # rounds between two JAX runs (JAX also runs after the last round)


def compile_arm(path: Path, settings: dict):
    saved = {k: config.get(k) for k in settings}
    try:
        for k, v in settings.items():
            config.replace_default(k, v)
        return hlotune.compile(hlotune.load_model(str(path)))
    finally:
        for k, v in saved.items():
            config.replace_default(k, v)


def time_arm(exe, args, seconds: float) -> list[float]:
    exe(*args)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        exe(*args)
        times.append(time.perf_counter() - t0)
    return times


def model_and_inputs(name: str, entry: dict, size: str) -> tuple[Path, list[np.ndarray]]:
    """The model file and its inputs: bench size (seeded normal inputs) or the fixture's test size (its npz)."""
    if size == "bench":
        return bench_hlo_path(name, entry), bench_inputs(name, entry)
    with np.load(MODELS_DIR / entry["files"]["npz"]) as z:
        args = [z[f"arg{i}"] for i in range(sum(f.startswith("arg") for f in z.files))]
    return MODELS_DIR / entry["files"]["hlo"], args


def run_model(name: str, entry: dict, a: argparse.Namespace) -> dict:
    path, args = model_and_inputs(name, entry, a.size)
    exes = {arm: compile_arm(path, s) for arm, s in ARMS.items()}
    row: dict = {"model": name, "subgraphs": {arm: len(e._subgraphs) for arm, e in exes.items()}}
    with tempfile.TemporaryDirectory(prefix=f"hlotune-ovh-{name}-") as d:
        tmp = Path(d)
        np.savez(tmp / "in.npz", **{f"arg{i}": x for i, x in enumerate(args)})
        jax = []
        per_round: dict[str, list[float]] = {arm: [] for arm in exes}
        best = {arm: float("inf") for arm in exes}
        order = list(exes)
        for r in range(a.rounds):
            if a.jax_python and r % JAX_EVERY == 0:
                jax.append(run_jax(name, tmp, a.jax_python, True, 300))
            for arm in order[r % len(order):] + order[: r % len(order)]:
                ts = time_arm(exes[arm], args, a.seconds)
                per_round[arm].append(statistics.median(ts))
                best[arm] = min(best[arm], min(ts))
        if a.jax_python:
            jax.append(run_jax(name, tmp, a.jax_python, True, 300))
        refs = None
        if (tmp / "jax.npz").exists():
            with np.load(tmp / "jax.npz") as z:
                refs = [z[f"out{i}"] for i in range(len(z.files))]
        if refs is None:
            refs = list(hlotune.reference_run(hlotune.load_model(str(path)), args))
        row["check"] = {arm: compare(list(e(*args)), refs)["ok"] for arm, e in exes.items()}
    if a.profile:
        prof = exes["new"].profile(*args, repeats=30)
        total = sum(t for _, _, t in prof)
        row["profile_new"] = [(n, t) for n, _, t in prof]
        print(f"{name} (new): kernels alone sum {total * 1e3:.3f} ms; " + ", ".join(
            f"{n} {t * 1e3:.3f}" for n, t in sorted(row["profile_new"], key=lambda x: -x[1])), flush=True)
    row["median_s"] = {arm: statistics.median(v) for arm, v in per_round.items()}
    row["best_s"] = best
    ok_jax = [j["timing"] for j in jax if j.get("ok") and "timing" in j]
    row["jax_s"] = min(t["median_s"] for t in ok_jax) if ok_jax else None
    row["jax_best_s"] = min(t["min_s"] for t in ok_jax) if ok_jax else None
    return row


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def render(rows: list[dict]) -> str:
    out = ["| model | subgraphs old/new | old ms | plan ms | new ms | new vs old | JAX-jit ms | new vs JAX | "
           "best old/new/JAX ms | outputs ok |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, jax = r["median_s"], r["jax_s"]
        vs_jax = f"{jax / m['new']:.2f}x" if jax else "-"
        out.append(f"| {r['model']} | {r['subgraphs']['old']}/{r['subgraphs']['new']} | {_ms(m['old'])} | "
                   f"{_ms(m['plan'])} | {_ms(m['new'])} | {m['old'] / m['new']:.2f}x | {_ms(jax)} | {vs_jax} | "
                   f"{_ms(r['best_s']['old'])}/{_ms(r['best_s']['new'])}/{_ms(r['jax_best_s'])} | "
                   f"{'yes' if all(r['check'].values()) else r['check']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.25, help="timing per arm per round")
    ap.add_argument("--jax-python", default="/tmp/vb/bin/python", help="python of a venv with JAX ('' for none)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--size", choices=("bench", "test"), default="bench",
                    help="bench shapes, or the fixtures' test shapes (per-call overhead dominates there)")
    ap.add_argument("--profile", action="store_true", help="also time each kernel of the new arm alone")
    a = ap.parse_args()
    if a.jax_python and not Path(a.jax_python).exists():
        a.jax_python = ""
    warm_malloc()   # the same glibc setting JAX's side gets from run_all's MALLOC_ENV
    manifest = load_manifest()["models"]
    rows = []
    for name in a.models.split(","):
        rows.append(run_model(name, manifest[name], a))
        print(json.dumps(rows[-1]), flush=True)
    print(render(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
