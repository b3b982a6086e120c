"""GPU tier: every fixture subgraph compiled for CUDA (default schedule, and random legal GPU schedules)
computes what `evaluate_compute` says, on fresh random inputs, with outputs poisoned before each run."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from tests.conftest import MODEL_NAMES, distinct_subgraphs


def _subgraphs():
    return distinct_subgraphs()


def _run_and_check(sg, steps, label, seed):
    from hlotune.codegen.cuda_runtime import build_cuda

    cd = sg.workload.compute
    kern = build_cuda(lower(cd, steps, name=sg.name), context=label)
    rng = np.random.default_rng(seed)
    n = len(sg.computation.parameters)
    args = [(rng.standard_normal(b.shape) * 0.5 + 1.0).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    want = evaluate_compute(cd, args)
    outs = [np.full(w.shape, np.nan, w.dtype) for w in want]
    kern(*args, *[consts[b.name] for b in cd.inputs[n:]], *outs)
    for w, g in zip(want, outs):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=label)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_default_gpu_schedules_agree_with_algorithm(name):
    for model, sg in _subgraphs():
        if model == name:
            _run_and_check(sg, default_gpu_schedule(sg.workload.compute), f"{model}/{sg.name}", 0)


def test_random_gpu_schedules_agree_with_algorithm():
    rng = np.random.default_rng(11)
    for model, sg in _subgraphs():
        for k in range(2):
            steps = default_gpu_schedule(sg.workload.compute, rng=rng)
            _run_and_check(sg, steps, f"{model}/{sg.name} random {k}", k + 1)


def test_device_arrays_and_timing():
    torch = pytest.importorskip("torch")
    from hlotune.codegen.cuda_runtime import build_cuda

    (model, sg), = [(m, s) for m, s in _subgraphs() if m == "matmul"]
    cd = sg.workload.compute
    kern = build_cuda(lower(cd, default_gpu_schedule(cd)))
    a = torch.randn(*cd.inputs[0].shape, device="cuda")
    b = torch.randn(*cd.inputs[1].shape, device="cuda")
    c = torch.full((cd.inputs[0].shape[0], cd.inputs[1].shape[1]), float("nan"), device="cuda")
    kern(a, b, c)
    torch.cuda.synchronize()
    ref = (a.double() @ b.double()).float()
    assert torch.allclose(c, ref, rtol=1e-4, atol=1e-4)
    ts = kern.time(a, b, c, min_time=0.01, repeat=3)
    assert len(ts) == 3 and all(0 < t < 0.01 for t in ts)


_DOTS = {"mm": "f32[96,80] parameter(0)", "bmm": "f32[3,64,48] parameter(0)"}


@pytest.mark.parametrize("tiles", [(8, 4, 8, 32, 16), (8, 4, 8, 32, 8), (8, 8, 8, 16, 8), (4, 4, 16, 16, 16),
                                   (4, 4, 4, 8, 4)])
def test_gemm_template_agrees_with_numpy(tiles):
    """The GEMM template (where the tiles fit it) and the generic code on dots whose tile loads are fewer than
    the threads, batched dots, and a B without batch dimensions."""
    import hlotune
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.codegen.cuda_runtime import build_cuda

    cases = [("HloModule a\nENTRY m {\n  a = f32[128,64] parameter(0)\n  b = f32[64,256] parameter(1)\n"
              "  ROOT d = f32[128,256] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n"),
             ("HloModule b\nENTRY m {\n  a = f32[4,64,32] parameter(0)\n  b = f32[4,32,128] parameter(1)\n"
              "  ROOT d = f32[4,64,128] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, "
              "lhs_contracting_dims={2}, rhs_contracting_dims={1}\n}\n"),
             ("HloModule c\nENTRY m {\n  a = f32[2,64,32] parameter(0)\n  b = f32[32,128] parameter(1)\n"
              "  ROOT d = f32[2,64,128] dot(a, b), lhs_contracting_dims={2}, rhs_contracting_dims={0}\n}\n")]
    rng = np.random.default_rng(5)
    used = 0
    for hlo in cases:
        (sg,) = hlotune.load_model(hlo).frontend.subgraphs
        cd = sg.workload.compute
        args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
        want = evaluate_compute(cd, args)[0]
        for gemm in (True, False):
            cuda_gen.GEMM_TEMPLATE = gemm
            rt._KCACHE.clear()
            try:
                kern = build_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles}), name=f"t{gemm:d}"))
            finally:
                cuda_gen.GEMM_TEMPLATE = True
            used += gemm and "GEMM template" in kern.text
            out = np.full(want.shape, np.nan, np.float32)
            kern(*args, out)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"{tiles} gemm={gemm}\n{hlo}")
    assert used >= 1, tiles


#: the GEMM template's cp.async ring (codegen.cuda.GEMM_STAGES, GEMM_A_ROW): (tiles, flags, dots of
#: `gemm_async_cases` by letter); 4 stages are cut to the K tiles + 1 where K is short (dot e: 2 K tiles of 8), 8x8
#: per thread splits B's rows
_ASYNC = [((8, 4, 8, 32, 16), {"GEMM_STAGES": 2}, "abc"),
          ((8, 4, 8, 32, 8), {"GEMM_STAGES": 3, "GEMM_A_ROW": True}, "abce"),
          ((8, 8, 8, 16, 8), {"GEMM_STAGES": 4}, "abce"),
          ((8, 8, 8, 16, 8), {"GEMM_STAGES": 3, "GEMM_A_ROW": True}, "abce"),
          ((4, 4, 4, 8, 4), {"GEMM_STAGES": 3, "GEMM_A_ROW": True}, "abce"),
          ((16, 4, 8, 32, 8), {"GEMM_STAGES": 3}, "ae")]


def gemm_async_cases() -> list:
    """(label, HLO text, tiles, codegen flags) of the cp.async GEMM template checks (also compiled ahead by
    gpu_session --precompile): a plain dot (a), a batched dot (b), a batched A against an unbatched B (c), a dot
    of K = 16 (e)."""
    hlos = {"a": ("HloModule a\nENTRY m {\n  a = f32[128,64] parameter(0)\n  b = f32[64,256] parameter(1)\n"
                  "  ROOT d = f32[128,256] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n"),
            "b": ("HloModule b\nENTRY m {\n  a = f32[4,64,32] parameter(0)\n  b = f32[4,32,128] parameter(1)\n"
                  "  ROOT d = f32[4,64,128] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, "
                  "lhs_contracting_dims={2}, rhs_contracting_dims={1}\n}\n"),
            "c": ("HloModule c\nENTRY m {\n  a = f32[2,64,32] parameter(0)\n  b = f32[32,128] parameter(1)\n"
                  "  ROOT d = f32[2,64,128] dot(a, b), lhs_contracting_dims={2}, rhs_contracting_dims={0}\n}\n"),
            "e": ("HloModule e\nENTRY m {\n  a = f32[128,16] parameter(0)\n  b = f32[16,128] parameter(1)\n"
                  "  ROOT d = f32[128,128] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")}
    force = {"GEMM_ASYNC_MAX_MR": 1 << 30, "GEMM_ASYNC_MR8_BLOCKS": 0, "GEMM_A_ROW": False}   # whatever the tile
    return [(f"{tiles} {flags} {x}", hlos[x], tiles, {**force, **flags}) for tiles, flags, which in _ASYNC
            for x in which]


def test_gemm_async_template_agrees_with_numpy():
    """The GEMM template with its global -> shared copy by cp.async (2-4 stages, A transposed or row-major in
    shared memory) against `evaluate_compute`, outputs poisoned; every case must take the cp.async template."""
    import hlotune
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.codegen.cuda_runtime import build_cuda

    rng = np.random.default_rng(6)
    for label, hlo, tiles, flags in gemm_async_cases():
        (sg,) = hlotune.load_model(hlo).frontend.subgraphs
        cd = sg.workload.compute
        args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
        want = evaluate_compute(cd, args)[0]
        old = {k: getattr(cuda_gen, k) for k in flags}
        rt._KCACHE.clear()
        try:
            for k, v in flags.items():
                setattr(cuda_gen, k, v)
            kern = build_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles}), name=sg.name))
        finally:
            for k, v in old.items():
                setattr(cuda_gen, k, v)
            rt._KCACHE.clear()
        assert "cp.async ring" in kern.text, label
        out = np.full(want.shape, np.nan, np.float32)
        kern(*args, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=label)


def _unary(op: str, n: int) -> str:
    return f"HloModule u\nENTRY m {{\n  x = f32[{n}] parameter(0)\n  ROOT y = f32[{n}] {op}(x)\n}}\n"


@pytest.mark.parametrize("op,float_reduction", [("exponential", False), ("sine", False), ("cosine", False),
                                                ("sine", True), ("cosine", True)])
def test_float_math_within_documented_ulp(op, float_reduction, monkeypatch):
    """float32 exp / sin / cos on the device against numpy float64 (rounded values' ulp), over a wide range of
    magnitudes, the float32 neighbours of multiples of pi/2, and the special values (sin / cos also with the
    float reduction and the out-of-line library call)."""
    import hlotune
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.codegen.cuda import FLOAT_MATH_ULP
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.ir.hlo import Op

    monkeypatch.setattr(cuda_gen, "SIN_FLOAT_REDUCTION", float_reduction)
    monkeypatch.setattr(cuda_gen, "SIN_HUGE_CALL", float_reduction)
    rt._KCACHE.clear()

    rng = np.random.default_rng(7)
    if op == "exponential":
        xs = np.concatenate([rng.uniform(-103.9, 88.7, 1 << 20), rng.uniform(-1, 1, 1 << 16),
                             -(10.0 ** rng.uniform(-30, 0, 4096))])
        bound, fn = FLOAT_MATH_ULP[Op.EXP], np.exp
    else:
        mags = 10.0 ** rng.uniform(-30, 38, 1 << 19) * rng.choice([-1, 1], 1 << 19)
        xs = np.concatenate([mags, rng.uniform(-20, 20, 1 << 19), np.arange(1, 1 << 16) * (np.pi / 2),
                             np.float32(2.0 ** 30) * np.arange(1, 64)])
        bound, fn = (FLOAT_MATH_ULP[Op.SINE], np.sin) if op == "sine" else (FLOAT_MATH_ULP[Op.COSINE], np.cos)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38], np.float32)
    x = np.concatenate([xs.astype(np.float32), specials])
    x = np.concatenate([x, np.zeros((-len(x)) % 1024, np.float32)])
    (sg,) = hlotune.load_model(_unary(op, len(x))).frontend.subgraphs
    cd = sg.workload.compute
    kern = build_cuda(lower(cd, default_gpu_schedule(cd), name=f"math_{op}"))
    rt._KCACHE.clear()
    out = np.full_like(x, np.nan)
    kern(x, out)
    with np.errstate(all="ignore"):
        ref = fn(x.astype(np.float64))
        ref32 = ref.astype(np.float32)
    fin = np.isfinite(ref32) & np.isfinite(x)
    ulp = np.abs(out[fin].astype(np.float64) - ref[fin]) / np.spacing(np.abs(ref32[fin])).astype(np.float64)
    assert ulp.max() <= bound, (op, float(ulp.max()), float(x[fin][np.argmax(ulp)]))
    np.testing.assert_array_equal(out[~fin], ref32[~fin])            # inf / NaN cases exactly as float64's
    assert np.signbit(out[len(xs) + 1]) == (op == "sine")            # sin(-0) = -0


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_row_fused_bench_subgraph_one_kernel(name):
    """XLA's GPU fusion of softmax / layernorm at bench size: one kernel, the algorithm's values."""
    import hlotune
    from hlotune.codegen.cuda_runtime import build_cuda
    from tests.conftest import model_path

    (sg,) = hlotune.load_model(str(model_path(name, "bench.gpu.opt.hlo"))).frontend.subgraphs
    cd = sg.workload.compute
    kern = build_cuda(lower(cd, default_gpu_schedule(cd), name=f"row_{name}"))
    assert len(kern.source.launches) == 1
    rng = np.random.default_rng(2)
    args = [(rng.standard_normal(b.shape) * 2).astype(np.float32) for b in cd.inputs]
    want = evaluate_compute(cd, args)
    out = np.full(want[0].shape, np.nan, np.float32)
    kern(*args, out)
    np.testing.assert_allclose(out, want[0], rtol=2e-5, atol=2e-6)


def test_grid_stride_elementwise_kernels():
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt

    for model, sg in _subgraphs():
        if model in ("relu_chain", "gelu_tanh", "sin_mul_add"):
            cuda_gen.GRID_STRIDE_BLOCKS = 5
            rt._KCACHE.clear()
            try:
                _run_and_check(sg, default_gpu_schedule(sg.workload.compute, options={"threads": 32, "per": 1}),
                               f"{model}/{sg.name} grid-stride", 3)
            finally:
                cuda_gen.GRID_STRIDE_BLOCKS = 0
                rt._KCACHE.clear()


_MID_CONV = """HloModule mid
ENTRY main {
  x = f32[2,28,28,32] parameter(0)
  w = f32[3,3,32,64] parameter(1)
  b = f32[64] parameter(2)
  c = f32[2,28,28,64] convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  bb = f32[2,28,28,64] broadcast(b), dimensions={3}
  s = f32[2,28,28,64] add(c, bb)
  z = f32[] constant(0)
  zb = f32[2,28,28,64] broadcast(z), dimensions={}
  ROOT r = f32[2,28,28,64] maximum(s, zb)
}
"""
#: (label, HLO text or path, schedule options): the implicit-GEMM template's cases (tests/null/test_cuda_conv.py)
#: with a mid-size conv under several conv tiles (MH, MW, TH, TW, NR, TJ, BK): tile loads fewer than the threads,
#: two output rows per thread, 8 channels per thread, BK 16
_MID_TILES = [(1, 8, 2, 7, 4, 16, 8), (1, 4, 1, 14, 4, 16, 8), (2, 4, 1, 7, 4, 16, 16), (1, 8, 2, 7, 8, 8, 8),
              (1, 4, 4, 7, 4, 8, 4)]


def implicit_gemm_cases() -> list:
    """(label, fused subgraph, steps) of every implicit-GEMM case (also compiled ahead by gpu_session --precompile)."""
    import hlotune
    from tests.null.test_cuda_conv import CASES

    out = []
    for label, src in sorted(CASES.items()):
        for sg in hlotune.load_model(str(src)).frontend.subgraphs:
            out.append((label, sg, default_gpu_schedule(sg.workload.compute, options={"sms": 1})))
    (sg,) = hlotune.load_model(_MID_CONV).frontend.subgraphs
    out.append(("mid conv default", sg, default_gpu_schedule(sg.workload.compute)))
    for t in _MID_TILES:
        out.append((f"mid conv {t}", sg, default_gpu_schedule(sg.workload.compute, options={"conv_tiles": t})))
    return out


def test_implicit_gemm_template_agrees_with_algorithm():
    """Convolutions through an inlined pad (same, strided, dilated, 3 channels: scalar fetches), the NT batched
    and TN dots, under several tiles: the implicit-GEMM template against `evaluate_compute`."""
    used = 0
    for k, (label, sg, steps) in enumerate(implicit_gemm_cases()):
        from hlotune.codegen.cuda_runtime import build_cuda
        kern = build_cuda(lower(sg.workload.compute, steps, name=sg.name), context=label)
        used += "implicit-GEMM template" in kern.text
        _run_and_check(sg, steps, f"implicit GEMM {label}", k)
    assert used >= 10, used
