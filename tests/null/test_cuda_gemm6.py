"""The FFMA GEMM templates run on the CPU (no GPU): the generated kernel text, compiled by g++ with a shim for the CUDA
names (threads of a block as std::threads, __syncthreads as a barrier, cp.async as copies that land at the matching
wait_group), reproduces A @ B for the register template and for the cp.async ring (the same sums in the same order:
bit for bit); the 4096^3 FFMA kernel compiles for sm_90 without spills (nvcc, skipped without it).  Session 9 removed
the session-6 quad variant and the session-7 128-thread template (GEMM_QUADS, GEMM_FFMA7: slower on the H200) whose
tests this file and test_cuda_gemm7.py held; their CPU harness stays here."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

import hlotune
import hlotune.codegen.cuda as cuda
from hlotune.codegen.cuda import generate_cuda
from hlotune.codegen.cuda_runtime import compile_cubin
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")
#: FFMA tilings (MR, NR, threads over rows, threads over columns, BK); the last is the 4096^3 default's
TILES = ((16, 4, 8, 32, 8), (8, 8, 16, 16, 8), (8, 4, 8, 32, 16))


def _mm(m: int, k: int, n: int):
    hlo = (f"HloModule mm\nENTRY m {{\n  a = f32[{m},{k}] parameter(0)\n  b = f32[{k},{n}] parameter(1)\n"
           f"  ROOT d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")
    (sg,) = hlotune.load_model(hlo).frontend.subgraphs
    return sg.workload.compute


def _source(cd, tiles, monkeypatch, stages: int = 0):
    """The FFMA template for `tiles`: the register template (stages 0) or the cp.async ring of `stages` stages."""
    monkeypatch.setattr(cuda, "GEMM_STAGES", stages)
    monkeypatch.setattr(cuda, "GEMM_ASYNC_MAX_MR", 1 << 30)
    monkeypatch.setattr(cuda, "GEMM_ASYNC_MR8_BLOCKS", 0)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles, "tensor_core": 0}), name="mm"))


_SHIM = r"""
#include <barrier>
#include <thread>
#include <vector>
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct hl_dim { int x, y, z; };
thread_local hl_dim threadIdx, blockIdx;
static std::barrier<>* hl_bar;
template <class T> static inline T __ldg(const T* p) { return *p; }
#define __syncthreads() hl_bar->arrive_and_wait()
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__
typedef int hl_idx;
"""

_RUN = r"""
extern "C" void hl_run(const float* a, const float* b, float* c, int blocks, int threads) {
  for (int bid = 0; bid < blocks; ++bid) {
    std::barrier<> bar(threads);
    hl_bar = &bar;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {bid, 0, 0}; KERNEL(a, b, c); });
    for (auto& t : ts) t.join();
  }
}
"""


def _run_on_cpu(src, a, b, out_shape, tmp_path, tag, shim: str = _SHIM):
    """The generated GEMM kernel of `src` run on the CPU (g++, `shim` for the CUDA names): C of `out_shape`."""
    text = src.text
    kern = text[text.index('extern "C" __global__'):]
    name = re.search(r"\)\s*(\w+)\(const float\*", kern).group(1)
    cpp = tmp_path / f"{tag}.cpp"
    cpp.write_text(shim + kern + _RUN.replace("KERNEL", name))
    so = tmp_path / f"{tag}.so"
    r = subprocess.run([GXX, "-std=c++20", "-O1", "-ffp-contract=off", "-w", "-shared", "-fPIC", "-pthread",
                        str(cpp), "-o", str(so)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    lib = ctypes.CDLL(str(so))
    c = np.full(out_shape, np.nan, np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    (ln,) = src.launches
    lib.hl_run(a.ctypes.data_as(ptr), b.ctypes.data_as(ptr), c.ctypes.data_as(ptr), ln.grid[0], ln.block[0])
    return c


def operands(m: int, k: int, n: int, seed: int):
    """The dot's compute definition and N(0, 1) float32 operands A[m, k], B[k, n]."""
    rng = np.random.default_rng(seed)
    return (_mm(m, k, n), rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


_SHIM_CP = "#include <cstring>\n" + _SHIM + r"""
// cp.async: a copy lands when a wait_group of its thread completes its group (never earlier)
struct hl_copy { void* dst; const void* src; int n, group; };
thread_local std::vector<hl_copy> hl_pending;
thread_local int hl_group = 0;
static inline void hl_cp16(void* d, const void* s) { hl_pending.push_back({d, s, 16, hl_group}); }
static inline void hl_cp4(void* d, const void* s) { hl_pending.push_back({d, s, 4, hl_group}); }
static inline void hl_cp_commit() { ++hl_group; }
template <int N> static inline void hl_cp_wait() {
  std::vector<hl_copy> keep;
  for (auto& c : hl_pending) {
    if (c.group < hl_group - N) std::memcpy(c.dst, c.src, c.n); else keep.push_back(c);
  }
  hl_pending.swap(keep);
}
"""


def assert_compiles_without_spills(text: str, tmp_path, max_regs: int) -> None:
    """nvcc -Xptxas -v compiles `text` for sm_90 with at most `max_regs` registers and no spill; the runtime's
    cached compile gives a cubin too."""
    cu = tmp_path / "q.cu"
    cu.write_text(text)
    r = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-Xptxas", "-v", str(cu), "-o", str(tmp_path / "q.cubin")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    assert regs <= max_regs and "0 bytes spill stores" in r.stderr, r.stderr
    assert compile_cubin(text, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.parametrize("tiles", TILES, ids=str)
def test_register_template_runs_on_cpu(monkeypatch, tmp_path, tiles):
    m, k, n = 256, 48, 256
    cd, a, b = operands(m, k, n, 6)
    src = _source(cd, tiles, monkeypatch)
    assert "GEMM template" in src.text and "cp.async" not in src.text
    got = _run_on_cpu(src, a, b, (m, n), tmp_path, "plain")
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.parametrize("stages", [2, 3])
def test_cp_async_ring_runs_on_cpu_like_register_template(monkeypatch, tmp_path, stages):
    m, k, n = 256, 96, 256
    cd, a, b = operands(m, k, n, 7)
    ring = _source(cd, TILES[-1], monkeypatch, stages)
    plain = _source(cd, TILES[-1], monkeypatch, 0)
    assert f"{stages}-stage cp.async ring" in ring.text and "cp.async" not in plain.text
    got = _run_on_cpu(ring, a, b, (m, n), tmp_path, "ring", _SHIM_CP)
    want = _run_on_cpu(plain, a, b, (m, n), tmp_path, "plain")
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert np.array_equal(got, want)   # the same k-ordered sums


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_ffma_ring_4096_compiles_without_spills(monkeypatch, tmp_path):
    cd = _mm(4096, 4096, 4096)     # the 8x4 ring (the 4096^3 default takes cuda_simt since session 10)
    opts = {"tensor_core": 0, "tiles": (8, 4, 8, 32, 16)}
    text = generate_cuda(lower(cd, default_gpu_schedule(cd, options=opts), name="mm")).text
    assert "cp.async ring" in text
    assert_compiles_without_spills(text, tmp_path, 128)
