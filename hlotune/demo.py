"""`make demo`: the main job on a bundled model.

1. load a bundled model (JAX's HLO of a transformer block) and show its fused subgraphs;
2. compile it with default schedules and check the output against JAX's and the reference interpreter;
3. time it against the numpy reference interpreter.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from . import api

MODELS = Path(__file__).resolve().parents[1] / "tests" / "data" / "models"


def _time(fn, min_s: float = 0.3) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s:
        fn()
        n += 1
    return (time.perf_counter() - t0) / max(n, 1)


def main(name: str = "transformer_block") -> int:
    path = MODELS / name / f"{name}.hlo"
    data = np.load(MODELS / name / f"{name}.npz")
    args = [data[f"arg{i}"] for i in range(sum(k.startswith("arg") for k in data.files))]
    want = [data[f"out{i}"] for i in range(sum(k.startswith("out") for k in data.files))]

    print(f"== model {path.relative_to(MODELS.parents[2])}")
    rep = api.inspect_model(str(path))
    for s in rep.subgraphs:
        print(f"  {s['key']}  x{s['weight']}  {s['kind']:6s} {s['flops']:10.3g} flops  {', '.join(s['opcodes'])}")

    t0 = time.perf_counter()
    exe = api.compile(str(path))
    print(f"== compiled {len(exe.sources())} subgraphs with default schedules in {time.perf_counter() - t0:.2f} s")
    got = exe(*args)
    ref = api.reference_run(str(path), args)
    err_jax = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    err_ref = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    ok = all(np.allclose(g, w, rtol=1e-5, atol=1e-5) for g, w in zip(got, want))
    print(f"== output vs JAX: max |diff| {err_jax:.2e}; vs reference interpreter: {err_ref:.2e}  "
          f"-> {'OK' if ok else 'MISMATCH'}")
    t_exe = _time(lambda: exe(*args))
    t_ref = _time(lambda: api.reference_run(str(path), args), 0.5)
    print(f"== time per call: hlotune {t_exe * 1e3:.3f} ms, numpy reference interpreter {t_ref * 1e3:.3f} ms "
          f"({t_ref / t_exe:.1f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
