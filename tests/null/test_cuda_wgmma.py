"""The wgmma 3xTF32 GEMM template (`hlotune.codegen.cuda_wgmma`) without a GPU: the descriptor's fields, the 128-byte
swizzle, and the whole data flow (B's conversion into the swizzled K-major planes, as the generated C text computes
it, read back through an independent model of wgmma's operand and accumulator layouts from the PTX ISA) emulated in
numpy against A @ B; the text compiles for sm_90a where nvcc exists."""

import re
import shutil
import subprocess

import numpy as np
import pytest

import hlotune
import hlotune.codegen.cuda as cuda
import hlotune.schedule_space.default_gpu as dg
from hlotune.codegen.cuda import generate_cuda
from hlotune.codegen.cuda_wgmma import smem_desc, swizzled_offset, wgmma_fits, wgmma_index, wgmma_prelude
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower


def _mm_hlo(m, n, k):
    return (f"HloModule mm\nENTRY main {{\n  a = f32[{m},{k}] parameter(0)\n  b = f32[{k},{n}] parameter(1)\n"
            f"  ROOT d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")


def _source(m, n, k, tiles, monkeypatch):
    monkeypatch.setattr(cuda, "GEMM_WGMMA", True)
    (sg,) = hlotune.load_model(_mm_hlo(m, n, k)).frontend.subgraphs
    cd = sg.workload.compute
    f = lower(cd, default_gpu_schedule(cd, options={"tensor_core": 3, "tiles": tiles}), name="mm")
    return generate_cuda(f)


def test_descriptor_fields():
    # PTX ISA "Matrix Descriptor Format": bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63 swizzle mode
    d = smem_desc(0x1400, sbo=1024, swizzle=1, lbo=16)
    assert d & 0x3FFF == 0x140 and (d >> 16) & 0x3FFF == 1 and (d >> 32) & 0x3FFF == 64 and d >> 62 == 1
    assert (d >> 49) & 7 == 0     # base offset 0: the planes start 1024-byte aligned
    assert smem_desc(0x40000 + 0x20) & 0x3FFF == 2     # (addr & 0x3FFFF) >> 4
    # the prelude's C helper builds the same value (LBO 16, SBO 1024, 128-byte swizzle)
    text = wgmma_prelude([128])
    assert "(1ull << 16)" in text and "(1024 >> 4) << 32" in text and "(1ull << 62)" in text
    assert "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in text


def test_swizzle_128b():
    # the 128-byte swizzle: address bits [4, 7) XOR bits [7, 10) (16-byte chunk ^ row % 8 within 1024-byte atoms)
    for row in range(64):
        for k in range(32):
            lin = row * 128 + 4 * k
            assert swizzled_offset(row, k) == lin ^ (((lin >> 7) & 7) << 4)


def _hw_b_operand(plane: np.ndarray, base: int, n_cols: int) -> np.ndarray:
    """wgmma's B operand (8 x N, K-major, 128-byte swizzle, SBO 1024) read at byte `base` of `plane` (float32 words):
    element (p, n) at logical address base + (n / 8) SBO + (n % 8) 128 + 4 p, swizzled."""
    out = np.zeros((8, n_cols), np.float64)
    for n in range(n_cols):
        for p in range(8):
            lin = base + (n // 8) * 1024 + (n % 8) * 128 + 4 * p
            out[p, n] = plane[(lin ^ (((lin >> 7) & 7) << 4)) // 4]
    return out


def _conversion_items(text: str, nr: int):
    """(f, plane row, chunk, block column, k0) of every conversion item, evaluated from the generated C text."""
    items = []
    heads = re.findall(r"\{ const int f = hl_tid \+ (\d+), (.*?);\n\s*const int (.*?);\n\s*const int k0 = (.*?);\n"
                       r"\s*const float\* hl_src = &hl_Bs\[0\]\[k0\]\[(.*?)\];", text)
    assert heads
    for tid in range(0, 1024):
        for r0, rest, mid, k0e, cole in heads:
            env = {"hl_tid": tid, "f": tid + int(r0)}
            for part in (rest + ", " + mid).split(", "):
                name, expr = part.split(" = ", 1)
                env[name.strip()] = eval(expr.replace("/", "//"), {}, env)
            env["k0"] = eval(k0e.replace("/", "//"), {}, env)
            items.append((env["f"], env["fc"], env["cq"], eval(cole.replace("/", "//"), {}, env), env["k0"]))
    return items


@pytest.mark.parametrize("tiles", [(2, 32, 64, 4, 32), (2, 16, 64, 4, 32), (2, 32, 32, 4, 32)])
def test_data_flow_emulated(tiles, monkeypatch):
    mr, nr, ti, tj, bk = tiles
    bm, bn, t_ = mr * ti, nr * tj, ti * tj
    src = _source(bm, bn, 2 * bk, tiles, monkeypatch)
    text = src.text
    assert f"hl_wgmma_n{bn}(" in text and "wgmma.mma_async" in text
    g = type("G", (), dict(mr=mr, nr=nr, bm=bm, bn=bn, bk=bk, threads=t_, k=64))
    assert wgmma_fits(g)
    ix = wgmma_index(g)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((bm, bk))
    B = rng.standard_normal((bk, bn))
    # B's conversion, as the text computes it: items of the first prologue block (slot 0), T threads x 8 BN / T items
    conv = [it for it in _conversion_items(text.split("hl_cp_wait<")[1], nr) if it[0] < 8 * bn]
    conv = sorted(set(conv))
    assert [it[0] for it in conv] == list(range(8 * bn))
    plane = np.full(bn * 32, np.nan)
    for f, fc, cq, col, k0 in conv:
        assert (fc, cq, col) == ix["conv_item"](f)
        for u in range(4):
            k = k0 + 4 * u
            assert k == ix["k_of"](cq, u)
            plane[(fc * 128 + ((cq ^ (fc & 7)) << 4)) // 4 + u] = B[k, col]
    assert not np.isnan(plane).any()
    # the wgmmas: per warpgroup w (block rows of its threads) and 8-k step q, D += Aop Bop (the PTX layouts)
    acc = np.zeros((t_, mr * nr))
    for w in range(t_ // 128):
        for q in range(bk // 8):
            bop = _hw_b_operand(plane, 32 * q, bn)
            c, s = q // 2, q % 2
            aop = np.zeros((64, 8))
            for m in range(64):
                v, rr = m // 16, m % 16
                gg, h = rr % 8, rr // 8
                for p in range(8):
                    tt, hi = p % 4, p // 4
                    tid = 128 * w + 32 * v + 4 * gg + tt
                    row = (tid >> 2) * mr + h     # the text: f0 = hl_r0 + 0, f1 = hl_r0 + 1 (registers a0..a3)
                    kk = 16 * c + tt * 4 + 2 * s + hi      # float4 at 16 c + 4 t: .x/.z (a0, a1), .y/.w (a2, a3)
                    assert kk == ix["a_k"](c, s, p)
                    aop[m, p] = A[row, kk]
            d = aop @ bop
            for m in range(64):
                v, rr = m // 16, m % 16
                gg, h = rr % 8, rr // 8
                for n in range(bn):
                    j, tt, e = n // 8, (n % 8) // 2, n % 2
                    tid = 128 * w + 32 * v + 4 * gg + tt
                    i = 4 * j + 2 * h + e
                    assert ix["d_pos"](i, tt) == (8 * h, n)
                    acc[tid, ix["acc_index"](0, i)] += d[m, n]
    # the loop nest's register tile: thread tid, acc[i NR + j] = C[(tid / 4) MR + i, (tid % 4) NR + j]
    want = A @ B
    for tid in range(t_):
        blk = want[(tid // 4) * mr:(tid // 4 + 1) * mr, (tid % 4) * nr:(tid % 4 + 1) * nr]
        np.testing.assert_allclose(acc[tid].reshape(mr, nr), blk, rtol=1e-12, atol=1e-12)
    # the text's accumulator adds use the same map
    for i in range(bn // 2):
        assert f"d_local[{ix['acc_index'](0, i)}] += hl_d[0][{i}];" in text


def test_plane_writes_conflict_free():
    # per 8-lane phase of a conversion store: 8 distinct 16-byte bank groups (offset / 16 mod 8)
    for tiles in [(2, 32, 64, 4, 32), (2, 16, 64, 4, 32), (2, 32, 32, 4, 32)]:
        mr, nr, ti, tj, bk = tiles
        g = type("G", (), dict(mr=mr, nr=nr, bm=mr * ti, bn=nr * tj, bk=bk, threads=ti * tj, k=64))
        ix = wgmma_index(g)
        for f0 in range(0, 8 * g.bn, 8):
            offs = [(lambda fc, cq: fc * 128 + ((cq ^ (fc & 7)) << 4))(*ix["conv_item"](f)[:2]) for f in
                    range(f0, f0 + 8)]
            assert len({(o // 16) % 8 for o in offs}) == 8
        for f0 in range(0, 8 * g.bn, 32):   # the raw B reads of a warp: 32 distinct banks
            assert len({ix["conv_item"](f)[2] % 32 for f in range(f0, f0 + 32)}) == 32


def test_fallback_and_flag_off(monkeypatch):
    # flag off: the same tiling is not the wgmma template; tilings it does not take keep the mma template
    (sg,) = hlotune.load_model(_mm_hlo(256, 256, 256)).frontend.subgraphs
    cd = sg.workload.compute
    monkeypatch.setattr(cuda, "GEMM_WGMMA", False)
    f = lower(cd, default_gpu_schedule(cd, options={"tensor_core": 3, "tiles": (2, 32, 64, 4, 32)}), name="mm")
    assert "wgmma" not in generate_cuda(f).text
    monkeypatch.setattr(cuda, "GEMM_WGMMA", True)
    f = lower(cd, default_gpu_schedule(cd, options={"tensor_core": 3, "tiles": (4, 8, 32, 4, 16)}), name="mm")
    t = generate_cuda(f).text
    assert "wgmma" not in t and "hl_mma_tf32(" in t


def test_schedule_picks_wgmma_tiles(monkeypatch):
    assert dg.TENSOR_CORE_WGMMA and cuda.GEMM_WGMMA     # the defaults (H200, session 9)
    assert dg._tensor_core(4096, 512, 512, 1, 1024) == 3       # K 512 = WGMMA_MIN_K (transformer_block's dots)
    assert dg._tensor_core(2048, 2816, 1024, 1, 1024) == 3
    assert dg._tile_sizes(4096, 4096, 4096, 1024, mma=True) == (2, 32, 64, 4, 32)
    assert dg._tile_sizes(2048, 2816, 1024, 1024, mma=True) == (2, 32, 64, 4, 32)
    assert dg._tile_sizes(4096, 512, 512, 1024, mma=True) == (2, 32, 64, 4, 32)
    assert dg._tile_sizes(1024, 1024, 1024, 1024, mma=True) == (2, 16, 64, 4, 32)   # 64 blocks of 128x128: 128x64
    monkeypatch.setattr(dg, "WGMMA_MIN_K", 1024)
    assert dg._tensor_core(4096, 512, 512, 1, 1024) == 0       # below WGMMA_MIN_K: FFMA
    monkeypatch.setattr(dg, "_WGMMA_TILES", dg._WGMMA_TILES[:1])
    assert dg._tile_sizes(1024, 1024, 1024, 1024, mma=True) == (4, 8, 32, 4, 32)    # the mma template's BK 32 tiles
    monkeypatch.setattr(dg, "TENSOR_CORE_WGMMA", False)
    assert dg._tensor_core(4096, 512, 512, 1, 1024) == 0
    assert dg._tile_sizes(4096, 4096, 4096, 1024, mma=True) == (4, 16, 32, 4, 16)


def test_not_on_other_gpus():
    # the schedule offers wgmma tiles only to sm_90 targets (sm_90a code); an sm_80 target keeps the mma tiles
    from hlotune.target import Target
    (sg,) = hlotune.load_model(_mm_hlo(4096, 4096, 4096)).frontend.subgraphs
    cd = sg.workload.compute
    texts = {}
    for arch in ("sm_90", "sm_80"):
        tgt = Target(kind="cuda", name="x", cores=132, arch=arch, max_threads_per_block=1024)
        texts[arch] = generate_cuda(lower(cd, default_gpu_schedule(cd, tgt), name="mm")).text
    assert "wgmma.mma_async" in texts["sm_90"] and "wgmma" not in texts["sm_80"]
    assert "hl_mma_tf32(" in texts["sm_80"]


def test_code_generator_keeps_wgmma_to_sm90(tmp_path):
    """A schedule that asks for the wgmma tiling (a search candidate, whatever its target) gets wgmma code only when
    generated for sm_90; for sm_80 the same loops get code without it, which nvcc compiles for sm_80."""
    (sg,) = hlotune.load_model(_mm_hlo(256, 256, 128)).frontend.subgraphs
    cd = sg.workload.compute
    f = lower(cd, default_gpu_schedule(cd, options={"tensor_core": 3, "tiles": (2, 32, 64, 4, 32)}), name="mm")
    assert "wgmma.mma_async" in generate_cuda(f).text and "wgmma.mma_async" in generate_cuda(f, "sm_90").text
    other = generate_cuda(f, "sm_80").text
    assert "wgmma" not in other
    assert "wgmma.mma_async" in generate_cuda(f).text     # the arch does not stick
    if shutil.which("nvcc"):
        cu = tmp_path / "k.cu"
        cu.write_text(other)
        r = subprocess.run(["nvcc", "-arch=sm_80", "-cubin", str(cu), "-o", str(tmp_path / "k.cubin")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_compiles_sm90a(monkeypatch, tmp_path):
    src = _source(256, 256, 128, (2, 32, 64, 4, 32), monkeypatch)
    from hlotune.codegen.cuda_runtime import kernel_arch
    assert kernel_arch(src.text, "sm_90") == "sm_90a" and kernel_arch("int x;", "sm_90") == "sm_90"
    p = tmp_path / "k.cu"
    p.write_text(src.text)
    r = subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-O3", "--std=c++17", "-Xptxas", "-v", "-o",
                        str(tmp_path / "k.cubin"), str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stderr and "serialized" not in r.stderr


def test_vectorized_epilogue(monkeypatch):
    # the wgmma tilings store each thread's 32 consecutive columns as float4s, the mma tilings theirs too
    # (VEC_EPILOGUE_MMA, on) and scalar stores without it; the accumulator layout of the template is unchanged
    (sg,) = hlotune.load_model(_mm_hlo(2048, 2816, 1024)).frontend.subgraphs
    cd = sg.workload.compute
    t = generate_cuda(lower(cd, default_gpu_schedule(cd), name="mm")).text
    assert "wgmma.mma_async" in t and t.count("vectorized x4") == 1 and "__stcs((float4*)&d[" in t
    assert "d_local[(i0_2) * 32 + ((i1_2_0 * 4) + 3)]" in t
    monkeypatch.setattr(dg, "VEC_EPILOGUE_WGMMA", False)
    t2 = generate_cuda(lower(cd, default_gpu_schedule(cd), name="mm")).text
    assert "wgmma.mma_async" in t2 and "vectorized" not in t2
    (sg,) = hlotune.load_model(_mm_hlo(1024, 1024, 1024)).frontend.subgraphs
    cd = sg.workload.compute
    monkeypatch.setattr(dg, "TENSOR_CORE_WGMMA", False)     # the mma template for this dot
    monkeypatch.setattr(dg, "VEC_EPILOGUE_MMA", False)
    t3 = generate_cuda(lower(cd, default_gpu_schedule(cd), name="mm")).text
    assert "hl_mma_tf32(" in t3 and "vectorized" not in t3
    monkeypatch.setattr(dg, "VEC_EPILOGUE_MMA", True)
    t4 = generate_cuda(lower(cd, default_gpu_schedule(cd), name="mm")).text
    assert "hl_mma_tf32(" in t4 and "vectorized x4" in t4
