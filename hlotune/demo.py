"""`make demo`: the main job on a bundled model.

1. load a bundled model (JAX's HLO of a transformer block) and show its fused subgraphs;
2. compile it with default schedules, check the output against JAX's and the reference interpreter, time it
   (and the numpy reference interpreter);
3. tune the model at its benchmark size (`--size bench`, the default; `--size test` tunes the small one) for
   about two minutes (`--seconds`) into a fresh tuning log under logs/;
4. compile it with the tuning log, check the output against the reference interpreter (same random inputs
   for both), and print default vs tuned time and the speedup.

    python -m hlotune.demo [--seconds 120] [--model transformer_block] [--size bench] [--policy evolutionary]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import api, config

MODELS = Path(__file__).resolve().parents[1] / "tests" / "data" / "models"


def _time(fn, min_s: float = 0.3) -> float:
    """Median seconds per call over repeats of at least min_s / 5 each."""
    fn()
    reps = []
    t_end = time.perf_counter() + min_s
    while time.perf_counter() < t_end or len(reps) < 5:
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if time.perf_counter() - t0 >= min_s / 5:
                break
        reps.append((time.perf_counter() - t0) / n)
    return float(np.median(reps))


def _check(exe, args, want, ref) -> bool:
    got = exe(*args)
    err_jax = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    err_ref = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    ok = all(np.allclose(g, w, rtol=1e-5, atol=1e-5) for g, w in zip(got, want))
    print(f"   output vs JAX: max |diff| {err_jax:.2e}; vs reference interpreter: {err_ref:.2e}  "
          f"-> {'OK' if ok else 'MISMATCH'}")
    return ok


def _rel_err(got, ref) -> float:
    """Largest |got - ref| relative to the largest |ref| of each output."""
    return max(float(np.abs(g - r).max()) / max(float(np.abs(r).max()), 1e-30) for g, r in zip(got, ref))


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m hlotune.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="tuning time (default 120)")
    ap.add_argument("--model", default="transformer_block", help="a bundled model (tests/data/models/NAME)")
    ap.add_argument("--size", choices=["bench", "test"], default="bench", help="which size of the model to tune")
    ap.add_argument("--policy", default="evolutionary", choices=["evolutionary", "random", "optuna"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--population", type=int, default=1024)
    ap.add_argument("--tuning-log", default=None, help="default: a fresh logs/demo-<model>-<time>.db")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    name = a.model
    path = MODELS / name / f"{name}.hlo"
    if not path.exists():
        have = ", ".join(sorted(p.name for p in MODELS.iterdir() if p.is_dir()))
        print(f"demo: no bundled model {name!r} (have: {have})", file=sys.stderr)
        return 2
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
    ref = api.reference_run(str(path), args)
    ok = _check(exe, args, want, ref)
    t_default = _time(lambda: exe(*args))
    t_ref = _time(lambda: api.reference_run(str(path), args), 0.5)
    print(f"   time per call: hlotune (default schedules) {t_default * 1e3:.3f} ms, numpy reference interpreter "
          f"{t_ref * 1e3:.3f} ms ({t_ref / t_default:.1f}x)")

    log = a.tuning_log
    if log is None:
        log_dir = str(config.get("log_dir"))
        os.makedirs(log_dir, exist_ok=True)
        log = os.path.join(log_dir, f"demo-{name}-{time.strftime('%Y%m%d-%H%M%S')}.db")
    tpath = path if a.size == "test" else MODELS / name / f"{name}.bench.hlo"
    print(f"== tuning {tpath.name} for {a.seconds:.0f} s ({a.policy} search, seed {a.seed}) into {log}")
    tr = api.tune(str(tpath), log, time_budget=a.seconds, seed=a.seed, policy=a.policy, batch_size=a.batch_size,
                  population=a.population)
    print(tr.text())

    rng = np.random.default_rng(a.seed)
    m = api.load_model(str(tpath))
    targs = [rng.standard_normal(s.dims).astype(s.dtype.np) for s in m.input_shapes()]
    default = exe if tpath == path else api.compile(m)
    t0 = time.perf_counter()
    tuned = api.compile(m, tuning_log=log)
    srcs = tuned.sources()
    n_tuned = sum(v.startswith("tuned") for v in srcs.values())
    print(f"== compiled {tpath.name} with the tuning log in {time.perf_counter() - t0:.2f} s ({n_tuned} of "
          f"{len(srcs)} subgraphs use tuned schedules)")
    tref = api.reference_run(m, targs)
    errs = (_rel_err(default(*targs), tref), _rel_err(tuned(*targs), tref))
    good = max(errs) < 2e-3   # float32 sums in another order than the interpreter's
    print(f"   output vs reference interpreter (max |diff| / max |ref|): default {errs[0]:.1e}, tuned {errs[1]:.1e} "
          f"-> {'OK' if good else 'MISMATCH'}")
    t_tuned = _time(lambda: tuned(*targs), 1.0)
    t_default = _time(lambda: default(*targs), 1.0)
    print(f"== time per call: default schedules {t_default * 1e3:.3f} ms, tuned {t_tuned * 1e3:.3f} ms "
          f"-> speedup {t_default / t_tuned:.2f}x")
    return 0 if ok and good else 1


if __name__ == "__main__":
    sys.exit(main())
