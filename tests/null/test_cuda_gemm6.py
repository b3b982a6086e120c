"""The FFMA GEMM template's quad variant (`codegen.cuda.GEMM_QUADS`, session 6) without a GPU: its text has the
structure it promises (8x8 as 2 x 2 quads, fragments double-buffered, one move to the loop nest's layout), it
compiles for sm_90 without spills (nvcc, skipped when missing), and the generated kernel, run on the CPU (g++ with a
thread per CUDA thread and a std::barrier for __syncthreads, skipped when g++ is missing), gives bitwise the
register-layout template's output and numpy's product within float32 rounding."""

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
QUADS = (8, 8, 16, 16, 8)


def _mm(m: int, k: int, n: int):
    hlo = (f"HloModule mm\nENTRY m {{\n  a = f32[{m},{k}] parameter(0)\n  b = f32[{k},{n}] parameter(1)\n"
           f"  ROOT d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")
    (sg,) = hlotune.load_model(hlo).frontend.subgraphs
    return sg.workload.compute


def _source(cd, tiles, monkeypatch, quads: bool):
    monkeypatch.setattr(cuda, "GEMM_QUADS", quads)
    monkeypatch.setattr(cuda, "GEMM_STAGES", 0)
    monkeypatch.setattr(cuda, "GEMM_QUADS_MIN_BLOCKS", 0)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles, "tensor_core": 0}), name="mm"))


def test_quads_text(monkeypatch):
    src = _source(_mm(256, 64, 256), QUADS, monkeypatch, True)
    text = src.text
    assert "8x8 per thread in 2 x 2 quads" in text and "cp.async" not in text
    # per k: two float4 of A (rows +0, +64) and of B (columns +0, +64), read a step ahead of the FFMAs
    assert "&hl_As[hl_cur][7][hl_ra0 + 64]" in text and "&hl_Bs[hl_cur][7][hl_cb0 + 64]" in text
    body = text[text.index("hl_fa[2][8]"):]
    assert body.index("hl_As[hl_cur][1][") < body.index("hl_fa[0][i] * hl_fb[0][j]")
    assert text.count("__syncthreads()") == 1 + 1 + 4    # first tile, per K tile, the move (2 halves), after it
    assert src.launches[0].shared_bytes == 4 * 128 * 128 // 2 <= cuda.STATIC_SHARED_LIMIT
    # other tilings keep the other templates
    assert "quads" not in _source(_mm(256, 64, 256), (16, 4, 8, 32, 8), monkeypatch, True).text
    assert "quads" not in _source(_mm(256, 64, 256), QUADS, monkeypatch, False).text


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


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_quads_compile_without_spills(monkeypatch, tmp_path):
    assert_compiles_without_spills(_source(_mm(4096, 4096, 4096), QUADS, monkeypatch, True).text, tmp_path, 128)


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


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_quads_run_on_cpu_match_register_template(monkeypatch, tmp_path):
    m, k, n = 256, 48, 128
    cd, a, b = operands(m, k, n, 6)
    quads = _source(cd, QUADS, monkeypatch, True)
    plain = _source(cd, QUADS, monkeypatch, False)
    assert "quads" in quads.text and "quads" not in plain.text and "GEMM template" in plain.text
    got = _run_on_cpu(quads, a, b, (m, n), tmp_path, "quads")
    want = _run_on_cpu(plain, a, b, (m, n), tmp_path, "plain")
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert np.array_equal(got, want)   # the same k-ordered sums as the register-layout template
