"""One call on the GPU machine: run the GPU tests, then time default-schedule CUDA kernels against cuBLAS
(torch.matmul, TF32 off) and the device-to-device copy bandwidth; write gpu_session.json / .md to --out.

    python3 benchmarks/gpu_session.py --out $OUT [--skip-tests]

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
                "rmsnorm_swiglu"]


def run_tests(out: Path) -> dict:
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu",
                        "tests/null/test_cuda_codegen.py"], cwd=ROOT, capture_output=True, text=True)
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
           "launches": [(ln.grid, ln.block, ln.shared_bytes) for ln in kern.source.launches]}
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
    for sg in hlotune.load_model(model_path(name, "bench.hlo")).frontend.subgraphs:
        cd = sg.workload.compute
        label = f"{name}/{sg.name}"
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
            t = float(np.median(kern.time(*d_in, *d_out, min_time=0.05, repeat=5)))
            nbytes = sum(x.nbytes for x in ins) + sum(w.nbytes for w in want)
            gbs = nbytes / t / 1e9
            r = {"subgraph": label, "us": t * 1e6, "bytes": nbytes, "gbs": gbs, "of_copy": gbs / copy_gbs,
                 "correct": ok, "max_abs_err": maxerr,
                 "launches": [(ln.grid, ln.block, ln.shared_bytes) for ln in kern.source.launches]}
            log(f"{label}: {t * 1e6:.1f} us, {gbs:.0f} GB/s ({100 * gbs / copy_gbs:.0f}% of copy), correct {ok}")
        except Exception as e:  # keep going: one failure must not lose the session
            r = {"subgraph": label, "error": f"{type(e).__name__}: {e}"[:800]}
            log(f"{label}: ERROR {r['error'][:300]}")
        out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--sizes", default="1024,4096")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

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
    for name in MEMORY_BOUND:
        res["memory_bound"] += memory_bound(name, torch, res["copy_gbs"], log)
    if not args.skip_tests:
        res["tests"] = run_tests(out)
        log(f"GPU tests: rc {res['tests']['returncode']}, {res['tests']['summary']} ({res['tests']['seconds']} s)")
    (out / "gpu_session.json").write_text(json.dumps(res, indent=1, default=str))
    md = ["# GPU session", "", f"target `{tgt.fingerprint}`, copy {res['copy_gbs']:.0f} GB/s", "",
          "| matmul | ours GFLOP/s | cuBLAS GFLOP/s | % | rel err |", "|---|---|---|---|---|"]
    md += [f"| {m['n']}^3 | {m['ours_gflops']:.0f} | {m['cublas_gflops']:.0f} | {100 * m['ratio']:.1f} | "
           f"{m['rel_err']:.1e} |" for m in res["matmul"]]
    md += ["", "| subgraph (bench size) | us | GB/s | % of copy | correct |", "|---|---|---|---|---|"]
    for r in res["memory_bound"]:
        if "error" in r:
            md.append(f"| {r['subgraph']} | error | | | {r['error'][:80]} |")
        else:
            md.append(f"| {r['subgraph']} | {r['us']:.1f} | {r['gbs']:.0f} | {100 * r['of_copy']:.0f} | "
                      f"{r['correct']} |")
    if "tests" in res:
        md += ["", f"GPU tests: {res['tests']['summary']}"]
    (out / "gpu_session.md").write_text("\n".join(md) + "\n")
    (out / "gpu_session.log").write_text("\n".join(lines) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
