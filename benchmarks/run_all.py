"""`make bench`: hlotune's CPU benchmark suite (default schedules) against JAX-jit and numpy.

    .venv/bin/python benchmarks/run_all.py [--models a,b] [--quick] [--no-jax] [--out docs/benchmarks.md]
        [--json results.json] [--jax-python .venv-bench/bin/python] [--timeout 600]

Every fixture model at its bench size (tests/data/models/manifest.json): inputs are made once here and
given to both sides; JAX runs in the side venv `.venv-bench` (`make bench-env`), hlotune and numpy in a
fresh process of this interpreter per model (a crash or hang is that model's row, not the run's end).
hlotune's outputs are checked against JAX's (or, without JAX, the reference interpreter's).  The peaks
(numpy/OpenBLAS matmul, np.copyto bandwidth) are measured in the same run with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unset for that measurement only.  The markdown goes between the markers
`<!-- bench:cpu-default:start/end -->` of --out; the rest of that file is kept.

Map: machine_info / peaks / run_model (jax_side.py + bench_models.py per model) / row_targets /
     render_markdown / write_markdown / main
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import NUMPY_IMPLS  # noqa: E402
from common import (  # noqa: E402
    ATOL,
    MALLOC_ENV,
    REPO,
    RTOL,
    bench_inputs,
    compare,
    load_manifest,
    replace_section,
)

HERE = Path(__file__).resolve().parent
ELEMENTWISE = ("sin_mul_add", "relu_chain", "gelu_tanh")
MIN_SPEEDUP = 0.5
MAX_COMPILE_S = 2.0
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
NEW_DOC = ("# Benchmarks\n\nEach section between `<!-- bench:... -->` markers is written by a script and replaced "
           "when it runs again; text outside the markers is kept.\n\n")


# ---- machine -------------------------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for ln in fh:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cache_sizes() -> dict[str, str]:
    """L1d/L2/L3 sizes of cpu0 from sysfs."""
    out: dict[str, str] = {}
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction":
            out[f"L{level}" + ("d" if kind == "Data" else "")] = _size_text(size)
    return out


def _size_text(size: str) -> str:
    """'491520K' -> '480 MiB', '48K' -> '48 KiB'."""
    if not size.endswith("K") or not size[:-1].isdigit():
        return size
    kib = int(size[:-1])
    return f"{kib // 1024} MiB" if kib >= 1024 and kib % 1024 == 0 else f"{kib} KiB"


def cpu_times() -> list[int]:
    """The aggregate `cpu` line of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    try:
        with open("/proc/stat", encoding="utf-8") as fh:
            return [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def steal_fraction(before: list[int], after: list[int]) -> float | None:
    if len(before) < 8 or len(after) < 8:
        return None
    d = [b - a for a, b in zip(before, after)]
    total = sum(d[:8])
    return d[7] / total if total > 0 else None


def _cmd_out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict:
    info = {"cpu": _cpu_name(), "cores": os.cpu_count(), "caches": cache_sizes(), "python": platform.python_version(),
            "numpy": np.__version__, "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
            # reported only: the peak measurement runs with both unset (see peaks())
            "openblas_env": {k: os.environ.get(k) for k in OPENBLAS_VARS}}
    try:
        import hlotune

        info["hlotune"] = hlotune.__version__
    except ImportError as e:
        info["hlotune"] = f"not importable: {e}"
    try:
        import llvmlite
        import llvmlite.binding as llvm

        info["llvmlite"] = llvmlite.__version__
        info["llvm"] = ".".join(map(str, llvm.llvm_version_info))
        info["llvm_cpu"] = llvm.get_host_cpu_name()
    except ImportError:
        pass
    commit = _cmd_out(["git", "rev-parse", "--short", "HEAD"])
    dirty = _cmd_out(["git", "status", "--porcelain", "--untracked-files=no"])
    info["git"] = (commit or "no commit") + (" (uncommitted changes)" if dirty else "")
    return info


def peaks(quick: bool) -> dict:
    """Run `common.py peaks` in a subprocess with the OpenBLAS overrides unset."""
    unset = [x for k in OPENBLAS_VARS for x in ("-u", k)]
    cmd = ["env", *unset, sys.executable, str(HERE / "common.py"), "peaks"] + (["--quick"] if quick else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"error": f"peak measurement failed: {e}"}


def merge_peaks(runs: list[dict]) -> dict:
    """The best of several peak measurements (the machine is shared: the highest figure is the
    closest to what it can do), each figure a max over the runs; the runs are kept under 'runs'."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": "; ".join(r["error"] for r in runs), "runs": runs}
    out = {k: v for k, v in ok[0].items() if k not in ("matmul_gflops", "copy_gbs")}
    for key in ("matmul_gflops", "copy_gbs"):
        out[key] = {k: max(r[key].get(k, 0.0) for r in ok) for k in ok[0][key]}
    out["peak_gflops"] = max(out["matmul_gflops"].values())
    out["peak_gbs"] = max(out["copy_gbs"].values())
    out["runs"] = runs
    return out


# ---- one model -----------------------------------------------------------------------------------

def _json_lines(text: str) -> list[dict]:
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                out.append(json.loads(ln))
            except ValueError:
                pass
    return out


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _run(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    malloc = [f"{k}={v}" for k, v in MALLOC_ENV.items()]
    try:
        p = subprocess.run(["env", *malloc, *cmd], capture_output=True, text=True, timeout=timeout, cwd=REPO)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        def s(x):
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
        return None, s(e.stdout), s(e.stderr) + f"\ntimed out after {timeout:.0f} s"


def _load_outs(path: Path) -> list[np.ndarray] | None:
    if not path.exists():
        return None
    with np.load(path) as z:
        return [z[f"out{i}"] for i in range(len(z.files))]


def run_jax(name: str, tmp: Path, jax_python: str, quick: bool, timeout: float) -> dict:
    cmd = [jax_python, str(HERE / "jax_side.py"), name, "--inputs", str(tmp / "in.npz"),
           "--outputs", str(tmp / "jax.npz")] + (["--quick"] if quick else [])
    rc, out, err = _run(cmd, timeout)
    lines = _json_lines(out)
    if rc != 0 or not lines:
        return {"ok": False, "error": f"JAX failed (exit {rc}): {_last_line(err) or _last_line(out)}"}
    return {"ok": True, **lines[-1]}


def tuning_log_of(name: str, logs: str | None) -> str | None:
    """The tuning database of model `name` in the folder `logs` (`NAME.db`), when there is one."""
    if not logs:
        return None
    p = Path(logs) / f"{name}.db"
    return str(p) if p.exists() else None


def run_worker(name: str, tmp: Path, side: str, quick: bool, timeout: float, reference: bool = False,
               tuning_log: str | None = None) -> dict:
    """bench_models.py for one side ('hlotune' or 'numpy'); returns its steps by name."""
    cmd = [sys.executable, str(HERE / "bench_models.py"), name, "--side", side, "--inputs", str(tmp / "in.npz"),
           "--outputs", str(tmp / f"{side}.npz")] + (["--tuning-log", tuning_log] if tuning_log else [])
    cmd += (["--quick"] if quick else []) + (["--reference", str(tmp / "ref.npz")] if reference else [])
    rc, out, err = _run(cmd, timeout)
    steps = {d["step"]: d for d in _json_lines(out) if "step" in d}
    if rc != 0:
        why = f"worker {'timed out' if rc is None else f'exited {rc}'}: {_last_line(err)}"
        wanted = ("compile", "hlotune") if side == "hlotune" else ("numpy",) + (("reference",) if reference else ())
        for step in wanted:
            if step not in steps:
                steps[step] = {"ok": False, "error": why}
                break
    return steps


def run_model(name: str, entry: dict, args: argparse.Namespace, jax_python: str | None) -> dict:
    res: dict = {"model": name, "flops": entry["bench"]["flops"], "min_bytes": entry["bench"]["min_bytes"],
                 "bound": "flops" if {"dot", "convolution"} & set(entry.get("hlo_opcodes", ())) else "bytes"}
    with tempfile.TemporaryDirectory(prefix=f"hlotune-bench-{name}-") as d:
        tmp = Path(d)
        np.savez(tmp / "in.npz", **{f"arg{i}": x for i, x in enumerate(bench_inputs(name, entry))})
        if jax_python:
            res["jax"] = run_jax(name, tmp, jax_python, args.quick, args.timeout)
        use_ref = not (res.get("jax") or {}).get("ok")
        if use_ref or name in NUMPY_IMPLS:
            res.update(run_worker(name, tmp, "numpy", args.quick, args.timeout, reference=use_ref))
        res["tuning_log"] = tuning_log_of(name, args.tuning_logs)
        res.update(run_worker(name, tmp, "hlotune", args.quick, args.timeout, tuning_log=res["tuning_log"]))
        ref_name = "jax" if not use_ref else "reference"
        refs = _load_outs(tmp / ("jax.npz" if not use_ref else "ref.npz"))
        outs = _load_outs(tmp / "hlotune.npz")
        if refs is not None:
            if outs is not None:
                res["check"] = {"against": ref_name, **compare(outs, refs)}
            np_outs = _load_outs(tmp / "numpy.npz")
            if np_outs is not None and "numpy" in res:
                res["numpy"]["check"] = {"against": ref_name, **compare(np_outs, refs[:1])}
        elif outs is not None:
            res["check"] = {"against": None, "ok": None, "why": "no reference outputs"}
    return res


# ---- targets and table ---------------------------------------------------------------------------

def _ms(step: dict | None) -> float | None:
    if step and step.get("ok") and "timing" in step:
        return step["timing"]["median_s"] * 1e3
    return None


def derived(res: dict, pk: dict) -> dict:
    """hlotune ms, rate, fraction of peak, JAX ms, speedup, compile s."""
    h_ms, j_ms = _ms(res.get("hlotune")), _ms(res.get("jax"))
    d: dict = {"hlotune_ms": h_ms, "jax_ms": j_ms, "numpy_ms": _ms(res.get("numpy"))}
    comp = res.get("compile") or {}
    d["compile_s"] = comp.get("wall_s") if comp.get("ok") else None
    if h_ms:
        work = res["flops"] if res["bound"] == "flops" else res["min_bytes"]
        d["rate"] = work / (h_ms * 1e-3) / 1e9
        peak = pk.get("peak_gflops") if res["bound"] == "flops" else pk.get("peak_gbs")
        d["peak_fraction"] = d["rate"] / peak if peak else None
    d["speedup"] = j_ms / h_ms if (h_ms and j_ms) else None
    return d


def row_targets(res: dict, d: dict) -> list[str]:
    """The targets this model misses (empty: all met); 'n/a' parts where something was not measured."""
    miss = []
    chk = res.get("check") or {}
    if d["hlotune_ms"] is None:
        return ["did not run"]
    if chk.get("ok") is False:
        miss.append("wrong result")
    elif chk.get("ok") is None:
        miss.append("unchecked")
    if d["speedup"] is None:
        miss.append("no JAX time")
    else:
        if d["speedup"] < MIN_SPEEDUP:
            miss.append(f"{d['speedup']:.2f}x < {MIN_SPEEDUP}x JAX")
        if res["model"] in ELEMENTWISE and d["speedup"] <= 1.0:
            miss.append(f"elementwise {d['speedup']:.2f}x does not beat JAX")
    if d["compile_s"] is None or d["compile_s"] >= MAX_COMPILE_S:
        miss.append(f"compile {d['compile_s']:.2f} s" if d["compile_s"] is not None else "no compile time")
    return miss


def _targets_text(miss: list[str]) -> str:
    if not miss:
        return "pass"
    if miss == ["no JAX time"]:
        return "n/a (no JAX)"
    return "FAIL: " + "; ".join(miss)


def _fmt(x: float | None, spec: str = ".3g", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def _fmt_ms(step: dict | None) -> str:
    if not step:
        return "—"
    if not step.get("ok"):
        return "error"
    t = step["timing"]
    return f"{t['median_s'] * 1e3:.3g} ±{t['spread'] * 100:.0f}%"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def table(results: list[dict], pk: dict) -> tuple[list[str], list[str]]:
    """Markdown table lines and the per-model error notes."""
    head = ("| model | FLOPs | min bytes | hlotune ms | hlotune rate | % of peak | JAX ms | JAX 1st call s "
            "| speedup vs JAX | numpy ms | compile s | max err vs ref (abs / rel) | targets |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    notes = []
    for res in results:
        d = res["derived"]
        rate = (f"{d['rate']:.3g} {'GFLOP/s' if res['bound'] == 'flops' else 'GB/s'}"
                if d.get("rate") else "—")
        chk = res.get("check") or {}
        err = (f"{chk['max_abs_err']:.2g} / {chk['max_rel_err']:.2g}" + ("" if chk.get("ok") else " ✗")
               if chk.get("max_abs_err") is not None else "—")
        if chk.get("against") == "reference":
            err += " (interp)"
        miss = res["missed"]
        jax = res.get("jax") or {}
        cells = [res["model"], f"{res['flops']:.3g}", f"{res['min_bytes']:.3g}", _fmt_ms(res.get("hlotune")), rate,
                 _fmt(d.get("peak_fraction") and d["peak_fraction"] * 100, ".0f") + ("%" if d.get("peak_fraction")
                                                                                     else ""),
                 _fmt_ms(jax), _fmt(jax.get("first_call_s"), ".2f"), _fmt(d["speedup"], ".2f") +
                 ("x" if d["speedup"] else ""), _fmt_ms(res.get("numpy")), _fmt(d["compile_s"], ".2f"), err,
                 _targets_text(miss)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        for step in ("compile", "hlotune", "jax", "numpy", "reference"):
            s = res.get(step)
            if s and not s.get("ok") and s.get("error"):
                notes.append(f"- `{res['model']}` {step}: {_cell(s['error'])}")
        if chk.get("ok") is False and chk.get("why"):
            notes.append(f"- `{res['model']}` check against {chk.get('against')}: {chk['why']}")
    gm = {k: _geomean([r["derived"].get(k) for r in results]) for k in ("hlotune_ms", "jax_ms", "speedup")}
    both = [r for r in results if r["derived"].get("speedup")]
    lines.append("| **geometric mean** | | | " + _fmt(gm["hlotune_ms"]) + " | | | " + _fmt(gm["jax_ms"]) +
                 f" | | **{_fmt(gm['speedup'], '.2f')}x** ({len(both)} models) | | "
                 + _fmt(_geomean([r["derived"].get("compile_s") for r in results]), ".2f") + " | | |")
    return lines, notes


def render_markdown(results: list[dict], info: dict, pk: dict, command: str, started: str, wall_s: float,
                    steal: float | None, quick: bool, tuned: bool = False) -> str:
    lines, notes = table(results, pk)
    if tuned:
        return _render_tuned(results, lines, notes, info, command, started, wall_s, steal)
    n_pass = sum(1 for r in results if not r["missed"])
    n_judged = sum(1 for r in results if r["missed"] != ["no JAX time"])
    blas = pk.get("blas", {})
    jaxv = next((r["jax"].get("jax") for r in results if (r.get("jax") or {}).get("ok")), None)
    mm = pk.get("matmul_gflops", {})
    cp = pk.get("copy_gbs", {})
    env = ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in info["openblas_env"].items())
    out = [
        "## CPU: default schedules vs JAX-jit and numpy",
        "",
        f"Made by `{command}` on {started} ({wall_s:.0f} s{', --quick: fewer repeats' if quick else ''}).",
        "",
        f"- Machine: {info['cpu']}, {info['cores']} cores (LLVM CPU `{info.get('llvm_cpu', '?')}`; caches "
        f"{', '.join(f'{k} {v}' for k, v in info['caches'].items()) or '?'}: a model whose data fits in the last "
        "level can pass 100% of the copy peak, which moves 512 MB); load average at "
        f"start {', '.join(f'{x:.2f}' for x in info['loadavg'] or ())}; CPU steal during the run "
        f"{_fmt(steal and steal * 100, '.1f')}% (/proc/stat). Steal and other jobs move single figures by tens of "
        "percent between runs: compare ratios taken in one run; ±x% is half the p10–p90 range of the repeats.",
        f"- Peaks measured in this run (numpy {pk.get('numpy', '?')}, {blas.get('api', '?')} "
        f"{blas.get('version', '')}, kernel `{blas.get('kernel', '?')}`, {blas.get('threads', '?')} threads, via "
        f"{blas.get('via', '?')}; with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset; measured at the start and at "
        f"the end, best of the two{_peak_runs_text(pk)}): matmul float32 1024³ "
        f"{_fmt(mm.get('1024'), '.0f')} GFLOP/s, 2048³ {_fmt(mm.get('2048'), '.0f')} GFLOP/s; np.copyto of 256 MB "
        + ", ".join(f"{_fmt(v, '.1f')} GB/s with {k} thread(s)" for k, v in cp.items())
        + " (read + write bytes). '% of peak' uses the best of these. This process's environment: " + env + ".",
        f"- Versions: hlotune {info.get('hlotune')} (git {info.get('git')}), Python {info['python']}, numpy "
        f"{info['numpy']}, llvmlite {info.get('llvmlite', '?')} (LLVM {info.get('llvm', '?')}), JAX "
        f"{jaxv or 'not run'}.",
        "",
        *lines,
        "",
        f"Targets: {n_pass} of {n_judged} models judged meet all of theirs: result within tolerance of JAX's, at "
        f"least {MIN_SPEEDUP}x JAX-jit's speed, the elementwise models ({', '.join(ELEMENTWISE)}) faster than "
        f"JAX-jit, whole-model compile under {MAX_COMPILE_S:.0f} s.",
        "",
        "How: inputs are standard-normal float32 at the bench shapes of `tests/data/models/manifest.json`, made once "
        "and given to every side. hlotune: `hlotune.compile(NAME.bench.hlo)` with default schedules (compile s = its "
        "wall time in a fresh process, cold kernel cache, after one tiny warm-up compile for LLVM start-up), then "
        "`exe(*inputs)`. JAX: `jax.jit` of the manifest's `jax_source`, inputs on the device, `block_until_ready`; "
        "'1st call' is trace + compile + run. numpy: a plain numpy version where one is natural. Timing: warm-up, "
        "then at least 20 calls and 1 s (capped at 20 s), median. Every side runs with glibc's "
        f"{' '.join(f'{k}={v}' for k, v in MALLOC_ENV.items())} (freed big buffers reused, as in "
        "`jax_cpu_times.json`). Rate: GFLOP/s (manifest FLOPs) for models with dot/convolution, else GB/s of the "
        "manifest's minimum bytes. Error: max |hlotune − JAX| (abs) and that over max(1, max|JAX|) (rel); within "
        f"tolerance means |Δ| ≤ {RTOL:g}·|JAX| + {ATOL:g}·max(1, max|JAX|) elementwise.",
    ]
    if notes:
        out += ["", "Errors:", "", *notes]
    return "\n".join(out) + "\n"


def _render_tuned(results, lines, notes, info, command, started, wall_s, steal) -> str:
    """The tuned-schedules section: the same table, with issue 6's targets."""
    sp = [r["derived"].get("speedup") for r in results]
    gm = _geomean(sp)
    slower = [r["model"] for r in results if (r["derived"].get("speedup") or 0) < 1.0]
    logs = ", ".join(f"{r['model']} ({Path(r['tuning_log']).name})" for r in results if r.get("tuning_log"))
    untuned = [r["model"] for r in results if not r.get("tuning_log")]
    out = ["## CPU: tuned schedules vs JAX-jit", "",
           f"Made by `{command}` on {started} ({wall_s:.0f} s); load average at start "
           f"{', '.join(f'{x:.2f}' for x in info['loadavg'] or ())}; CPU steal {_fmt(steal and steal * 100, '.1f')}%. "
           "Same method as the default-schedule table above, but each model is compiled with the best schedules of "
           f"its tuning database: {logs or 'none'}" + (f"; no database (default schedules): {', '.join(untuned)}"
                                                        if untuned else "") + ".", "", *lines, "",
           f"Targets (issue 6): geometric mean ≥ 1.5x JAX-jit: {_fmt(gm, '.2f')}x -> "
           f"{'met' if gm and gm >= 1.5 else 'NOT MET'}; no model slower than JAX: "
           + ("met" if not slower else f"NOT MET ({', '.join(slower)})") + "."]
    if notes:
        out += ["", "Errors:", "", *notes]
    return "\n".join(out) + "\n"


def _peak_runs_text(pk: dict) -> str:
    runs = [r for r in pk.get("runs", ()) if "error" not in r]
    if len(runs) < 2:
        return ""
    return (" — start / end: " + " / ".join(f"{r['peak_gflops']:.0f}" for r in runs) + " GFLOP/s, "
            + " / ".join(f"{r['peak_gbs']:.1f}" for r in runs) + " GB/s")


TUNED_START = "<!-- bench:cpu-tuned:start -->"
TUNED_END = "<!-- bench:cpu-tuned:end -->"


def write_markdown(path: Path, body: str, tuned: bool = False) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else NEW_DOC
    path.parent.mkdir(parents=True, exist_ok=True)
    marks = (TUNED_START, TUNED_END) if tuned else ()
    path.write_text(replace_section(text, body, *marks), encoding="utf-8")


# ---- main ----------------------------------------------------------------------------------------

def _progress(res: dict) -> str:
    d = res["derived"]
    return (f"{res['model']:18s} hlotune {_fmt(d['hlotune_ms'])} ms  JAX {_fmt(d['jax_ms'])} ms  "
            f"speedup {_fmt(d['speedup'], '.2f')}  numpy {_fmt(d['numpy_ms'])} ms  "
            f"compile {_fmt(d['compile_s'], '.2f')} s"
            f"  {_targets_text(res['missed'])}")


def _print_peaks(what: str, pk: dict) -> None:
    if "error" in pk:
        print(f"{what}: {pk['error']}", flush=True)
        return
    mm = ", ".join(f"{k}^3 {v:.0f}" for k, v in pk["matmul_gflops"].items())
    cp = ", ".join(f"{k} thread(s) {v:.1f}" for k, v in pk["copy_gbs"].items())
    print(f"{what}: matmul GFLOP/s {mm}; copy GB/s {cp}; BLAS kernel {pk['blas'].get('kernel')}", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated model names (default: all in the manifest)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--no-jax", action="store_true", help="skip JAX (hlotune is checked by the reference interpreter)")
    ap.add_argument("--jax-python", default=str(REPO / ".venv-bench" / "bin" / "python"),
                    help="interpreter of the side venv with JAX (default: .venv-bench, made by `make bench-env`)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"), help="markdown file to update")
    ap.add_argument("--json", help="also write all raw results here")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per model and side")
    ap.add_argument("--tuning-logs", default=None, metavar="DIR",
                    help="compile each model with DIR/NAME.db (its tuning database) where there is one; the table "
                         "goes to the section of tuned results")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    manifest = load_manifest()["models"]
    names = args.models.split(",") if args.models else list(manifest)
    unknown = [n for n in names if n not in manifest]
    if unknown:
        print(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(manifest)}", file=sys.stderr)
        return 2
    jax_python = None
    if not args.no_jax:
        if Path(args.jax_python).exists():
            jax_python = args.jax_python
        else:
            print(f"no JAX interpreter at {args.jax_python} (run `make bench-env`); JAX is skipped", file=sys.stderr)
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t0, stat0 = time.perf_counter(), cpu_times()
    info = machine_info()
    pk_runs = [peaks(args.quick)]
    _print_peaks("peaks at start", pk_runs[0])
    results = []
    for name in names:
        res = run_model(name, manifest[name], args, jax_python)
        res["derived"] = derived(res, pk_runs[0])
        res["missed"] = row_targets(res, res["derived"])
        results.append(res)
        print(_progress(res), flush=True)
    pk_runs.append(peaks(args.quick))
    _print_peaks("peaks at end", pk_runs[1])
    pk = merge_peaks(pk_runs)
    for res in results:
        res["derived"] = derived(res, pk)
    wall = time.perf_counter() - t0
    steal = steal_fraction(stat0, cpu_times())
    command = " ".join(["python benchmarks/run_all.py", *argv]) if argv else "make bench"  # make: no arguments
    tuned = bool(args.tuning_logs)
    body = render_markdown(results, info, pk, command, started, wall, steal, args.quick, tuned)
    write_markdown(Path(args.out), body, tuned)
    print(f"wrote {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "peaks": pk, "steal": steal, "command": command,
                                               "started": started, "results": results}, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
