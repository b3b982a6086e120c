"""Session 6b (row kernels), no GPU: softmax's division by the row's sum through one reciprocal per row and
Markstein's correction (`codegen.cuda.ROW_DIV_RCP`, `hl_fdiv_row`).

The prelude function itself is compiled for the CPU (g++, with `__frcp_rn` / `__fmul_rn` as correctly rounded
float32 operations and glibc's exact fmaf) and compared bit for bit with the IEEE division over random bit
patterns (NaN, inf, zeros, subnormals), the edges of its range guard and every significand of the dividend for a
set of divisors; the same steps are emulated exactly in numpy (float64 where exact, a TwoSum for the last fma);
the generated softmax kernel is checked for where the helper is used (and with nvcc: one reciprocal per row)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

import hlotune
import hlotune.codegen.cuda as cuda_gen
from hlotune.codegen.cuda import ROW_DIV_PRELUDE, generate_cuda
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from tests.conftest import model_path


@pytest.fixture(autouse=True)
def _plain_loads(monkeypatch):
    """These tests read the plain vector load / store forms; the streaming hints have their own test
    (test_cuda_codegen.test_stream_hints_only_on_inputs_read_once)."""
    monkeypatch.setattr(cuda_gen, "STREAM_HINTS", False)

GXX = shutil.which("g++")
NVCC = shutil.which("nvcc")
F = np.float32

_SHIM = r"""
#include <math.h>
#include <string.h>
#define HL_INL static inline
static inline float __frcp_rn(float b) { volatile float one = 1.0f; return one / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
""" + ROW_DIV_PRELUDE + r"""
static unsigned bits(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static float of_bits(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
extern "C" void div_row(const float* a, const float* b, float* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = hl_fdiv_row(a[i], b[i]);
}
/* the grouped form (ROW_DIV_GROUPED) for one quotient: the fast value where hl_div_ok, else the division */
extern "C" void div_grouped(const float* a, const float* b, float* out, long n) {
  for (long i = 0; i < n; ++i) {
    volatile float vb = b[i];
    out[i] = hl_div_ok(a[i], b[i]) ? hl_fdiv_fast(a[i], b[i]) : a[i] / vb;
  }
}
/* every significand of a dividend with exponent field ea (both signs) against b: the number of results that
   differ from the division's bits (NaN: any NaN) */
extern "C" long exhaustive(float b, unsigned ea) {
  long bad = 0;
  volatile float vb = b;
  for (unsigned s = 0; s < 2; ++s)
    for (unsigned m = 0; m < (1u << 23); ++m) {
      const float a = of_bits((s << 31) | (ea << 23) | m);
      const float got = hl_fdiv_row(a, b), want = a / vb;
      bad += bits(got) != bits(want) && !(got != got && want != want);
    }
  return bad;
}
"""


def gxx_division_lib(tmp_path_factory, tag: str, shim: str):
    """`shim` (C++ with an `exhaustive(float, unsigned)` entry) built with g++ as a shared library (IEEE float
    arithmetic, no contraction), loaded; the test is skipped without g++."""
    if GXX is None:
        pytest.skip("g++ not found")
    d = tmp_path_factory.mktemp(tag)
    (d / "div.cpp").write_text(shim)
    r = subprocess.run([GXX, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-w", "-shared", "-fPIC",
                        str(d / "div.cpp"), "-o", str(d / "div.so")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    so = ctypes.CDLL(str(d / "div.so"))
    so.exhaustive.restype = ctypes.c_long
    so.exhaustive.argtypes = [ctypes.c_float, ctypes.c_uint]
    return so


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return gxx_division_lib(tmp_path_factory, "rowdiv", _SHIM)


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Bitwise equal, or both NaN."""
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


def _cases(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Dividend / divisor pairs: random bit patterns, values around the guard's bounds, softmax-like rows."""
    raw = rng.integers(0, 2 ** 32, size=(2, n), dtype=np.uint64).astype(np.uint32).view(F)
    sig = rng.random((2, n)) + 1.0
    ea = rng.integers(-70, 110, size=n)
    eb = rng.integers(-30, 30, size=n)
    inr = np.stack([sig[0] * np.exp2(ea), sig[1] * np.exp2(eb)]).astype(F) * rng.choice([-1, 1], size=(2, n)).astype(F)
    edges_a = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0 ** -54, 2.0 ** 100, 2.0 ** -149, 2.0 ** -126,
                        np.finfo(F).max, 1.0, 1.0 - 2.0 ** -24, 1.0 + 2.0 ** -23], dtype=F)
    bnd = np.array([2.0 ** -24, 2.0 ** 24, 1.0, 2.0 - 2.0 ** -23, 1.0 + 2.0 ** -23, 3.0, 1024.0, 0.0, np.inf, np.nan,
                    2.0 ** -25, 2.0 ** 25], dtype=F)
    near = lambda v: np.concatenate([np.nextafter(v, F(0)), v, np.nextafter(v, F(np.inf))])  # noqa: E731
    with np.errstate(over="ignore"):
        ea2, eb2 = np.meshgrid(near(edges_a), near(bnd))
    soft = np.exp(-rng.random(n) * 120).astype(F)     # exp(x - max) of a row, divided by sums in [1, 4096]
    sums = (1 + rng.random(n) * 4095).astype(F)
    a = np.concatenate([raw[0], inr[0], ea2.ravel(), -ea2.ravel(), soft])
    b = np.concatenate([raw[1], inr[1], eb2.ravel(), -eb2.ravel(), sums])
    return a, b


@pytest.mark.parametrize("fn", ["div_row", "div_grouped"])
def test_row_division_is_the_ieee_division_on_random_and_edge_inputs(lib, fn):
    """hl_fdiv_row, and hl_fdiv_fast under hl_div_ok (compiled from the prelude text), against the division:
    bitwise over ~1M pairs of random bit patterns, in-range values of both signs, values next to the guard's
    bounds and softmax-like quotients."""
    a, b = _cases(np.random.default_rng(7), 300_000)
    out = np.empty_like(a)
    p = ctypes.POINTER(ctypes.c_float)
    getattr(lib, fn)(a.ctypes.data_as(p), b.ctypes.data_as(p), out.ctypes.data_as(p), len(a))
    with np.errstate(all="ignore"):
        want = a / b
    bad = ~_same(out, want)
    assert not bad.any(), [(x.hex(), y.hex()) for x, y in zip(a[bad][:5].astype(float), b[bad][:5].astype(float))]


@pytest.mark.parametrize("b", [1.0, 1.0 + 2.0 ** -23, 2.0 - 2.0 ** -23, 1.5, 3.0, 1000.7, 2.0 ** -24,
                               *map(float.fromhex, ["0x1.fffffep23", "0x1.7d7842p-3", "0x1.c71c72p+9"])])
def test_row_division_every_dividend_significand(lib, b):
    """Every float32 significand of the dividend (both signs, two exponents: one inside the guard, one at its
    lower edge) divided by `b` (significands near 1 and 2, the guard's bounds): bitwise the division."""
    for ea in (127, 127 - 54):
        assert lib.exhaustive(b, ea) == 0, (b, ea)


def test_row_division_every_dividend_significand_random_divisors(lib):
    """Every dividend significand in [1, 2) (both signs) against 40 random divisor significands in [1, 2): the
    correction's result depends on the significands only inside the guard."""
    rng = np.random.default_rng(11)
    for m in rng.integers(0, 1 << 23, size=40):
        b = float(np.array([0x3F800000 | int(m)], dtype=np.uint32).view(F)[0])
        assert lib.exhaustive(b, 127) == 0, b.hex()


def _fma32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """RN32(x y + z) exactly for float32 x, y, z whose x y + z needs no more than float64 plus a TwoSum tail:
    x y is exact in float64, s + t = x y + z exactly (TwoSum), then s rounded to float32 with a tie at a float32
    midpoint broken by the sign of t."""
    p = x.astype(np.float64) * y.astype(np.float64)
    zz = z.astype(np.float64)
    s = p + zz
    bv = s - p
    t = (p - (s - bv)) + (zz - bv)
    r = s.astype(F)
    up, dn = np.nextafter(r, F(np.inf)), np.nextafter(r, F(-np.inf))
    other = np.where(r.astype(np.float64) < s, up, dn)
    tie = (r.astype(np.float64) + other.astype(np.float64)) / 2 == s
    go = tie & (t != 0) & ((other.astype(np.float64) > s) == (t > 0))
    return np.where(go, other, r)


def test_markstein_steps_emulated_exactly_give_the_division():
    """The helper's fast path as exact numpy arithmetic (y = RN(1/b), q = RN(a y), r = fma(-q, b, a),
    fma(r, y, q)) on in-range pairs: bitwise numpy's float32 division (independent of any C compiler)."""
    rng = np.random.default_rng(3)
    n = 400_000
    a = ((rng.random(n) + 1) * np.exp2(rng.integers(-54, 100, n))).astype(F) * rng.choice([-1, 1], n).astype(F)
    b = ((rng.random(n) + 1) * np.exp2(rng.integers(-24, 24, n))).astype(F) * rng.choice([-1, 1], n).astype(F)
    b = np.where(np.abs(b) > 2.0 ** 24, F(2.0 ** 24), b)
    y = F(1) / b
    q = a * y
    r = _fma32(-q, b, a)
    got = _fma32(r, y, q)
    assert _same(got, a / b).all()
    # the emulation itself is not vacuous: without the correction step about a fifth of the quotients differ
    assert (~_same(q, a / b)).mean() > 0.05


def _softmax_source(flag: bool, monkeypatch, grouped: bool = False):
    monkeypatch.setattr(cuda_gen, "ROW_DIV_RCP", flag)
    monkeypatch.setattr(cuda_gen, "ROW_DIV_GROUPED", grouped)
    (sg,) = hlotune.load_model(model_path("softmax", "bench.gpu.opt.hlo")).frontend.subgraphs
    cd = sg.workload.compute
    # one warp per row: 32 register elements per lane (the default, two warps per row, has 16)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options={"row_lanes": 32}), name="row")).text


def test_row_division_used_only_for_the_row_scalar(monkeypatch):
    """With ROW_DIV_RCP the softmax kernel (4096 rows: the row-register schedule) divides its 32 register
    elements per lane (4 in the text: a float4 group in an unrolled loop) by the row's sum through hl_fdiv_row
    and carries the helper; without it, no trace."""
    on = _softmax_source(True, monkeypatch)
    off = _softmax_source(False, monkeypatch)
    assert "hl_fdiv_row(" not in off and "HL_INL float hl_fdiv_row" not in off
    assert "HL_INL float hl_fdiv_row" in on
    assert len(re.findall(r"hl_fdiv_row\(exp_\w+\[", on)) == 4     # a float4 group in an unrolled loop of 8
    assert on.replace(ROW_DIV_PRELUDE, "").count(" / reduce_sum") == 0


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_row_division_takes_one_reciprocal_per_row(monkeypatch, tmp_path):
    """nvcc computes the reciprocal once per row (one rcp.rn.f32 in the PTX for 32 quotients per lane)."""
    cu = tmp_path / "s.cu"
    cu.write_text(_softmax_source(True, monkeypatch))
    r = subprocess.run([NVCC, "-O3", "--std=c++17", "-arch=sm_90", "-ptx", str(cu), "-o", str(tmp_path / "s.ptx")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ptx = (tmp_path / "s.ptx").read_text()
    assert len(re.findall(r"\brcp\.rn\.f32", ptx)) == 1
    assert len(re.findall(r"\bdiv\.rn\.f32", ptx)) == 32    # the guarded fallbacks


def test_grouped_row_division_guards_each_float4(monkeypatch):
    """ROW_DIV_GROUPED: the four quotients of a float4 store by hl_fdiv_fast, one hl_div_ok test of all four, and
    the four divisions as the fallback inside it, before the store."""
    src = _softmax_source(True, monkeypatch, grouped=True)
    assert "hl_fdiv_row(exp" not in src
    assert len(re.findall(r"hl_vs\d+\.[xyzw] = hl_fdiv_fast\(exp_\w+\[", src)) == 4
    m = re.search(r"if \(!\((hl_div_ok\([^{]*)\)\) \{\n"
                  r"((?:\s*hl_vs\d+\.[xyzw] = \(exp_\w+\[.*\] / reduce_sum_1\[0\]\);\n){4})"
                  r"\s*\}\n\s*\*\(float4\*\)", src)
    assert m is not None and m.group(1).count("hl_div_ok(") == 4
