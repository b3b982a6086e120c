"""3xTF32 GEMM template on Hopper's warpgroup MMA (wgmma, sm_90a only; issue #7, session 9).

Map:
  wgmma_fits(g)               whether a `cuda._Gemm` tiling suits this template: TJ = 4, MR = 2, NR 16 or 32 (N = 4 NR
                              = 64 or 128 per wgmma), BK 32, whole warpgroups (128 or 256 threads)
  wgmma_shared_bytes(g, st)   its dynamic shared memory: a ring of st raw (A, B) stages, two TF32 planes of B^T
                              (big and small, double-buffered), 1 KB of alignment slack
  wgmma_stages(g, want, lim)  the stages it takes (at most `want`, within `lim` bytes)
  wgmma_index(g)              the index maps the template is built from (B^T plane rows, the conversion's items, the
                              swizzle, the descriptor, the accumulator map), as Python callables for the tests
  wgmma_text(g, acc, a, b)    the CUDA C lines that replace the K-tile loop
  wgmma_prelude(ns)           the device helpers for wgmma shapes m64nNk8 (N in `ns`)
  smem_desc(addr, sbo, swz)   the 64-bit shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format")

Design (one block = WG warpgroups, warpgroup w owning block rows [w 32 MR, (w + 1) 32 MR)):
  * A is copied by cp.async (16-byte chunks, rows padded as the mma template's `_mma_pad_a`), read by each thread as
    float4s of 4 k of its own rows and split into big + small TF32 words in registers (A from registers: the wgmma
    A fragment of m64nNk8 .tf32 is mma.m16n8k8's per warp: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4),
    g = lane / 4, t = lane % 4, rows 16 warp + ...).  Fragment row g (g + 8) of warp v is block row (8 v + g) MR (+ 1),
    so each thread's rows are the loop nest's own (tid / 4) MR + [0, MR).  Fragment k column t (t + 4) of 8-k step
    s of a 16-k chunk c is k = 16 c + 4 t + 2 s (+ 1): a thread's float4 at 16 c + 4 t feeds both steps.
  * B ([K, N] row-major, N contiguous) is copied verbatim by cp.async, then split and transposed once per block into
    two K-major planes (big, small TF32 words) of N rows of 32 k (128 bytes, the 128-byte swizzle: 16-byte chunk q
    of row n at chunk q ^ (n % 8)), read by wgmma through descriptors.  Plane row fc = 8 j + 2 t + e (the wgmma D
    fragment's column: thread t holds columns 8 j + 2 t + {0, 1}) holds block column t NR + 2 j + e, so each
    thread's accumulator columns are the loop nest's t NR + [0, NR).  Plane position 8 q + p of k step q = 2 c + s
    holds k = 16 c + 4 (p % 4) + 2 s + p / 4 (the A side's k order).
  * Per K tile kt: the A fragments, 3 wgmmas per 8-k step (Asmall Bbig, Abig Bsmall, Abig Bbig) into a zeroed
    fragment (scale-d 0 first), one commit; while they run, the wait for tile kt + 1's copies, a barrier, the next
    copies, tile kt + 1's B split into the other planes (+ fence.proxy.async); then wait_group 0, the fragment added
    to the loop nest's accumulators by FADD (round to nearest: the tensor cores' own accumulation truncates), a
    barrier.  Accumulator D of m64nN: d[4 j + 2 h + e] is row 16 warp + g + 8 h, column 8 j + 2 t + e.
"""

from __future__ import annotations

#: the swizzle mode of the planes (PTX ISA: 1 = 128-byte swizzle), their rows (bytes) and 8-row group stride (SBO)
SWIZZLE_128B = 1
ROW_BYTES = 128
SBO = 1024
#: Tried on the H200 and removed (session 9, docs/gpu.md "Session 9: wgmma 3xTF32"): the tensor cores summing 2 k tiles
#: into one fragment before the FADD (124 % of cuBLAS against 130 % at 4096^3), each 8-k step's A words split just
#: before its wgmmas (138.9 % against 140.0 %), and the first K loop with two barriers per tile and the B split and
#: copies not interleaved with the wgmmas (130.9 % against 140.0 %).


def smem_desc(addr: int, sbo: int = SBO, swizzle: int = SWIZZLE_128B, lbo: int = 16) -> int:
    """The wgmma shared-memory matrix descriptor: start address, leading and stride byte offsets (each (x & 0x3FFFF)
    >> 4, bits 0-13, 16-29, 32-45), base offset 0 (bits 49-51: the pattern starts 1024-byte aligned), swizzle mode
    (bits 62-63: 0 none, 1 128B, 2 64B, 3 32B)."""
    enc = (lambda x: (x & 0x3FFFF) >> 4)
    return enc(addr) | (enc(lbo) << 16) | (enc(sbo) << 32) | (swizzle << 62)


def swizzled_offset(row: int, k: int) -> int:
    """Byte offset of element (row, k) of a K-major tf32 plane of 32-k rows under the 128-byte swizzle."""
    return row * ROW_BYTES + (((k // 4) ^ (row % 8)) * 16) + (k % 4) * 4


def wgmma_fits(g) -> bool:
    """The tilings this template takes (see the map)."""
    return (g.bn // g.nr == 4 and g.mr == 2 and g.nr in (16, 32) and g.bk == 32 and g.threads in (128, 256)
            and g.bm == 32 * g.mr * (g.threads // 128) and g.k % g.bk == 0 and g.k // g.bk >= 2
            and (8 * g.bn) % g.threads == 0)


def _pad_a(g) -> int:
    return next((p for p in range(4, 36, 4) if g.mr * (g.bk + p) % 32 == 16), 4)


def _layout(g, st: int) -> tuple[int, int, int, int]:
    """(bytes of one raw A stage, one raw B stage, one plane, the total incl. 1 KB alignment slack)."""
    sa = 4 * g.bm * (g.bk + _pad_a(g))
    sb = 4 * g.bk * g.bn
    plane = 4 * g.bn * g.bk
    return sa, sb, plane, 1024 + 4 * plane + st * (sa + sb)


def wgmma_shared_bytes(g, st: int) -> int:
    return _layout(g, st)[3]


def wgmma_stages(g, want: int, limit: int) -> int:
    """Stages of the raw ring: at most `want`, at least 3 (the loop waits for tile kt + 1 with st - 3 groups in
    flight), within `limit` bytes (0 where 3 do not fit), no more than K tiles + 1."""
    st = max(3, want)
    while st > 3 and wgmma_shared_bytes(g, st) > limit:
        st -= 1
    if wgmma_shared_bytes(g, st) > limit:
        return 0
    return min(st, max(3, g.k // g.bk + 1))


def wgmma_index(g) -> dict:
    """The template's index maps (Python callables over non-negative ints; the text below uses the same formulas):
      plane_col(fc)       block column held by plane row fc (= wgmma D column fc)
      acc(h, fc_local)    -- see acc_index
      acc_index(mt, i)    the loop nest's accumulator index (row 2 mt + h, column t NR + 2 j + e) of D register i
                          (the thread's t is implied: D register i of thread t is column 8 j + 2 t + e)
      d_pos(i, t)         (row in the m64 tile relative to 16 warp + g, D column) of D register i of thread t
      conv_item(f)        conversion item f = tid + T r -> (plane row fc, 16-byte chunk cq, block column col)
      k_of(cq, u)         the tile k of element u of plane chunk cq (positions 4 cq + u)
      a_k(c, s, p)        the tile k of A fragment k column p of step s of 16-k chunk c"""
    nr = g.nr

    def plane_col(fc: int) -> int:
        j, t, e = fc // 8, (fc % 8) // 2, fc % 2
        return t * nr + 2 * j + e

    def acc_index(mt: int, i: int) -> int:
        j, h, e = i // 4, (i // 2) % 2, i % 2
        return (2 * mt + h) * nr + 2 * j + e

    def d_pos(i: int, t: int) -> tuple[int, int]:
        j, h, e = i // 4, (i // 2) % 2, i % 2
        return 8 * h, 8 * j + 2 * t + e

    def conv_item(f: int) -> tuple[int, int, int]:
        pi = f % nr
        t = (f // nr) % 4
        h = f // (4 * nr)
        j, e = pi // 2, pi % 2
        cq = (2 * (j % 4) + h) % 8
        return 8 * j + 2 * t + e, cq, t * nr + pi

    def k_of(cq: int, u: int) -> int:
        q, p = cq // 2, 4 * (cq % 2) + u
        return a_k(q // 2, q % 2, p)

    def a_k(c: int, s: int, p: int) -> int:
        return 16 * c + 4 * (p % 4) + 2 * s + p // 4

    return {"plane_col": plane_col, "acc_index": acc_index, "d_pos": d_pos, "conv_item": conv_item, "k_of": k_of,
            "a_k": a_k}


def wgmma_prelude(ns) -> str:
    """Device helpers: hl_wgmma_n<N>(d, a0..a3, desc, scale_d) = wgmma.mma_async m64nNk8 f32 += tf32 (A from
    registers, B from a descriptor), and the fence / commit / wait / proxy-fence wrappers."""
    out = [r"""
HL_INL void hl_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
HL_INL void hl_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
HL_INL void hl_wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
HL_INL void hl_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
HL_INL void hl_reg_fence(float& x) { asm volatile("" : "+f"(x) :: "memory"); }
HL_INL unsigned long long hl_wg_desc(unsigned addr) {   // 128-byte swizzle, SBO 1024, LBO 16 (unused)
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32)
         | (1ull << 62);
}
"""]
    for n in sorted(set(ns)):
        nd = n // 2
        regs = ", ".join(f"%{i}" for i in range(nd))
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(nd))
        out.append(
            f"HL_INL void hl_wgmma_n{n}(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, "
            "unsigned long long desc, int scale_d) {\n"
            "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" + str(nd + 5) + ", 0;\\n\"\n"
            f"    \"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{regs}}}, "
            f"{{%{nd}, %{nd + 1}, %{nd + 2}, %{nd + 3}}}, %{nd + 4}, p, 1, 1;\\n}}\\n\"\n"
            f"    : {outs}\n"
            "    : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"l\"(desc), \"r\"(scale_d) : \"memory\");\n}\n")
    return "".join(out)


def wgmma_text(g, acc: str, a: str, b: str, block_pointers: list[str]) -> list[str]:
    """The K-tile loop as the wgmma 3xTF32 template (see the map); `g.stages` raw stages at byte g.smem_off of the
    kernel's dynamic shared memory hl_smem; `block_pointers`: the lines that set hl_tid, hl_A, hl_B (the GEMM
    templates' `_gemm_block_pointers`)."""
    st, kt, bk, bn, bm, nr, t_ = g.stages, g.k // g.bk, g.bk, g.bn, g.bm, g.nr, g.threads
    pa = bk + _pad_a(g)
    sa, sb, plane, _ = _layout(g, st)
    na, nb = bm * bk // 4, bk * bn // 4        # 16-byte chunks of a raw tile
    la, lb = max(1, na // t_), max(1, nb // t_)
    ga = f"if (hl_tid < {na}) " if na < t_ else ""
    gb = f"if (hl_tid < {nb}) " if nb < t_ else ""
    nconv = 8 * bn // t_      # plane chunks per thread per tile
    nd = bn // 2              # D registers per wgmma
    mt_n = g.mr // 2
    o = [f"{{  // GEMM template: {bm}x{bn}x{bk} tile, {g.mr}x{nr} per thread, 3xTF32 tensor cores (wgmma m64n{bn}k8 "
         f"sm_90a), {st}-stage cp.async ring, B split into swizzled K-major planes once per block",
         f"  unsigned char* hl_wsm = (unsigned char*)((((unsigned long long)(hl_smem + {g.smem_off})) + 1023ull) "
         "& ~1023ull);",
         f"  unsigned char* hl_wpl = hl_wsm;   // planes: [2 buffers][big, small][{bn} rows][128 bytes]",
         f"  float (*hl_As)[{bm}][{pa}] = reinterpret_cast<float (*)[{bm}][{pa}]>(hl_wsm + {4 * plane});",
         f"  float (*hl_Bs)[{bk}][{bn}] = reinterpret_cast<float (*)[{bk}][{bn}]>(hl_wsm + {4 * plane + st * sa});",
         *block_pointers,
         "  const int hl_t = hl_tid & 3;",
         f"  const int hl_r0 = (hl_tid >> 2) * {g.mr};",
         "  const unsigned hl_pl0 = (unsigned)__cvta_generic_to_shared(hl_wpl);",
         f"  float hl_d[{mt_n}][{nd}];"]

    def issue(kexpr: str, sexpr: str) -> list[str]:
        out = []
        for q in range(la):
            out.append(f"      {ga}{{ const int q = hl_tid + {q * t_}; hl_cp16(&hl_As[{sexpr}][q / {bk // 4}]"
                       f"[(q % {bk // 4}) * 4], hl_A + (q / {bk // 4}) * {g.ka} + {kexpr} * {bk} + "
                       f"(q % {bk // 4}) * 4); }}")
        for q in range(lb):
            out.append(f"      {gb}{{ const int q = hl_tid + {q * t_}; hl_cp16(&hl_Bs[{sexpr}][q / {bn // 4}]"
                       f"[(q % {bn // 4}) * 4], hl_B + ({kexpr} * {bk} + q / {bn // 4}) * {g.n} + "
                       f"(q % {bn // 4}) * 4); }}")
        return out

    def convert_parts(slot: str, pbuf: str) -> tuple[list[str], list[list[str]], list[str]]:
        """(head, one line list per conversion item, tail) of the B split into planes `pbuf`."""
        # item f = tid + T r: pi = f % NR, t = (f / NR) % 4, h = f / (4 NR); j = pi / 2, e = pi % 2;
        # plane row fc = 8 j + 2 t + e, chunk cq = (2 (j % 4) + h) % 8, block column t NR + pi
        head = [f"      {{  // tile's B -> big / small TF32 planes {pbuf} (transposed, K-major, 128-byte swizzle)",
                f"        unsigned char* hl_pb = hl_wpl + {pbuf} * {2 * plane};"]
        items = []
        for r in range(nconv):
            items.append([f"        {{ const int f = hl_tid + {r * t_}, pi = f % {nr}, tt = (f / {nr}) & 3, "
                          f"hh = f / {4 * nr};",
                          "          const int j = pi >> 1, fc = 8 * j + 2 * tt + (pi & 1), "
                          "cq = (2 * (j & 3) + hh) & 7;",
                          "          const int k0 = 16 * (cq >> 2) + 2 * ((cq >> 1) & 1) + (cq & 1);",
                          f"          const float* hl_src = &hl_Bs[{slot}][k0][tt * {nr} + pi];",
                          "          uint4 hl_w, hl_s;",
                          *[f"          hl_split_tf32(hl_src[{4 * u * bn}], hl_w.{c}, hl_s.{c});"
                            for u, c in enumerate("xyzw")],
                          "          const int off = fc * 128 + ((cq ^ (fc & 7)) << 4);",
                          "          *(uint4*)(hl_pb + off) = hl_w;",
                          f"          *(uint4*)(hl_pb + {plane} + off) = hl_s;",
                          "        }"])
        return head, items, ["        hl_fence_async_smem();", "      }"]

    def mmas(slot: str, pbuf: str) -> list[list[str]]:
        """The A fragments and wgmmas of a tile as line lists: [head, step 0, .., step n - 1, tail]."""
        out = ["    {  // A fragments (split in registers), 3 wgmmas per 8-k step into hl_d (zeroed by the first)"]
        for mt in range(mt_n):
            out.append(f"      unsigned hl_ab{mt}[{bk // 8}][4], hl_as{mt}[{bk // 8}][4];")
            for c in range(bk // 16):
                out.append(f"      {{ const float4 f0 = *(const float4*)&hl_As[{slot}][hl_r0 + {2 * mt}]"
                           f"[{16 * c} + hl_t * 4];")
                out.append(f"        const float4 f1 = *(const float4*)&hl_As[{slot}][hl_r0 + {2 * mt + 1}]"
                           f"[{16 * c} + hl_t * 4];")
                for s, (lo, hi) in enumerate((("x", "y"), ("z", "w"))):
                    q = 2 * c + s
                    for r, (row, comp) in enumerate((("f0", lo), ("f1", lo), ("f0", hi), ("f1", hi))):
                        out.append(f"        hl_split_tf32({row}.{comp}, hl_ab{mt}[{q}][{r}], "
                                   f"hl_as{mt}[{q}][{r}]);")
                out.append("      }")
        out += [f"      const unsigned hl_pbig = hl_pl0 + {pbuf} * {2 * plane}, hl_psm = hl_pbig + {plane};"]
        out.append("      hl_wgmma_fence();")
        stepped = [out]
        for q in range(bk // 8):
            stepped.append([])
            out = stepped[-1]
            for mt in range(mt_n):
                for n_, (aa, bb) in enumerate(((f"hl_as{mt}", "hl_pbig"), (f"hl_ab{mt}", "hl_psm"),
                                               (f"hl_ab{mt}", "hl_pbig"))):
                    regs = ", ".join(f"{aa}[{q}][{r}]" for r in range(4))
                    first = q == 0 and n_ == 0
                    scale = "0" if first else "1"
                    out.append(f"      hl_wgmma_n{bn}(hl_d[{mt}], {regs}, hl_wg_desc({bb} + {32 * q}), {scale});")
        stepped.append(["      hl_wgmma_commit();", "    }"])
        return stepped

    add = []
    for mt in range(mt_n):
        for i in range(nd):
            j, h, e = i // 4, (i // 2) % 2, i % 2
            add.append(f"      hl_reg_fence(hl_d[{mt}][{i}]); {acc}[{(2 * mt + h) * nr + 2 * j + e}] += "
                       f"hl_d[{mt}][{i}];")
    return o + _interleaved(g, st, kt, issue, convert_parts, mmas, add)


def _interleaved(g, st: int, kt: int, issue, convert_parts, mmas, add) -> list[str]:
    """The K loop with one barrier per tile: wait for tile kt + 1's copies, a barrier, then per 8-k step the 3
    wgmmas of tile kt, a share of tile kt + 1's B split (into the other planes) and of tile kt + st - 1's copies
    (into the slot of tile kt - 1), then commit, fence.proxy.async, wait_group 0 and the FADDs."""
    ns = g.bk // 8
    cps = issue("hl_nk", "hl_ns")
    head, items, tail = convert_parts("hl_nx", "(hl_pbuf ^ 1)")
    conv = head + [x for it in items for x in it] + tail
    n_items = len(items)
    steps = mmas("hl_cur", "hl_pbuf")
    o = ["  // the ring: tiles 0 .. st - 2 in flight, tile 0's B split into planes 0"]
    for s0 in range(st - 1):
        o += ["  {", *[x.replace("hl_nk", str(s0)).replace("hl_ns", str(s0)) for x in cps], "  }"] if s0 < kt else []
        o.append("  hl_cp_commit();")
    o += [f"  hl_cp_wait<{st - 2}>();", "  __syncthreads();",
          *[x.replace("hl_nx", "0").replace("(hl_pbuf ^ 1)", "0") for x in conv], "  __syncthreads();",
          f"  for (int hl_kt = 0; hl_kt < {kt}; ++hl_kt) {{",
          f"    const int hl_cur = hl_kt % {st}, hl_pbuf = hl_kt & 1, hl_nx = (hl_kt + 1) % {st};",
          f"    const int hl_nk = hl_kt + {st - 1}, hl_ns = hl_nk % {st};",
          f"    if (hl_kt + 1 < {kt}) hl_cp_wait<{st - 3}>();",
          "    __syncthreads();",
          *steps[0]]
    cp_ok = f"hl_nk < {kt}"
    cv_ok = f"hl_kt + 1 < {kt}"
    for q in range(ns):
        o += steps[1 + q]
        mine = items[q * n_items // ns:(q + 1) * n_items // ns]
        if mine:
            o += [f"    if ({cv_ok}) {{", *head, *[x for it in mine for x in it], "      }", "    }"]
        cq = cps[q * len(cps) // ns:(q + 1) * len(cps) // ns]
        if cq:
            o += [f"    if ({cp_ok}) {{", *cq, "    }"]
    return o + [*steps[-1], "    hl_cp_commit();", f"    {tail[0].strip()}", "    hl_wgmma_wait0();", *add, "  }",
                "  __syncthreads();", "}"]


__all__ = ["wgmma_fits", "wgmma_shared_bytes", "wgmma_stages", "wgmma_index", "wgmma_text", "wgmma_prelude",
           "smem_desc", "swizzled_offset"]
