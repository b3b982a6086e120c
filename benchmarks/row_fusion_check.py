"""Row (normalization) fusion: default schedules with the rule off and on, and JAX-jit, in one run.

    .venv/bin/python benchmarks/row_fusion_check.py [--models softmax,layernorm] [--jax-python /tmp/vb/bin/python]
        [--no-jax] [--full] [--rounds 3]

For each model at bench size (inputs from `common.bench_inputs`, the same on every side): JAX-jit through
`run_all.run_jax` (the side venv's `jax_side.py`), then hlotune compiled twice in this process, with the
setting `row_fusion` off ("before") and on ("after"), each output checked against JAX's (`common.compare`)
and timed by the QUICK rule (--full: the FULL rule) in --rounds interleaved rounds, the best median kept.
Short enough to run under `chrt -r 1` (about half a minute).
Prints one table: subgraph counts, milliseconds, after/before and after/JAX speedups.

Map: compile_hlotune(name, entry, args, row_fusion) / time_rounds(sides, args, rule, rounds) / main
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import FULL, QUICK, bench_hlo_path, bench_inputs, compare, load_manifest, time_calls, warm_malloc  # noqa: E402
from run_all import _load_outs, run_jax  # noqa: E402

MODELS = ("softmax", "layernorm", "rmsnorm_swiglu", "mlp_train_step", "mlp2", "transformer_block")


def compile_hlotune(name: str, entry: dict, args: list[np.ndarray], row_fusion: bool) -> dict:
    """Compile the bench HLO with `row_fusion` set as given (default schedules) and run it once."""
    import hlotune
    from hlotune import config

    config.replace_default("row_fusion", row_fusion)
    t0 = time.perf_counter()
    exe = hlotune.compile(str(bench_hlo_path(name, entry)))
    compile_s = time.perf_counter() - t0
    outs = [np.asarray(x) for x in exe(*args)]
    return {"exe": exe, "outs": outs, "compile_s": compile_s, "subgraphs": len(exe.model.frontend.subgraphs),
            "times": []}


def time_rounds(sides: list[dict], args: list[np.ndarray], rule, rounds: int) -> None:
    """Time each side `rounds` times, interleaved (a load burst then hits both); keep the best median."""
    for _ in range(rounds):
        for side in sides:
            exe = side["exe"]
            t = time_calls(lambda: exe(*args), rule)  # noqa: B023 - called before the loop moves on
            side["times"].append((t.median_s * 1e3, t.spread))
    for side in sides:
        side["ms"], side["spread"] = min(side["times"])


def _row(name: str, jax: dict | None, before: dict, after: dict, refs) -> str:
    jms = jax["timing"]["median_s"] * 1e3 if jax and jax.get("ok") else None
    checks = [compare(r["outs"], refs)["ok"] if refs is not None else None for r in (before, after)]

    def ok(c):
        return "-" if c is None else ("ok" if c else "FAIL")
    ratio = before["ms"] / after["ms"]
    vs = f"{jms / after['ms']:.2f}x" if jms else "-"
    vs_b = f"{jms / before['ms']:.2f}x" if jms else "-"
    return (f"| {name} | {before['subgraphs']} -> {after['subgraphs']} | {before['ms']:.3f} ±{before['spread']:.0%} | "
            f"{after['ms']:.3f} ±{after['spread']:.0%} | {jms:.3f} | {ratio:.2f}x | {vs_b} | {vs} | "
            f"{ok(checks[0])} / {ok(checks[1])} |" if jms else
            f"| {name} | {before['subgraphs']} -> {after['subgraphs']} | {before['ms']:.3f} | {after['ms']:.3f} | - | "
            f"{ratio:.2f}x | - | - | {ok(checks[0])} / {ok(checks[1])} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--jax-python", default="/tmp/vb/bin/python")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--full", action="store_true", help="FULL timing rule (longer) instead of QUICK")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timings of before and after (best kept)")
    a = ap.parse_args(argv)
    warm_malloc()
    rule = FULL if a.full else QUICK
    manifest = load_manifest()["models"]
    lines = ["| model | subgraphs before -> after | before ms | after ms | JAX ms | after/before | "
             "before vs JAX | after vs JAX | check vs JAX (before / after) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in a.models.split(","):
        entry = manifest[name]
        args = bench_inputs(name, entry)
        jax, refs = None, None
        if not a.no_jax:
            with tempfile.TemporaryDirectory(prefix=f"rowf-{name}-") as d:
                tmp = Path(d)
                np.savez(tmp / "in.npz", **{f"arg{i}": x for i, x in enumerate(args)})
                jax = run_jax(name, tmp, a.jax_python, quick=not a.full, timeout=300)
                refs = _load_outs(tmp / "jax.npz") if jax.get("ok") else None
        before = compile_hlotune(name, entry, args, False)
        after = compile_hlotune(name, entry, args, True)
        time_rounds([before, after], args, rule, a.rounds)
        lines.append(_row(name, jax, before, after, refs))
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
