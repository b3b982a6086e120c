"""Fuzz the default schedules of dense layers over random extents against numpy.

    .venv/bin/python benchmarks/fuzz_dense_shapes.py [--count 500] [--seed 0] [--max-rows 80] [--max-k 600]
        [--max-cols 700] [--max-batch 0] [--row-step 1]

Each case: relu(x @ w + b) with random M, K, N (w stored [K, N], or [N, K] as x @ w.T in a third of the cases;
with --max-batch B, half the cases batched: x [b, M, K] @ w [b, K, N] with b in 2..B and N a multiple of 64 in
half of those, so the column-panel plan's register panel is taken; with --row-step R, M a multiple of R: 16 gives
the unpacked short-K plan its cases),
compiled with hlotune's default schedules (`hlotune.compile`), run on standard-normal inputs and compared to
numpy (rtol = atol = 1e-4 scaled by sqrt(K)).  Prints one line per failure and a summary: cases, failures, and
how many took each plan (padded rows / columns, row streaming, dot-product tile, register panel, other), so a run
shows that the new plans were exercised.  Exit status 1 when any case fails.

Map: plan_of(steps) / run_case(rng, limits) / fuzz(count, seed, limits) -> (cases, failures, plans) / main
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awkward_gemm import hlo  # noqa: E402


def plan_of(steps) -> str:
    """Which default plan a dense layer's steps took."""
    from hlotune.schedule_space.loop_ir import ForKind
    from hlotune.schedule_space.steps import Annotate, Pack, Pad, RFactor, Split

    pads = sorted({s.iter for s in steps if isinstance(s, Pad)})
    rf = any(isinstance(s, RFactor) for s in steps)
    if rf and any(isinstance(s, Split) and not s.inner_to_outer for s in steps):
        return "row streaming"
    if any(isinstance(s, Annotate) and s.stage.endswith(".rf") and s.kind is ForKind.UNROLLED for s in steps):
        return "dot tile" + (" padded" if pads else "")
    if rf:
        return "rfactor reduction"
    if any(isinstance(s, Pack) and s.factor >= 64 for s in steps):   # 4 or 8 vectors of 16 lanes
        return "register panel" + (" padded" if pads else "")
    if not pads and not any(isinstance(s, Pack) for s in steps) and any(
            isinstance(s, Split) and len(s.factors) == 2 and s.factors[0] == 2 and s.factors[1] >= 16 for s in steps):
        return "unpacked two-vector tile"   # `_unpacked_short_k` (or B reused by too few rows to pack)
    return ("GEMM padded " + "+".join(pads)) if pads else "other"


def run_case(rng: np.random.Generator, limits: tuple[int, ...]) -> tuple[str, str, str | None]:
    """(shape, plan, error or None) of one random layer."""
    import hlotune
    from hlotune.api import load_model
    from hlotune.schedule_space.default import default_schedule

    step = limits[4] if len(limits) > 4 else 1
    m = step * int(rng.integers(1, max(1, limits[0] // step) + 1))
    k = int(rng.integers(1, limits[1] + 1))
    n = int(rng.integers(1, limits[2] + 1))
    t = bool(rng.random() < 1 / 3)
    bt = 0
    if len(limits) > 3 and limits[3] >= 2 and rng.random() < 0.5:
        bt = int(rng.integers(2, limits[3] + 1))
        if rng.random() < 0.5 and limits[2] >= 64:
            n = 64 * int(rng.integers(1, limits[2] // 64 + 1))
    text = hlo(m, k, n, t, bt)
    shape = f"{f'{bt}/' if bt else ''}{m}x{k}x{n}{' t' if t else ''}"
    (sg,) = load_model(text).frontend.subgraphs
    plan = plan_of(default_schedule(sg.workload.compute))
    lead = (bt,) if bt else ()
    x = rng.standard_normal(lead + (m, k), dtype=np.float32)
    w = rng.standard_normal(lead + ((n, k) if t else (k, n)), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    got = hlotune.compile(text)(x, w, b)
    got = got[0] if isinstance(got, tuple | list) else got
    want = np.maximum(x @ (np.swapaxes(w, -1, -2) if t else w) + b, 0)
    tol = 1e-4 * max(1.0, k ** 0.5)
    if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
        err = float(np.nanmax(np.abs(got - want))) if got.shape == want.shape else float("nan")
        return shape, plan, f"max abs error {err:.3g}"
    return shape, plan, None


def fuzz(count: int, seed: int, limits: tuple[int, ...] = (80, 600, 700)):
    rng = np.random.default_rng(seed)
    plans: collections.Counter = collections.Counter()
    failures = []
    for _ in range(count):
        shape, plan, err = run_case(rng, limits)
        plans[plan] += 1
        if err:
            failures.append((shape, plan, err))
    return count, failures, plans


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-rows", type=int, default=80)
    ap.add_argument("--max-k", type=int, default=600)
    ap.add_argument("--max-cols", type=int, default=700)
    ap.add_argument("--max-batch", type=int, default=0)
    ap.add_argument("--row-step", type=int, default=1, help="rows a multiple of this (16: the unpacked short-K plan)")
    a = ap.parse_args(argv)
    n, failures, plans = fuzz(a.count, a.seed, (a.max_rows, a.max_k, a.max_cols, a.max_batch, a.row_step))
    for shape, plan, err in failures:
        print(f"FAIL {shape} ({plan}): {err}")
    print(f"{n} cases, {len(failures)} failures; plans: " + ", ".join(f"{k} {v}" for k, v in plans.most_common()))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
