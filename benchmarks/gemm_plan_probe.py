"""A GEMM's default schedule against variants of its default plan and the best records of tuning databases, timed
together (a probe for default-plan rules, not part of `make bench`).

    python benchmarks/gemm_plan_probe.py SHAPE VARIANT [VARIANT ...]

SHAPE: a `search_compare.py` subgraph label, `dense:[B/]M,K,N[,t]` (relu(x @ w + b) as in `awkward_gemm.py`), or
`conv:N,H,W,C,K[,R]` (relu(conv(x[N,H,W,C], w[R,R,C,K]) + b), same padding, R = 3 if not given).
VARIANT:
  mr,nvec,tm,kc[,tn]     the default plan (`default._gemm_plan`) with these fields replaced (0: the plan's own;
                         kc -1: the plan's own, 0: k not blocked)
  np:mr,nvec,tm,kc[,tn]  the same with B not packed and its columns not padded (PACK_MIN_ROWS and PAD_GAIN set out
                         of reach while the schedule is made)
  set:NAME=VALUE[,...]   the default schedule made with these numeric constants of `schedule_space.default` set (e.g.
                         set:UNPACKED_L1=0, the plan before session 47's unpacked short-K rule)
  db:PATH                the two fastest records of a tuning database of that workload
Each candidate is timed in PASSES (env, default 3) alternating passes (search_compare's re-measure timing); the
table gives each one's median, the default's time over it and GFLOP/s.  Session 47 (docs/benchmarks.md, CPU section
"unpacked B for short reductions"): with K <= 256 the unpacked 8 x 32 plan was 1.1-1.7x the padded, packed plan
on most shapes, and became the default for padded columns (`default._unpacked_short_k`)."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from awkward_gemm import hlo, parse_shape  # noqa: E402
from search_compare import SUBGRAPHS, load_subgraph, time_together  # noqa: E402

import hlotune  # noqa: E402
import hlotune.schedule_space.default as D  # noqa: E402
from hlotune.schedule_space.steps import Schedule, schedule_from_json  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.search.space import TaskSpace  # noqa: E402
from hlotune.target import Target  # noqa: E402


def conv_hlo(n: int, h: int, w: int, c: int, k: int, r: int = 3) -> str:
    """HLO text of relu(conv(x[n,h,w,c], w[r,r,c,k], same padding) + b) as JAX lowers it (NHWC, HWIO)."""
    x, y, wt = f"f32[{n},{h},{w},{c}]", f"f32[{n},{h},{w},{k}]", f"f32[{r},{r},{c},{k}]"
    lo, hi = (r - 1) // 2, r // 2
    return f"""HloModule conv_{n}x{h}x{w}x{c}x{k}x{r}

ENTRY %main (x: {x}, w: {wt}, b: f32[{k}]) -> {y} {{
  %x = {x}{{3,2,1,0}} parameter(0)
  %w = {wt}{{3,2,1,0}} parameter(1)
  %c = {y}{{3,2,1,0}} convolution(%x, %w), window={{size={r}x{r} pad={lo}_{hi}x{lo}_{hi}}}, dim_labels=b01f_01io->b01f
  %b = f32[{k}]{{0}} parameter(2)
  %bb = {y}{{3,2,1,0}} broadcast(%b), dimensions={{3}}
  %a = {y}{{3,2,1,0}} add(%c, %bb)
  %z = f32[] constant(0)
  %zb = {y}{{3,2,1,0}} broadcast(%z), dimensions={{}}
  ROOT %r = {y}{{3,2,1,0}} maximum(%a, %zb)
}}
"""


def subgraph(label: str):
    """The fused subgraph a SHAPE names."""
    if label.startswith("conv:"):
        text = conv_hlo(*map(int, label[5:].split(",")))
        return [g for g in hlotune.load_model(text).frontend.subgraphs if g.workload.flops][0]
    if label.startswith("dense:"):
        m, k, n, t, b = parse_shape(label[6:])
        return [g for g in hlotune.load_model(hlo(m, k, n, t, b)).frontend.subgraphs if g.workload.flops][0]
    _, model, kind, name, _ = next(s for s in SUBGRAPHS if s[0] == label)
    return load_subgraph(model, kind, name)


def variant(task: Task, target: Target, spec: str) -> Schedule:
    """The default schedule made with the plan fields (and packing) of a VARIANT."""
    unpacked = spec.startswith("np:")
    mr, nvec, tm, kc, *tn = map(int, spec.removeprefix("np:").split(","))
    orig, saved = D._gemm_plan, (D.PACK_MIN_ROWS, D.PAD_GAIN)

    def plan(red_stage, target_, lanes):
        p = orig(red_stage, target_, lanes)
        return p if p is None else dataclasses.replace(
            p, mr=mr or p.mr, nvec=nvec or p.nvec, tm=tm or p.tm, kc=p.kc if kc < 0 else kc,
            tn=tn[0] if tn else p.tn)

    D._gemm_plan = plan
    if unpacked:
        D.PACK_MIN_ROWS, D.PAD_GAIN = 1 << 40, 1e9
    try:
        return Schedule(task.key, tuple(D.default_schedule(task.compute, target)))
    finally:
        D._gemm_plan, (D.PACK_MIN_ROWS, D.PAD_GAIN) = orig, saved


def with_constants(task: Task, target: Target, spec: str) -> Schedule:
    """The default schedule made with the constants of a `set:` VARIANT."""
    pairs = [kv.split("=", 1) for kv in spec.removeprefix("set:").split(",")]
    saved = {k: getattr(D, k) for k, _ in pairs}
    try:
        for k, v in pairs:
            setattr(D, k, type(saved[k])(float(v)) if not isinstance(saved[k], bool) else v == "1")
        return Schedule(task.key, tuple(D.default_schedule(task.compute, target)))
    finally:
        for k, v in saved.items():
            setattr(D, k, v)


def records(path: str, n: int = 2) -> dict[str, Schedule]:
    """The `n` fastest valid records of a tuning database."""
    rows = sqlite3.connect(path).execute("select steps from hlotune_records where median > 0 order by median "
                                         "limit ?", (n,)).fetchall()
    tag = os.path.basename(path).removesuffix(".db")
    return {f"{tag}#{j}": schedule_from_json(json.loads(s)) for j, (s,) in enumerate(rows)}


def main() -> None:
    warnings.simplefilter("ignore")
    label, specs = sys.argv[1], sys.argv[2:]
    sg = subgraph(label)
    target = Target.host_cpu()
    task = Task(sg.workload.key, sg.workload.compute, target, 1, label, float(sg.workload.flops))
    cands = {"default": TaskSpace(task).default}
    for spec in specs:
        if spec.startswith("db:"):
            cands.update(records(spec[3:]))
        elif spec.startswith("set:"):
            cands[spec] = with_constants(task, target, spec)
        else:
            cands[spec] = variant(task, target, spec)
    times, errors = time_together(task, cands, int(os.environ.get("PASSES", "3")))
    for k, err in errors.items():
        print(f"{k}: {err}")
    med = {k: statistics.median(v) for k, v in times.items() if v}
    base = med.get("default")
    for k in sorted(med, key=med.get):
        rel = f"default/this {base / med[k]:.2f}" if base else ""
        print(f"{k:32s} {med[k] * 1e3:9.4f} ms  {rel}  {task.flops / med[k] / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
