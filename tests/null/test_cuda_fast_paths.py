"""CUDA fast paths without a GPU: the float32 exp / sin / cos of the prelude (their constants and algorithm,
emulated in numpy with exact double steps, against float64 within `FLOAT_MATH_ULP`), the one-kernel schedule of
row-fused subgraphs (XLA's GPU fusions of softmax / layernorm: the loop nest computes the algorithm, one launch,
nvcc compiles it without spills), and grid-stride elementwise kernels."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from fractions import Fraction

import numpy as np
import pytest

import hlotune
import hlotune.codegen.cuda as cuda_gen
from hlotune.codegen.cuda import FLOAT_MATH_ULP, PRELUDE, generate_cuda
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.ir.hlo import Op
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.lower import lower
from tests.conftest import model_path


@pytest.fixture(autouse=True)
def _plain_loads(monkeypatch):
    """These tests read the plain vector load / store forms; the streaming hints have their own test
    (test_cuda_codegen.test_stream_hints_only_on_inputs_read_once)."""
    monkeypatch.setattr(cuda_gen, "STREAM_HINTS", False)

NVCC = shutil.which("nvcc")
F = np.float32


def _consts(fn: str, text: str = PRELUDE) -> list[float]:
    body = text[text.index(f"HL_INL float {fn}(float x"):]
    body = body[:body.index("\n}\n")]
    return [float.fromhex(h.rstrip("f")) for h in re.findall(r"-?0x[0-9a-f.]+p[-+]?\d+f?", body)]


def _fmaf(a, b, c):
    return F(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))   # one rounding (exact sum first)


def _horner(cs, x):
    acc = F(cs[0])
    for c in cs[1:]:
        acc = _fmaf(acc, x, c)
    return acc


def _exp(x: F) -> F:
    log2e, lhi, llo, *poly = _consts("hl_exp")
    xc = F(min(max(x, F(-104)), F(89)))
    n = F(np.rint(F(xc * F(log2e))))
    r = _fmaf(-n, llo, _fmaf(-n, lhi, xc))
    p = _horner(poly, r)
    n1 = int(n) >> 1
    return F(F(p * F(2.0 ** n1)) * F(2.0 ** (int(n) - n1)))


def _float_reduce(x: F, k: F, p1, p2, p3) -> tuple[F, F]:
    """The float reduction's r + rl = x - k pi/2: exact first step, k p2 as a pair, TwoSum, k p3 into the tail."""
    r1 = _fmaf(-k, p1, x)
    th = F(k * F(p2))
    tl = _fmaf(k, p2, -th)
    s = F(r1 - th)
    bv = F(s - r1)
    e = F(F(r1 - F(s - bv)) - F(th + bv))
    lo = _fmaf(-k, p3, F(e - tl))
    r = F(s + lo)
    return r, F(lo - F(r - s))


def _sincos(x: F, cosine: int, float_reduction: bool = False) -> F:
    """The prelude's sin / cos (the default text, or with the float reduction for |x| < 2^17)."""
    two_pi_f, p1, p2, _, p3, two_pi, p_hi, p_lo, *cs = _consts("hl_sincosf", cuda_gen._float_math(float_reduction))
    cos_c, sin_c = cs[:5], cs[5:]
    if float_reduction and abs(x) < 2.0 ** 17:   # float: exact first step, k p2 as a pair, TwoSum, k p3 into the tail
        k = F(np.rint(F(x * F(two_pi_f))))
        r, rl = _float_reduce(x, k, p1, p2, p3)
        q = (int(k) + cosine) & 3
    else:
        xd = Fraction(float(x))
        k = float(xd * Fraction(two_pi) + 6755399441055744) - 6755399441055744.0   # the shifter: nearest
        rd = float(float(-Fraction(k) * Fraction(p_hi) + xd) - Fraction(k) * Fraction(p_lo))
        r = F(rd)
        rl = F(rd - float(r))
        q = (int(k) + cosine) & 3
    z = F(r * r)
    if q & 1:
        v = F(F(1) + _fmaf(z, _horner(cos_c, z), F(-r * rl)))
    else:
        v = F(r + _fmaf(F(r * z), _horner(sin_c, z), rl))
    return -v if q & 2 else v


def _ulp(got, ref: float) -> float:
    return abs(float(got) - ref) / float(np.spacing(np.abs(F(ref))))


def test_float_math_emulated_within_bounds():
    """The prelude's float32 exp / sin / cos (constants parsed from the CUDA text, fma and the double steps
    emulated exactly) against float64 over a wide range of arguments."""
    rng = np.random.default_rng(3)
    xs = np.concatenate([rng.uniform(-103, 88.5, 1500), rng.uniform(-1, 1, 300)]).astype(F)
    assert max(_ulp(_exp(x), math.exp(float(x))) for x in xs) <= FLOAT_MATH_ULP[Op.EXP]
    mags = 10.0 ** rng.uniform(-12, 9.2, 1200) * rng.choice([-1, 1], 1200)
    near = F(np.arange(1, 400) * (np.pi / 2))                       # float32 neighbours of multiples of pi/2
    xs = np.concatenate([mags, rng.uniform(-7, 7, 600), near]).astype(F)
    for fr in (False, True):
        assert max(_ulp(_sincos(x, 0, fr), math.sin(float(x))) for x in xs) <= FLOAT_MATH_ULP[Op.SINE]
        assert max(_ulp(_sincos(x, 1, fr), math.cos(float(x))) for x in xs) <= FLOAT_MATH_ULP[Op.COSINE]
    assert cuda_gen._float_math() in PRELUDE and "hl_sincos_huge" not in PRELUDE


def _small(name: str, rows: int) -> str:
    """The bench-size XLA GPU fusion of `name` with fewer rows (so the loop-IR interpreter stays fast)."""
    text = model_path(name, "bench.gpu.opt.hlo").read_text()
    big = {"softmax": "4096", "layernorm": "8192"}[name]
    return text.replace(f"[{big},", f"[{rows},").replace(f"[{big}]", f"[{rows}]")


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_row_fused_subgraph_is_one_kernel(name):
    (sg,) = hlotune.load_model(_small(name, 48)).frontend.subgraphs
    cd = sg.workload.compute
    assert sum(s.is_reduction for s in cd.stages) == 2
    f = lower(cd, default_gpu_schedule(cd), name="row")
    rng = np.random.default_rng(0)
    n = len(sg.computation.parameters)
    args = [rng.standard_normal(b.shape).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    want = evaluate_compute(cd, args)
    got = evaluate_loop_func(f, args + [consts[b.name] for b in cd.inputs[n:]])
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)
    src = generate_cuda(f)
    (ln,) = src.launches
    assert ln.block == (32, 8, 1) and ln.grid == (6, 1, 1)
    t = src.text[src.text.index("__global__"):]
    # float4 stores; warp-private barriers; butterfly all-reduces; softmax's exp computed once per element into the
    # warp's shared copy of the row (four calls: one float4 group), read by the sum and the output
    assert "*(float4*)&" in t and "__syncthreads" not in t and t.count("__syncwarp") >= 2
    assert t.count("warp all-reduce") == 2
    if name == "softmax":
        assert "exp_1_1[(hl_idx)threadIdx.y * 1024 +" in t and t.count("hl_exp(") == 4
    if NVCC:
        from hlotune.codegen.cuda_runtime import compile_cubin
        assert compile_cubin(src.text, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_row_fused_kernel_keeps_registers(tmp_path):
    (sg,) = hlotune.load_model(str(model_path("softmax", "bench.gpu.opt.hlo"))).frontend.subgraphs
    cd = sg.workload.compute
    (tmp_path / "k.cu").write_text(generate_cuda(lower(cd, default_gpu_schedule(cd), name="row")).text)
    r = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"),
                        str(tmp_path / "k.cu")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "0 bytes spill stores" in r.stderr and "0 bytes stack frame" in r.stderr


def test_row_fusion_needs_row_reductions_only():
    """Subgraphs that are not one output over row reductions keep their kernels (the CPU-shaped softmax)."""
    for sg in hlotune.load_model(str(model_path("softmax", "opt.hlo"))).frontend.subgraphs:
        cd = sg.workload.compute
        n = len(generate_cuda(lower(cd, default_gpu_schedule(cd), name="k")).launches)
        assert n == len(generate_cuda(lower(cd, default_gpu_schedule(cd, options={"row_fused": False}),
                                            name="k")).launches)


def test_row_fused_variants_agree(monkeypatch):
    """With the row cache, the exp inlined, other rows per block, and block-wide barriers and shared combines:
    the same values (the loop nests are the same algorithm) and the expected kernel structure."""
    (sg,) = hlotune.load_model(_small("softmax", 16)).frontend.subgraphs
    cd = sg.workload.compute
    x = np.random.default_rng(1).standard_normal(cd.inputs[0].shape).astype(np.float32)
    want = evaluate_compute(cd, [x])[0]
    for opts in ({"row_cache": True}, {"row_keep": False}, {"rows": 2}, {"rows": 1}):
        f = lower(cd, default_gpu_schedule(cd, options=opts), name="row")
        np.testing.assert_allclose(evaluate_loop_func(f, [x])[0], want, rtol=2e-5, atol=1e-6)
        (ln,) = generate_cuda(f).launches
        assert ln.block == (32, opts.get("rows", 4 if "row_cache" in opts else 8), 1)   # 48 KB of rows
    monkeypatch.setattr(cuda_gen, "WARP_BARRIERS", False)
    monkeypatch.setattr(cuda_gen, "WARP_ALLREDUCE", False)
    t = generate_cuda(lower(cd, default_gpu_schedule(cd), name="row")).text
    assert "__syncwarp" not in t and "__syncthreads" in t and "warp all-reduce" not in t


def test_grid_stride_elementwise(monkeypatch):
    (sg,) = hlotune.load_model(str(model_path("relu_chain", "hlo"))).frontend.subgraphs
    cd = sg.workload.compute
    f = lower(cd, default_gpu_schedule(cd, options={"threads": 32, "per": 1}), name="k")
    plain = generate_cuda(f)
    monkeypatch.setattr(cuda_gen, "GRID_STRIDE_BLOCKS", 3)
    strided = generate_cuda(f)
    assert plain.launches[0].grid[0] > 3 and strided.launches[0].grid == (3, 1, 1)
    assert "gridDim.x" in strided.text and "gridDim.x" not in plain.text
    (mm,) = hlotune.load_model(str(model_path("matmul", "hlo"))).frontend.subgraphs   # shared memory: no
    assert "gridDim.x" not in generate_cuda(lower(mm.workload.compute,
                                                  default_gpu_schedule(mm.workload.compute), name="m")).text
