"""Session 7b (layernorm's row kernel), no GPU: the division by an expression of the row's scalars (layernorm's
sqrt(var / n + eps)) through one reciprocal per row and Markstein's correction (`codegen.cuda.ROW_DIV_EXPR`,
`hl_fdiv_row`).

Exactness: the prelude is compiled for the CPU (g++, the shim of tests/null/test_cuda_rows7.py) and compared bit for
bit with the IEEE division for every dividend significand against layernorm's own divisors (float32 sqrt(v / 1024 +
eps) over the whole range of v, rounded as the kernel rounds them) and for quotients of layernorm rows (x - mean over
rows scaled 1e-30 .. 1e30, constant rows, zeros); the kernel text takes the helper only for the row-invariant
divisor; with nvcc the square root and the reciprocal are computed once per row and nothing spills."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

import hlotune.codegen.cuda as cuda_gen
from hlotune.codegen.cuda import generate_cuda
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from tests.null.test_cuda_rows6 import _subgraph
from tests.null.test_cuda_rows7 import _SHIM, _same, gxx_division_lib

GXX = shutil.which("g++")
NVCC = shutil.which("nvcc")
F = np.float32
EPS = F(float.fromhex("0x1.4f8b58p-17"))    # layernorm's epsilon in the fixture (1e-5 as float32)
#: session 7's kernel: the IEEE division
OFF = {"ROW_DIV_RCP": False, "ROW_DIV_EXPR": False, "ROW_DIV_GROUPED": False}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return gxx_division_lib(tmp_path_factory, "rowdiv9", _SHIM)


def _divisor(v: np.ndarray) -> np.ndarray:
    """layernorm's divisor as the kernel computes it: RN32(sqrt(RN32(v * 2^-10 + eps))) (the product is exact)."""
    return np.sqrt((v.astype(F) * F(2.0 ** -10)).astype(F) + EPS).astype(F)


def _source(name: str, flags: dict, monkeypatch, rows: int = 8192, opts: dict | None = None) -> str:
    """The default kernel of `name` with `rows` rows, the 7b flags off except those of `flags`."""
    for k, v in {**OFF, **flags}.items():
        monkeypatch.setattr(cuda_gen, k, v)
    cd = _subgraph(name, rows).workload.compute
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options=opts), name="row")).text


def test_layernorm_divisors_every_dividend_significand(lib):
    """Every dividend significand (both signs) at three exponents (inside the guard, at its lower edge, |x - mean|
    of a row scaled by 2^40) against layernorm divisors over v = 0 (sqrt(eps): the smallest), v around 1024 (unit
    variance), large (one past the guard) and random variances: bitwise the division."""
    rng = np.random.default_rng(2)
    vs = np.concatenate([[0.0, 1.0, 1024.0, 1023.9, 2.0 ** 40, 3.0e30], rng.random(4) * 10.0 ** rng.integers(-3, 9, 4)])
    bs = _divisor(vs)
    assert bs.min() > 2.0 ** -24 and (bs > 2.0 ** 24).sum() == 1    # one outside the guard: the division
    for b in bs:
        for ea in (127, 127 - 54, 127 + 40):
            assert lib.exhaustive(float(b), ea) == 0, (float(b).hex(), ea)


def test_layernorm_row_quotients_are_the_division(lib):
    """(x - mean) / sqrt(var / n + eps) for 2000 rows of 1024 (scales 1e-30 .. 1e30, constant rows: zero dividends,
    rows of -0, rows with inf / NaN): the helper bitwise the division, element by element."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((2000, 1024)) * 10.0 ** rng.uniform(-30, 30, (2000, 1))).astype(F)
    x[0] = 3.0
    x[1] = -0.0
    x[2, 7] = np.inf
    x[3, 9] = np.nan
    x[4] = 2.0 ** -140
    with np.errstate(all="ignore"):
        mean = (x.sum(axis=1, dtype=F) * F(2.0 ** -10)).astype(F)
        a = (x - mean[:, None]).astype(F)
        b = np.broadcast_to(_divisor((a * a).sum(axis=1, dtype=F))[:, None], a.shape)
        a, b = np.ascontiguousarray(a).ravel(), np.ascontiguousarray(b).ravel()
        want = a / b
    out = np.empty_like(a)
    p = ctypes.POINTER(ctypes.c_float)
    lib.div_row(a.ctypes.data_as(p), b.ctypes.data_as(p), out.ctypes.data_as(p), len(a))
    assert _same(out, want).all()
    assert (a == 0).sum() >= 1024 and np.isnan(want).any()     # the guard's fallbacks are reached


def test_layernorm_kernel_divides_through_the_helper(monkeypatch):
    """With ROW_DIV_EXPR the default layernorm kernel (8192 rows: two warps per row) divides its float4 groups by
    hl_sqrt(...) through hl_fdiv_row (4 in the text: the unrolled loop of 4 float4s per lane), with
    ROW_DIV_GROUPED through hl_fdiv_fast under one hl_div_ok guard per float4; without the flag (and with ROW_DIV_RCP
    alone: its divisor is not a plain row scalar) the IEEE division; softmax does not take it without ROW_DIV_RCP."""
    off = _source("layernorm", {}, monkeypatch)
    assert "hl_fdiv_row(" not in off and off.count(") / hl_sqrt(") == 4
    assert "hl_fdiv_row(" not in _source("layernorm", {"ROW_DIV_RCP": True}, monkeypatch)
    monkeypatch.undo()
    on = _source("layernorm", {"ROW_DIV_EXPR": True}, monkeypatch)
    assert len(re.findall(r"hl_fdiv_row\(\(param_\w+_local\[[^;]*, hl_sqrt\(", on)) == 4
    assert ") / hl_sqrt(" not in on.replace(cuda_gen.ROW_DIV_PRELUDE, "")
    grouped = _source("layernorm", {"ROW_DIV_EXPR": True, "ROW_DIV_GROUPED": True}, monkeypatch)
    assert grouped.count("hl_fdiv_fast((") == 4 and grouped.count("if (!(hl_div_ok(") == 1
    monkeypatch.undo()
    assert "hl_fdiv_row(" not in _source("softmax", {"ROW_DIV_EXPR": True}, monkeypatch, 4096)
    small = _source("layernorm", {"ROW_DIV_EXPR": True}, monkeypatch, 512)     # no row registers: untouched
    assert "hl_fdiv_row(" not in small


def test_allreduce_text(monkeypatch):
    """The row kernels' warp all-reduces (64 partials of a row: two per lane) shuffle a value and a "has a value"
    flag per step (session 9 removed the flagless variant, `ROW_ALLREDUCE_FULL`: no faster on the H200)."""
    t = _source("layernorm", {}, monkeypatch)
    assert t.count("// warp all-reduce\n") == 2 and t.count("__shfl_xor_sync") == 4


def _nvcc(text: str, tmp_path, kind: str) -> str:
    cu = tmp_path / "k.cu"
    cu.write_text(text)
    args = [NVCC, "-O3", "--std=c++17", "-arch=sm_90", f"-{kind}", str(cu), "-o", str(tmp_path / f"k.{kind}")]
    if kind == "cubin":
        args += ["-Xptxas", "-v"]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stderr if kind == "cubin" else (tmp_path / "k.ptx").read_text()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_layernorm_helper_once_per_row_with_nvcc(monkeypatch, tmp_path):
    """nvcc evaluates the square root and its reciprocal once per row (one sqrt.rn.f32, one rcp.rn.f32 for 16
    quotients per lane), the two all-reduces take 20 shuffles (value and flag, 5 steps each), and nothing spills."""
    flags = {"ROW_DIV_EXPR": True}
    ptx = _nvcc(_source("layernorm", flags, monkeypatch), tmp_path, "ptx")
    assert ptx.count("sqrt.rn.f32") == 1 and ptx.count("rcp.rn.f32") == 1 and ptx.count("shfl.sync") == 20
    assert ptx.count("mul.rn.f32") == 16
    info = _nvcc(_source("layernorm", flags, monkeypatch), tmp_path, "cubin")
    assert "0 bytes spill stores" in info and "0 bytes spill loads" in info


def test_defaults_take_the_grouped_row_division():
    """Since session 7b the row kernels divide by a row's scalar (softmax's sum) or an expression of them (layernorm's
    sqrt) through one reciprocal per row, one range guard per float4 (the fastest form on the H200, same call)."""
    assert cuda_gen.ROW_DIV_RCP and cuda_gen.ROW_DIV_EXPR and cuda_gen.ROW_DIV_GROUPED
    for name, rows in (("layernorm", 8192), ("softmax", 4096)):
        cd = _subgraph(name, rows).workload.compute
        t = generate_cuda(lower(cd, default_gpu_schedule(cd), name="row")).text
        assert t.count("if (!(hl_div_ok(") == 1 and t.count("hl_fdiv_fast((") + t.count("hl_fdiv_fast(exp") == 4


def test_row_invariant_quotients_keep_the_division(monkeypatch):
    """rmsnorm_swiglu's normalization divides the row's sum of squares by the constant 1024 (once per row: the
    dividend is a row scalar too): neither that nor a division by a constant alone takes the helper, so its kernel
    is session 7's text whatever the flags."""
    import hlotune
    from hlotune.schedule_space.default_gpu import _row_reductions
    from tests.conftest import model_path

    sgs = hlotune.load_model(str(model_path("rmsnorm_swiglu", "bench.hlo"))).frontend.subgraphs
    (cd,) = [sg.workload.compute for sg in sgs if _row_reductions(sg.workload.compute) is not None]
    on = generate_cuda(lower(cd, default_gpu_schedule(cd), name="row")).text
    assert "hl_fdiv_fast(" not in on and "hl_fdiv_row(" not in on and " / 0x1.0000000000000p+10f" in on
    for k, v in OFF.items():
        monkeypatch.setattr(cuda_gen, k, v)
    assert generate_cuda(lower(cd, default_gpu_schedule(cd), name="row")).text == on
