"""Dense layers relu(x @ w + b) with awkward extents, default schedules, against numpy and JAX-jit in one run.

    .venv/bin/python benchmarks/awkward_gemm.py [--shapes 251,784,509 1,4096,4096,t ...] [--before-rev REV]
        [--rounds 5] [--jax-python .venv-bench/bin/python] [--no-jax]

Shapes whose rows or columns have no good divisor (prime rows; columns that take no full two-vector micro-tile)
beside one that divides (256x784x512), single rows (batch-1 inference: a GEMV), and weights stored [N, K] (shape
suffix `,t`: x @ w.T, PyTorch's layout).  Per shape: JAX-jit in its own process (`jax_dense_side.py`), numpy in this
one, hlotune compiled with the working tree's default schedules ("after") and, with --before-rev, with
`hlotune/schedule_space/default.py` at that revision ("before"; `gemm_check.load_before`, `compile_with`); every
output checked against numpy.  The sides are timed in --rounds interleaved rounds (`gemm_check.time_side`), best
median kept.  '% peak': GFLOP/s over numpy's 1024^3 float32 matmul rate measured at the start of the run.

Map: hlo(m, k, n) / numpy_dense / jax_side(shapes, tmp, python) / main
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
from common import REPO, compare, measure_peaks, warm_malloc  # noqa: E402
from gemm_check import compile_with, load_before, time_side  # noqa: E402

SHAPES = ("256,784,512", "251,784,509", "250,784,500", "255,784,511", "1000,1000,1000", "100,1024,1000",
          "61,2048,997", "1,4096,4096", "1,4096,4099", "8,4096,4099", "1,4096,4096,t", "8,4096,4099,t",
          "4,1024,1000,t")


def parse_shape(s: str) -> tuple[int, int, int, bool]:
    """'M,K,N' or 'M,K,N,t' (w stored [N, K])."""
    parts = s.split(",")
    return int(parts[0]), int(parts[1]), int(parts[2]), parts[3:] == ["t"]


def hlo(m: int, k: int, n: int, t: bool = False) -> str:
    """HLO text of relu(x @ w + b) (or x @ w.T with `t`) as JAX lowers it (dot, broadcast bias, add, max with 0)."""
    w, rc = (f"f32[{n},{k}]", 1) if t else (f"f32[{k},{n}]", 0)
    return f"""HloModule dense_{m}x{k}x{n}{'t' if t else ''}

ENTRY %main (x: f32[{m},{k}], w: {w}, b: f32[{n}]) -> f32[{m},{n}] {{
  %x = f32[{m},{k}]{{1,0}} parameter(0)
  %w = {w}{{1,0}} parameter(1)
  %d = f32[{m},{n}]{{1,0}} dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{{rc}}}
  %b = f32[{n}]{{0}} parameter(2)
  %bb = f32[{m},{n}]{{1,0}} broadcast(%b), dimensions={{1}}
  %a = f32[{m},{n}]{{1,0}} add(%d, %bb)
  %z = f32[] constant(0)
  %zb = f32[{m},{n}]{{1,0}} broadcast(%z), dimensions={{}}
  ROOT %r = f32[{m},{n}]{{1,0}} maximum(%a, %zb)
}}
"""


def numpy_dense(x: np.ndarray, w: np.ndarray, b: np.ndarray, t: bool = False) -> np.ndarray:
    return np.maximum(x @ (w.T if t else w) + b, 0)


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
    warm_malloc()
    t_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    peak = measure_peaks(quick=True)["matmul_gflops"]["1024"]
    before = load_before(a.before_rev).default_schedule if a.before_rev else None
    rng = np.random.default_rng(0)
    data = {}
    with tempfile.TemporaryDirectory(prefix="awkward-") as d:
        tmp = Path(d)
        for s in a.shapes:
            m, k, n, t = parse_shape(s)
            data[s] = (rng.standard_normal((m, k), dtype=np.float32),
                       rng.standard_normal((n, k) if t else (k, n), dtype=np.float32),
                       rng.standard_normal(n, dtype=np.float32))
            np.savez(tmp / f"{s.replace(',', '_')}.npz", x=data[s][0], w=data[s][1], b=data[s][2])
        jax_s = {} if a.no_jax else jax_side(a.shapes, tmp, a.jax_python)
        jax_out = {s: np.load(tmp / f"{s.replace(',', '_')}.jax.npy") for s in jax_s}
    head = ("| shape M x K x N | JAX ms (GFLOP/s) | numpy ms | before ms | hlotune ms | hlotune % peak | "
            "after/before | vs numpy | vs JAX | check |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in a.shapes:
        m, k, n, t = parse_shape(s)
        args = data[s]
        flops = 2.0 * m * k * n
        ref = numpy_dense(*args, t)
        sides = {"numpy": lambda args=args, t=t: numpy_dense(*args, t), "after": compile_with(hlo(m, k, n, t))}
        if before is not None:
            sides["before"] = compile_with(hlo(m, k, n, t), before)
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
        lines.append(
            f"| {m} x {k} x {n}{' (w as [N, K])' if t else ''} | {jax_cell} | {ms['numpy']:.3f} | {before_cell} | "
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
