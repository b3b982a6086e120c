"""Short check of the vector math library: elementwise/transcendental models vs JAX-jit, plus per-op throughput.

    chrt -r 1 .venv/bin/python benchmarks/vecmath_check.py [--models gelu_tanh,...] [--no-jax] [--no-ops]
        [--jax-python /tmp/vb/bin/python]

Models (default schedules, bench size, inputs from `common.bench_inputs`): hlotune in this process, JAX-jit in
the side venv through `run_all.run_jax`, both on the same inputs in the same run; the rate is the model's
`min_bytes` over the median time, given as a fraction of np.copyto's bandwidth measured here (one thread per
core, 256 MB).  Ops: elements/s of each `vecmath.emit_math` function in a tight single-thread loop over a
cache-resident buffer (16 x f32 / 8 x f64 vectors), which shows the cost of the math alone.  Whole run < 1 min.

Map: copy_bandwidth / time_model / op_kernel + op_throughput / main
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    QUICK,
    TimingRule,
    _copy_rate,
    bench_hlo_path,
    bench_inputs,
    compare,
    load_manifest,
    time_calls,
    warm_malloc,
)
from run_all import run_jax  # noqa: E402

MODELS = ("gelu_tanh", "sin_mul_add", "relu_chain", "softmax", "layernorm")
RULE = TimingRule(warmup=2, min_repeats=10, min_seconds=0.5, max_seconds=4.0)


def copy_bandwidth() -> float:
    src = np.ones(256 * 2 ** 20 // 4, np.float32)
    dst = np.zeros_like(src)
    return _copy_rate(src, dst, os.cpu_count() or 1, QUICK)


def time_model(name: str, entry: dict, jax_python: str | None) -> dict:
    import hlotune

    inputs = bench_inputs(name, entry)
    t0 = time.perf_counter()
    exe = hlotune.compile(str(bench_hlo_path(name, entry)))
    compile_s = time.perf_counter() - t0
    outs = exe(*inputs)
    res = {"hlotune_ms": time_calls(lambda: exe(*inputs), RULE).median_s * 1e3, "compile_s": compile_s}
    if jax_python:
        with tempfile.TemporaryDirectory(prefix=f"vecmath-check-{name}-") as d:
            np.savez(Path(d) / "in.npz", **{f"arg{i}": x for i, x in enumerate(inputs)})
            jax = run_jax(name, Path(d), jax_python, quick=True, timeout=120)
            if jax.get("ok"):
                res["jax_ms"] = jax["timing"]["median_s"] * 1e3
                with np.load(Path(d) / "jax.npz") as z:
                    res["check"] = compare(outs, [z[f"out{i}"] for i in range(len(z.files))])
            else:
                res["jax_error"] = jax.get("error")
    return res


# ---- per-op throughput ---------------------------------------------------------------------------

def op_kernel(op, dtype):
    """JIT-compiled `kernel(out, x, y, n, reps)`: `reps` passes of out[i] = op(x[i][, y[i]]) over n (a multiple
    of the vector width) elements."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    from hlotune.codegen import llvm_cpu
    from hlotune.codegen.vecmath import emit_math
    from hlotune.ir.hlo import Op

    width = 16 if dtype == np.float32 else 8
    fty = ir.FloatType() if dtype == np.float32 else ir.DoubleType()
    vty, i64 = ir.VectorType(fty, width), ir.IntType(64)
    mod = ir.Module(name=f"op_{op.name}")
    mod.triple = llvm.get_process_triple()
    ptr = fty.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, i64, i64]), "kernel")
    out, x, y, n, reps = fn.args
    entry, outer, inner, latch, done = (fn.append_basic_block(s) for s in ("entry", "outer", "inner", "latch", "done"))
    b = ir.IRBuilder(entry)
    b.branch(outer)
    b.position_at_end(outer)
    r = b.phi(i64)
    r.add_incoming(ir.Constant(i64, 0), entry)
    b.branch(inner)
    b.position_at_end(inner)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), outer)
    args = [b.load(b.bitcast(b.gep(p, [i]), vty.as_pointer()), align=4) for p in (x, y)]
    val = emit_math(b, op, args if op in (Op.POWER, Op.ATAN2) else args[:1])
    b.store(val, b.bitcast(b.gep(out, [i]), vty.as_pointer()), align=4)
    i_next = b.add(i, ir.Constant(i64, width))
    i.add_incoming(i_next, inner)
    b.cbranch(b.icmp_signed("<", i_next, n), inner, latch)
    b.position_at_end(latch)
    r_next = b.add(r, ir.Constant(i64, 1))
    r.add_incoming(r_next, latch)
    b.cbranch(b.icmp_signed("<", r_next, reps), outer, done)
    b.position_at_end(done)
    b.ret_void()
    m = llvm.parse_assembly(str(mod))
    tm = llvm_cpu.target_machine()
    llvm_cpu.optimize(m, tm, 3)
    engine = llvm.create_mcjit_compiler(m, llvm_cpu._new_target_machine(llvm_cpu.Target.host_cpu()))
    engine.finalize_object()
    cty = ctypes.POINTER(ctypes.c_float if dtype == np.float32 else ctypes.c_double)
    f = ctypes.CFUNCTYPE(None, cty, cty, cty, ctypes.c_int64, ctypes.c_int64)(engine.get_function_address("kernel"))
    return engine, f, cty


def op_throughput(op, dtype, n: int = 4096, reps: int = 500) -> float:
    """Elements per second (one thread) of `op` on `dtype`, inputs in (0.1, 3) (y of power in (-3, 3))."""
    engine, f, cty = op_kernel(op, dtype)
    rng = np.random.default_rng(0)
    x = rng.uniform(0.1, 3.0, n).astype(dtype)
    y = rng.uniform(-3.0, 3.0, n).astype(dtype)
    out = np.empty_like(x)
    p = [a.ctypes.data_as(cty) for a in (out, x, y)]
    f(*p, n, 10)
    best = min(_timed(lambda: f(*p, n, reps)) for _ in range(3))
    del engine
    return n * reps / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--jax-python", default="/tmp/vb/bin/python")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-ops", action="store_true")
    a = ap.parse_args()
    warm_malloc()
    jax_python = None if a.no_jax or not Path(a.jax_python).exists() else a.jax_python
    manifest = load_manifest()["models"]
    bw = copy_bandwidth()
    print(f"np.copyto bandwidth ({os.cpu_count()} threads): {bw:.1f} GB/s")
    print(f"{'model':<12} {'hlotune ms':>10} {'GB/s':>6} {'% copy':>7} {'JAX ms':>8} {'speedup':>8}  check")
    for name in a.models.split(","):
        entry = manifest[name]
        r = time_model(name, entry, jax_python)
        gbs = entry["bench"]["min_bytes"] / (r["hlotune_ms"] * 1e-3) / 1e9
        jax_ms = r.get("jax_ms")
        chk = r.get("check", {})
        speed = f"{jax_ms / r['hlotune_ms']:.2f}x" if jax_ms else "-"
        print(f"{name:<12} {r['hlotune_ms']:>10.2f} {gbs:>6.1f} {gbs / bw * 100:>6.0f}% "
              f"{(f'{jax_ms:.2f}' if jax_ms else '-'):>8} {speed:>8}"
              f"  {'ok' if chk.get('ok') else chk.get('why', r.get('jax_error', 'unchecked'))}", flush=True)
    if not a.no_ops:
        from hlotune.codegen.vecmath import SUPPORTED_OPS
        from hlotune.ir.hlo import Op

        ops = [o for o in (Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.TANH, Op.LOGISTIC, Op.SINE, Op.COSINE, Op.ERF,
                           Op.SQRT, Op.RSQRT, Op.POWER, Op.ATAN2) if o in SUPPORTED_OPS]
        print(f"\n{'op (1 thread)':<14} {'f32 Gelem/s':>12} {'f64 Gelem/s':>12}")
        for op in ops:
            r32, r64 = op_throughput(op, np.float32), op_throughput(op, np.float64)
            print(f"{op.name.lower():<14} {r32 / 1e9:>12.2f} {r64 / 1e9:>12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
