"""Split-K dots and the small-model kernels on the GPU, in one call: each kernel of a model timed alone (replayed in a
CUDA graph), the models built with and without split K (`default_gpu.SPLIT_K`) timed interleaved beside JAX in
processes of its own, and schedule variants of their GEMM-bound subgraphs (each checked against the algorithm).

    HLOTUNE_CACHE_DIR=$PWD/.gpu-cache .venv/bin/python benchmarks/gpu_split_k.py --precompile   # here (nvcc, no GPU)
    # GPU machine (carry .gpu-wheels and .gpu-cache; the install lines of docs/gpu.md first):
    python3 benchmarks/gpu_split_k.py --out $OUT

Writes split_k.json and prints one line per measurement."""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_session import (  # noqa: E402
    GRAPH_REPEATS,
    SMS,
    _events_round_time,
    _events_time,
    _variant_kernel,
    graph_time,
    jax_clean_times,
)

MODELS = ("mlp_train_step", "mlp2")
ASYNC3 = {"GEMM_STAGES": 3, "GEMM_A_ROW": True, "GEMM_ASYNC_MAX_MR": 1 << 30, "GEMM_ASYNC_MR8_BLOCKS": 0}
#: (model, subgraph, label, schedule options, codegen flags); model "mm256": a 256^3 matmul
VARIANTS = [
    *[(m, s, label, opts, flags) for m, s in (("mlp_train_step", "output_fusion"), ("mlp2", "max.3"),
                                              ("mm256", "d"))
      for label, opts, flags in (("no split (before)", {"split_k": 1}, {}), ("default", {}, {}),
                                 ("split 7, 3xTF32", {"split_k": 7, "tensor_core": 3}, {}))
      if m != "mm256" or "TF32" not in label],
    ("mm256", "d", "split 2", {"split_k": 2}, {}),
    *[("mlp_train_step", "sub.20", f"split {k}, tiles {t}", {**({"tiles": t} if t else {}),
                                                             **({"split_k": k} if k else {})}, {})
      for k, t in ((1, None), (None, None), (4, (4, 4, 4, 16, 16)), (2, (4, 4, 4, 16, 16)), (4, (8, 4, 2, 32, 16)))],
    ("mlp_train_step", "dot_general.7", "one warp per output (before)", {"column_dot": False}, {}),
    ("mlp_train_step", "dot_general.7", "columns, K over threadIdx.y (default)", {}, {}),
]


def _subgraph(model: str, name: str):
    import hlotune
    from benchmarks.gpu_session import _mm_hlo
    from tests.conftest import model_path

    if model.startswith("mm"):
        return hlotune.load_model(_mm_hlo(int(model[2:]))).frontend.subgraphs[0]

    return {s.name: s for s in hlotune.load_model(str(model_path(model, "bench.hlo"))).frontend.subgraphs}[name]


def _flag(value):
    """Session 11's default-schedule changes on (True) or off (False): split K, the column skinny dot, one block for
    small full reductions; returns the old settings (pass them back to restore)."""
    import hlotune.schedule_space.default_gpu as dg

    old = (dg.SPLIT_K, dg.COLUMN_DOT, dg.SMALL_REDUCTION_BLOCK)
    dg.SPLIT_K, dg.COLUMN_DOT, dg.SMALL_REDUCTION_BLOCK = value if isinstance(value, tuple) else (
        (True, True, 64) if value else (False, False, 0))
    return old


def kernel_profile(exe, d_args, torch) -> list[dict]:
    """Each kernel of the model's launch program alone: GRAPH_REPEATS launches of it in one CUDA graph (the
    pointers of one real call, so the data are the model's), microseconds per launch."""
    from hlotune.codegen.cuda_runtime import LaunchProgram

    keep = exe.call_device(*d_args)
    torch.cuda.synchronize()
    prog = exe._gpu.fast.prog
    rows = []
    for i, (st, call) in enumerate(zip(prog._steps, prog._calls)):
        if st[0] != "k":
            continue
        sub = LaunchProgram()
        sub.slots, sub._calls = prog.slots, [call] * GRAPH_REPEATS
        t = _events_time(lambda s=sub, i=i: s.run(("profile", i)), torch, reps=20) / GRAPH_REPEATS
        ln = st[2]
        rows.append({"kernel": ln.name, "grid": list(ln.grid), "block": list(ln.block), "us": t * 1e6})
    del keep
    return rows


def models(torch, log, rounds: int = 7) -> list[dict]:
    """Each model built with session 11's changes (`_flag`) on and off, timed interleaved (CUDA events,
    device-resident, the executable's CUDA graph), and each kernel alone; JAX in three processes of its own."""
    import hlotune
    import hlotune.codegen.cuda_runtime as rt
    from tests.conftest import model_path

    jax = jax_clean_times(list(MODELS), log)
    out = []
    for name in MODELS:
        m = hlotune.load_model(str(model_path(name, "bench.hlo")))
        rng = np.random.default_rng(0)
        args = [(rng.standard_normal(p.array_shape.dims) * 0.5).astype(p.array_shape.dtype.np)
                for p in m.module.entry_computation.parameters]
        d_args = [torch.from_numpy(a).cuda() for a in args]
        exes, got = {}, {}
        for on in (True, False):
            old = _flag(on)
            rt._KCACHE.clear()
            try:
                exes[on] = hlotune.compile(m, target="cuda")
            finally:
                _flag(old)
            got[on] = [torch.as_tensor(g, device="cuda").double().cpu().numpy() for g in exes[on].call_device(*d_args)]
        want = [np.asarray(x, np.float64) for x in hlotune.compile(m, target="cpu")(*args)]
        r: dict = {"model": name, "jax_us": jax.get(name, 0) * 1e6}
        for on in (True, False):
            r[f"err_{on}"] = max(float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
                                 for g, w in zip(got[on], want))
            r[f"kernels_{on}"] = exes[on]._gpu.fast.prog.n_kernels
        ts: dict = {True: [], False: []}
        for _ in range(rounds):
            for on in (True, False):
                ts[on].append(_events_round_time(lambda e=exes[on], a=d_args: e.call_device(*a), torch, rounds=3))
        for on in (True, False):
            r[f"us_{on}"] = float(np.median(ts[on])) * 1e6
            r[f"profile_{on}"] = kernel_profile(exes[on], d_args, torch)
        log(f"model {name}: new {r['us_True']:.1f} us ({r['kernels_True']} kernels, err {r['err_True']:.1e}), "
            f"without {r['us_False']:.1f} us ({r['kernels_False']} kernels, err {r['err_False']:.1e}), JAX "
            f"{r['jax_us']:.1f} us: x{r['jax_us'] / r['us_True']:.2f} / x{r['jax_us'] / r['us_False']:.2f}")
        for on in (True, False):
            log(f"  kernels alone (new {on}): " + ", ".join(
                f"{k['kernel']} {k['grid'][0]}x{k['block'][0]} {k['us']:.1f}" for k in r[f"profile_{on}"])
                + f"; sum {sum(k['us'] for k in r[f'profile_{on}']):.1f} us")
        out.append(r)
    return out


def variants(torch, log) -> list[dict]:
    """VARIANTS built, checked against `evaluate_compute` and timed in CUDA graphs (graph_time)."""
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.ir.compute_eval import evaluate_compute
    from tests.null.test_cuda_rows6 import _args

    out, cache = [], {}
    for model, name, label, opts, flags in VARIANTS:
        r: dict = {"model": model, "subgraph": name, "variant": label, "opts": str(opts)}
        try:
            if (model, name) not in cache:
                sg = _subgraph(model, name)
                args, full = _args(sg, seed=1)
                want = evaluate_compute(sg.workload.compute, args)
                d_in = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in full]
                cache[(model, name)] = (sg, want, d_in)
            sg, want, d_in = cache[(model, name)]
            kern = _variant_kernel(sg.workload.compute, sg.name, opts, flags, build_cuda)
            d_out = [torch.full(w.shape, float("nan"), device="cuda") for w in want]
            kern(*d_in, *d_out)
            torch.cuda.synchronize()
            err = max(float(np.linalg.norm(o.cpu().numpy().astype(np.float64) - w)
                            / max(np.linalg.norm(w.astype(np.float64)), 1e-30)) for o, w in zip(d_out, want))
            t = graph_time(kern, [x.data_ptr() for x in d_in + d_out], torch)
            text = kern.text
            r.update({"us": t * 1e6, "rel_err": err, "launches": [[ln.grid[0], ln.block[0]]
                                                                  for ln in kern.source.launches],
                      "template": ("mma" if "tensor cores" in text else "implicit" if "implicit-GEMM" in text
                                   else "gemm" if "GEMM template" in text else "generic")})
            log(f"  {model}/{name} {label}: {t * 1e6:.2f} us, err {err:.1e}, {r['template']}, {r['launches']}")
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"[:400]
            log(f"  {model}/{name} {label}: ERROR {r['error'][:300]}")
            traceback.print_exc()
        out.append(r)
    return out


def precompile(log) -> int:
    """Every kernel this script builds (the models with session 11's changes on and off, VARIANTS,
    tests/gpu/test_split_k.py's) compiled with the local nvcc into the cubin cache."""
    import hlotune
    from hlotune.codegen.cuda import generate_cuda
    from hlotune.codegen.cuda_runtime import compile_cubin
    from hlotune.executable import _kernel_name, choose_schedule
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower
    from hlotune.target import Target
    from tests.conftest import model_path
    from tests.null.test_split_k import SPLIT_CASES

    tgt = Target(kind="cuda", name="NVIDIA H200", cores=SMS, arch="sm_90", max_threads_per_block=1024)
    texts: dict[str, str] = {}

    def add(func):
        texts[generate_cuda(func).text] = func.name

    for name in MODELS:
        m = hlotune.load_model(str(model_path(name, "bench.hlo")))
        for on in (True, False):
            old = _flag(on)
            try:
                for sg in m.frontend.subgraphs:
                    add(lower(sg.workload.compute, choose_schedule(sg.workload, None, tgt).steps,
                              name=_kernel_name(sg.name)))
            finally:
                _flag(old)
    for model, name, _, opts, flags in VARIANTS:
        sg = _subgraph(model, name)
        _variant_kernel(sg.workload.compute, sg.name, opts, flags, add)
    for model, name in (("mlp_train_step", "output_fusion"), ("mlp2", "max.3"), ("mlp_train_step", "sub.20"),
                        ("mlp_train_step", "dot_general.7"), ("mlp_train_step", "neg.3")):
        cd = _subgraph(model, name).workload.compute
        add(lower(cd, default_gpu_schedule(cd), name=f"splitk_{model}_{name}"))
    cd = _subgraph("mlp_train_step", "output_fusion").workload.compute
    for opts in SPLIT_CASES:
        add(lower(cd, default_gpu_schedule(cd, options=dict(opts)), name="splitk_variant"))
    errors = []
    for text, name in texts.items():
        try:
            compile_cubin(text, "sm_90", context=name)
        except Exception as e:
            errors.append(f"{name}: {e}"[:300])
    log(f"precompile: {len(texts)} kernels, {len(errors)} errors")
    for e in errors:
        log(e)
    return 1 if errors else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--parts", default="models,variants")
    a = ap.parse_args()

    def log(msg: str) -> None:
        print(msg, flush=True)

    if a.precompile:
        return precompile(log)
    import torch

    res: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = set(a.parts.split(","))
    if "models" in parts:
        res["models"] = models(torch, log)
        (out / "split_k.json").write_text(json.dumps(res, indent=1))
    if "variants" in parts:
        res["variants"] = variants(torch, log)
    (out / "split_k.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
