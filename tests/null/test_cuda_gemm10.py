"""The big-tile FFMA GEMM template (`cuda_simt`, session 10) without a GPU: with the tile rule on
(default_gpu.FFMA_SIMT_TILES, on by default) the default schedule of a big float32 dot takes it (8x16 per thread,
128x256x16 tiles, dynamic shared memory, one block per SM, grouped rasterization of the block index, float4 stores);
off, the 4096^3 FFMA text is the 8x4 cp.async ring as before; the generated kernel, run on the CPU through the g++
shim of test_cuda_gemm6.py (a thread per CUDA thread, barriers, cp.async copies landing at their wait_group), gives
A @ B bit for bit as the cp.async FFMA template (the same k-ordered sums) for 8x16 and 16x8, BK 8 and 16, with and
without rasterization, batched; the quad layout covers the block tile once; nvcc compiles the 4096^3 kernel for
sm_90 without spills."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import hlotune
import hlotune.codegen.cuda as cuda
from hlotune.codegen.cuda import generate_cuda
from hlotune.codegen.cuda_simt import simt_quad, simt_raster
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from tests.null.test_cuda_gemm6 import _SHIM_CP, _mm, _run_on_cpu, assert_compiles_without_spills, operands

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")

# the shim's static __shared__ cannot declare the template's dynamic shared memory: a static buffer stands for it
_SHIM_DYN = _SHIM_CP + ("alignas(16) static unsigned char hl_dyn_smem[256 * 1024];\n#define hl_smem hl_dyn_smem\n"
                        "template <class T> static inline void __stcs(T* p, T v) { *p = v; }\n")


def _src(cd, tiles, monkeypatch, simt: bool = True, group: int = 8):
    monkeypatch.setattr(cuda, "GEMM_SIMT", simt)
    monkeypatch.setattr(cuda, "GEMM_SIMT_GROUP", group)
    monkeypatch.setattr(cuda, "GEMM_STAGES", 3)
    monkeypatch.setattr(cuda, "GEMM_ASYNC_MAX_MR", 1 << 30)
    monkeypatch.setattr(cuda, "GEMM_ASYNC_MR8_BLOCKS", 0)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles, "tensor_core": 0}), name="mm"))


def _cpu(src, a, b, shape, tmp_path, tag):
    text = src.text.replace("extern __shared__ __align__(16) unsigned char hl_smem[];", "")
    return _run_on_cpu(dataclasses.replace(src, text=text), a, b, shape, tmp_path, tag, shim=_SHIM_DYN)


def test_default_schedule_takes_the_template_at_4096(monkeypatch):
    import hlotune.schedule_space.default_gpu as dg

    cd = _mm(4096, 4096, 4096)
    monkeypatch.setattr(dg, "FFMA_SIMT_TILES", False)
    text = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tensor_core": 0}), name="mm")).text
    assert "cuda_simt" not in text and "3-stage cp.async ring" in text
    monkeypatch.setattr(dg, "FFMA_SIMT_TILES", True)
    src = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tensor_core": 0}), name="mm"))
    t = src.text
    assert "__stcs((float4*)&d[" in t
    assert "GEMM template (FFMA, cuda_simt): 128x256x16 tile, 8x16 per thread in quads, 2-stage ring" in t
    assert "__launch_bounds__(256, 1)" in t and "extern __shared__ __align__(16) unsigned char hl_smem[];" in t
    (ln,) = src.launches
    assert ln.grid == (512, 1, 1) and ln.block == (256, 1, 1) and ln.dynamic_shared_bytes == 4 * 128 * (256 + 4)
    ras = simt_raster(type("G", (), dict(m=4096, n=4096, bm=128, bn=256))(), 8)
    assert t.count(ras) == 2       # the kernel's block loop and the template read the same tile
    # smaller grids and short K keep the other FFMA tilings
    for m, k, n in ((1024, 1024, 1024), (4096, 512, 4096), (2048, 2048, 2048)):
        cd = _mm(m, k, n)
        text = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tensor_core": 0}), name="mm")).text
        assert "cuda_simt" not in text


def test_raster_is_a_permutation_grouping_tile_rows():
    g = type("G", (), dict(m=128 * 16, n=256 * 5, bm=128, bn=256))()
    expr = simt_raster(g, 8)
    tiles = 16 * 5
    got = [eval(expr.replace("blockIdx.x", str(b)).replace("/", "//")) for b in range(3 * tiles)]
    assert sorted(got) == list(range(3 * tiles))
    assert [divmod(x % tiles, 5) for x in got[:10]] == [(i, 0) for i in range(8)] + [(0, 1), (1, 1)]
    assert simt_raster(g, 3) is None and simt_raster(g, 0) is None


@pytest.mark.parametrize("mr,nr", [(8, 16), (16, 8)])
def test_quads_cover_the_tile_once_with_float4_columns(mr, nr):
    g = type("G", (), dict(mr=mr, nr=nr, bm=16 * mr, bn=16 * nr))()
    q = simt_quad(g)
    cells = [q(ty, tx, i, j) for ty in range(16) for tx in range(16) for i in range(mr) for j in range(nr)]
    assert sorted(cells) == [(r, c) for r in range(g.bm) for c in range(g.bn)]
    for ty, tx, i in ((0, 0, 0), (3, 5, mr - 1), (15, 15, 5)):
        for j4 in range(nr // 4):     # four consecutive columns per float4, a warp's lanes on consecutive float4s
            r, c = q(ty, tx, i, 4 * j4)
            assert [q(ty, tx, i, 4 * j4 + e) for e in range(4)] == [(r, c + e) for e in range(4)]
            assert q(ty, tx + 1, i, 4 * j4) == (r, c + 4) if tx < 15 else True


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.parametrize("tiles,group,m,k,n", [((8, 16, 16, 16, 16), 2, 256, 64, 512),
                                               ((8, 16, 16, 16, 8), 0, 256, 48, 256),
                                               ((16, 8, 16, 16, 16), 2, 512, 32, 256)], ids=str)
def test_template_runs_on_cpu_bitwise_as_the_ring(monkeypatch, tmp_path, tiles, group, m, k, n):
    cd, a, b = operands(m, k, n, 10)
    src = _src(cd, tiles, monkeypatch, group=group)
    assert "cuda_simt" in src.text and ("blockIdx.x % 2" in src.text) == (group == 2)
    got = _cpu(src, a, b, (m, n), tmp_path, "simt")
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    ref = _src(cd, (8, 4, 8, 32, tiles[4]), monkeypatch, simt=False)
    assert "cuda_simt" not in ref.text
    np.testing.assert_array_equal(got, _cpu(ref, a, b, (m, n), tmp_path, "ring"))


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_batched_dot_runs_on_cpu(monkeypatch, tmp_path):
    hlo = ("HloModule bmm\nENTRY m {\n  a = f32[2,256,32] parameter(0)\n  b = f32[2,32,512] parameter(1)\n"
           "  ROOT d = f32[2,256,512] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, "
           "rhs_contracting_dims={1}\n}\n")
    (sg,) = hlotune.load_model(hlo).frontend.subgraphs
    cd = sg.workload.compute
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 256, 32)).astype(np.float32)
    b = rng.standard_normal((2, 32, 512)).astype(np.float32)
    src = _src(cd, (8, 16, 16, 16, 16), monkeypatch, group=2)
    assert "cuda_simt" in src.text and "blockIdx.x % 2" in src.text
    got = _cpu(src, a, b, (2, 256, 512), tmp_path, "bsimt")
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_4096_kernel_compiles_without_spills(monkeypatch, tmp_path):
    import hlotune.schedule_space.default_gpu as dg

    monkeypatch.setattr(dg, "FFMA_SIMT_TILES", True)
    cd = _mm(4096, 4096, 4096)
    src = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tensor_core": 0}), name="mm"))
    assert "cuda_simt" in src.text
    assert_compiles_without_spills(src.text, tmp_path, 255)


def test_shared_memory_stays_within_the_arch_limit():
    """Every GEMM template keeps a block's shared memory within what the arch allows (`target.cuda_shared_limit`):
    sm_86 / sm_89 take 99 KB, so the 4096^3 FFMA default there is not cuda_simt (133 KB), and the mma ring takes
    fewer stages; sm_80 and sm_90 keep the texts they had."""
    import hlotune.schedule_space.default_gpu as dg
    from hlotune.target import cuda_shared_limit

    assert [cuda_shared_limit(a) // 1024 for a in ("sm_90a", "sm_86", "sm_80", "sm_75", "sm_61", "sm_121", "gfx90a")] \
        == [227, 99, 163, 64, 48, 99, 48]
    cd = _mm(4096, 4096, 4096)
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90"):
        cap = cuda_shared_limit(arch)
        for opts in ({"tensor_core": 0}, {"tensor_core": 0, "tiles": dg._SIMT_TILES[0][:5]}, {"tensor_core": 3},
                     *({"tensor_core": 3, "tiles": t[:5]} for t in dg._MMA_TILES)):
            src = generate_cuda(lower(cd, default_gpu_schedule(cd, options={**opts, "shared": cap}), name="mm"), arch)
            assert all(ln.shared_bytes <= cap for ln in src.launches), (arch, opts)
            assert ("cuda_simt" in src.text) == (cap >= dg._SIMT_SHARED and opts["tensor_core"] == 0), (arch, opts)
