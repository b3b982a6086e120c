"""FFMA GEMM template for big register tiles (8x16 / 16x8 outputs per thread, 256 threads, one block per SM; issue #7,
session 10).

Map:
  simt_fits(g)                 whether a `cuda._Gemm` FFMA tiling suits this template (see the design)
  simt_shared_bytes(g, st)     its shared memory: a ring of st (A^T, B) stages, or the tile exchange if larger
  simt_stages(g, want, lim)    the stages it takes (at most `want`, at least 2, within `lim` bytes; 0: does not fit)
  simt_raster(g, group)        the C expression of the block index the kernel runs as (grouped rasterization), or None
  simt_quad(g)                 thread (ty, tx)'s accumulator (i, j) -> its output (row, column) in the K loop
  simt_text(g, acc, a, b, block_pointers)  the CUDA C lines that replace the K-tile loop

Design (H200, session 10, logs/gpu_s10f, docs/gpu.md "Session 10: FFMA GEMM"): 128x256x16 tiles, 8x16 per thread.
  * The K loop computes each thread's outputs in quads: rows ty 4 + (i / 4) BM / (MR / 4) + i % 4, columns
    tx 4 + (j / 4) BN / (NR / 4) + j % 4 (`simt_quad`), so per k a thread reads MR / 4 float4 of A^T and NR / 4 float4
    of B from plain (unpermuted) shared tiles, a warp's consecutive float4s: MR NR FFMAs against (MR + NR) / 4 LDS.128.
  * The generic epilogue wants the loop nest's outputs, rows (tid / TJ) MR + [0, MR) and columns (tid % TJ) NR +
    [0, NR), in acc[i NR + j].  The tile moves between the two layouts through shared memory, once before the K loop
    (whatever the loop nest initialized acc to) and once after it: every thread stores its float4s, a barrier, every
    thread loads its float4s of the other layout, a barrier (BM x (BN + 4) floats, the ring's memory).  Every output
    is the same k-ordered FFMA chain as the other FFMA templates' (bitwise the same results).
  * B: a ring of `stages` stages filled by 16-byte cp.async; A: float4 __ldg into registers at the top of the K tile
    (tile kt + stages - 1), stored transposed (4 STS.32 per float4) into its ring slot after the tile's FFMAs (that slot
    was last read in tile kt - 1, before this tile's barrier, and is next read in tile kt + stages - 1, after its
    barrier).  One barrier per K tile; `__launch_bounds__(T, 1)` (about 230 registers, no spill).
  * Grouped rasterization (`simt_raster`): consecutive blocks walk a group of `group` tile rows column by column, so
    the blocks resident at once share B's columns in L2 (+1.7 % for 8x8 tiles; within noise for 8x16).
  * Measured (interleaved with cuBLAS float32 at 4096^3): the prototype of this exchange 97.2-97.5 % of cuBLAS, the
    same K loop storing its quads directly 98.7 %; tried first and removed: the shared tiles stored permuted so that
    the K loop itself computes the loop nest's layout (the same SASS K loop, 86.5 %; swizzled writes 82 %).
"""

from __future__ import annotations


def simt_fits(g) -> bool:
    """FFMA tilings this template takes: MR x NR of 8x16 or 16x8, 256 threads, BK 8 or 16, whole warps over whole
    thread rows (TJ divides 32), both tiles in whole float4s per thread, at least two K tiles."""
    tj = g.bn // g.nr
    return (not g.mma and (g.mr, g.nr) in ((8, 16), (16, 8)) and g.threads == 256 and g.bk in (8, 16)
            and 32 % tj == 0 and (g.bm * g.bk // 4) % g.threads == 0 and (g.bk * g.bn // 4) % g.threads == 0
            and g.k % g.bk == 0 and g.k // g.bk >= 2)


def simt_shared_bytes(g, st: int) -> int:
    return max(4 * st * (g.bk * (g.bm + 4) + g.bk * g.bn), 4 * g.bm * (g.bn + 4))


def simt_stages(g, want: int, limit: int) -> int:
    st = min(want, g.k // g.bk + 1)
    while st >= 2 and simt_shared_bytes(g, st) > limit:
        st -= 1
    return st if st >= 2 else 0


def simt_raster(g, group: int) -> str | None:
    """The block index as a C expression of blockIdx.x: within each batch, groups of `group` tile rows, the
    blocks of a group column by column (tile (bi, bj) of group gi runs as block gi group NBJ + bj group + bi % group).
    None where it does not apply (group < 2, the tile rows not a multiple of group, a single tile column)."""
    nbi, nbj = g.m // g.bm, g.n // g.bn
    if group < 2 or nbi % group or nbj < 2:
        return None
    p = group * nbj
    return f"((blockIdx.x / {p}) * {p} + (blockIdx.x % {group}) * {nbj} + (blockIdx.x % {p}) / {group})"


def simt_quad(g):
    """(ty, tx, i, j) -> (row, column) in the block tile of accumulator acc[i NR + j] of thread (ty, tx) in the K
    loop (the loop nest's own layout is (ty MR + i, tx NR + j))."""
    ni4, nj4 = g.mr // 4, g.nr // 4
    return lambda ty, tx, i, j: (ty * 4 + (i // 4) * (g.bm // ni4) + i % 4, tx * 4 + (j // 4) * (g.bn // nj4) + j % 4)


def _exchange(g, acc: str, to_quad: bool) -> list[str]:
    """acc from the loop nest's layout into the quad layout (or back) through hl_S[BM][BN + 4]."""
    mr, nr, ni4, nj4, bm, bn = g.mr, g.nr, g.mr // 4, g.nr // 4, g.bm, g.bn
    ld = bn + 4

    def nest(i: int, j4: int) -> str:
        return f"(hl_ty * {mr} + {i}) * {ld} + hl_tx * {nr} + {4 * j4}"

    def quad(i: int, j4: int) -> str:
        return f"(hl_ty * 4 + {(i // 4) * (bm // ni4) + i % 4}) * {ld} + hl_tx * 4 + {j4 * (bn // nj4)}"

    src, dst = (nest, quad) if to_quad else (quad, nest)
    o = []
    for i in range(mr):
        for j4 in range(nj4):
            v = ", ".join(f"{acc}[{i * nr + 4 * j4 + e}]" for e in range(4))
            o.append(f"  *(float4*)&hl_S[{src(i, j4)}] = make_float4({v});")
    o.append("  __syncthreads();")
    for i in range(mr):
        for j4 in range(nj4):
            o.append(f"  {{ const float4 t = *(const float4*)&hl_S[{dst(i, j4)}]; " + " ".join(
                f"{acc}[{i * nr + 4 * j4 + e}] = t.{x};" for e, x in enumerate("xyzw")) + " }")
    return o + ["  __syncthreads();"]


def simt_text(g, acc: str, a: str, b: str, block_pointers: list[str]) -> list[str]:
    """The K-tile loop as this template (see the map); `g.stages` ring stages at byte g.smem_off of the kernel's
    dynamic shared memory hl_smem (a static array when g.smem_off < 0); `block_pointers` set hl_tid, hl_A, hl_B."""
    st, kt, bk, bm, bn, mr, nr, t_ = g.stages, g.k // g.bk, g.bk, g.bm, g.bn, g.mr, g.nr, g.threads
    tj = bn // nr
    ni4, nj4 = mr // 4, nr // 4
    ap = bm + 4
    la, lb = bm * bk // 4 // t_, bk * bn // 4 // t_     # float4 of A / 16-byte chunks of B per thread per tile
    ka, nb4 = bk // 4, bn // 4
    if g.smem_off >= 0:
        decl = [f"  float* hl_S = reinterpret_cast<float*>(hl_smem + {g.smem_off});"]
    else:
        decl = [f"  __shared__ __align__(16) float hl_S[{simt_shared_bytes(g, st) // 4}];"]
    decl += [f"  float (*hl_As)[{bk}][{ap}] = reinterpret_cast<float (*)[{bk}][{ap}]>(hl_S);",
             f"  float (*hl_Bs)[{bk}][{bn}] = reinterpret_cast<float (*)[{bk}][{bn}]>(hl_S + {st * bk * ap});"]
    o = [f"{{  // GEMM template (FFMA, cuda_simt): {bm}x{bn}x{bk} tile, {mr}x{nr} per thread in quads, {st}-stage "
         "ring (B cp.async, A^T through registers), the tile exchanged through shared memory",
         *decl, *block_pointers,
         f"  const int hl_ty = hl_tid / {tj}, hl_tx = hl_tid % {tj};",
         f"  float4 hl_ra[{la}];",
         "  // acc: the loop nest's layout -> quads",
         *_exchange(g, acc, True)]

    def ldg_a(kexpr: str) -> list[str]:
        return [f"      {{ const int q = hl_tid + {u * t_}; hl_ra[{u}] = __ldg((const float4*)(hl_A + (long long)"
                f"(q / {ka}) * {g.ka} + {kexpr} * {bk} + (q % {ka}) * 4)); }}" for u in range(la)]

    def sts_a(sexpr: str) -> list[str]:
        return [f"      {{ const int q = hl_tid + {u * t_}, r = q / {ka}, c = (q % {ka}) * 4; "
                + " ".join(f"hl_As[{sexpr}][c + {v}][r] = hl_ra[{u}].{x};" for v, x in enumerate("xyzw")) + " }"
                for u in range(la)]

    def cp_b(kexpr: str, sexpr: str) -> list[str]:
        return [f"      {{ const int q = hl_tid + {u * t_}; hl_cp16(&hl_Bs[{sexpr}][q / {nb4}][(q % {nb4}) * 4], "
                f"hl_B + (long long)({kexpr} * {bk} + q / {nb4}) * {g.n} + (q % {nb4}) * 4); }}" for u in range(lb)]

    for s0 in range(st - 1):
        o += ["  {", *ldg_a(str(s0)), *sts_a(str(s0)), *cp_b(str(s0), str(s0)), "  }", "  hl_cp_commit();"]
    o += ["  int hl_cur = 0, hl_nxt = " + str(st - 1) + ";",
          f"  for (int hl_kt = 0; hl_kt < {kt}; ++hl_kt) {{",
          f"    hl_cp_wait<{st - 2}>();",
          "    __syncthreads();",
          f"    const bool hl_more = hl_kt + {st - 1} < {kt};",
          "    if (hl_more) {",
          *ldg_a(f"(hl_kt + {st - 1})"), *cp_b(f"(hl_kt + {st - 1})", "hl_nxt"),
          "    }",
          "    hl_cp_commit();",
          "    #pragma unroll",
          f"    for (int hl_kk = 0; hl_kk < {bk}; ++hl_kk) {{",
          f"      float hl_a[{mr}], hl_b[{nr}];"]
    for v in range(ni4):
        o.append(f"      {{ const float4 t = *(const float4*)&hl_As[hl_cur][hl_kk][hl_ty * 4 + {v * (bm // ni4)}]; "
                 f"hl_a[{4 * v}] = t.x; hl_a[{4 * v + 1}] = t.y; hl_a[{4 * v + 2}] = t.z; hl_a[{4 * v + 3}] = t.w; }}")
    for v in range(nj4):
        o.append(f"      {{ const float4 t = *(const float4*)&hl_Bs[hl_cur][hl_kk][hl_tx * 4 + {v * (bn // nj4)}]; "
                 f"hl_b[{4 * v}] = t.x; hl_b[{4 * v + 1}] = t.y; hl_b[{4 * v + 2}] = t.z; hl_b[{4 * v + 3}] = t.w; }}")
    o += ["      #pragma unroll",
          f"      for (int i = 0; i < {mr}; ++i) {{",
          "        #pragma unroll",
          f"        for (int j = 0; j < {nr}; ++j) {acc}[i * {nr} + j] = {acc}[i * {nr} + j] + hl_a[i] * hl_b[j];",
          "      }",
          "    }",
          "    if (hl_more) {", *sts_a("hl_nxt"), "    }",
          f"    hl_cur = hl_cur == {st - 1} ? 0 : hl_cur + 1;",
          f"    hl_nxt = hl_nxt == {st - 1} ? 0 : hl_nxt + 1;",
          "  }",
          "  hl_cp_wait<0>();",
          "  __syncthreads();",
          "  // acc: quads -> the loop nest's layout (for the generic epilogue)",
          *_exchange(g, acc, False),
          "}"]
    return o
