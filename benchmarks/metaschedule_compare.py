"""Issue 6's peer comparison: hlotune's search against TVM MetaSchedule at equal trials, in one run.

    .venv/bin/python benchmarks/metaschedule_compare.py --tvm-python TVM_VENV/bin/python \
        [--jax-python JAX_VENV/bin/python] [--workloads matmul,dense_bias_relu,softmax] [--trials 64 256] \
        [--out logs/ms_compare] [--skip-tvm] [--skip-hlotune] [--report-only]

Workloads A, B, C of `../shared/peers` are exactly the bench sizes of three fixtures: A = matmul (1024^3),
B = dense_bias_relu (relu(X[512,1024] W[1024,1024] + b)), C = softmax (4096x1024).

Steps (each result is saved in `<out>/state.json` as it arrives, so a stopped run keeps what it measured):
  1. hlotune: `tune_model` on the fixture's bench HLO into `<out>/<workload>.db`, first to the smaller trial
     budget, then resumed to the larger one (the same run continued, as MetaSchedule's snapshot is a prefix of
     its run); after each budget the model is compiled with the database and timed in a fresh process
     (`bench_models.py --tuning-log`, the same timing rule as the CPU table), its outputs checked against
     numpy.  The tuning wall time per measured trial is the run's wall time over its trials.
  2. TVM MetaSchedule: the shared peer script `peers_cpu_tvm.py` (from `--peers`) in its own venv, one
     process per workload, with its target set to this machine's CPU (`-mcpu` from LLVM's host name, all
     cores), max trials = the larger budget and a snapshot at the smaller one.
  3. JAX-jit (optional): `jax_side.py` in the JAX venv, the same inputs.
  4. report: the marked section `metaschedule` of docs/benchmarks.md.
Load average is logged at each step: the machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import REPO, bench_hlo_path, bench_inputs, load_manifest, replace_section  # noqa: E402

HERE = Path(__file__).resolve().parent
START = "<!-- bench:metaschedule:start -->"
END = "<!-- bench:metaschedule:end -->"
LETTER = {"matmul": "A", "dense_bias_relu": "B", "softmax": "C"}

#: run inside the TVM venv: the peer script with its target replaced by this machine's
TVM_WRAPPER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import peers_cpu_tvm as p
p.TARGET = json.loads(sys.argv[2])
sys.argv = ["peers_cpu_tvm.py"] + sys.argv[3:]
p.main()
"""


def loadavg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def save(state: dict, out: Path) -> None:
    tmp = out / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1, default=str))
    os.replace(tmp, out / "state.json")


def host_mcpu() -> str:
    import llvmlite.binding as llvm

    try:
        llvm.initialize_native_target()
    except Exception:  # noqa: BLE001 - newer llvmlite initializes itself
        pass
    return llvm.get_host_cpu_name()


def reference(name: str, args: list[np.ndarray]) -> np.ndarray:
    x = [a.astype(np.float64) for a in args]
    if name == "matmul":
        return x[0] @ x[1]
    if name == "dense_bias_relu":
        return np.maximum(x[0] @ x[1] + x[2], 0.0)
    e = np.exp(x[0] - x[0].max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def time_hlotune(name: str, tmp: Path, db: str | None) -> dict:
    """Compile (with the tuning log) and time the model in a fresh process; check its output."""
    cmd = [sys.executable, str(HERE / "bench_models.py"), name, "--side", "hlotune", "--inputs", str(tmp / "in.npz"),
           "--outputs", str(tmp / "out.npz")] + (["--tuning-log", db] if db else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    steps = {d["step"]: d for d in (json.loads(x) for x in p.stdout.splitlines() if x.startswith("{"))
             if "step" in d}
    h = steps.get("hlotune", {})
    if not h.get("ok"):
        return {"ok": False, "error": h.get("error") or p.stderr[-300:]}
    with np.load(tmp / "in.npz") as z:
        args = [z[f"arg{i}"] for i in range(len(z.files))]
    with np.load(tmp / "out.npz") as z:
        got = z["out0"]
    ref = reference(name, args)
    err = float(np.abs(got - ref).max() / max(1e-30, np.abs(ref).max()))
    return {"ok": True, "ms": h["timing"]["median_s"] * 1e3, "rel_err": err, "timing": h["timing"]}


def run_hlotune(a, name: str, state: dict, out: Path) -> None:
    import hlotune
    from hlotune.database import open_database
    from hlotune.search.tuner import tune_model
    from hlotune.target import Target

    entry = load_manifest()["models"][name]
    res = state.setdefault("hlotune", {}).setdefault(name, {})
    db_path = out / f"{name}.db"
    with tempfile.TemporaryDirectory(prefix="hlotune-ms-") as d:
        tmp = Path(d)
        np.savez(tmp / "in.npz", **{f"arg{i}": x for i, x in enumerate(bench_inputs(name, entry))})
        if "default" not in res:
            res["default"] = time_hlotune(name, tmp, None)
            save(state, out)
        if not a.resume and db_path.exists() and not res.get("budgets"):
            db_path.unlink()
        model = hlotune.load_model(str(bench_hlo_path(name, entry)))
        wall = res.get("tune_wall_s", 0.0)
        for n in sorted(a.trials):
            key = str(n)
            if key in res.setdefault("budgets", {}):
                continue
            db = open_database(str(db_path))
            t0 = time.perf_counter()
            try:
                rep = tune_model(model, db, Target.host_cpu(), trials=n, seed=a.seed, cost_model=a.cost_model,
                                                      progress=False, write_log=False, early_stopping=None,
                                                      db_location=str(db_path))
            finally:
                db.close()
            wall += time.perf_counter() - t0
            t = time_hlotune(name, tmp, str(db_path))
            res["budgets"][key] = {"trials": rep.total_trials, "tune_wall_s": wall, "search_s": rep.search_s,
                                   "measure_s": rep.measure_s, "estimated_ms": (rep.model_latency_s or 0) * 1e3,
                                   "load": loadavg(), **t}
            res["tune_wall_s"] = wall
            print(f"[{time.strftime('%H:%M:%S')} load {loadavg()}] hlotune {name} @{n}: "
                  f"{t.get('ms', float('nan')):.3f} ms, tuning {wall:.0f} s", flush=True)
            save(state, out)


def run_tvm(a, name: str, state: dict, out: Path) -> None:
    res = state.setdefault("tvm", {})
    if name in res:
        return
    target = {"kind": "llvm", "mcpu": a.mcpu, "num-cores": os.cpu_count() or 1}
    part = out / f"tvm_{name}.json"
    cmd = [a.tvm_python, "-c", TVM_WRAPPER, a.peers, json.dumps(target), "--workloads", name,
           "--trials", str(max(a.trials)), "--snap", str(min(a.trials)), "--workdir", str(out / "tvm_work"),
           "--out", str(part)]
    env = dict(os.environ, TVM_NUM_THREADS=str(os.cpu_count() or 1))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.tvm_timeout)
    (out / f"tvm_{name}.log").write_text(p.stdout + "\n" + p.stderr)
    if p.returncode != 0 or not part.exists():
        res[name] = {"ok": False, "error": (p.stderr or p.stdout)[-400:], "wall_s": time.perf_counter() - t0}
    else:
        r = json.loads(part.read_text())["results"][0]
        res[name] = {"ok": True, "target": target, "wall_s": time.perf_counter() - t0, **r}
    print(f"[{time.strftime('%H:%M:%S')} load {loadavg()}] tvm {name}: "
          f"{'ok' if res[name]['ok'] else res[name]['error'][-200:]}", flush=True)
    save(state, out)


def run_jax(a, name: str, state: dict, out: Path) -> None:
    res = state.setdefault("jax", {})
    if name in res:
        return
    entry = load_manifest()["models"][name]
    with tempfile.TemporaryDirectory(prefix="hlotune-ms-jax-") as d:
        tmp = Path(d)
        np.savez(tmp / "in.npz", **{f"arg{i}": x for i, x in enumerate(bench_inputs(name, entry))})
        p = subprocess.run([a.jax_python, str(HERE / "jax_side.py"), name, "--inputs", str(tmp / "in.npz"),
                            "--outputs", str(tmp / "jax.npz")], capture_output=True, text=True, timeout=600,
                           cwd=HERE)
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    res[name] = {"ok": True, "ms": lines[-1]["timing"]["median_s"] * 1e3} if p.returncode == 0 and lines else \
        {"ok": False, "error": p.stderr[-300:]}
    save(state, out)


# ----------------------------------------------------------------------------- report

def _f(x, spec=".3f") -> str:
    return "—" if x is None else format(x, spec)


def report(a, state: dict, command: str) -> str:
    lo, hi = (str(n) for n in sorted(state.get("trials", a.trials)))
    L = ["## Search: hlotune vs TVM MetaSchedule at equal trials (workloads A, B, C of ../shared/peers)", "",
         f"Made by `{command}` on {state.get('started', '?')} (load average at start {state.get('load_start')}, "
         f"at the end {state.get('load_end')}). TVM {state.get('tvm_version', '?')} MetaSchedule through the shared "
         f"peer script with target `{json.dumps(state.get('tvm_target'))}` (this machine's CPU, all cores); hlotune "
         f"with its defaults (evolutionary search, XGBoost cost model, batch 64, confirmation of new bests), one "
         f"run per workload continued from {lo} to {hi} trials. Latencies: the tuned program timed after tuning "
         f"(hlotune: the compiled model in a fresh process, median of ≥20 calls; TVM: the peer script's "
         f"`confirm` median of ≥20 calls). Tuning time per trial = tuning wall time / trials.", ""]
    L.append(f"| workload | JAX-jit ms | hlotune default ms | hlotune @{lo} ms | hlotune @{hi} ms | MetaSchedule "
             f"@{lo} ms | MetaSchedule @{hi} ms | hlotune @{lo} vs MS @{hi} | hlotune s/trial | MS s/trial | "
             f"speed of tuning |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for name in a.workloads:
        h = state.get("hlotune", {}).get(name, {})
        t = state.get("tvm", {}).get(name, {})
        j = state.get("jax", {}).get(name, {})
        hb = h.get("budgets", {})
        h_lo, h_hi = (hb.get(lo) or {}).get("ms"), (hb.get(hi) or {}).get("ms")
        t_lo, t_hi = (t.get(f"ms@{lo}") or {}).get("ms"), (t.get(f"ms@{hi}") or {}).get("ms")
        h_rate = (hb.get(hi) or {}).get("tune_wall_s", 0) / max(1, (hb.get(hi) or {}).get("trials", 0) or 1)
        t_rec = t.get(f"ms@{hi}") or {}
        t_rate = t_rec.get("tune_wall_s", 0) / max(1, t_rec.get("trials", 0) or 1) if t_rec else None
        vs = t_hi / h_lo if h_lo and t_hi else None
        sp = t_rate / h_rate if t_rate and h_rate else None
        L.append(f"| {LETTER[name]} {name} | {_f(j.get('ms'))} | {_f((h.get('default') or {}).get('ms'))} | "
                 f"{_f(h_lo)} | {_f(h_hi)} | {_f(t_lo)} | {_f(t_hi)} | {_f(vs, '.2f')}x | {_f(h_rate, '.2f')} | "
                 f"{_f(t_rate, '.2f')} | {_f(sp, '.1f')}x |")
        verdicts.append((name, h_lo, h_hi, t_lo, t_hi, sp))
    L += ["", "Targets (issue 6): faster than MetaSchedule at both budgets; hlotune's "
          f"{lo}-trial result at least matches MetaSchedule's {hi}-trial result; tuning wall time per trial at "
          "least 3x shorter.", ""]
    for name, h_lo, h_hi, t_lo, t_hi, sp in verdicts:
        ok1 = h_lo is not None and t_lo is not None and h_hi is not None and t_hi is not None and h_lo < t_lo \
            and h_hi < t_hi
        ok2 = h_lo is not None and t_hi is not None and h_lo <= t_hi
        ok3 = sp is not None and sp >= 3
        L.append(f"- {LETTER[name]} {name}: faster at both budgets: {'met' if ok1 else 'NOT MET'}; "
                 f"@{lo} matches MS @{hi}: {'met' if ok2 else 'NOT MET'}; ≥3x faster tuning per trial: "
                 f"{'met' if ok3 else 'NOT MET'}")
    if a.notes:
        L += ["", a.notes]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tvm-python", default=None, help="python of the TVM venv (see ../shared/peers)")
    ap.add_argument("--jax-python", default=None)
    ap.add_argument("--peers", default=str(REPO.parent / "shared" / "peers"), help="folder of peers_cpu_tvm.py")
    ap.add_argument("--workloads", default="matmul,dense_bias_relu,softmax")
    ap.add_argument("--trials", type=int, nargs=2, default=[64, 256])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="logs/ms_compare")
    ap.add_argument("--resume", action="store_true", help="keep an existing hlotune database")
    ap.add_argument("--cost-model", default="none",
                    help="hlotune's starting cost model: none (cold, as MetaSchedule starts; default), auto (the "
                         "shipped one, which was trained on these fixtures) or a file")
    ap.add_argument("--skip-tvm", action="store_true")
    ap.add_argument("--skip-hlotune", action="store_true")
    ap.add_argument("--tvm-timeout", type=float, default=3600.0)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--notes", default="")
    ap.add_argument("--doc", default=str(REPO / "docs" / "benchmarks.md"))
    a = ap.parse_args(argv)
    command = "python benchmarks/metaschedule_compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
    a.workloads = [w for w in a.workloads.split(",") if w]
    for w in a.workloads:
        if w not in LETTER:
            raise SystemExit(f"unknown workload {w!r} (one of {', '.join(LETTER)})")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    state = json.loads((out / "state.json").read_text()) if (out / "state.json").exists() else {}
    if not a.report_only:
        a.mcpu = host_mcpu()
        state.setdefault("started", time.strftime("%Y-%m-%d %H:%M"))
        state.setdefault("load_start", loadavg())
        state["trials"] = sorted(a.trials)
        for name in a.workloads:
            if not a.skip_hlotune:
                run_hlotune(a, name, state, out)
            if a.tvm_python and not a.skip_tvm:
                run_tvm(a, name, state, out)
                if state["tvm"][name].get("ok"):
                    state["tvm_target"] = state["tvm"][name]["target"]
            if a.jax_python:
                run_jax(a, name, state, out)
        if a.tvm_python:
            v = subprocess.run([a.tvm_python, "-c", "import tvm; print(tvm.__version__)"], capture_output=True,
                               text=True)
            state["tvm_version"] = v.stdout.strip() or "?"
        state["load_end"] = loadavg()
        save(state, out)
    body = report(a, state, command)
    doc = Path(a.doc)
    doc.write_text(replace_section(doc.read_text() if doc.exists() else "", body, START, END))
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
