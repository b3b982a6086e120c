"""The FFMA GEMM template for 128-thread blocks of 128x128 tiles (`codegen.cuda_ffma7`, issue #7, session 7) without
a GPU: its text has the structure it promises (quads of 4x4, the next k's fragments read before the FFMAs, a cp.async
ring, the move to the loop nest's layout), it compiles for sm_90 without spills (nvcc, skipped when missing), and the
generated kernel, run on the CPU (g++ with a thread per CUDA thread, a std::barrier for __syncthreads and cp.async
copies deferred to the `cp.async.wait_group` that completes them; skipped when g++ is missing), gives bitwise the
in-place register template's output and numpy's product within float32 rounding."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import hlotune.codegen.cuda as cuda
from hlotune.codegen import cuda_ffma7
from hlotune.codegen.cuda import generate_cuda
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from tests.null.test_cuda_gemm6 import _SHIM as _SHIM6
from tests.null.test_cuda_gemm6 import _mm, assert_compiles_without_spills, operands
from tests.null.test_cuda_gemm6 import _run_on_cpu as _run_cpu6

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")
T816 = (8, 16, 16, 8, 8)       # MR, NR, threads over rows, threads over columns, BK
T168 = (16, 8, 8, 16, 8)


def _source(cd, tiles, monkeypatch, on: bool, stages: int = 3):
    monkeypatch.setattr(cuda, "GEMM_FFMA7", on)
    monkeypatch.setattr(cuda, "GEMM_FFMA7_STAGES", stages)
    monkeypatch.setattr(cuda, "GEMM_FFMA7_MIN_BLOCKS", 0)
    monkeypatch.setattr(cuda, "GEMM_STAGES", 0)
    monkeypatch.setattr(cuda, "GEMM_QUADS", False)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles, "tensor_core": 0}), name="mm"))


def test_ffma7_text(monkeypatch):
    src = _source(_mm(256, 64, 256), T816, monkeypatch, True)
    text = src.text
    assert "GEMM template 7: 128x128x8 tile, 8x16 per thread in quads, 128 threads, 3-stage cp.async ring" in text
    # per k: two float4 of A (rows +0, +32) and four of B (columns +0, +16, +32, +48), read a step ahead of the FFMAs
    assert "&hl_As[hl_cur][7][hl_ra0 + 32]" in text and "&hl_Bs[hl_cur][7][hl_cb0 + 48]" in text
    body = text[text.index("for (int hl_kt = 0;"):]
    assert body.index("hl_As[hl_cur][1][") < body.index("hl_fa[0][i] * hl_fb[0][j]")
    # the next tile's first fragments: after the barrier, between the FFMAs of k = 6 and k = 7
    nx = body.index("hl_As[hl_nx][0][")
    assert body.rindex("hl_fa[0][i] * hl_fb[0][j]") < body.index("__syncthreads()") < nx
    assert nx < body.rindex("hl_fa[1][i] * hl_fb[1][j]")
    # barriers: tile 0, one per K tile, 4 passes of the move (2 each), after it
    assert text.count("__syncthreads()") == 1 + 1 + 8 + 1
    assert src.launches[0].block == (128, 1, 1) and src.launches[0].shared_bytes == 4 * 3 * 8 * (132 + 128)
    t168 = _source(_mm(256, 64, 256), T168, monkeypatch, True, stages=6).text
    assert "16x8 per thread in quads" in t168 and "&hl_As[hl_cur][7][hl_ra0 + 48]" in t168
    assert "hl_cb0 + 32]" in t168 and "5-stage" in t168           # 6 stages do not fit in 48 KB
    # other tilings and the flag off keep the other templates
    assert "template 7" not in _source(_mm(256, 64, 256), (8, 8, 16, 16, 8), monkeypatch, True).text
    assert "template 7" not in _source(_mm(256, 64, 256), T816, monkeypatch, False).text


def test_ffma7_fits_and_stages():
    g = cuda._Gemm("a", "b", "c", 4096, 4096, 4096, 128, 128, 8, 8, 16, 128, 0, 0)
    assert cuda_ffma7.ffma7_fits(g) and cuda_ffma7.ffma7_fits(dataclasses.replace(g, mr=16, nr=8))
    # BK 8: 8320 bytes per stage (A rows padded to 132 floats), at most 5 stages in 48 KB, no more than K tiles + 1
    assert [cuda_ffma7.ffma7_stages(g, s) for s in (2, 3, 6)] == [2, 3, 5]
    assert cuda_ffma7.ffma7_stages(dataclasses.replace(g, k=16), 4) == 3
    assert cuda_ffma7.ffma7_stages(dataclasses.replace(g, bk=16), 3) == 2     # 3 x 16640 bytes do not fit
    for other in (dict(mr=8, nr=8), dict(threads=256), dict(bm=64), dict(bk=32), dict(bk=4)):
        assert not cuda_ffma7.ffma7_fits(dataclasses.replace(g, **other)), other


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("tiles", [T816, (8, 16, 16, 8, 16)])
def test_ffma7_compile_without_spills(monkeypatch, tmp_path, tiles):
    assert_compiles_without_spills(_source(_mm(4096, 4096, 4096), tiles, monkeypatch, True).text, tmp_path, 255)


_SHIM = "#include <cstring>\n" + _SHIM6 + r"""
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


def _run_on_cpu(src, a, b, out_shape, tmp_path, tag):
    return _run_cpu6(src, a, b, out_shape, tmp_path, tag, _SHIM)


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.parametrize("tiles, k, stages", [(T816, 48, 3), (T816, 16, 4), (T168, 32, 2), ((8, 16, 16, 8, 16), 48, 3)])
def test_ffma7_run_on_cpu_match_register_template(monkeypatch, tmp_path, tiles, k, stages):
    m, n = 256, 256
    cd, a, b = operands(m, k, n, 7)
    new = _source(cd, tiles, monkeypatch, True, stages)
    plain = _source(cd, tiles, monkeypatch, False)
    assert "template 7" in new.text and "template 7" not in plain.text and "GEMM template" in plain.text
    got = _run_on_cpu(new, a, b, (m, n), tmp_path, "new")
    want = _run_on_cpu(plain, a, b, (m, n), tmp_path, "plain")
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert np.array_equal(got, want)   # the same k-ordered sums as the in-place template
