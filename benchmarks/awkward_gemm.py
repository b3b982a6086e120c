"""Dense layers relu(x @ w + b) with awkward extents or a short reduction, default schedules, against numpy and
JAX-jit in one run.

    .venv/bin/python benchmarks/awkward_gemm.py [--shapes 251,784,509 1,4096,4096,t 16/256,64,256 ...]
        [--before-rev REV] [--rounds 5] [--jax-python .venv-bench/bin/python] [--no-jax]

Shapes whose rows or columns have no good divisor (prime rows; columns that take no full two-vector micro-tile)
beside one that divides (256x784x512), single rows (batch-1 inference: a GEMV), weights stored [N, K] (shape
suffix `,t`: x @ w.T, PyTorch's layout), and batched layers with a short reduction (`B/M,K,N`: x[B, M, K] @
w[B, K, N], as attention's scores and values with a head size of 64; `--shapes short` names those of
SHORT_K_SHAPES).  Per shape: JAX-jit in its own process (`jax_dense_side.py`), numpy in this
one, hlotune compiled with the working tree's default schedules ("after") and, with --before-rev, with
`hlotune/schedule_space/default.py` at that revision ("before"; `gemm_check.load_before`, `compile_with`); every
output checked against numpy.  The sides are timed in --rounds interleaved rounds (`gemm_check.time_side`), best
median kept.  '% peak': GFLOP/s over numpy's 1024^3 float32 matmul rate measured at the start of the run.

Map: parse_shape / hlo(m, k, n, t, batch) / numpy_dense / jax_side(shapes, tmp, python) / main
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import REPO, compare, measure_peaks, shape_tag, warm_malloc  # noqa: E402
from gemm_check import compile_with, load_before, time_side  # noqa: E402

SHAPES = ("256,784,512", "251,784,509", "250,784,500", "255,784,511", "1000,1000,1000", "100,1024,1000",
          "61,2048,997", "1,4096,4096", "1,4096,4099", "8,4096,4099", "1,4096,4096,t", "8,4096,4099,t",
          "4,1024,1000,t")
#: batched layers with a short reduction (the column-panel GEMM's register panel, `default._register_panel`)
SHORT_K_SHAPES = ("16/256,64,256", "16/256,64,256,t", "8/512,32,512", "16/256,16,256", "12/256,96,256",
                  "8/256,128,256", "4/256,192,256", "16/255,64,256")


def parse_shape(s: str) -> tuple[int, int, int, bool, int]:
    """'[B/]M,K,N[,t]' -> (M, K, N, t, B): w stored [N, K] with t; B the batch (0: none)."""
    batch, _, s = s.rpartition("/")
    parts = s.split(",")
    return int(parts[0]), int(parts[1]), int(parts[2]), parts[3:] == ["t"], int(batch or 0)


def hlo(m: int, k: int, n: int, t: bool = False, batch: int = 0) -> str:
    """HLO text of relu(x @ w + b) (or x @ w.T with `t`) as JAX lowers it (dot, broadcast bias, add, max with 0);
    with `batch`, x is [batch, m, k] and w [batch, k, n] (or [batch, n, k]): a batched dot."""
    lead = [batch] if batch else []
    dims = lambda *d: ",".join(map(str, lead + list(d)))   # noqa: E731
    lay = lambda r: "{" + ",".join(map(str, range(r - 1, -1, -1))) + "}"   # noqa: E731
    r = len(lead) + 2
    w, rc = (f"f32[{dims(n, k)}]", len(lead) + 1) if t else (f"f32[{dims(k, n)}]", len(lead))
    bd = "lhs_batch_dims={0}, rhs_batch_dims={0}, " if batch else ""
    y = f"f32[{dims(m, n)}]"
    return f"""HloModule dense_{batch or ''}{'x' if batch else ''}{m}x{k}x{n}{'t' if t else ''}

ENTRY %main (x: f32[{dims(m, k)}], w: {w}, b: f32[{n}]) -> {y} {{
  %x = f32[{dims(m, k)}]{lay(r)} parameter(0)
  %w = {w}{lay(r)} parameter(1)
  %d = {y}{lay(r)} dot(%x, %w), {bd}lhs_contracting_dims={{{r - 1}}}, rhs_contracting_dims={{{rc}}}
  %b = f32[{n}]{{0}} parameter(2)
  %bb = {y}{lay(r)} broadcast(%b), dimensions={{{r - 1}}}
  %a = {y}{lay(r)} add(%d, %bb)
  %z = f32[] constant(0)
  %zb = {y}{lay(r)} broadcast(%z), dimensions={{}}
  ROOT %r = {y}{lay(r)} maximum(%a, %zb)
}}
"""


def numpy_dense(x: np.ndarray, w: np.ndarray, b: np.ndarray, t: bool = False) -> np.ndarray:
    return np.maximum(x @ (np.swapaxes(w, -1, -2) if t else w) + b, 0)


def jax_side(shapes: list[str], tmp: Path, python: str) -> dict[str, float]:
    """Seconds per call of JAX-jit per shape ({} when the side venv is missing or fails)."""
    if not Path(python).exists():
        print(f"# no JAX: {python} not found (make bench-env)", file=sys.stderr)
        return {}
    cmd = [python, str(Path(__file__).with_name("jax_dense_side.py")), *shapes, "--inputs", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode:
        print(f"# JAX failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
        return {}
    return {d["shape"]: d["median_s"] for d in map(json.loads, r.stdout.split("\n")[:-1]) if "shape" in d}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--before-rev", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.2)
    ap.add_argument("--jax-python", default=str(REPO / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--no-jax", action="store_true")
    a = ap.parse_args(argv)
    if a.shapes == ["short"]:
        a.shapes = list(SHORT_K_SHAPES)
    warm_malloc()
    t_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    peak = measure_peaks(quick=True)["matmul_gflops"]["1024"]
    before = load_before(a.before_rev).default_schedule if a.before_rev else None
    rng = np.random.default_rng(0)
    data = {}
    with tempfile.TemporaryDirectory(prefix="awkward-") as d:
        tmp = Path(d)
        for s in a.shapes:
            m, k, n, t, bt = parse_shape(s)
            lead = (bt,) if bt else ()
            data[s] = (rng.standard_normal(lead + (m, k), dtype=np.float32),
                       rng.standard_normal(lead + ((n, k) if t else (k, n)), dtype=np.float32),
                       rng.standard_normal(n, dtype=np.float32))
            np.savez(tmp / f"{shape_tag(s)}.npz", x=data[s][0], w=data[s][1], b=data[s][2])
        jax_s = {} if a.no_jax else jax_side(a.shapes, tmp, a.jax_python)
        jax_out = {s: np.load(tmp / f"{shape_tag(s)}.jax.npy") for s in jax_s}
    head = ("| shape [B x] M x K x N | JAX ms (GFLOP/s) | numpy ms | before ms | hlotune ms | hlotune % peak | "
            "after/before | vs numpy | vs JAX | check |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in a.shapes:
        m, k, n, t, bt = parse_shape(s)
        args = data[s]
        flops = 2.0 * max(1, bt) * m * k * n
        ref = numpy_dense(*args, t)
        sides = {"numpy": lambda args=args, t=t: numpy_dense(*args, t), "after": compile_with(hlo(m, k, n, t, bt))}
        if before is not None:
            sides["before"] = compile_with(hlo(m, k, n, t, bt), before)
        ok = []
        for name in ("after", "before"):
            if name in sides:
                out = sides[name](*args)
                out = out[0] if isinstance(out, tuple | list) else out
                ok.append(f"{name}:{'ok' if compare([out], [ref])['ok'] else 'FAIL'}")
        if s in jax_out:
            ok.append(f"jax:{'ok' if compare([jax_out[s]], [ref])['ok'] else 'FAIL'}")
        fns = {key: (f if key == "numpy" else (lambda f=f, args=args: f(*args))) for key, f in sides.items()}
        best = {key: float("inf") for key in fns}
        for _ in range(a.rounds):
            for key, f in fns.items():
                best[key] = min(best[key], time_side(f, time.perf_counter, a.min_seconds))
        ms = {key: v * 1e3 for key, v in best.items()}
        jx = jax_s.get(s)
        aft = ms["after"]
        jax_cell = "-" if jx is None else f"{jx * 1e3:.3f} ({flops / jx / 1e9:.0f})"
        before_cell = f"{ms['before']:.3f}" if "before" in ms else "-"
        before_ratio = f"{ms['before'] / aft:.2f}x" if "before" in ms else "-"
        jax_ratio = "-" if jx is None else f"{jx * 1e3 / aft:.2f}x"
        label = f"{f'{bt} x ' if bt else ''}{m} x {k} x {n}{' (w as [N, K])' if t else ''}"
        lines.append(
            f"| {label} | {jax_cell} | {ms['numpy']:.3f} | {before_cell} | "
            f"{aft:.3f} ({flops / aft / 1e6:.0f} GFLOP/s) | {flops / aft / 1e6 / peak:.0%} | {before_ratio} | "
            f"{ms['numpy'] / aft:.2f}x | {jax_ratio} | {' '.join(ok)} |")
        print(lines[-1], flush=True)
    print(f"\nRun {t_start}, git {_git_rev()}; numpy 1024^3 float32 matmul (peak) {peak:.0f} GFLOP/s; "
          f"ratios: the other side's time over hlotune's (above 1: hlotune faster).")
    print("\n".join(lines))
    return 0


def _git_rev() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
