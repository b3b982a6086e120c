"""JAX's GPU time per fixture model at bench size, in a process that imports nothing but JAX and numpy (the method of
../shared/models/jax_gpu_times.json: 20 back-to-back calls per round, block at the end, median of 5 rounds, dispatch
included), to compare with the same-call JAX column of gpu_session.py, which shares its process with torch and
pycuda.  Prints one JSON object {model: seconds} and writes it to --out.

    python3 benchmarks/jax_gpu_clean.py --out $OUT/jax_clean.json [--models a,b]"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"


def _args(spec: dict, rng) -> list:
    return [(rng.standard_normal(a["shape"]) * 0.5).astype(a["dtype"]) for a in spec["inputs"]]


def round_time(fn, args, rounds: int = 5, calls: int = 20) -> float:
    import jax

    for _ in range(3):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls - 1):
            fn(*args)
        jax.block_until_ready(fn(*args))
        ts.append((time.perf_counter() - t0) / calls)
    return float(np.median(ts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", default="")
    a = ap.parse_args()
    import jax
    import jax.numpy as jnp
    from jax import lax

    jax.config.update("jax_default_matmul_precision", "highest")
    manifest = json.loads((MODELS / "manifest.json").read_text())["models"]
    names = [x for x in a.models.split(",") if x] or list(manifest)
    out = {}
    for name in names:
        ns = {"jax": jax, "jnp": jnp, "lax": lax}
        exec(manifest[name]["jax_source"], ns)
        fn = jax.jit(ns[name])
        args = [jax.device_put(x) for x in _args(manifest[name]["bench"], np.random.default_rng(0))]
        out[name] = round_time(fn, args)
        print(f"{name}: {out[name] * 1e6:.1f} us", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
