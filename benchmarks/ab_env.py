"""A/B one fixture model under settings given as environment variables, interleaved with JAX-jit.

    python benchmarks/ab_env.py relu_chain off:HLOTUNE_NONTEMPORAL_STORE_BYTES=0 on --rounds 5

Each variant is `LABEL[:VAR=VALUE[,VAR=VALUE...]]`.  Every round runs `bench_models.py` (hlotune side, a fresh
process, FULL timing) once per variant, in alternating order, then JAX's side (`jax_side.py`, from the
`make bench-env` venv unless --jax-python says otherwise, skipped with --no-jax); it prints each variant's
median over rounds of the per-run median times.  Run it on a quiet machine (`chrt -r 1` where allowed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import bench_inputs, load_manifest  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    label, _, rest = text.partition(":")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return label, env


def _median_ms(stdout: str, step: str | None) -> float | None:
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    rows = [r for r in rows if step is None or r.get("step") == step]
    if not rows or "timing" not in rows[-1]:
        return None
    return rows[-1]["timing"]["median_s"] * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("variants", nargs="+", help="LABEL[:VAR=VALUE,...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jax-python", default=str(HERE.parent / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--no-jax", action="store_true")
    a = ap.parse_args(argv)
    entry = load_manifest()["models"][a.model]
    variants = [parse_variant(v) for v in a.variants]
    times: dict[str, list[float]] = {label: [] for label, _ in variants}
    with tempfile.TemporaryDirectory(prefix="hlotune-ab-") as d:
        tmp = Path(d)
        np.savez(tmp / "in.npz", **{f"arg{i}": x for i, x in enumerate(bench_inputs(a.model, entry))})
        for r in range(a.rounds):
            for label, extra in (variants if r % 2 == 0 else variants[::-1]):
                cmd = [sys.executable, str(HERE / "bench_models.py"), a.model, "--side", "hlotune",
                       "--inputs", str(tmp / "in.npz"), "--outputs", str(tmp / "out.npz")]
                env = {**os.environ, **extra}
                ms = _median_ms(subprocess.run(cmd, capture_output=True, text=True, env=env).stdout, "hlotune")
                times[label].append(ms if ms is not None else float("nan"))
            if not a.no_jax:
                cmd = [a.jax_python, str(HERE / "jax_side.py"), a.model, "--inputs", str(tmp / "in.npz"),
                       "--outputs", str(tmp / "jax.npz")]
                ms = _median_ms(subprocess.run(cmd, capture_output=True, text=True).stdout, None)
                times.setdefault("jax", []).append(ms if ms is not None else float("nan"))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} ms" for k, v in times.items()), flush=True)
    for label, xs in times.items():
        print(f"{a.model} {label}: median {statistics.median(xs):.3f} ms over {len(xs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
