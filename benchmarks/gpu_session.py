"""One call on the GPU machine: GPU tests, kernel figures (matmul vs cuBLAS without TF32, memory-bound
subgraphs vs the device-to-device copy, schedule variants), whole fixture models at bench size through
`hlotune.compile(target="cuda")` device-resident against JAX on the same GPU (precision highest) and
torch.compile where the model is easy to write in torch; writes gpu_session.json / .md / .log to --out.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/gpu_session.py --out $OUT [--skip-tests]
    python3 benchmarks/gpu_session.py --out $OUT --tune dense_bias_relu [--tune-trials 40]   (tune + compile check)

Model timing: inputs in device memory; `exe.call_device(*inputs)` called 20 times back to back between two
CUDA events, median of 5 rounds (launch and Python glue included, as JAX's figures include dispatch);
JAX the same way (block_until_ready at the end of each round) in separate processes that import nothing but JAX
(`jax_gpu_clean.py`, three processes, the median per model: in this process, beside torch's and pycuda's CUDA
contexts, JAX measured 1.5-2x slower than its reference figures, session 10; that figure is kept as
jax_inproc_s); torch.compile (mode "max-autotune-no-cudagraphs" is not used: default mode) the same way.

Figures: matmul 1024^3 and 4096^3 in GFLOP/s (ours vs cuBLAS) with the relative error against a float64
product; every fused subgraph of the memory-bound fixtures at bench size in GB/s (bytes = inputs read once +
outputs written once) against the copy bandwidth (bytes read + written), with a correctness check against
`evaluate_compute` on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MEMORY_BOUND = ["gelu_tanh", "relu_chain", "sin_mul_add", "softmax", "layernorm", "row_sum", "sum_reduce",
                "rmsnorm_swiglu", "softmax@bench.gpu.opt.hlo", "layernorm@bench.gpu.opt.hlo"]
#: models timed whole; NAME@FILE: the fixture NAME from tests/data/models/NAME/NAME.FILE (XLA's GPU fusions: one
#: row-fused subgraph for softmax / layernorm), compared with the same JAX function
MODEL_EXTRA = ["softmax@bench.gpu.opt.hlo", "layernorm@bench.gpu.opt.hlo"]


def _model_file(name: str) -> tuple[str, str]:
    """'softmax@bench.gpu.opt.hlo' -> ('softmax', 'bench.gpu.opt.hlo'); 'softmax' -> ('softmax', 'bench.hlo')."""
    base, _, kind = name.partition("@")
    return base, kind or "bench.hlo"


def run_tests(out: Path, timeout: float = 200.0) -> dict:
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu",
                            "tests/null/test_gpu_measure.py"], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        (out / "gpu_tests.log").write_text(str(e.stdout or "") + "\n" + str(e.stderr or ""))
        return {"returncode": -1, "summary": f"timed out after {timeout:.0f} s", "seconds": timeout}
    (out / "gpu_tests.log").write_text(r.stdout + "\n" + r.stderr)
    last = [ln for ln in r.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
    return {"returncode": r.returncode, "summary": last[0], "seconds": round(time.time() - t0, 1)}


def _events_time(fn, torch, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(5):
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / 1e3 / reps)
    return float(np.median(out))


#: launches of one kernel per CUDA graph in `graph_time` (the device time without the host's launch cost)
GRAPH_REPEATS = 20


def graph_time(kern, ptrs: list[int], torch, min_time: float = 0.05) -> float:
    """Seconds per launch of `kern` (device pointers `ptrs`, inputs then outputs) with the host out of the way:
    GRAPH_REPEATS launches back to back in one CUDA graph (a `LaunchProgram` replayed by one driver call), replayed
    for at least `min_time` per timing, median of 5.  A per-launch timing (`kern.time`) is host-bound for kernels of
    about 10 us, whose launches through pycuda cost about as much as the kernel itself."""
    from hlotune.codegen.cuda_runtime import LaunchProgram

    prog = LaunchProgram()
    slots = [prog.slot(p) for p in ptrs]
    for _ in range(GRAPH_REPEATS):
        prog.kernel(kern, slots)
    prog.finish()
    run = (lambda: prog.run(("graph_time",)))
    one = _events_time(run, torch, reps=1)      # its warm-up calls capture the graph
    if not prog.graph_launches:
        raise RuntimeError("graph_time: the launches were not captured into a CUDA graph")
    calls = max(1, int(min_time / max(one, 1e-7)))
    return _events_time(run, torch, reps=calls) / GRAPH_REPEATS


def copy_bandwidth(torch) -> float:
    n = 1 << 28  # 1 GiB of float32
    a = torch.rand(n, device="cuda")
    b = torch.empty_like(a)
    t = _events_time(lambda: b.copy_(a), torch, reps=10)
    return 2 * n * 4 / t / 1e9


def matmul(n: int, torch, log) -> dict:
    import hlotune
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower

    hlo = (f"HloModule mm{n}\nENTRY main {{\n  a = f32[{n},{n}] parameter(0)\n  b = f32[{n},{n}] parameter(1)\n"
           f"  ROOT d = f32[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")
    (sg,) = hlotune.load_model(hlo).frontend.subgraphs
    cd = sg.workload.compute
    t0 = time.time()
    kern = build_cuda(lower(cd, default_gpu_schedule(cd), name=f"mm{n}"))
    build_s = time.time() - t0
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.full((n, n), float("nan"), device="cuda")
    kern(a, b, c)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    err = float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))
    t_ours = float(np.median(kern.time(a, b, c, min_time=0.2, repeat=5)))
    torch.backends.cuda.matmul.allow_tf32 = False
    t_cublas = _events_time(lambda: torch.matmul(a, b, out=c), torch, reps=10 if n <= 1024 else 3)
    fl = 2 * n ** 3
    res = {"n": n, "ours_gflops": fl / t_ours / 1e9, "cublas_gflops": fl / t_cublas / 1e9,
           "ratio": t_cublas / t_ours, "rel_err": err, "build_s": build_s,
           "launches": [(ln.grid, ln.block, ln.shared_bytes) for ln in kern.source.launches],
           "template": "GEMM template" in kern.text, "resources": _resources(kern)}
    log(f"matmul {n}: ours {res['ours_gflops']:.0f} GFLOP/s, cuBLAS {res['cublas_gflops']:.0f} "
        f"({100 * res['ratio']:.1f}%), rel err {err:.2e}")
    return res


def memory_bound(name: str, torch, copy_gbs: float, log) -> list[dict]:
    import hlotune
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.ir.compute import constant_values
    from hlotune.ir.compute_eval import evaluate_compute
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower
    from tests.conftest import model_path

    out = []
    base, kind = _model_file(name)
    from hlotune.schedule_space.default_gpu import _is_tiled_reduction

    for sg in hlotune.load_model(model_path(base, kind)).frontend.subgraphs:
        cd = sg.workload.compute
        label = f"{name}/{sg.name}"
        if any(_is_tiled_reduction(st) for st in cd.stages):
            continue   # dots and convolutions: not memory-bound
        try:
            kern = build_cuda(lower(cd, default_gpu_schedule(cd), name=sg.name))
            rng = np.random.default_rng(0)
            k = len(sg.computation.parameters)
            args = [(rng.standard_normal(b.shape) * 0.5 + 1.0).astype(b.dtype.np) for b in cd.inputs[:k]]
            consts = constant_values(cd)
            ins = args + [consts[b.name] for b in cd.inputs[k:]]
            want = evaluate_compute(cd, args)
            d_in = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in ins]
            d_out = [torch.full(w.shape, float("nan"), device="cuda") for w in want]
            kern(*d_in, *d_out)
            torch.cuda.synchronize()
            ok = all(np.allclose(o.cpu().numpy(), w, rtol=1e-4, atol=1e-4, equal_nan=True) for o, w in zip(d_out, want))
            maxerr = max(float(np.nanmax(np.abs(o.cpu().numpy() - w))) for o, w in zip(d_out, want))
            t_launch = float(np.median(kern.time(*d_in, *d_out, min_time=0.05, repeat=5)))
            t = graph_time(kern, [x.data_ptr() for x in d_in + d_out], torch)
            nbytes = sum(x.nbytes for x in ins) + sum(w.nbytes for w in want)
            gbs = nbytes / t / 1e9
            src = torch.empty(nbytes // 8, device="cuda")   # a device copy moving the same bytes (read + write)
            dst = torch.empty_like(src)
            t_copy = _events_time(lambda a=src, b=dst: b.copy_(a), torch, reps=20)
            r = {"subgraph": label, "us": t * 1e6, "bytes": nbytes, "gbs": gbs, "of_copy": gbs / copy_gbs,
                 "us_per_launch": t_launch * 1e6, "of_copy_per_launch": nbytes / t_launch / 1e9 / copy_gbs,
                 "copy_same_us": t_copy * 1e6, "of_copy_same": t_copy / t,
                 "correct": ok, "max_abs_err": maxerr,
                 "launches": [(ln.grid, ln.block, ln.shared_bytes) for ln in kern.source.launches]}
            log(f"{label}: {t * 1e6:.1f} us in a graph ({t_launch * 1e6:.1f} us launched one by one), {gbs:.0f} GB/s "
                f"({100 * gbs / copy_gbs:.0f}% of copy; a copy of the same "
                f"bytes {t_copy * 1e6:.1f} us), correct {ok}, launches {r['launches']}")
        except Exception as e:  # keep going: one failure must not lose the session
            r = {"subgraph": label, "error": f"{type(e).__name__}: {e}"[:800]}
            log(f"{label}: ERROR {r['error'][:300]}")
        out.append(r)
    return out


#: codegen.cuda flags that take the cp.async ring wherever GEMM_STAGES >= 2 (whatever the register tile and grid)
ASYNC_ALWAYS = {"GEMM_ASYNC_MAX_MR": 1 << 30, "GEMM_ASYNC_MR8_BLOCKS": 0}
MATMUL_VARIANTS = {  # label -> ((MR, NR, TI, TJ, BK), GEMM template: True / False / "nosplit" (8 columns per
    # thread with B's shared rows not split in halves) / a dict of codegen.cuda flags); the template needs BK % 4 == 0;
    # "cp.async S A^T / A row": GEMM_STAGES = S with A transposed by 4-byte copies / kept row-major (GEMM_A_ROW)
    "16x4/8x32/bk8": ((16, 4, 8, 32, 8), {"GEMM_STAGES": 0}),
    "8x8/16x16/bk8": ((8, 8, 16, 16, 8), {"GEMM_STAGES": 0}),
    "8x4/8x32/bk16": ((8, 4, 8, 32, 16), {"GEMM_STAGES": 0}),
    **{f"{t} cp.async {st} {'A row' if row else 'A^T'}":
       (tiles, {"GEMM_STAGES": st, "GEMM_A_ROW": bool(row), **ASYNC_ALWAYS})
       for t, tiles, cfg in (("16x4/8x32/bk8", (16, 4, 8, 32, 8), ((3, 0), (3, 1), (4, 1))),
                             ("16x4/8x32/bk16", (16, 4, 8, 32, 16), ((2, 1),)),
                             ("8x8/16x16/bk8", (8, 8, 16, 16, 8), ((3, 1),)),
                             ("8x4/8x32/bk8", (8, 4, 8, 32, 8), ((3, 1),)),
                             ("8x4/8x32/bk16", (8, 4, 8, 32, 16), ((2, 1), (3, 1), (4, 1))))
       for st, row in cfg},
}
EW_VARIANTS = {"per1/t256 (default)": {"per": 1, "threads": 256}, "per2/t256": {"per": 2, "threads": 256},
               "per4/t256": {"per": 4, "threads": 256}, "per1/t512": {"per": 1, "threads": 512},
               "per1/t128": {"per": 1, "threads": 128}, "per2/t128": {"per": 2, "threads": 128},
               "per1/t256/grid 8/SM": {"per": 1, "threads": 256, "grid": 8},
               # sin / cos (sin_mul_add only): session 6's default selects between both polynomials
               "sin: quadrant branch (session 5)": {"flags": {"SIN_SELECT": False}},
               "sin: float reduction, library call inline": {"flags": {"SIN_FLOAT_REDUCTION": True,
                                                                       "SIN_HUGE_CALL": False}}}
#: GEMM-bound subgraph variants (`--variants gemm`): (model, subgraph, label, schedule options, codegen flags); the
#: first of each subgraph is the code before the implicit-GEMM template; conv tiles (MH, MW, TH, TW, NR, TJ, BK),
#: dot tiles (MR, NR, TI, TJ, BK)
GEMM_VARIANTS = [
    ("conv2d_bias_relu", "max.3", "before (generic, no template)", {"implicit_gemm": False}, {}),
    ("conv2d_bias_relu", "max.3", "implicit GEMM, default", {}, {}),
    ("conv2d_bias_relu", "max.3", "register tiles, template off", {}, {"IGEMM_TEMPLATE": False}),
    ("conv2d_bias_relu", "max.3", "8x8 px: 1x8/8x1x16/nr4/bk16", {"conv_tiles": (1, 8, 8, 1, 4, 16, 16)}, {}),
    ("conv2d_bias_relu", "max.3", "2x56 px: 1x8/2x7x16/nr4/bk32", {"conv_tiles": (1, 8, 2, 7, 4, 16, 32)}, {}),
    ("conv2d_bias_relu", "max.3", "2x56 px: 1x8/2x7x16/nr4/bk8", {"conv_tiles": (1, 8, 2, 7, 4, 16, 8)}, {}),
    ("conv2d_bias_relu", "max.3", "4x8 px: 1x8/4x1x16/nr4/bk32", {"conv_tiles": (1, 8, 4, 1, 4, 16, 32)}, {}),
    ("transformer_block", "dot_general.9", "before (shared stages, generic)", {"implicit_gemm": False}, {}),
    ("transformer_block", "dot_general.9", "implicit GEMM, default", {}, {}),
    ("transformer_block", "dot_general.9", "4x4/8x32/bk16", {"tiles": (4, 4, 8, 32, 16)}, {}),
    ("mlp_train_step", "sub.20", "before (shared stages, generic)", {"implicit_gemm": False}, {}),
    ("mlp_train_step", "sub.20", "implicit GEMM, default", {}, {}),
    *[(model, name, label, {}, flags) for model, name in (("rmsnorm_swiglu", "dot_general.4"),
                                                          ("rmsnorm_swiglu", "dot_general.5"),
                                                          ("transformer_block", "dot_general.6"),
                                                          ("mlp2", "max.3"), ("dense_bias_relu", "max.3"))
      for label, flags in (("GEMM, registers", {"GEMM_STAGES": 0}), ("default", {}),
                           ("cp.async 3 A row", {"GEMM_STAGES": 3, "GEMM_A_ROW": True, **ASYNC_ALWAYS}))],
    *[(model, name, label, {"tiles": tiles}, flags) for model, name in (("rmsnorm_swiglu", "dot_general.4"),
                                                                        ("transformer_block", "dot_general.6"))
      for tiles in ((16, 4, 8, 32, 8), (8, 4, 8, 32, 8))
      for label, flags in ((f"{tiles} registers", {"GEMM_STAGES": 0}),
                           (f"{tiles} cp.async 3 A row", {"GEMM_STAGES": 3, "GEMM_A_ROW": True, **ASYNC_ALWAYS}))],
]
#: tensor-core variants (`--variants mma`): register tiles (MR, NR, TI, TJ, BK) the mma template takes (TJ = 4)
MMA_TILES = ((4, 16, 32, 4, 16), (2, 8, 64, 4, 16), (2, 16, 32, 4, 16), (8, 16, 16, 4, 16), (2, 16, 64, 4, 16),
             (4, 8, 64, 4, 16), (4, 8, 32, 4, 16), (2, 8, 32, 4, 16), (8, 8, 32, 4, 16))
#: matmul variants of `--variants mma`: label -> schedule options (cuBLAS float32 and TF32 timed in the same call)
MMA_MATMUL = {"FFMA template (no tensor cores)": ({"tensor_core": 0}, {}),
              "3xTF32, default tiles": ({"tensor_core": 3}, {}), "1xTF32, default tiles": ({"tensor_core": 1}, {}),
              "3xTF32, default tiles, steps one by one (session 5)": ({"tensor_core": 3},
                                                                      {"GEMM_MMA_PAIR_STEPS": False}),
              "3xTF32, default tiles, B split once per block": ({"tensor_core": 3}, {"GEMM_MMA_B_PLANES": True}),
              "3xTF32, default tiles, B split once per block, steps one by one": (
                  {"tensor_core": 3}, {"GEMM_MMA_B_PLANES": True, "GEMM_MMA_PAIR_STEPS": False}),
              "1xTF32, default tiles, B converted once per block": ({"tensor_core": 1}, {"GEMM_MMA_B_PLANES": True}),
              "3xTF32, default tiles, acc in the mma": ({"tensor_core": 3}, {"GEMM_MMA_SPLIT_ACC": False}),
              **{f"3xTF32 {t}": ({"tensor_core": 3, "tiles": t}, {}) for t in MMA_TILES}}
#: GEMM-bound subgraphs of `--variants mma` (FFMA default, 3xTF32 default tiles, 3xTF32 under other tiles)
MMA_SUBGRAPHS = (("rmsnorm_swiglu", "dot_general.4"), ("rmsnorm_swiglu", "mul.19"), ("rmsnorm_swiglu", "dot_general.5"),
                 ("transformer_block", "dot_general.6"), ("transformer_block", "add.1"),
                 ("transformer_block", "dot_general.10"), ("dense_bias_relu", "max.3"), ("mlp2", "max.3"),
                 ("mlp_train_step", "output_fusion"))
MMA_GEMM_VARIANTS = [(model, name, label, opts, flags) for model, name in MMA_SUBGRAPHS
                     for label, opts, flags in (("FFMA (no tensor cores)", {"tensor_core": 0}, {}),
                                                ("3xTF32, default tiles", {"tensor_core": 3}, {}),
                                                ("3xTF32, default tiles, steps one by one (session 5)",
                                                 {"tensor_core": 3}, {"GEMM_MMA_PAIR_STEPS": False}),
                                                ("3xTF32, default tiles, B split once per block",
                                                 {"tensor_core": 3}, {"GEMM_MMA_B_PLANES": True}),
                                                *[(f"3xTF32 {t}", {"tensor_core": 3, "tiles": t}, {})
                                                  for t in MMA_TILES[:2]])]
#: models timed with and without the tensor-core path by `--variants mma`
MMA_MODELS = ("matmul", "transformer_block", "rmsnorm_swiglu", "mlp_train_step", "dense_bias_relu", "mlp2")
SMS = 132
TORCH_MODELS: set | None = None    # --torch-models: only these get torch.compile
MODELS_TORCH = {
    "sin_mul_add": lambda t: lambda x: t.sin(x) * 2 + 1,
    "relu_chain": lambda t: lambda x: t.relu(x * 2.0 + 1.0) * 0.5,
    "gelu_tanh": lambda t: lambda x: t.nn.functional.gelu(x, approximate="tanh"),
    "softmax": lambda t: lambda x: t.softmax(x, dim=-1),
    "row_sum": lambda t: lambda x: x.sum(dim=1),
    "sum_reduce": lambda t: lambda x: x.sum(),
    "layernorm": lambda t: lambda x, s, b: t.nn.functional.layer_norm(x, x.shape[-1:], s, b, eps=1e-5),
    "matmul": lambda t: lambda a, b: a @ b,
}


def _mm_hlo(n: int) -> str:
    return (f"HloModule mm{n}\nENTRY main {{\n  a = f32[{n},{n}] parameter(0)\n  b = f32[{n},{n}] parameter(1)\n"
            f"  ROOT d = f32[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")


def _resources(kern) -> list:
    import pycuda.driver as drv
    fa = drv.function_attribute
    return [{"name": ln.fn.get_attribute(fa.NUM_REGS) and n.name, "regs": ln.fn.get_attribute(fa.NUM_REGS),
             "local_bytes": ln.fn.get_attribute(fa.LOCAL_SIZE_BYTES), "grid": n.grid, "block": n.block,
             "shared": n.shared_bytes} for ln, n in zip(kern._launches, kern.source.launches)]


def matmul_variants(n: int, torch, log, cublas: float | None) -> list[dict]:
    import hlotune
    from hlotune.codegen.cuda_runtime import build_cuda

    (sg,) = hlotune.load_model(_mm_hlo(n)).frontend.subgraphs
    cd = sg.workload.compute
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.full((n, n), float("nan"), device="cuda")
    ref = a.double() @ b.double()

    out = []
    for label, (tiles, gemm) in MATMUL_VARIANTS.items():
        try:
            kern = _variant_kernel(cd, f"mm{n}", {"tiles": tiles}, _gemm_flags(gemm), build_cuda)
            r0 = {"template": "GEMM template" in kern.text}
            c.fill_(float("nan"))
            kern(a, b, c)
            torch.cuda.synchronize()
            err = float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))
            t = float(np.median(kern.time(a, b, c, min_time=0.05 if n <= 1024 else 0.1, repeat=3)))
            r = {**r0, "n": n, "variant": label, "gflops": 2 * n ** 3 / t / 1e9, "rel_err": err,
                 "of_cublas": (2 * n ** 3 / t / 1e9) / cublas if cublas else None, "resources": _resources(kern)}
            log(f"  matmul {n} {label}: {r['gflops']:.0f} GFLOP/s ({100 * (r['of_cublas'] or 0):.0f}% of cuBLAS), "
                f"err {err:.1e}, regs {r['resources'][0]['regs']}, local {r['resources'][0]['local_bytes']}")
        except Exception as e:
            r = {"n": n, "variant": label, "error": f"{type(e).__name__}: {e}"[:400]}
            log(f"  matmul {n} {label}: ERROR {r['error'][:200]}")
        out.append(r)
    return out


def _gemm_flags(gemm) -> dict:
    """codegen.cuda flags of a MATMUL_VARIANTS entry."""
    if isinstance(gemm, dict):
        return dict(gemm)
    return {"GEMM_TEMPLATE": bool(gemm), "GEMM_SPLIT_B": gemm != "nosplit"}


def _variant_kernel(cd, name: str, opts: dict, flags: dict, build):
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower

    old = {k: getattr(cuda_gen, k) for k in flags}
    rt._KCACHE.clear()
    for k, v in flags.items():
        setattr(cuda_gen, k, v)
    try:
        return build(lower(cd, default_gpu_schedule(cd, options=dict(opts)), name=name))
    finally:
        for k, v in old.items():
            setattr(cuda_gen, k, v)
        rt._KCACHE.clear()


def _gemm_subgraph(model: str, name: str):
    import hlotune
    from tests.conftest import model_path

    return next(sg for sg in hlotune.load_model(model_path(model, "bench.hlo")).frontend.subgraphs if sg.name == name)


def _conv_reference(torch, x, w, b):
    """conv2d_bias_relu in torch (NHWC input, HWIO filter, padding 1, no TF32), NHWC out."""
    torch.backends.cudnn.allow_tf32 = False
    y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), b, padding=1)
    return torch.relu(y).permute(0, 2, 3, 1).contiguous()


def gemm_variants(torch, log, variants=None) -> list[dict]:
    """The GEMM-bound subgraphs of GEMM_VARIANTS (or `variants`): each variant built, checked (the conv against
    torch's conv2d without TF32, the others against `evaluate_compute`) and timed (TFLOP/s of the tiled
    reduction)."""
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.ir.compute import constant_values
    from hlotune.ir.compute_eval import evaluate_compute
    from hlotune.schedule_space.default_gpu import _is_tiled_reduction

    out = []
    cache: dict = {}
    for model, name, label, opts, flags in (GEMM_VARIANTS if variants is None else variants):
        r: dict = {"model": model, "subgraph": name, "variant": label}
        try:
            if (model, name) not in cache:
                sg = _gemm_subgraph(model, name)
                cd = sg.workload.compute
                rng = np.random.default_rng(0)
                k = len(sg.computation.parameters)
                args = [(rng.standard_normal(b.shape) * 0.5).astype(b.dtype.np) for b in cd.inputs[:k]]
                consts = constant_values(cd)
                d_in = [torch.from_numpy(np.ascontiguousarray(x)).cuda()
                        for x in args + [consts[b.name] for b in cd.inputs[k:]]]
                if model == "conv2d_bias_relu":
                    want = [_conv_reference(torch, *d_in).cpu().numpy()]
                else:
                    want = evaluate_compute(cd, args)
                red = next(st for st in cd.stages if _is_tiled_reduction(st))
                flops = 2 * int(np.prod(red.shape)) * int(np.prod([a.extent for a in red.reduce_axes]))
                cache[(model, name)] = (sg, cd, d_in, want, flops)
            sg, cd, d_in, want, flops = cache[(model, name)]
            kern = _variant_kernel(cd, sg.name, opts, flags, build_cuda)
            d_out = [torch.full(w.shape, float("nan"), device="cuda") for w in want]
            kern(*d_in, *d_out)
            torch.cuda.synchronize()
            err = max(float(np.linalg.norm(o.cpu().numpy().astype(np.float64) - w)
                            / max(np.linalg.norm(w.astype(np.float64)), 1e-30)) for o, w in zip(d_out, want))
            t = float(np.median(kern.time(*d_in, *d_out, min_time=0.05, repeat=3)))
            r.update({"us": t * 1e6, "tflops": flops / t / 1e12, "rel_err": err,
                      "template": ("implicit" if "implicit-GEMM template" in kern.text
                                   else "mma" if "tensor cores" in kern.text
                                   else "gemm" if "GEMM template" in kern.text else ""),
                      "resources": _resources(kern)})
            rs = r["resources"][0]
            log(f"  {model}/{name} {label}: {t * 1e6:.1f} us, {r['tflops']:.1f} TFLOP/s, rel err {err:.1e}, "
                f"template {r['template']!r}, regs {rs['regs']}, local {rs['local_bytes']}, launch {rs['grid']} x "
                f"{rs['block']}")
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"[:400]
            log(f"  {model}/{name} {label}: ERROR {r['error'][:300]}")
            traceback.print_exc()
        out.append(r)
    return out


def _max_err(c, ref) -> float:
    """max |C - C64| / max |C64| (the largest error relative to the largest output)."""
    return float((c.double() - ref).abs().max() / ref.abs().max())


def _mma_time(n: int, label: str, fn, c, ref, torch, log, extra=None, kern=None, args=()) -> dict:
    """One matmul n^3 variant: `fn` writes c; GFLOP/s (our kernels: `kern.time`, device time without the host's
    per-launch cost) and its errors against the float64 product `ref`."""
    c.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    if kern is not None:
        t = float(np.median(kern.time(*args, min_time=0.05 if n <= 1024 else 0.1, repeat=3)))
    else:
        t = _events_time(fn, torch, reps=10 if n <= 1024 else 3)
    r = {"n": n, "variant": label, "gflops": 2 * n ** 3 / t / 1e9, "us": t * 1e6, "max_err": _max_err(c, ref),
         "rel_err": float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)), **(extra or {})}
    rs = f", regs {r['resources'][0]['regs']}, local {r['resources'][0]['local_bytes']}" if "resources" in r else ""
    log(f"  mma matmul {n} {label}: {r['gflops']:.0f} GFLOP/s ({r['us']:.1f} us), max err {r['max_err']:.2e}, "
        f"norm err {r['rel_err']:.2e}{rs}")
    return r


def mma_variants(torch, log, sizes=(1024, 4096)) -> list[dict]:
    """`--variants mma`: matmul n^3 under MMA_MATMUL (FFMA template, 3xTF32, 1xTF32, tiles) beside cuBLAS float32 and
    cuBLAS TF32 (torch allow_tf32) in the same call: GFLOP/s, the error against a float64 product on N(0, 1) inputs
    (max-normalized and norm-wise), registers / local bytes."""
    import hlotune
    from hlotune.codegen.cuda_runtime import build_cuda

    out = []
    for n in sizes:
        (sg,) = hlotune.load_model(_mm_hlo(n)).frontend.subgraphs
        cd = sg.workload.compute
        gen = torch.Generator(device="cuda").manual_seed(n)
        a = torch.randn(n, n, device="cuda", generator=gen)
        b = torch.randn(n, n, device="cuda", generator=gen)
        c = torch.full((n, n), float("nan"), device="cuda")
        ref = a.double() @ b.double()
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
            out.append(_mma_time(n, f"cuBLAS {'TF32' if tf32 else 'float32'}",
                                 lambda x=a, y=b, z=c: torch.matmul(x, y, out=z), c, ref, torch, log))
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        for label, (opts, flags) in MMA_MATMUL.items():
            try:
                kern = _variant_kernel(cd, f"mm{n}", opts, flags, build_cuda)
                tmpl = "mma" if "tensor cores" in kern.text else "gemm" if "GEMM template" in kern.text else ""
                extra = {"template": tmpl, "resources": _resources(kern),
                         "launch": [(ln.grid, ln.block, ln.shared_bytes) for ln in kern.source.launches]}
                out.append(_mma_time(n, label, lambda k=kern, x=a, y=b, z=c: k(x, y, z), c, ref, torch, log, extra,
                                     kern, (a, b, c)))
            except Exception as e:
                out.append({"n": n, "variant": label, "error": f"{type(e).__name__}: {e}"[:400]})
                log(f"  mma matmul {n} {label}: ERROR {out[-1]['error'][:300]}")
    return out


def mma_models(torch, log, deadline: float, names=None) -> list[dict]:
    """MMA_MODELS (or `names`) whole (device-resident) with the default schedules (3xTF32 where the default takes it)
    and with the tensor-core path off (default_gpu.TENSOR_CORE = 0), JAX in the same call for the first."""
    import hlotune.schedule_space.default_gpu as dg

    res = []
    for tc in (dg.TENSOR_CORE, 0):
        old, dg.TENSOR_CORE = dg.TENSOR_CORE, tc
        try:
            for r in models(torch, log, deadline, False, names=list(names or MMA_MODELS), with_jax=tc != 0):
                res.append({**r, "tensor_core": tc})
        finally:
            dg.TENSOR_CORE = old
    return res


def elementwise_variants(torch, copy_gbs: float, log) -> list[dict]:
    import hlotune
    from hlotune.codegen.cuda_runtime import build_cuda
    from tests.conftest import model_path

    out = []
    for name in ("sin_mul_add", "relu_chain", "gelu_tanh"):
        (sg,) = hlotune.load_model(model_path(name, "bench.hlo")).frontend.subgraphs
        cd = sg.workload.compute
        x = torch.randn(*cd.inputs[0].shape, device="cuda")
        y = torch.empty_like(x)
        ref = None
        for label, opts in EW_VARIANTS.items():
            if "flags" in opts and name != "sin_mul_add":
                continue
            try:
                kern = _ew_kernel(cd, sg.name, opts, build_cuda)
                y.fill_(float("nan"))
                kern(x, y)
                torch.cuda.synchronize()
                ref = y.clone() if ref is None else ref
                agrees = bool(torch.equal(y, ref))   # the same arithmetic: bitwise the same results
                t = float(np.median(kern.time(x, y, min_time=0.03, repeat=3)))
                gbs = 2 * x.numel() * 4 / t / 1e9
                out.append({"model": name, "variant": label, "us": t * 1e6, "gbs": gbs, "of_copy": gbs / copy_gbs,
                            "agrees": agrees, "resources": _resources(kern)})
                log(f"  {name} {label}: {t * 1e6:.1f} us, {gbs:.0f} GB/s ({100 * gbs / copy_gbs:.0f}% of copy), "
                    f"bitwise equal to the first variant {agrees}, regs {out[-1]['resources'][0]['regs']}")
            except Exception as e:
                out.append({"model": name, "variant": label, "error": f"{type(e).__name__}: {e}"[:400]})
                log(f"  {name} {label}: ERROR {e}"[:300])
    return out


def _ew_kernel(cd, name: str, opts: dict, build):
    """An elementwise variant: schedule options, and `grid` = resident blocks per SM of a grid-stride kernel."""
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower

    opts = dict(opts)
    grid = opts.pop("grid", 0)
    flags = opts.pop("flags", {})
    old = {k: getattr(cuda_gen, k) for k in flags}
    rt._KCACHE.clear()
    cuda_gen.GRID_STRIDE_BLOCKS = SMS * grid
    for k, v in flags.items():
        setattr(cuda_gen, k, v)
    try:
        return build(lower(cd, default_gpu_schedule(cd, options=opts), name=name))
    finally:
        cuda_gen.GRID_STRIDE_BLOCKS = 0
        for k, v in old.items():
            setattr(cuda_gen, k, v)
        rt._KCACHE.clear()


_S5 = {"row_regs": False}    # the session-5 schedule: the row re-read from L1, softmax's exp in shared memory
_REGS = {"row_regs": True}   # session 6: the row (and softmax's exp) in registers
_DIV = {"ROW_DIV_RCP": True, "ROW_DIV_GROUPED": False}
_DIV4 = {"ROW_DIV_RCP": True, "ROW_DIV_GROUPED": True}
_W2, _W4 = {**_REGS, "row_lanes": 64}, {**_REGS, "row_lanes": 128}
_W1 = {**_REGS, "row_lanes": 32}    # one warp per row whatever `default_gpu.ROW_LANES` says
#: session 7's variants (also timed interleaved with the default and the one-warp schedule: `row_interleaved`)
ROW_LANE_VARIANTS = {"registers, 1 warp/row, 16 rows/block": ({**_W1, "rows": 16}, {}),
                     "registers, 2 warps/row, 8 rows/block": ({**_W2, "rows": 8}, {}),
                     "registers, 2 warps/row, 4 rows/block": ({**_W2, "rows": 4}, {}),
                     "registers, 2 warps/row, 16 rows/block": ({**_W2, "rows": 16}, {}),
                     "registers, 2 warps/row, 8 rows/block, __syncthreads": ({**_W2, "rows": 8},
                                                                            {"ROW_BARRIERS": False}),
                     "registers, 4 warps/row, 4 rows/block": ({**_W4, "rows": 4}, {}),
                     "registers, 4 warps/row, 2 rows/block": ({**_W4, "rows": 2}, {})}
_IEEE = {"ROW_DIV_RCP": False, "ROW_DIV_EXPR": False, "ROW_DIV_GROUPED": False}   # session 7: the IEEE division
_RDIV = {"ROW_DIV_RCP": True, "ROW_DIV_EXPR": True, "ROW_DIV_GROUPED": False}   # sum / sqrt(var + eps): one reciprocal
_RDIV4 = {**_RDIV, "ROW_DIV_GROUPED": True}     # the same, one range guard per float4 (the default since session 7b)
#: session 7b: the division by a row's scalar (or an expression of them) through one reciprocal per row + Markstein's
#: correction (bit for bit the IEEE kernel's results; session 9 removed the all-reduce without "has a value" flags)
ROW_S7B_VARIANTS = {"7b: 2 warps/row, 8 rows/block, IEEE division (session 7)": ({**_W2, "rows": 8}, _IEEE),
                    "7b: 2 warps/row, 8 rows/block, row division": ({**_W2, "rows": 8}, _RDIV),
                    "7b: 2 warps/row, 8 rows/block, row division, one guard per float4": ({**_W2, "rows": 8}, _RDIV4),
                    "7b: 2 warps/row, 4 rows/block, row division per float4": ({**_W2, "rows": 4}, _RDIV4),
                    "7b: 2 warps/row, 16 rows/block, row division per float4": ({**_W2, "rows": 16}, _RDIV4),
                    "7b: 4 warps/row, 4 rows/block, row division per float4": ({**_W4, "rows": 4}, _RDIV4),
                    "7b: 4 warps/row, 2 rows/block, row division per float4": ({**_W4, "rows": 2}, _RDIV4),
                    "7b: 4 warps/row, 4 rows/block, IEEE division (session 7)": ({**_W4, "rows": 4}, _IEEE)}
#: the variants `row_interleaved` times against the default (session 7b's second call: the default is the 2 x 8
#: "row division, one guard per float4" kernel)
ROW_INTERLEAVED_LABELS = ["7b: 2 warps/row, 8 rows/block, IEEE division (session 7)",
                          "7b: 2 warps/row, 4 rows/block, row division per float4",
                          "7b: 2 warps/row, 16 rows/block, row division per float4",
                          "7b: 4 warps/row, 4 rows/block, row division per float4",
                          "7b: 4 warps/row, 2 rows/block, row division per float4",
                          "7b: 4 warps/row, 4 rows/block, IEEE division (session 7)"]
#: models of the interleaved timing and its rounds (each round times every variant once, in a rotated order)
ROW_INTERLEAVED_MODELS = ["softmax@bench.gpu.opt.hlo", "layernorm@bench.gpu.opt.hlo", "rmsnorm_swiglu"]
ROW_INTERLEAVED_ROUNDS = 9
ROW_VARIANTS = {"default": ({}, {}), "session 5 (8 rows/block, row re-read, exp in shared)": (_S5, {}),
                "session 5, row cache in shared": ({"row_cache": True, **_S5}, {}),
                "session 5, exp inlined (computed twice)": ({"row_keep": False, **_S5}, {}),
                "session 5, 1 row/block": ({"rows": 1, **_S5}, {}),
                "registers, 8 rows/block": ({**_REGS, "rows": 8}, {}),
                "registers, 4 rows/block": ({**_REGS, "rows": 4}, {}),
                "registers, 32 rows/block": ({**_REGS, "rows": 32}, {}),
                # K rows per warp, the next row's loads issued before this row's work
                "registers, 2 rows/warp, 8 rows/block": ({**_REGS, "row_pipe": 2, "rows": 8}, {}),
                "registers, 2 rows/warp, 16 rows/block": ({**_REGS, "row_pipe": 2, "rows": 16}, {}),
                # session 6b: softmax's division by the row's sum through one reciprocal per row (exact: Markstein)
                "registers, division by one reciprocal per row": ({**_REGS}, _DIV),
                "registers, 8 rows/block, division by one reciprocal per row": ({**_REGS, "rows": 8}, _DIV),
                "registers, 32 rows/block, division by one reciprocal per row": ({**_REGS, "rows": 32}, _DIV),
                "registers, division by one reciprocal per row, one guard per float4": ({**_REGS}, _DIV4),
                "registers, 32 rows/block, division by one reciprocal per row, one guard per float4":
                    ({**_REGS, "rows": 32}, _DIV4),
                # session 7: two / four warps per row (row_lanes 64 / 128: N / 64, N / 128 registers per lane of the
                # row, a named barrier per row, each warp combining the row's per-lane partials from shared memory)
                **ROW_LANE_VARIANTS, **ROW_S7B_VARIANTS}
ROW_MODELS = ["softmax@bench.gpu.opt.hlo", "layernorm@bench.gpu.opt.hlo", "rmsnorm_swiglu", "transformer_block"]


def _row_subgraphs():
    import hlotune
    from hlotune.schedule_space.default_gpu import _row_reductions
    from tests.conftest import model_path

    for name in ROW_MODELS:
        base, kind = _model_file(name)
        for sg in hlotune.load_model(model_path(base, kind)).frontend.subgraphs:
            if _row_reductions(sg.workload.compute) is not None:
                yield name, sg


def row_variants(torch, copy_gbs: float, log) -> list[dict]:
    """The row-fused schedule's choices (row cache, rows per block, barriers and combines) on the row-fused
    subgraphs, each checked against the default variant's output."""
    from hlotune.codegen.cuda_runtime import build_cuda

    out = []
    for name, sg in _row_subgraphs():
        cd = sg.workload.compute
        rng = np.random.default_rng(0)
        ins = [torch.from_numpy(rng.standard_normal(b.shape).astype(np.float32)).cuda() for b in cd.inputs]
        ref = None
        for label, (opts, flags) in ROW_VARIANTS.items():
            try:
                kern = _variant_kernel(cd, sg.name, opts, flags, build_cuda)
                o = torch.full(cd.stage(cd.outputs[0]).shape, float("nan"), device="cuda")
                kern(*ins, o)
                torch.cuda.synchronize()
                ref = o.clone() if ref is None else ref
                ok = bool(torch.allclose(o, ref, rtol=1e-5, atol=1e-6))
                t = float(np.median(kern.time(*ins, o, min_time=0.03, repeat=3)))
                nbytes = sum(x.numel() * 4 for x in ins) + o.numel() * 4
                gbs = nbytes / t / 1e9
                out.append({"model": name, "variant": label, "us": t * 1e6, "gbs": gbs, "of_copy": gbs / copy_gbs,
                            "agrees": ok, "launch": kern.source.launches[0].block, "resources": _resources(kern)})
                log(f"  row {name}/{sg.name} {label}: {t * 1e6:.1f} us ({100 * gbs / copy_gbs:.0f}% of copy), "
                    f"agrees {ok}, regs {out[-1]['resources'][0]['regs']}")
            except Exception as e:
                out.append({"model": name, "variant": label, "error": f"{type(e).__name__}: {e}"[:400]})
                log(f"  row {name} {label}: ERROR {e}"[:300])
    return out


def row_interleaved(torch, copy_gbs: float, log, rounds: int = ROW_INTERLEAVED_ROUNDS) -> list[dict]:
    """The default row kernel and the variants of `ROW_INTERLEAVED_LABELS` timed interleaved in one process:
    `rounds` rounds, each timing every variant once (CUDA events, median of 3 x 20 ms) in an order rotated per
    round; per variant the median and minimum over the rounds and the median of its per-round ratio to the default."""
    from hlotune.codegen.cuda_runtime import build_cuda

    out = []
    for name, sg in _row_subgraphs():
        if name not in ROW_INTERLEAVED_MODELS:
            continue
        cd = sg.workload.compute
        rng = np.random.default_rng(0)
        ins = [torch.from_numpy(rng.standard_normal(b.shape).astype(np.float32)).cuda() for b in cd.inputs]
        nbytes = sum(x.numel() * 4 for x in ins) + int(np.prod(cd.stage(cd.outputs[0]).shape)) * 4
        labels = ["default", *ROW_INTERLEAVED_LABELS]
        kerns, outs, ref = {}, {}, None
        for label in labels:
            opts, flags = ROW_VARIANTS[label]
            try:
                kerns[label] = _variant_kernel(cd, sg.name, opts, flags, build_cuda)
            except Exception as e:
                log(f"  interleaved {name} {label}: ERROR {e}"[:300])
                continue
            o = torch.full(cd.stage(cd.outputs[0]).shape, float("nan"), device="cuda")
            kerns[label](*ins, o)
            torch.cuda.synchronize()
            ref = o.clone() if ref is None else ref
            outs[label] = (o, bool(torch.allclose(o, ref, rtol=1e-5, atol=1e-6)), bool(torch.equal(o, ref)))
        times: dict[str, list[float]] = {k: [] for k in kerns}
        order = list(kerns)
        for r in range(rounds):
            for label in order[r % len(order):] + order[:r % len(order)]:
                times[label].append(float(np.median(kerns[label].time(*ins, outs[label][0], min_time=0.02,
                                                                         repeat=3))))
        base = times.get("default")
        for label, ts in times.items():
            med = float(np.median(ts))
            ratio = float(np.median([t / b for t, b in zip(ts, base)])) if base else float("nan")
            gbs = nbytes / med / 1e9
            out.append({"model": name, "variant": label, "us": med * 1e6, "min_us": min(ts) * 1e6,
                        "ratio_to_default": ratio, "gbs": gbs, "of_copy": gbs / copy_gbs, "agrees": outs[label][1],
                        "bitwise": outs[label][2],
                        "rounds_us": [x * 1e6 for x in ts], "launch": kerns[label].source.launches[0].block,
                        "resources": _resources(kerns[label])})
            log(f"  interleaved {name} {label}: {med * 1e6:.2f} us (min {min(ts) * 1e6:.2f}, "
                f"{100 * gbs / copy_gbs:.0f}% of copy, x{ratio:.3f} of default), agrees {outs[label][1]}, "
                f"bitwise {outs[label][2]}, "
                f"regs {out[-1]['resources'][0]['regs']}")
    return out


def _round_time(fn, sync, rounds=5, calls=20) -> float:
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        ts.append((time.perf_counter() - t0) / calls)
    return float(np.median(ts))


def _events_round_time(fn, torch, rounds=5, calls=20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(rounds):
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3 / calls)
    return float(np.median(ts))


def jax_clean_times(models: list[str], log, timeout: float = 300.0, processes: int = 3,
                    python: str = sys.executable) -> dict[str, float]:
    """Seconds per call of each model's JAX function, timed by jax_gpu_clean.py in `processes` processes of its own
    one after the other (JAX's per-call figure moves by up to 1.5x between processes, session 10): the median over
    the processes ({} when none ran)."""
    import tempfile

    runs: list[dict[str, float]] = []
    for p in range(processes):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "jax.json"
            cmd = [python, str(Path(__file__).with_name("jax_gpu_clean.py")), "--out", str(out), "--models",
                   ",".join(models)]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                runs.append(json.loads(out.read_text()) if out.exists() else {})
            except (subprocess.TimeoutExpired, OSError, ValueError) as e:
                log(f"JAX in a clean process ({p + 1}): failed ({type(e).__name__}: {e})")
                continue
        if r.returncode:
            log(f"JAX in a clean process ({p + 1}): exit {r.returncode}: {r.stderr[-300:]}")
    runs = [x for x in runs if x]
    times = {k: float(np.median([x[k] for x in runs if k in x])) for k in models if any(k in x for x in runs)}
    log(f"JAX in {len(runs)} clean processes (us per call, median; per process): " + ", ".join(
        f"{k} {v * 1e6:.1f} ({' / '.join(f'{x[k] * 1e6:.1f}' for x in runs if k in x)})" for k, v in times.items()))
    return times


def models(torch, log, deadline: float, with_torch: bool, names=None, with_jax: bool = True,
           torch_margin: float = 60.0) -> list[dict]:
    import json as _json

    import hlotune
    from tests.conftest import MODEL_NAMES, MODELS_DIR, model_path

    jax = None
    try:
        if with_jax:
            import jax
            import jax.numpy as jnp
            from jax import lax
            jax.config.update("jax_default_matmul_precision", "highest")
    except Exception as e:  # pragma: no cover
        log(f"JAX not usable: {e}")
        jax = None
    manifest = _json.loads((MODELS_DIR / "manifest.json").read_text())["models"]
    ref = _json.loads((MODELS_DIR / "jax_gpu_times.json").read_text())["highest"]
    clean = jax_clean_times(sorted({_model_file(n)[0] for n in names or (list(MODEL_NAMES) + MODEL_EXTRA)}), log) \
        if jax is not None else {}
    out = []
    for name in names or (list(MODEL_NAMES) + MODEL_EXTRA):
        if time.time() > deadline:
            log(f"model {name}: skipped (time budget)")
            continue
        base, kind = _model_file(name)
        r: dict = {"model": name, "jax_ref_s": ref.get(base)}
        try:
            m = hlotune.load_model(str(model_path(base, kind)))
            rng = np.random.default_rng(0)
            args = [(rng.standard_normal(p.array_shape.dims) * 0.5).astype(p.array_shape.dtype.np)
                    for p in m.module.entry_computation.parameters]
            t0 = time.time()
            exe = hlotune.compile(m, target="cuda")
            r["compile_s"] = time.time() - t0
            d_args = [torch.from_numpy(a).cuda() for a in args]
            got = [torch.as_tensor(g, device="cuda") for g in exe.call_device(*d_args)]
            r["ours_s"] = _events_round_time(lambda e=exe, a=d_args: e.call_device(*a), torch)
            r["kernels"] = exe._gpu.fast.prog.n_kernels if exe._gpu.fast is not None else None
            import hlotune.codegen.cuda_runtime as rt
            rt.USE_GRAPHS = False   # the launch program kernel by kernel (no CUDA graph replay)
            r["ours_nograph_s"] = _events_round_time(lambda e=exe, a=d_args: e.call_device(*a), torch)
            rt.USE_GRAPHS = True
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(100):
                exe.call_device(*d_args)
            r["host_s"] = (time.perf_counter() - t0) / 100    # Python + driver time per call (queue not full)
            torch.cuda.synchronize()
            fast, exe._gpu.fast = exe._gpu.fast, None   # the general glue path (one pycuda launch per kernel)
            r["ours_general_s"] = _events_round_time(lambda e=exe, a=d_args: e.call_device(*a), torch)
            exe._gpu.fast = fast
            # the device time of the kernels alone: launched back to back without the host in the way
            if fast is not None:
                r["ours_device_s"] = _events_round_time(fast.prog.run, torch, calls=50)
            r["host_fallbacks"] = dict(exe._gpu.host_fallbacks)
            if jax is not None:
                ns = {"jax": jax, "jnp": jnp, "lax": lax}
                exec(manifest[base]["jax_source"], ns)
                fn = jax.jit(ns[base])
                j_args = [jax.device_put(a) for a in args]
                jo = jax.tree_util.tree_leaves(fn(*j_args))
                errs = []
                for g, w in zip(got, jo):
                    w64 = np.asarray(w, dtype=np.float64)
                    g64 = g.double().cpu().numpy()
                    errs.append(float(np.linalg.norm(g64 - w64) / max(np.linalg.norm(w64), 1e-30)))
                r["rel_err_vs_jax"] = max(errs)
                r["jax_inproc_s"] = _round_time(lambda f=fn, a=j_args: f(*a),
                                                lambda f=fn, a=j_args: jax.block_until_ready(f(*a)))
                r["jax_s"] = clean.get(base, r["jax_inproc_s"])
                r["jax_clean"] = base in clean
                r["speedup_vs_jax"] = r["jax_s"] / r["ours_s"]
            if (with_torch and base in MODELS_TORCH and time.time() < deadline - torch_margin
                    and (TORCH_MODELS is None or name in TORCH_MODELS)):
                tf = torch.compile(MODELS_TORCH[base](torch))
                tf(*d_args)
                r["torch_compile_s"] = _events_round_time(lambda f=tf, a=d_args: f(*a), torch)
                r["speedup_vs_torch"] = r["torch_compile_s"] / r["ours_s"]
            log(f"model {name}: ours {r['ours_s'] * 1e6:.1f} us (no graphs {r['ours_nograph_s'] * 1e6:.1f} us, host "
                f"{r['host_s'] * 1e6:.1f} us/call, general path {r['ours_general_s'] * 1e6:.1f} us, "
                f"kernels alone {r.get('ours_device_s', 0) * 1e6:.1f} us, {r['kernels']} kernels), "
                f"JAX {r.get('jax_s', 0) * 1e6:.1f} us (in this process {r.get('jax_inproc_s', 0) * 1e6:.1f} us) "
                f"(x{r.get('speedup_vs_jax', 0):.2f}), torch.compile {r.get('torch_compile_s', 0) * 1e6:.1f} us, "
                f"err {r.get('rel_err_vs_jax', -1):.1e}, host fallbacks {r['host_fallbacks']}")
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"[:800]
            log(f"model {name}: ERROR {r['error'][:300]}")
            traceback.print_exc()
        out.append(r)
    return out


def tune_check(name: str, trials: int, out: Path, log, timeout: float, population: int = 256,
               budget: str | None = None) -> dict:
    """`hlotune tune MODEL --target cuda` (bench size, `trials` trials, a subprocess with a time cap) into
    out/gpu_tune.db, then `hlotune.compile(model, tuning_log=db, target="cuda")`: which subgraphs use tuned
    schedules, outputs against the default-schedule executable on the same inputs, device-resident times."""
    import torch

    import hlotune
    from hlotune.database import open_database
    from tests.conftest import model_path

    db = out / "gpu_tune.db"
    res: dict = {"model": name, "trials": trials, "population": population}
    cmd = [sys.executable, "-c", "import sys; from hlotune.cli import main; sys.exit(main(sys.argv[1:]))", "tune",
           str(model_path(name, "bench.hlo")), "--target", "cuda", "--tuning-log", str(db), "--population",
           str(population), "--seed", "0", "--json", "-q", "--log-dir", "/tmp/hlotune_logs"]
    cmd += ["--time-budget", budget, "--trials", "100000"] if budget else ["--trials", str(trials)]
    res["budget"] = budget
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        (out / "gpu_tune.log").write_text(" ".join(cmd) + "\n" + r.stdout + "\n" + r.stderr)
        res["returncode"] = r.returncode
        if r.returncode == 0:
            res["report"] = json.loads(r.stdout)
    except subprocess.TimeoutExpired as e:
        (out / "gpu_tune.log").write_text(str(e.stdout or "") + "\n" + str(e.stderr or ""))
        res["returncode"] = -1
        res["error"] = f"tune timed out after {timeout:.0f} s (the database keeps what was measured)"
    res["tune_s"] = round(time.time() - t0, 1)
    log(f"tune {name}: rc {res['returncode']} in {res['tune_s']} s")
    try:
        d = open_database(str(db))
        recs = list(d.records())
        res["records"] = len(recs)
        rep = res.get("report") or {}
        res["measured"] = rep.get("trials")
        res["candidates_per_s"] = (rep.get("trials") or 0) / max(rep.get("elapsed_s") or res["tune_s"], 1e-9)
        log(f"tune {name}: {res['measured']} measured in {rep.get('elapsed_s')} s "
            f"({res['candidates_per_s']:.2f}/s), {res['records']} records in the database, "
            f"estimated model {rep.get('model_latency_s')} s vs default {rep.get('default_latency_s')} s")
        res["valid_records"] = sum(rec.valid for rec in recs)
        res["errors"] = sorted({rec.error_kind for rec in recs if not rec.valid})
        d.close()
    except Exception as e:
        res["records_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        m = hlotune.load_model(str(model_path(name, "bench.hlo")))
        rng = np.random.default_rng(0)
        args = [(rng.standard_normal(p.array_shape.dims) * 0.5).astype(p.array_shape.dtype.np)
                for p in m.module.entry_computation.parameters]
        exe_t = hlotune.compile(m, tuning_log=str(db), target="cuda")
        exe_d = hlotune.compile(m, target="cuda")
        res["sources"] = exe_t.sources()
        got, want = exe_t(*args), exe_d(*args)
        res["max_rel_err_vs_default"] = max(
            float(np.linalg.norm(np.asarray(g, np.float64) - np.asarray(w, np.float64))
                  / max(np.linalg.norm(np.asarray(w, np.float64)), 1e-30)) for g, w in zip(got, want))
        d_args = [torch.from_numpy(a).cuda() for a in args]
        res["tuned_s"] = _events_round_time(lambda e=exe_t, a=d_args: e.call_device(*a), torch)
        res["default_s"] = _events_round_time(lambda e=exe_d, a=d_args: e.call_device(*a), torch)
        log(f"tune {name}: compile with the log: {res['sources']}; tuned {res['tuned_s'] * 1e6:.1f} us, default "
            f"{res['default_s'] * 1e6:.1f} us, rel err vs default {res['max_rel_err_vs_default']:.1e}")
    except Exception as e:
        res["compile_error"] = f"{type(e).__name__}: {e}"[:800]
        log(f"tune {name}: ERROR {res['compile_error'][:300]}")
        traceback.print_exc()
    (out / "gpu_tune.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def precompile(log) -> int:
    """No GPU needed: generate every kernel this script builds by default (matmul and its variants, the memory-bound
    subgraphs, the elementwise variants, every model's subgraphs with the default schedules an H200 gets) and
    compile them with the local nvcc into the cubin cache (HLOTUNE_CACHE_DIR), to carry to the GPU machine."""
    from concurrent.futures import ThreadPoolExecutor

    import hlotune
    import hlotune.codegen.cuda as cuda_gen
    from hlotune.codegen.cuda import generate_cuda
    from hlotune.codegen.cuda_runtime import compile_cubin
    from hlotune.executable import _kernel_name, choose_schedule
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower
    from hlotune.target import Target
    from tests.conftest import MODEL_NAMES, model_path
    tgt = Target(kind="cuda", name="NVIDIA H200", cores=SMS, arch="sm_90", max_threads_per_block=1024)
    texts: dict[str, str] = {}

    def add(func, grid: int = 0):
        cuda_gen.GRID_STRIDE_BLOCKS = grid
        try:
            texts[generate_cuda(func).text] = func.name
        except Exception as e:
            log(f"precompile {func.name}: {type(e).__name__}: {e}"[:300])
        finally:
            cuda_gen.GRID_STRIDE_BLOCKS = 0

    for n in (1024, 4096):
        (sg,) = hlotune.load_model(_mm_hlo(n)).frontend.subgraphs
        cd = sg.workload.compute
        add(lower(cd, default_gpu_schedule(cd), name=f"mm{n}"))
        for tiles, gemm in MATMUL_VARIANTS.values():
            _variant_kernel(cd, f"mm{n}", {"tiles": tiles}, _gemm_flags(gemm), add)
    for name in MEMORY_BOUND:
        base, kind = _model_file(name)
        for sg in hlotune.load_model(model_path(base, kind)).frontend.subgraphs:
            cd = sg.workload.compute
            add(lower(cd, default_gpu_schedule(cd), name=sg.name))
    for name in ("sin_mul_add", "relu_chain", "gelu_tanh"):
        (sg,) = hlotune.load_model(model_path(name, "bench.hlo")).frontend.subgraphs
        cd = sg.workload.compute
        for opts in EW_VARIANTS.values():
            if "flags" in opts and name != "sin_mul_add":
                continue
            o = dict(opts)
            grid = o.pop("grid", 0)
            _ew_kernel(cd, sg.name, o, lambda f, g=grid: add(f, SMS * g))
    for _, sg in _row_subgraphs():
        for opts, flags in ROW_VARIANTS.values():
            _variant_kernel(sg.workload.compute, sg.name, opts, flags, add)
    for model, name, _, opts, flags in GEMM_VARIANTS:
        sg = _gemm_subgraph(model, name)
        _variant_kernel(sg.workload.compute, sg.name, opts, flags, add)
    for name in list(MODEL_NAMES) + MODEL_EXTRA:
        base, kind = _model_file(name)
        m = hlotune.load_model(str(model_path(base, kind)))
        for sg in m.frontend.subgraphs:
            choice = choose_schedule(sg.workload, None, tgt)
            add(lower(sg.workload.compute, choice.steps, name=_kernel_name(sg.name)))
    # the GPU tests' kernels at test size: default and random schedules of every distinct subgraph, whole models
    from tests.conftest import distinct_subgraphs
    rng = np.random.default_rng(11)
    for _, sg in distinct_subgraphs():
        cd = sg.workload.compute
        add(lower(cd, default_gpu_schedule(cd), name=sg.name))
        for _ in range(2):
            add(lower(cd, default_gpu_schedule(cd, rng=rng), name=sg.name))
    from tests.gpu.test_cuda_run import implicit_gemm_cases
    for _, sg, steps in implicit_gemm_cases():
        add(lower(sg.workload.compute, steps, name=sg.name))
    from tests.gpu.test_cuda_run import gemm_async_cases
    for _, hlo, tiles, flags in gemm_async_cases():
        (sg,) = hlotune.load_model(hlo).frontend.subgraphs
        _variant_kernel(sg.workload.compute, sg.name, {"tiles": tiles}, flags, add)
    from tests.gpu.test_rows6 import ROW_CASES, SIN_CASES, _unary, base_flags, sin_inputs  # session 6's GPU tests
    for name in ("softmax", "layernorm"):
        (sg,) = hlotune.load_model(str(model_path(name, "bench.gpu.opt.hlo"))).frontend.subgraphs
        for opts, flags in ROW_CASES:
            _variant_kernel(sg.workload.compute, f"row_{name}", opts, flags, add)
    for op in ("sine", "cosine"):
        (sg,) = hlotune.load_model(_unary(op, len(sin_inputs()))).frontend.subgraphs
        for fl in SIN_CASES:
            for flags in (dict(zip(("SIN_FLOAT_REDUCTION", "SIN_SELECT"), fl)), base_flags(fl)):
                _variant_kernel(sg.workload.compute, f"math_{op}", {}, flags, add)
    for name in MODEL_NAMES:
        for sg in hlotune.load_model(str(model_path(name))).frontend.subgraphs:
            choice = choose_schedule(sg.workload, None, tgt)
            add(lower(sg.workload.compute, choice.steps, name=_kernel_name(sg.name)))
    # tensor cores (`--variants mma`, tests/gpu/test_cuda_mma.py): matmul and subgraph variants, the models with the
    # tensor-core path off, the tests' dots and fused subgraphs
    import hlotune.schedule_space.default_gpu as dg
    for n in (1024, 4096):
        (sg,) = hlotune.load_model(_mm_hlo(n)).frontend.subgraphs
        for opts, flags in MMA_MATMUL.values():
            _variant_kernel(sg.workload.compute, f"mm{n}", opts, flags, add)
    for model, name, _, opts, flags in MMA_GEMM_VARIANTS:
        sg = _gemm_subgraph(model, name)
        _variant_kernel(sg.workload.compute, sg.name, opts, flags, add)
    old_tc, dg.TENSOR_CORE = dg.TENSOR_CORE, 0
    try:
        for name in MMA_MODELS:
            for sg in hlotune.load_model(str(model_path(name, "bench.hlo"))).frontend.subgraphs:
                choice = choose_schedule(sg.workload, None, tgt)
                add(lower(sg.workload.compute, choice.steps, name=_kernel_name(sg.name)))
    finally:
        dg.TENSOR_CORE = old_tc
    from tests.gpu.test_cuda_mma import FUSED, mma_cases
    for _, hlo, opts in mma_cases():
        (sg,) = hlotune.load_model(hlo).frontend.subgraphs
        _variant_kernel(sg.workload.compute, sg.name, opts, {}, add)
    for model, name in FUSED:
        sg = _gemm_subgraph(model, name)
        _variant_kernel(sg.workload.compute, sg.name, {"tensor_core": 3}, {}, add)
    log(f"precompile: {len(texts)} kernels")
    errors = []

    def one(item):
        try:
            compile_cubin(item[0], "sm_90", context=item[1])
        except Exception as e:
            errors.append(f"{item[1]}: {e}"[:300])

    with ThreadPoolExecutor(2) as ex:
        list(ex.map(one, texts.items()))
    for e in errors:
        log(f"precompile error {e}")
    return 1 if errors else 0


def _subgraph_variant_table(title: str, rows) -> list[str]:
    """Markdown lines of a table of subgraph variants (`gemm_variants`, `mma_subgraphs`); none without rows."""
    if not rows:
        return []
    md = ["", f"| {title} | us | TFLOP/s | rel err | template | regs | launch |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['model']}/{r['subgraph']} {r['variant']} | error | | {r['error'][:80]} | | | |")
        else:
            rs = r["resources"][0]
            md.append(f"| {r['model']}/{r['subgraph']} {r['variant']} | {r['us']:.1f} | {r['tflops']:.1f} | "
                      f"{r['rel_err']:.1e} | {r['template']} | {rs['regs']} | {rs['grid']} x {rs['block']} |")
    return md



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for everything before the tests")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-memory-bound", action="store_true")
    ap.add_argument("--tune", default=None, metavar="MODEL",
                    help="only tune MODEL (bench size) for cuda and compile it with the log (gpu_tune.json)")
    ap.add_argument("--tune-trials", type=int, default=40)
    ap.add_argument("--tune-timeout", type=float, default=150.0)
    ap.add_argument("--tune-budget", default=None, help="time budget of the tune run (e.g. 75s) instead of trials")
    ap.add_argument("--precompile", action="store_true",
                    help="no GPU: compile every default kernel of this script into the local cubin cache")
    ap.add_argument("--torch-models", default=None, help="comma-separated models timed with torch.compile too")
    ap.add_argument("--variants", default="matmul,ew",
                    help="comma-separated variant groups: matmul, ew, row, gemm (GEMM-bound subgraphs), mma "
                         "(tensor cores: matmul beside cuBLAS float32 / TF32, GEMM subgraphs, models on / off)")
    ap.add_argument("--models", default=None, help="comma-separated models (default: all fixtures + MODEL_EXTRA)")
    ap.add_argument("--mma-parts", default="matmul,subgraphs,models", help="parts of --variants mma")
    ap.add_argument("--mma-models", default=None, help="models of --variants mma (default: MMA_MODELS)")
    ap.add_argument("--torch-only", default=None, metavar="MODELS",
                    help="only ours vs torch.compile for these models (comma-separated; '' = all of MODELS_TORCH)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    global TORCH_MODELS
    if args.torch_models:
        TORCH_MODELS = set(args.torch_models.split(","))
    if args.precompile:
        return precompile(log)
    if args.tune:
        tune_check(args.tune, args.tune_trials, out, log, args.tune_timeout, budget=args.tune_budget)
        return 0
    if args.torch_only:   # ours and torch.compile only (the models of MODELS_TORCH), results written per model
        import torch
        order = [n for n in args.torch_only.split(",") if n] or list(MODELS_TORCH)
        res = []
        for name in order:
            res += models(torch, log, time.time() + args.budget, True, names=[name], with_jax=False, torch_margin=0)
            (out / "gpu_torch.json").write_text(json.dumps(res, indent=1, default=str))
        return 0
    t_start = time.time()
    deadline = t_start + args.budget
    import torch

    from hlotune.codegen.cuda_runtime import detect_cuda_target, nvcc_version

    tgt = detect_cuda_target()
    res: dict = {"target": tgt.to_dict(), "nvcc": nvcc_version(), "torch": torch.__version__}
    log(f"target {tgt.fingerprint}; {tgt.name}, {tgt.cores} SMs, driver {tgt.driver_version}")
    res["copy_gbs"] = copy_bandwidth(torch)
    log(f"device-to-device copy: {res['copy_gbs']:.0f} GB/s (read + write)")
    res["matmul"] = []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        try:
            res["matmul"].append(matmul(n, torch, log))
        except Exception as e:
            log(f"matmul {n}: ERROR {type(e).__name__}: {e}"[:800])
            traceback.print_exc()
    res["memory_bound"] = []
    for name in ([] if args.no_memory_bound else MEMORY_BOUND):
        res["memory_bound"] += memory_bound(name, torch, res["copy_gbs"], log)
    res["models"] = models(torch, log, deadline - (0 if args.no_variants else 90), not args.no_torch,
                           names=[x for x in args.models.split(",") if x] if args.models else None)
    (out / "gpu_session.json").write_text(json.dumps(res, indent=1, default=str))
    if not args.no_variants:
        cub = {m["n"]: m["cublas_gflops"] for m in res["matmul"]}
        res["matmul_variants"] = []
        groups = set(args.variants.split(","))
        for n in [int(x) for x in args.sizes.split(",") if x and "matmul" in groups]:
            if time.time() < deadline:
                res["matmul_variants"] += matmul_variants(n, torch, log, cub.get(n))
        if "row" in groups:
            res["row_variants"] = row_variants(torch, res["copy_gbs"], log)
            (out / "gpu_session.json").write_text(json.dumps(res, indent=1, default=str))
            res["row_interleaved"] = row_interleaved(torch, res["copy_gbs"], log)
        if time.time() < deadline + 30 and "ew" in groups:
            res["elementwise_variants"] = elementwise_variants(torch, res["copy_gbs"], log)
        if "gemm" in groups:
            res["gemm_variants"] = gemm_variants(torch, log)
        if "mma" in groups:
            parts = set(args.mma_parts.split(","))
            if "matmul" in parts:
                res["mma_matmul"] = mma_variants(torch, log)
                (out / "gpu_session.json").write_text(json.dumps(res, indent=1, default=str))
            if "subgraphs" in parts:
                res["mma_subgraphs"] = gemm_variants(torch, log, MMA_GEMM_VARIANTS)
                (out / "gpu_session.json").write_text(json.dumps(res, indent=1, default=str))
            if "models" in parts:
                res["mma_models"] = mma_models(torch, log, time.time() + 240,
                                               args.mma_models.split(",") if args.mma_models else None)
    (out / "gpu_session.json").write_text(json.dumps(res, indent=1, default=str))
    if not args.skip_tests:
        res["tests"] = run_tests(out, max(60.0, t_start + args.budget + 200 - time.time()))
        log(f"GPU tests: rc {res['tests']['returncode']}, {res['tests']['summary']} ({res['tests']['seconds']} s)")
    (out / "gpu_session.json").write_text(json.dumps(res, indent=1, default=str))
    md = ["# GPU session", "", f"target `{tgt.fingerprint}`, copy {res['copy_gbs']:.0f} GB/s", "",
          "| matmul | ours GFLOP/s | cuBLAS GFLOP/s | % | rel err |", "|---|---|---|---|---|"]
    md += [f"| {m['n']}^3 | {m['ours_gflops']:.0f} | {m['cublas_gflops']:.0f} | {100 * m['ratio']:.1f} | "
           f"{m['rel_err']:.1e} |" for m in res["matmul"]]
    md += ["", f"| subgraph (bench size) | us ({GRAPH_REPEATS} per graph) | GB/s | % of copy | us, launched one by one "
           "| % of copy, one by one | correct |", "|---|---|---|---|---|---|---|"]
    for r in res["memory_bound"]:
        if "error" in r:
            md.append(f"| {r['subgraph']} | error | | | | | {r['error'][:80]} |")
        else:
            md.append(f"| {r['subgraph']} | {r['us']:.1f} | {r['gbs']:.0f} | {100 * r['of_copy']:.0f} | "
                      f"{r['us_per_launch']:.1f} | {100 * r['of_copy_per_launch']:.0f} | {r['correct']} |")
    md += ["", "| model (bench size) | ours us | JAX us (highest, own process) | vs JAX | torch.compile us | "
           "vs torch | rel err vs JAX | host fallbacks | kernels | no graphs us | host us/call | general path us | "
           "kernels alone us |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("models", []):
        if "error" in r:
            md.append(f"| {r['model']} | error | | | | | {r['error'][:80]} | |")
            continue
        tc = f"{r['torch_compile_s'] * 1e6:.1f}" if "torch_compile_s" in r else "-"
        vt = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        md.append(f"| {r['model']} | {r['ours_s'] * 1e6:.1f} | {r.get('jax_s', 0) * 1e6:.1f} | "
                  f"{r.get('speedup_vs_jax', 0):.2f}x | {tc} | {vt} | {r.get('rel_err_vs_jax', -1):.1e} | "
                  f"{sum(r['host_fallbacks'].values())} | {r.get('kernels')} | {r['ours_nograph_s'] * 1e6:.1f} | "
                  f"{r['host_s'] * 1e6:.1f} | {r['ours_general_s'] * 1e6:.1f} | "
                  f"{r.get('ours_device_s', 0) * 1e6:.1f} |")
    if res.get("matmul_variants"):
        md += ["", "| matmul variant | GFLOP/s | % cuBLAS | regs | local bytes |", "|---|---|---|---|---|"]
        for r in res["matmul_variants"]:
            if "error" not in r:
                md.append(f"| {r['n']} {r['variant']} | {r['gflops']:.0f} | {100 * (r['of_cublas'] or 0):.0f} | "
                          f"{r['resources'][0]['regs']} | {r['resources'][0]['local_bytes']} |")
    md += _subgraph_variant_table("GEMM-bound subgraph variant", res.get("gemm_variants"))
    if res.get("mma_matmul"):
        md += ["", "| matmul (mma variants) | GFLOP/s | us | max err | norm err | template | regs | local bytes |",
               "|---|---|---|---|---|---|---|---|"]
        for r in res["mma_matmul"]:
            if "error" in r:
                md.append(f"| {r['n']} {r['variant']} | error | | {r['error'][:80]} | | | | |")
                continue
            rs = (r.get("resources") or [{}])[0]
            md.append(f"| {r['n']}^3 {r['variant']} | {r['gflops']:.0f} | {r['us']:.1f} | {r['max_err']:.2e} | "
                      f"{r['rel_err']:.2e} | {r.get('template', '')} | {rs.get('regs', '')} | "
                      f"{rs.get('local_bytes', '')} |")
    md += _subgraph_variant_table("GEMM-bound subgraph (mma variants)", res.get("mma_subgraphs"))
    if res.get("mma_models"):
        md += ["", "| model (mma on / off) | tensor_core | ours us | kernels alone us | JAX us | JAX reference us | "
               "x reference | rel err vs JAX |", "|---|---|---|---|---|---|---|---|"]
        for r in res["mma_models"]:
            if "error" in r:
                md.append(f"| {r['model']} | {r['tensor_core']} | error | {r['error'][:80]} | | | | |")
                continue
            xr = (r["jax_ref_s"] / r["ours_s"]) if r.get("jax_ref_s") else 0
            md.append(f"| {r['model']} | {r['tensor_core']} | {r['ours_s'] * 1e6:.1f} | "
                      f"{r.get('ours_device_s', 0) * 1e6:.1f} | {r.get('jax_s', 0) * 1e6:.1f} | "
                      f"{(r.get('jax_ref_s') or 0) * 1e6:.1f} | {xr:.2f} | {r.get('rel_err_vs_jax', -1):.1e} |")
    if res.get("elementwise_variants"):
        md += ["", "| elementwise variant | us | GB/s | % copy | agrees | regs |", "|---|---|---|---|---|---|"]
        for r in res["elementwise_variants"]:
            if "error" not in r:
                md.append(f"| {r['model']} {r['variant']} | {r['us']:.1f} | {r['gbs']:.0f} | "
                          f"{100 * r['of_copy']:.0f} | {r.get('agrees')} | {r['resources'][0]['regs']} |")
    if res.get("row_variants"):
        md += ["", "| row-fused variant | us | GB/s | % copy | agrees | regs | block |",
               "|---|---|---|---|---|---|---|"]
        for r in res["row_variants"]:
            if "error" in r:
                md.append(f"| {r['model']} {r['variant']} | error | | | {r['error'][:80]} | | |")
            else:
                md.append(f"| {r['model']} {r['variant']} | {r['us']:.1f} | {r['gbs']:.0f} | "
                          f"{100 * r['of_copy']:.0f} | {r['agrees']} | {r['resources'][0]['regs']} | "
                          f"{r['resources'][0]['grid']} x {r['launch']} |")
    if res.get("row_interleaved"):
        md += ["", f"| row kernel, interleaved ({ROW_INTERLEAVED_ROUNDS} rounds) | median us | min us | x default | "
                   "% copy | agrees | regs | block |", "|---|---|---|---|---|---|---|---|"]
        for r in res["row_interleaved"]:
            md.append(f"| {r['model']} {r['variant']} | {r['us']:.2f} | {r['min_us']:.2f} | "
                      f"{r['ratio_to_default']:.3f} | {100 * r['of_copy']:.0f} | {r['agrees']} | "
                      f"{r['resources'][0]['regs']} | {r['resources'][0]['grid']} x {r['launch']} |")
    if "tests" in res:
        md += ["", f"GPU tests: {res['tests']['summary']}"]
    (out / "gpu_session.md").write_text("\n".join(md) + "\n")
    (out / "gpu_session.log").write_text("\n".join(lines) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
