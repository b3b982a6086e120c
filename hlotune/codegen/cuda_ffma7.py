"""FFMA GEMM template for 128-thread blocks of 128x128 tiles (issue #7, session 7).

Map:
  ffma7_fits(g)             whether a `cuda._Gemm` tiling suits this template: 128 threads, 128x128 block tiles, 8x16
                            or 16x8 per thread, BK 8 or 16, the ring and the move within the static shared limit
  ffma7_stages(g, limit)    the cp.async stages it takes (3 at BK 8, 2 at BK 16 within 48 KB)
  ffma7_shared_bytes(g, st) its shared memory: the ring, or a quarter block tile for the move after the K loop
  ffma7_text(g, acc, a, b)  the CUDA C lines that replace the K-tile loop

The layout follows cuBLAS's sm80 FFMA kernels: 2 x 2 warps of 64x64 outputs each; a thread's 8x16 (16x8) tile is
MR/4 x NR/4 quads of 4x4 (rows warp row * 64 + qi * 64/(MR/4) + ly * 4, columns warp column * 64 + qj * 64/(NR/4)
+ lx * 4), so per k it reads MR/4 + NR/4 float4 fragments (a warp: one shared-memory wavefront each, broadcast),
the next k's fragments before the current k's FFMAs (the next tile's first k after the barrier inside the tile's
last k).  A is copied transposed into shared memory by 4-byte cp.async (rows padded by 4 floats: no write
conflicts), B verbatim by 16-byte ones, a ring of S stages with one barrier per K tile.  After the K loop the tile
moves through shared memory (a quarter of the block tile per pass: the rows = u mod 4) into the loop nest's register
tile `acc` (rows (tid / TJ) * MR + i, columns (tid % TJ) * NR + j), which the generic epilogue stores; every output
is the same k-ordered sum as the in-place template's (`cuda.gemm_text`).
"""

from __future__ import annotations

#: shared-memory bytes a kernel may declare statically (`cuda.STATIC_SHARED_LIMIT`)
_LIMIT = 48 * 1024
_THREADS, _TILE, _WARP = 128, 128, 64


def ffma7_shared_bytes(g, stages: int) -> int:
    """Shared memory of the template: the ring (A transposed with padded rows, B), or the move's quarter tile."""
    return 4 * max(stages * g.bk * (g.bm + 4 + g.bn), (g.bm // 4) * (g.bn + 4))


def ffma7_stages(g, want: int, limit: int = _LIMIT) -> int:
    """Stages of the cp.async ring: at most `want`, as many as fit in `limit` bytes, no more than K tiles + 1."""
    st = max(2, want)
    while st > 2 and ffma7_shared_bytes(g, st) > limit:
        st -= 1
    return min(st, max(2, g.k // g.bk + 1))


def ffma7_fits(g, limit: int = _LIMIT) -> bool:
    """Whether the tiling of `g` (a `cuda._Gemm`) is this template's: 128 threads, 128x128, 8x16 / 16x8, BK 8 / 16."""
    return (g.threads == _THREADS and g.bm == _TILE and g.bn == _TILE and (g.mr, g.nr) in ((8, 16), (16, 8))
            and g.bk in (8, 16) and ffma7_shared_bytes(g, 2) <= limit)


def _f4(dst: str, src: str, n0: int) -> str:
    return (f"{{ const float4 t = *(const float4*)&{src}; {dst}[{n0}] = t.x; {dst}[{n0 + 1}] = t.y; "
            f"{dst}[{n0 + 2}] = t.z; {dst}[{n0 + 3}] = t.w; }}")


def ffma7_text(g, acc: str, a: str, b: str, stages: int = 3) -> list[str]:
    """CUDA C lines of the template for `g` (see the module map); `acc` the loop nest's register tile, `a`, `b` the
    global operands (row-major (batch.., M, K) and (batch.., K, N) float32)."""
    assert ffma7_fits(g), g
    st = ffma7_stages(g, stages)
    mr, nr, bk = g.mr, g.nr, g.bk
    mq, nq = mr // 4, nr // 4
    rq, cq = _WARP // mq, _WARP // nq            # row / column distance of a thread's quads
    lx = 32 // (rq // 4)                           # lanes across the warp's columns
    ap = g.bm + 4                                  # padded row of the transposed A tile
    tj = g.bn // nr
    kt = g.k // g.bk
    ka, nb4 = bk // 4, g.bn // 4
    sm = ffma7_shared_bytes(g, st) // 4
    from .cuda import _gemm_block_pointers  # here: cuda imports this module

    o = [f"{{  // GEMM template 7: {g.bm}x{g.bn}x{bk} tile, {mr}x{nr} per thread in quads, 128 threads, "
         f"{st}-stage cp.async ring",
         f"  __shared__ __align__(16) float hl_sm[{sm}];",
         f"  float (*hl_As)[{bk}][{ap}] = reinterpret_cast<float (*)[{bk}][{ap}]>(hl_sm);",
         f"  float (*hl_Bs)[{bk}][{g.bn}] = reinterpret_cast<float (*)[{bk}][{g.bn}]>(hl_sm + {st * bk * ap});",
         *_gemm_block_pointers(g, a, b),
         "  const int hl_w = hl_tid >> 5, hl_l = hl_tid & 31;",
         f"  const int hl_ra0 = (hl_w >> 1) * {_WARP} + (hl_l / {lx}) * 4, "
         f"hl_cb0 = (hl_w & 1) * {_WARP} + (hl_l % {lx}) * 4;",
         f"  float hl_c[{mr * nr}];",
         "  #pragma unroll",
         f"  for (int i = 0; i < {mr * nr}; ++i) hl_c[i] = 0.0f;",
         f"  float hl_fa[2][{mr}], hl_fb[2][{nr}];"]

    def issue(kexpr: str, sexpr: str) -> list[str]:
        out = []
        for p in range(bk // 4):      # A: float4 q = tid + p * 128 of the tile: row q / (BK/4), k (q % (BK/4)) * 4
            src = f"hl_A + r * {g.k} + {kexpr} * {bk} + c"
            cps = " ".join(f"hl_cp4(&hl_As[{sexpr}][c + {v}][r], {src} + {v});" for v in range(4))
            out.append(f"    {{ const int q = hl_tid + {p * _THREADS}, r = q / {ka}, c = (q % {ka}) * 4; {cps} }}")
        for p in range(bk // 4):      # B: row q / (BN/4), column (q % (BN/4)) * 4
            out.append(f"    {{ const int q = hl_tid + {p * _THREADS}; hl_cp16(&hl_Bs[{sexpr}][q / {nb4}]"
                       f"[(q % {nb4}) * 4], hl_B + ({kexpr} * {bk} + q / {nb4}) * {g.n} + (q % {nb4}) * 4); }}")
        return out

    def frag(buf: int, sexpr: str, kk: int) -> list[str]:
        out = [f"    {_f4(f'hl_fa[{buf}]', f'hl_As[{sexpr}][{kk}][hl_ra0 + {qi * rq}]', qi * 4)}" for qi in range(mq)]
        return out + [f"    {_f4(f'hl_fb[{buf}]', f'hl_Bs[{sexpr}][{kk}][hl_cb0 + {qj * cq}]', qj * 4)}"
                      for qj in range(nq)]

    def ffma(buf: int) -> list[str]:
        return ["    #pragma unroll",
                f"    for (int i = 0; i < {mr}; ++i) {{",
                "      #pragma unroll",
                f"      for (int j = 0; j < {nr}; ++j) hl_c[i * {nr} + j] = hl_c[i * {nr} + j] + "
                f"hl_fa[{buf}][i] * hl_fb[{buf}][j];",
                "    }"]

    # the ring: tiles 0..S-2 issued up front, tile 0 awaited, tile S-1 issued; at the end of tile kt (before its last
    # k's FFMAs, whose fragments are in registers) tile kt + 1 is awaited (S - 2 newer groups may pend), one barrier
    # (every thread done reading tile kt), tile kt + S issued into tile kt's slot, tile kt + 1's first fragments read
    for s0 in range(st - 1):
        o += (["  {", *issue(str(s0), str(s0)), "  }"] if s0 < kt else []) + ["  hl_cp_commit();"]
    o += [f"  hl_cp_wait<{st - 2}>();", "  __syncthreads();"]
    o += (["  {", *issue(str(st - 1), str(st - 1)), "  }"] if st - 1 < kt else []) + ["  hl_cp_commit();"]
    o += ["  {", *frag(0, "0", 0), "  }",
          "  int hl_cur = 0;",
          f"  for (int hl_kt = 0; hl_kt < {kt}; ++hl_kt) {{"]
    for kk in range(bk - 1):
        o += frag((kk + 1) & 1, "hl_cur", kk + 1) + ffma(kk & 1)
    o += [f"    if (hl_kt + 1 < {kt}) {{",
          f"      hl_cp_wait<{st - 2}>();",
          "      __syncthreads();",
          f"      const int hl_nx = hl_cur == {st - 1} ? 0 : hl_cur + 1;",
          f"      if (hl_kt + {st} < {kt}) {{",
          *["    " + x for x in issue(f"(hl_kt + {st})", "hl_cur")],
          "      }",
          "      hl_cp_commit();",
          *["  " + x for x in frag(0, "hl_nx", 0)],
          "      hl_cur = hl_nx;",
          "    }",
          *ffma((bk - 1) & 1),
          "  }"]
    # the move, in four passes u = 0..3: rows = u (mod 4) of the block tile, through hl_sm as 32 x (BN + 4) (row r at
    # r / 4); hl_c[i * NR + j] is row hl_ra0 + (i / 4) * RQ + i % 4, column hl_cb0 + (j / 4) * CQ + j % 4, acc[i * NR
    # + j] row r0 + i, column c0 + j (r0 a multiple of 8): per pass every thread stores MR / 4 rows of hl_c and loads
    # MR / 4 rows of acc, so no more than MR x NR values are live
    rp = g.bn + 4
    o += [f"  const int hl_r4 = (hl_tid / {tj}) * {mr // 4}, hl_c1 = (hl_tid % {tj}) * {nr};"]
    for u in range(4):
        o.append("  __syncthreads();")
        for i in range(u, mr, 4):
            for qj in range(nq):
                c = ", ".join(f"hl_c[{i * nr + qj * 4 + v}]" for v in range(4))
                o.append(f"  *(float4*)&hl_sm[((hl_ra0 >> 2) + {(i // 4) * (rq // 4)}) * {rp} + hl_cb0 + {qj * cq}] = "
                         f"make_float4({c});")
        o.append("  __syncthreads();")
        for i in range(u, mr, 4):
            for v in range(0, nr, 4):
                o.append(f"  {{ const float4 t = *(const float4*)&hl_sm[(hl_r4 + {i // 4}) * {rp} + hl_c1 + {v}]; "
                         + " ".join(f"{acc}[{i * nr + v + x}] = {acc}[{i * nr + v + x}] + t.{c};"
                                    for x, c in enumerate("xyzw")) + " }")
    return o + ["  __syncthreads();", "}"]
