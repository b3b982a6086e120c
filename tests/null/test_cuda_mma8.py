"""Session 8's tensor-core GEMM variants (`codegen.cuda._gemm_mma_text`) without a GPU: tiles of BK 32 and 256
threads whose cp.async ring takes dynamic shared memory (`GEMM_MMA_SHARED_LIMIT`), the chunk loop
(`GEMM_MMA_CHUNK_LOOP`) and the unrounded small word (`GEMM_MMA_SMALL_TRUNC`).  The emulation of
tests/null/test_cuda_mma.py (the template's own index expressions against an independent table of the PTX m16n8k8
.tf32 layout) reproduces numpy's matmul at every thread's accumulators for the new tilings; the kernel text declares
its tiles in dynamic shared memory at the offsets the launch reserves; the texts compile for sm_90 without spills
(nvcc -Xptxas -v, skipped without nvcc)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from hlotune.codegen import cuda
from hlotune.codegen.cuda import _Gemm, _mma_fits, gemm_text, generate_cuda, mma_index_exprs
from hlotune.schedule_space import default_gpu as dg
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from tests.null.test_cuda_mma import _gemm, _mm, check_emulated_accumulators, tf32

NVCC = shutil.which("nvcc")

@pytest.fixture(autouse=True)
def _mma_not_wgmma(monkeypatch):
    """These tests are about the mma.sync template: the wgmma template (session 9, tests/null/test_cuda_wgmma.py) off,
    and its float4 epilogue too (the texts checked here are session 8's)."""
    monkeypatch.setattr(cuda, "GEMM_WGMMA", False)
    monkeypatch.setattr(dg, "TENSOR_CORE_WGMMA", False)
    monkeypatch.setattr(dg, "VEC_EPILOGUE_MMA", False)


#: tilings new in session 8 (MR, NR, TI, TJ, BK): BK 32 (4x8 is the 1024^3 mma default), 256 threads
NEW_TILES = ((4, 8, 32, 4, 32), (4, 16, 32, 4, 32), (4, 16, 64, 4, 16), (8, 8, 32, 4, 16))


@pytest.mark.parametrize("tiles", NEW_TILES)
def test_emulated_fragments_reproduce_matmul_for_new_tilings(tiles):
    mr, nr, ti, tj, bk = tiles
    g = _gemm(*tiles)
    assert _mma_fits(g) and g.smem_off == -1
    g3 = _gemm(*tiles, k=8 * bk)
    assert g3.stages == cuda.GEMM_MMA_STAGES == 3
    assert g3.shared_bytes == 4 * 3 * (g3.bm * (bk + g3.pad_a) + bk * g3.bn)
    check_emulated_accumulators(g, tiles)


def _src(m, n, k, opts=None):
    cd = _mm(m, k, n)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options=opts or {}), name="mm"))


def test_1024_default_takes_bk32_in_dynamic_shared_memory():
    """matmul 1024^3 by default: 4x8 on 32x4 threads, BK 32, a 3-stage ring of 67,584 bytes declared as pointers into
    the kernel's dynamic shared memory (hl_smem), the launch passing that many dynamic bytes."""
    src = _src(1024, 1024, 1024)
    (ln,) = src.launches
    g = _gemm(4, 8, 32, 4, 32, 1024, 1024, 1024)
    assert "128x32x32 tile, 4x8 per thread, 3xTF32" in src.text and "3-stage cp.async ring" in src.text
    assert ln.grid == (256, 1, 1) and ln.block == (128, 1, 1)
    assert g.shared_bytes == 67584 == ln.shared_bytes == ln.dynamic_shared_bytes
    assert "extern __shared__ __align__(16) unsigned char hl_smem[];" in src.text
    pad = g.bk + g.pad_a
    assert f"float (*hl_As)[128][{pad}] = reinterpret_cast<float (*)[128][{pad}]>(hl_smem + 0);" in src.text
    b_off = 4 * 3 * 128 * pad
    assert f"float (*hl_Bs)[32][32] = reinterpret_cast<float (*)[32][32]>(hl_smem + {b_off});" in src.text
    assert b_off + 4 * 3 * 32 * 32 == ln.dynamic_shared_bytes
    assert "__shared__ __align__(16) float hl_As" not in src.text
    assert "__launch_bounds__(128, 2)" in src.text


def test_static_limit_gives_the_session5_kernel(monkeypatch):
    """With the limit at 48 KB and session 5's tile list the 1024^3 kernel is the old one: 4x8 BK 16, static arrays."""
    monkeypatch.setattr(cuda, "GEMM_MMA_SHARED_LIMIT", cuda.STATIC_SHARED_LIMIT)
    monkeypatch.setattr(dg, "_MMA_TILES", tuple(t for t in dg._MMA_TILES if t[4] == 16))
    src = _src(1024, 1024, 1024)
    (ln,) = src.launches
    assert "128x32x16 tile, 4x8 per thread" in src.text and ln.dynamic_shared_bytes == 0
    assert "__shared__ __align__(16) float hl_As[3][128][20];" in src.text and "hl_smem" not in src.text
    # BK 32 within 48 KB: a ring of 2 stages, static
    src = _src(1024, 1024, 1024, {"tensor_core": 3, "tiles": (4, 8, 32, 4, 32)})
    assert "2-stage cp.async ring" in src.text and src.launches[0].dynamic_shared_bytes == 0


def test_ffma_gemm_stays_within_static_shared_memory():
    """Only the mma template takes dynamic shared memory: an FFMA tiling whose shared tiles pass 48 KB keeps the
    generic code (no GEMM template), as before."""
    src = _src(1024, 1024, 1024, {"tensor_core": 0, "tiles": (4, 8, 32, 4, 64)})
    assert "GEMM template" not in src.text and src.launches[0].dynamic_shared_bytes == 0


def test_launch_bounds_of_256_thread_mma_blocks():
    big = _src(1024, 1024, 1024, {"tensor_core": 3, "tiles": (4, 16, 64, 4, 16)})
    assert "__launch_bounds__(256, 1)" in big.text and big.launches[0].dynamic_shared_bytes > 48 * 1024
    small = _src(1024, 1024, 1024, {"tensor_core": 3, "tiles": (2, 8, 64, 4, 16)})
    assert "__launch_bounds__(256, 2)" in small.text     # 16 accumulators: as before


def test_chunk_loop_uses_the_same_index_expressions(monkeypatch):
    """`GEMM_MMA_CHUNK_LOOP`: one 16-k chunk body in a loop over hl_kc (not unrolled) with the chunk offset in the
    fragment expressions; the same mma count per chunk."""
    g = _gemm(4, 16, 32, 4, 32)
    e = mma_index_exprs(g)
    unrolled = "\n".join(gemm_text(g, "acc", "A", "B"))
    monkeypatch.setattr(cuda, "GEMM_MMA_CHUNK_LOOP", True)
    looped = "\n".join(gemm_text(g, "acc", "A", "B"))
    assert "for (int hl_kc = 0; hl_kc < 32; hl_kc += 16)" in looped and "#pragma unroll 1" in looped
    assert "hl_kc" not in unrolled
    assert unrolled.count("hl_mma_tf32(") == 2 * looped.count("hl_mma_tf32(") == 2 * 6
    assert e["a_frag_col"].format(c16="hl_kc + 0") in looped and e["a_frag_col"].format(c16="16") in unrolled
    for k0 in range(4):
        assert e["b_frag_row"].format(k0=f"hl_kc + {k0}") in looped
        assert e["b_frag_row"].format(k0=16 + k0) in unrolled
    # a loop over chunks at BK 16 is the plain text
    g16 = _gemm(4, 16, 32, 4, 16)
    monkeypatch.setattr(cuda, "GEMM_MMA_CHUNK_LOOP", False)
    plain = "\n".join(gemm_text(g16, "acc", "A", "B"))
    monkeypatch.setattr(cuda, "GEMM_MMA_CHUNK_LOOP", True)
    assert "\n".join(gemm_text(g16, "acc", "A", "B")) == plain


def trunc_tf32(x: np.ndarray) -> np.ndarray:
    """What the tensor cores read of a float32 word given as .tf32: its 13 low significand bits dropped."""
    b = np.asarray(x, np.float32).view(np.uint32)
    return (b & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def test_small_trunc_operand_error_bound(monkeypatch):
    """`GEMM_MMA_SMALL_TRUNC`: big = RN-TF32(x), small = x - big (exact in float32) passed unrounded, read truncated:
    |x - big - trunc(small)| = |x - big - RN(small)| for every x (so the same error bound, 2^-22 |x|); the text calls
    hl_split_tf32_t, whose body is that split."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(200_000) * np.exp2(rng.integers(-20, 20, 200_000))).astype(np.float32)
    big = tf32(x)
    small = np.asarray(x, np.float64) - big
    assert np.array_equal(small, (x - big.astype(np.float32)).astype(np.float64))    # exact in float32
    xd = x.astype(np.float64)
    e_trunc = np.abs(xd - big - trunc_tf32(small)) / np.abs(xd)
    e_rna = np.abs(xd - big - tf32(small)) / np.abs(xd)
    # |small| <= half an ulp of big: at most 12 significant bits, so TF32 (11) loses at most its last bit either way:
    # the same error magnitude (a tie, rounded away by cvt.rna, truncated toward zero), the opposite sign
    assert e_rna.max() <= 2.0 ** -22
    np.testing.assert_array_equal(e_trunc, e_rna)
    assert (trunc_tf32(small) != tf32(small)).mean() > 0.2
    monkeypatch.setattr(cuda, "GEMM_MMA_SMALL_TRUNC", True)
    text = "\n".join(gemm_text(_gemm(4, 16, 32, 4, 16), "acc", "A", "B"))
    assert "hl_split_tf32_t(" in text and "hl_split_tf32(" not in text
    body = cuda.MMA_PRELUDE.split("hl_split_tf32_t(float x, unsigned& big, unsigned& small) {")[1].split("}")[0]
    assert "big = hl_tf32(x);" in body and "small = __float_as_uint(x - __uint_as_float(big));" in body


def _ptxas(text: str, tmp_path) -> tuple[int, int]:
    from hlotune.codegen.cuda_runtime import NVCC_OPTIONS

    p = os.path.join(tmp_path, "k.cu")
    with open(p, "w") as f:
        f.write(text)
    r = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-Xptxas", "-v", *NVCC_OPTIONS, "-o",
                        os.path.join(tmp_path, "k.cubin"), p], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:2000]
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spill = int(re.search(r"(\d+) bytes spill stores", r.stderr).group(1))
    return regs, spill


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("what", ["default 1024", "4x16 bk32 loop", "4x16/64x4 trunc"])
def test_new_variants_compile_without_spills(what, tmp_path, monkeypatch):
    if what == "default 1024":
        text = _src(1024, 1024, 1024).text
    elif what == "4x16 bk32 loop":
        monkeypatch.setattr(cuda, "GEMM_MMA_CHUNK_LOOP", True)
        text = _src(1024, 1024, 1024, {"tensor_core": 3, "tiles": (4, 16, 32, 4, 32)}).text
    else:
        monkeypatch.setattr(cuda, "GEMM_MMA_SMALL_TRUNC", True)
        text = _src(1024, 1024, 1024, {"tensor_core": 3, "tiles": (4, 16, 64, 4, 16)}).text
    assert "3xTF32 tensor cores" in text
    regs, spill = _ptxas(text, str(tmp_path))
    assert spill == 0 and regs <= 255, (what, regs, spill)


def test_gemm_dataclass_default_is_static():
    g = _Gemm("A", "B", "acc", 128, 32, 64, 128, 32, 32, 4, 8, 128, 0, 0)
    assert g.smem_off == -1
