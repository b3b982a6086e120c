"""The GEMM template on tensor cores (3xTF32 mma.sync, `codegen.cuda._gemm_mma_text`) without a GPU: an emulation of
the emitted index expressions (the cp.async copies into the padded / swizzled shared tiles, each lane's fragment
loads, the mma.m16n8k8 .tf32 fragment layout of the PTX ISA, the accumulator each C register lands in) reproduces
numpy's matmul at every thread's own accumulators acc[i NR + j] = C[r0 + i, c0 + j], the loop nest's mapping, for
several tilings; the shared-memory reads are bank-conflict free where the template says so; the schedule step (a
("tensor_core", 3) pragma on the K-tile loop) round-trips and reaches the template; the text compiles for sm_90
with the local nvcc (skipped without it)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import hlotune
from hlotune.codegen import cuda
from hlotune.codegen.cuda import _Gemm, _mma_fits, _mma_gemm, gemm_text, generate_cuda, mma_index_exprs
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.steps import (
    Pragma,
    Schedule,
    parse_schedule,
    parse_step,
    schedule_from_json,
    schedule_to_json,
    step_str,
)

NVCC = shutil.which("nvcc")

# ---- the PTX ISA layout of mma.m16n8k8 with .tf32 operands (g = lane >> 2, t = lane & 3), written independently
# of the code generator: register -> (row, column) of the 16x8 A, 8x8 B (row = k, column = n), 16x8 C / D fragment
A_LAYOUT = {"a0": lambda g, t: (g, t), "a1": lambda g, t: (g + 8, t), "a2": lambda g, t: (g, t + 4),
            "a3": lambda g, t: (g + 8, t + 4)}
B_LAYOUT = {"b0": lambda g, t: (t, g), "b1": lambda g, t: (t + 4, g)}
C_LAYOUT = {"c0": lambda g, t: (g, 2 * t), "c1": lambda g, t: (g, 2 * t + 1), "c2": lambda g, t: (g + 8, 2 * t),
            "c3": lambda g, t: (g + 8, 2 * t + 1)}


def _mma(a_regs: list[dict], b_regs: list[dict]) -> list[dict]:
    """One warp's mma: per lane its a0..a3 and b0, b1 -> per lane its c0..c3 of A (16x8) @ B (8x8)."""
    fa, fb = np.full((16, 8), np.nan), np.full((8, 8), np.nan)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for r, pos in A_LAYOUT.items():
            fa[pos(g, t)] = a_regs[lane][r]
        for r, pos in B_LAYOUT.items():
            fb[pos(g, t)] = b_regs[lane][r]
    assert not np.isnan(fa).any() and not np.isnan(fb).any()
    d = fa @ fb
    return [{r: d[pos(lane >> 2, lane & 3)] for r, pos in C_LAYOUT.items()} for lane in range(32)]


def _ev(expr: str, env: dict) -> int:
    """A C index expression of the template evaluated for non-negative ints (C's `/` is Python's `//`)."""
    return int(eval(expr.replace("/", "//"), {}, dict(env)))


def _gemm(mr, nr, ti, tj, bk, m=None, n=None, k=None) -> _Gemm:
    bm, bn = mr * ti, nr * tj
    m, n, k = m or bm, n or bn, k or 2 * bk
    return _mma_gemm(_Gemm("A", "B", "acc", m, n, k, bm, bn, bk, mr, nr, ti * tj, 0, 0), 3)


def tf32(x: np.ndarray) -> np.ndarray:
    """x (as float32) rounded to TF32, nearest with ties away (cvt.rna.tf32.f32), written independently."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32).astype(np.float64)


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    big = tf32(x)
    return big, tf32(np.asarray(x, np.float32) - np.asarray(big, np.float32))


def emulate(g: _Gemm, A: np.ndarray, B: np.ndarray, e: dict | None = None) -> np.ndarray:
    """Every thread's accumulators after the template's K loop for one block tile (A: BM x K, B: K x BN), computed
    from the template's own index expressions (or `e`): acc[tid, i * NR + j].  3xTF32: each product as small_A big_B
    + big_A small_B + big_A big_B; B's big / small words from the block's conversion (`GEMM_MMA_B_PLANES`: stage
    chunk b_conv in place, small plane chunk b_small) or split by each warp."""
    e = e or mma_index_exprs(g)
    T, bm, bn, bk = g.threads, g.bm, g.bn, g.bk
    na, nb = bm * bk // 4, bk * bn // 4
    acc = np.zeros((T, g.mr * g.nr))
    lane_env = []
    for tid in range(T):
        env = {"hl_tid": tid}
        env["hl_g"], env["hl_t"] = _ev(e["g"], env), _ev(e["t"], env)
        env["hl_r0"], env["hl_bsw"] = _ev(e["r0"], env), _ev(e["bsw"], env)
        env.update({f"hl_bc{v}": _ev(x, env) for v, x in enumerate(e["bc"])})
        lane_env.append(env)
    for kt in range(g.k // bk):
        sa = np.full((bm, bk + g.pad_a), np.nan)
        sb = np.full((bk, bn), np.nan)
        for q in range(max(na, T)):   # every 16-byte chunk: thread q % T, copy q // T (guarded past the tile)
            if q < na:
                r, c = _ev(e["a_row"], {"q": q}), _ev(e["a_col"], {"q": q})
                assert np.isnan(sa[r, c:c + 4]).all(), "A chunk written twice"
                sa[r, c:c + 4] = A[r, kt * bk + c:kt * bk + c + 4]
            if q < nb:
                r, c = _ev(e["b_row"], {"q": q}), _ev(e["b_col"], {"q": q})
                src = (q % (bn // 4)) * 4
                assert np.isnan(sb[r, c:c + 4]).all(), "B chunk written twice"
                sb[r, c:c + 4] = B[kt * bk + r, src:src + 4]
        if cuda.GEMM_MMA_B_PLANES:    # the block's conversion: chunk q of the stage in place, its small words
            big, small = np.full(bk * bn, np.nan), np.full(bk * bn, np.nan)
            for q in range(nb):
                p, ps = _ev(e["b_conv"], {"q": q}), _ev(e["b_small"], {"q": q})
                assert np.isnan(big[4 * p:4 * p + 4]).all() and np.isnan(small[4 * ps:4 * ps + 4]).all()
                big[4 * p:4 * p + 4], small[4 * ps:4 * ps + 4] = split(sb.reshape(-1)[4 * p:4 * p + 4])
            planes = (big.reshape(bk, bn), small.reshape(bk, bn))
        else:
            planes = split(sb)
        for w in range(T // 32):
            envs = lane_env[32 * w:32 * w + 32]
            for c in range(bk // 16):
                fa = [[sa[_ev(e["a_frag_row"].format(i=i), env),
                          _ev(e["a_frag_col"].format(c16=16 * c), env):][:4] for i in range(g.mr)] for env in envs]
                for s in range(2):
                    bregs = []
                    for env in envs:
                        rows = [_ev(e["b_frag_row"].format(k0=16 * c + 2 * s + x), env) for x in range(2)]
                        vals = [[np.concatenate([pl[rw, env[f"hl_bc{v}"]:env[f"hl_bc{v}"] + 4]
                                                 for v in range(g.nr // 8)]) for rw in rows] for pl in planes]
                        bregs.append(vals)
                    for mi in range(g.mr // 2):
                        a_regs = []
                        for lane in range(32):
                            regs = {}
                            for r, (row, hl) in e["a_regs"].items():
                                regs[r] = fa[lane][_ev(row, {"hl_mi": mi})][2 * s + hl]
                            a_regs.append(regs)
                        a_big = [{r: split(x)[0] for r, x in regs.items()} for regs in a_regs]
                        a_small = [{r: split(x)[1] for r, x in regs.items()} for regs in a_regs]
                        for ni in range(g.nr // 2):
                            b_big, b_small = ([{"b0": bregs[lane][p][0][ni], "b1": bregs[lane][p][1][ni]}
                                               for lane in range(32)] for p in range(2))
                            d = [{r: x + y + z for (r, x), y, z in zip(d0.items(), d1.values(), d2.values())}
                                 for d0, d1, d2 in zip(_mma(a_small, b_big), _mma(a_big, b_small),
                                                       _mma(a_big, b_big))]
                            for lane in range(32):
                                for r, x in e["acc"].items():
                                    acc[32 * w + lane, _ev(x, {"hl_mi": mi, "hl_ni": ni})] += d[lane][r]
    return acc


@pytest.mark.parametrize("tiles", [(2, 16, 64, 4, 16), (4, 16, 32, 4, 16), (2, 8, 64, 4, 16), (4, 8, 16, 4, 32),
                                   (6, 8, 8, 4, 16)])
def test_emulated_fragments_reproduce_matmul_at_the_loop_nests_accumulators(tiles):
    mr, nr, ti, tj, bk = tiles
    g = _gemm(*tiles)
    assert _mma_fits(g) and g.stages >= 2 and g.shared_bytes <= cuda.STATIC_SHARED_LIMIT
    check_emulated_accumulators(g, tiles)
    # the expressions emulated are the ones the template is built from
    text = "\n".join(gemm_text(g, "acc", "A", "B"))
    e = mma_index_exprs(g)
    for x in (e["g"], e["t"], e["r0"], e["bsw"], *e["bc"], e["a_row"], e["a_col"], e["b_row"], e["b_col"],
              *e["acc"].values()):
        assert x in text, x
    assert e["a_frag_row"].format(i=mr - 1) in text and e["b_frag_row"].format(k0=bk - 13) in text
    assert text.count("hl_mma_tf32(") == 3 * 2 * (bk // 16)


def check_emulated_accumulators(g, tiles) -> None:
    """The emulated template's accumulators of every thread equal numpy's matmul at the outputs the loop nest gives
    that thread (what the epilogue stores), on integer A and B values that need both TF32 words."""
    mr, nr, ti, tj, bk = tiles
    rng = np.random.default_rng(sum(tiles))
    A = rng.integers(-4, 5, (g.bm, g.k)).astype(np.float64)
    B = _b_values(rng, (g.k, g.bn))
    want = A @ B
    acc = emulate(g, A, B)
    for tid in range(g.threads):
        r0, c0 = (tid // tj) * mr, (tid % tj) * nr
        np.testing.assert_array_equal(acc[tid].reshape(mr, nr), want[r0:r0 + mr, c0:c0 + nr], err_msg=f"tid {tid}")


def _b_values(rng, shape) -> np.ndarray:
    """Integers plus multiples of 2^-10: TF32's big word (11 significant bits) cannot hold them alone, big + small
    can (exactly), so a small word from the wrong place changes the result."""
    return rng.integers(-4, 5, shape) + rng.integers(0, 1024, shape) / 1024.0


@pytest.mark.parametrize("planes", [True, False])
def test_emulated_b_split_matches_with_and_without_planes(planes, monkeypatch):
    monkeypatch.setattr(cuda, "GEMM_MMA_B_PLANES", planes)
    g = _gemm(2, 8, 32, 4, 16)
    assert ("hl_Bsm" in "\n".join(gemm_text(g, "acc", "A", "B"))) == planes
    assert g.shared_bytes == 4 * (g.stages * (g.bm * (g.bk + g.pad_a) + g.bk * g.bn) + planes * g.bk * g.bn)
    rng = np.random.default_rng(5)
    A, B = rng.integers(-4, 5, (g.bm, g.k)).astype(float), _b_values(rng, (g.k, g.bn))
    assert not np.array_equal(tf32(B), B)
    acc = emulate(g, A, B)
    np.testing.assert_array_equal(acc[0].reshape(2, 8), (A @ B)[0:2, 0:8])


@pytest.mark.parametrize("what", ["bc", "b_small"])
def test_a_wrong_index_is_caught(what, monkeypatch):
    """The emulation fails for a template whose B fragment columns are one thread row off, or whose small words
    land one chunk off in the small plane (`GEMM_MMA_B_PLANES`)."""
    monkeypatch.setattr(cuda, "GEMM_MMA_B_PLANES", what == "b_small")
    g = _gemm(2, 8, 32, 4, 16)
    e = mma_index_exprs(g)
    if what == "bc":
        bad = dict(e, bc=[x.replace("(hl_g & 1)", "((hl_g + 1) & 1)") for x in e["bc"]])
    else:
        bad = dict(e, b_small=f"({e['b_small']}) ^ 1")
    rng = np.random.default_rng(3)
    A, B = rng.integers(-4, 5, (g.bm, g.k)).astype(float), _b_values(rng, (g.k, g.bn))
    acc = emulate(g, A, B, bad)
    assert not np.array_equal(acc[0].reshape(2, 8), (A @ B)[0:2, 0:8])


def _banks(addrs: list[int]) -> int:
    """Shared-memory wavefronts of one quarter warp's float4 reads (4-byte words; 32 banks)."""
    words = {}
    for a in addrs:
        for x in range(4):
            words.setdefault((a + x) % 32, set()).add((a + x) // 32)
    return max(len(v) for v in words.values())


@pytest.mark.parametrize("tiles", [(2, 16, 64, 4, 16), (4, 16, 32, 4, 16), (2, 8, 64, 4, 16)])
def test_fragment_reads_are_bank_conflict_free(tiles):
    g = _gemm(*tiles)
    e = mma_index_exprs(g)
    ka = g.bk + g.pad_a
    for phase in range(4):
        envs = []
        for lane in range(8 * phase, 8 * phase + 8):
            env = {"hl_tid": lane}
            env["hl_g"], env["hl_t"] = _ev(e["g"], env), _ev(e["t"], env)
            env["hl_r0"], env["hl_bsw"] = _ev(e["r0"], env), _ev(e["bsw"], env)
            env.update({f"hl_bc{v}": _ev(x, env) for v, x in enumerate(e["bc"])})
            envs.append(env)
        for i in range(g.mr):
            a = [_ev(e["a_frag_row"].format(i=i), v) * ka + _ev(e["a_frag_col"].format(c16=0), v) for v in envs]
            assert _banks(a) == 1, ("A", phase, i)
        for k0 in range(4):
            for v in range(g.nr // 8):
                b = [_ev(e["b_frag_row"].format(k0=k0), x) * g.bn + x[f"hl_bc{v}"] for x in envs]
                assert _banks(b) == 1, ("B", phase, k0, v)


_MM = ("HloModule mm\nENTRY m {{\n  a = f32[{m},{k}] parameter(0)\n  b = f32[{k},{n}] parameter(1)\n"
       "  ROOT d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")


def _mm(m, k, n):
    (sg,) = hlotune.load_model(_MM.format(m=m, k=k, n=n)).frontend.subgraphs
    return sg.workload.compute


def test_schedule_step_round_trips_and_reaches_the_template():
    cd = _mm(256, 64, 128)
    steps = default_gpu_schedule(cd, options={"tiles": (2, 16, 64, 4, 16), "tensor_core": 3})
    prag = [s for s in steps if isinstance(s, Pragma)]
    assert prag == [Pragma("d.local", "r0.0", "tensor_core", 3)]
    assert parse_step(step_str(prag[0])) == prag[0]
    sch = Schedule("k", tuple(steps))
    assert parse_schedule(str(sch)).steps == sch.steps and schedule_from_json(schedule_to_json(sch)).steps == sch.steps
    f = lower(cd, steps, name="mm")
    assert any(dict(x.annotations).get("tensor_core") == 3 for x in _loops(f.body))
    text = generate_cuda(f).text
    assert "3xTF32 tensor cores" in text and "hl_mma_tf32(" in text and "cvt.rna.tf32.f32" in text
    # plain TF32 (1 pass) and FFMA (0 / no pragma) from the same tiles
    one = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": (2, 16, 64, 4, 16), "tensor_core": 1}),
                              name="mm")).text
    assert "TF32 tensor cores" in one and "3xTF32" not in one and "hl_split_tf32(" not in one.split("GEMM template")[1]
    off = default_gpu_schedule(cd, options={"tiles": (2, 16, 64, 4, 16), "tensor_core": 0})
    assert not any(isinstance(s, Pragma) for s in off)
    assert "tensor cores" not in generate_cuda(lower(cd, off, name="mm")).text


def _loops(s):
    from hlotune.schedule_space.loop_ir import For, walk_stmts
    return [x for x in walk_stmts(s) if isinstance(x, For)]


def test_pragma_on_a_tiling_the_mma_template_cannot_take_keeps_ffma():
    cd = _mm(256, 64, 128)
    for tiles in ((4, 4, 8, 32, 16), (2, 16, 64, 4, 8), (2, 4, 64, 4, 16)):   # TJ 32; BK 8; NR 4
        if 256 % (tiles[0] * tiles[2]):
            continue
        text = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles, "tensor_core": 3}),
                                   name="mm")).text
        assert "GEMM template" in text and "tensor cores" not in text, tiles


def test_default_uses_tensor_cores_for_big_dots_only():
    big = default_gpu_schedule(_mm(1024, 1024, 1024))
    assert any(isinstance(s, Pragma) and s.name == "tensor_core" for s in big)
    small = default_gpu_schedule(_mm(256, 64, 128))
    assert not any(isinstance(s, Pragma) and s.name == "tensor_core" for s in small)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA C is generated but not compiled")
@pytest.mark.parametrize("tiles,passes", [((2, 16, 64, 4, 16), 3), ((4, 8, 16, 4, 32), 1)])
def test_mma_template_compiles_for_sm90(tiles, passes, tmp_path, monkeypatch):
    from hlotune.codegen.cuda_runtime import compile_cubin

    monkeypatch.setenv("HLOTUNE_CACHE_DIR", str(tmp_path))
    cd = _mm(256, 64, 128)
    text = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles, "tensor_core": passes}),
                               name="mm")).text
    assert "tensor cores" in text
    assert compile_cubin(text, "sm_90")[:4] == b"\x7fELF"


def test_gpu_search_space_mma_knob():
    """Tiled kernels of the GPU sketches have an `mma` knob (0 or 3 where the tiling fits the template, else 0); a
    point with mma = 3 schedules the pragma and generates the tensor-core template."""
    from hlotune.schedule_space.sketch_gpu import KNOBS, _free_domain, generate_gpu_sketches, gpu_steps

    cd = _mm(256, 64, 128)
    sk = next(s for s in generate_gpu_sketches(cd, default=False) if s.kernels[0].shared)
    k = sk.kernels[0]
    fit = {"mr": 2, "nr": 8, "ti": 32, "tj": 4, "bk": 16}
    assert _free_domain(k, "mma", fit) == [0, 3]
    assert _free_domain(k, "mma", dict(fit, tj=8)) == [0] and _free_domain(k, "mma", dict(fit, bk=8)) == [0]
    d = dict(fit, vec=1, kunroll=1, unroll=0, mma=3)
    steps = gpu_steps(sk, (tuple(d[x] for x in KNOBS["tiled"]),))
    assert Pragma("d.local", "r0.0", "tensor_core", 3) in steps
    assert "3xTF32 tensor cores" in generate_cuda(lower(cd, steps, name="mm")).text
    d["mma"] = 0
    steps = gpu_steps(sk, (tuple(d[x] for x in KNOBS["tiled"]),))
    assert not any(isinstance(s, Pragma) and s.name == "tensor_core" for s in steps)


@pytest.mark.parametrize("pair", [False, True])
def test_paired_steps_halve_the_fragment_adds(pair, monkeypatch, tmp_path):
    """`GEMM_MMA_PAIR_STEPS`: the six products of a 16-k chunk's two steps share one zeroed fragment (one FADD per
    C register per chunk instead of two), the same mma count; the emulation (exact sums) still holds and the text
    compiles for sm_90 where nvcc is found."""
    monkeypatch.setattr(cuda, "GEMM_MMA_PAIR_STEPS", pair)
    g = _gemm(4, 16, 32, 4, 16)
    text = "\n".join(gemm_text(g, "acc", "A", "B"))
    assert text.count("hl_mma_tf32(") == 3 * 2 * (g.bk // 16)
    assert text.count("float hl_p0 = 0.0f") == (1 if pair else 2) * (g.bk // 16)
    rng = np.random.default_rng(7)
    A, B = rng.integers(-4, 5, (g.bm, g.k)).astype(float), _b_values(rng, (g.k, g.bn))
    acc = emulate(g, A, B)
    np.testing.assert_array_equal(acc[5].reshape(4, 16), (A @ B)[4:8, 16:32])
    if NVCC is not None:
        from hlotune.codegen.cuda_runtime import compile_cubin

        monkeypatch.setenv("HLOTUNE_CACHE_DIR", str(tmp_path))
        cd = _mm(256, 64, 128)
        src = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": (2, 16, 64, 4, 16),
                                                                        "tensor_core": 3}), name="mm")).text
        assert compile_cubin(src, "sm_90")[:4] == b"\x7fELF"
