"""Default GPU schedules: a sound heuristic per stage kind (correct first, reasonably fast second).

Map:
  default_gpu_schedule(cd, target) -> list[Step]   the whole compute definition
  _tiled(O, Rd, ...)      dot / conv: a block tile of O per blockIdx.x, a thread grid (threadIdx.x) each
                          computing an MR x NR register tile of Rd (local), Rd's reduction split by BK;
                          for plain products of two inputs, shared-memory tiles of both (cache_read,
                          cooperative fetch by all threads of the block at each BK step); products in another
                          layout (NT, TN dots): register tiles only (the code generator's implicit-GEMM template);
                          dots of at least TENSOR_CORE_MIN_FLOPS in the template's layout: _MMA_TILES and a
                          ("tensor_core", 3) pragma on the K-tile loop (3xTF32 tensor cores, `_tensor_core`)
  _implicit_gemm(...)     a conv over (batch..., H, W, N): M = output pixels in H x W tiles of one image, N =
                          output channels, K = the reduce axes fused in the filter's order; register tiles at the
                          thread loop, no cache_read (the implicit-GEMM template fetches through the inlined pad)
  _row_fused(cd)          a row-fused subgraph (reductions over rows, then an elementwise output reading them
                          through broadcasts: softmax, layernorm): one kernel, a warp per row, reductions
                          computed in the output's row loop; from 1024 rows the row and softmax's exp in
                          registers (each lane its float4 columns; `ROW_REGISTERS`), rows of 1024 two warps per
                          row (64 lanes, `ROW_LANES`)
  _row_reduction(R)       rows up to 2048 long (>= 1024 rows): one warp per row, 8 rows per block
                          (threadIdx.x lanes, threadIdx.y rows, warp shuffles); longer rows: one block per row,
                          rfactor over threadIdx.x (cross-thread reduction of the partials)
  _column_reduction(R)    column sums with few outputs: 32 columns x COLUMN_SPLIT row slices per block
                          (threadIdx.x, threadIdx.y), the slices combined by row 0; else outputs spread over
                          threads (serial reduction per thread; coalesced reads)
  _split_k(R, O)          a dot (or, with options "split_k", any product of two inputs) whose output makes less than a
                          wave of blocks: partial dots over SPLIT_K parts of K (rfactor; the GEMM or implicit-GEMM
                          template reads K slices), then their sum in the elementwise consumer's thread loop
  _skinny_dot(S)          a dot with <= 16 rows or columns and few outputs: one warp per output
                          (`_warp_row_reduction` over K) instead of register tiles; TN ones whose wide operand is read
                          along the output's columns: threads along them, K over threadIdx.y (`_column_dot`)
  _full_reduction(R)      partial sums per (block, thread) into a global temporary, then one combine; below 4 x
                          THREADS elements one block (a cross-thread reduction)
  _elementwise(S)         fuse, then blockIdx.x / threadIdx.x / vectorized 4 (one float4 load and store per
                          thread) where 4 divides the size; else blockIdx.x / unrolled / threadIdx.x

Rules: non-output elementwise stages are inlined into their consumers (no kernel and no round trip
through device memory); every other stage is a kernel of its own (lowered at root), except a tiled
reduction computed inside its elementwise consumer's thread loop (Ansor's "fuse the consumer").
"""

from __future__ import annotations

import math

from ..ir.expr import Axis, Binary, ComputeDef, Load, Stage, Unary, walk
from ..ir.hlo import DType, Op
from ..target import Target, cuda_shared_limit
from .default import _consumers, _contiguous_in, _divisor_at_most, _reads_same_point
from .loop_ir import ForKind
from .steps import (
    Annotate,
    CacheRead,
    CacheWrite,
    ComputeAt,
    ComputeInline,
    Fuse,
    Pragma,
    Reorder,
    RFactor,
    Split,
    Step,
)

THREADS = 256          # threads per block of elementwise and reduction kernels
MAX_THREADS = 1024


def default_gpu_schedule(cd: ComputeDef, target: Target | None = None, rng=None, *,
                         options: dict | None = None) -> list[Step]:
    """Steps of the default GPU schedule of `cd` (for a `cuda` target; the target bounds threads and gives
    the SM count).  With `rng` (a numpy Generator), tile sizes, threads and elements per thread are drawn at
    random among legal choices instead (tests, and seeds for the search).  `options` (benchmarks): "tiles"
    = (MR, NR, TI, TJ, BK) for dot/conv stages, "per" = elements per thread and "threads" = threads per
    block of elementwise stages; row-fused subgraphs: "row_fused" (False: one kernel per stage), "rows" per
    block, "row_cache" (the row's inputs copied to shared memory first), "row_keep" (False: inline softmax's exp
    twice), "row_regs" (the row-register schedule on / off, default ROW_REGISTERS from ROW_REGISTERS_MIN_ROWS rows),
    "row_pipe" (rows per warp under it, the next row prefetched), "row_lanes" (32 / 64 / 128 lanes per row under it:
    one, two, four warps per row; default `ROW_LANES`); convs: "conv_tiles" = (MH, MW, TH, TW, NR,
    TJ[, BK]), "implicit_gemm" (False: the tiling before the implicit-GEMM template, also for dots outside the
    GEMM template's layout); dots: "tensor_core" = TF32 passes (0: FFMA, 1, 3: 3xTF32) instead of the
    TENSOR_CORE rule (with "tiles": on those tiles)."""
    global _RNG, _OPTS
    max_threads = (target.max_threads_per_block if target is not None and target.max_threads_per_block
                   else MAX_THREADS)
    threads = min(int((options or {}).get("threads", THREADS)), max_threads)
    _RNG = rng
    _OPTS = dict(options or {})
    _OPTS.setdefault("sms", target.cores if target is not None and target.kind == "cuda" else SMS)
    _OPTS.setdefault("hopper", target is None or target.kind != "cuda" or (target.arch or "sm_90").startswith("sm_90"))
    _OPTS.setdefault("shared", cuda_shared_limit((target.arch if target is not None and target.kind == "cuda" else "")
                                                 or "sm_90"))
    try:
        return _schedule(cd, max_threads, threads if rng is None else int(rng.choice([32, 64, 128, 256, 512])))
    finally:
        _RNG = None
        _OPTS = {}


_RNG = None
_OPTS: dict = {}
SMS = 132              # SM count assumed when no cuda target is given (H200)
#: (MR, NR, TI, TJ, BK, waves): per-thread tile MR x NR, thread grid TI x TJ (TJ = 32: one warp spans a row of
#: the block tile, so the shared-memory reads of B are consecutive float4s and A's are broadcasts), reduction step;
#: preferred first; the first that divides the output and gives at least `waves` x SM count blocks is taken.
#: Dots of two plain inputs then run the GEMM template of the code generator (double-buffered shared tiles).
#: Measured on an H200 with the template (GFLOP/s at 4096^3 / 1024^3): 16x4/8x32/BK8 43.1k / 19.5k (127
#: registers; 64 blocks at 1024), 8x4/8x32/BK16 41.8k / 35.5k, 8x8/16x16/BK8 40.7k / 17.4k; cuBLAS 50.6k / 36.3k.
#: Session 7: 8x4/8x32/BK16 is first at every size (at 4096^3 it takes the 3-stage cp.async ring, A row-major: 43.7k
#: against 43.2k for 16x4/8x32/BK8, 7 rounds interleaved with cuBLAS's 51.2k: 85.3 / 84.4 %, logs/gpu_s7m/ffma_ab.py;
#: the 16x4 tiling, first for grids of 4 waves until then, stays in the list for the search)
_WARP_ROW_TILES = ((8, 4, 8, 32, 16, 0.9), (16, 4, 8, 32, 8, 4.0), (4, 4, 8, 32, 16, 0.9), (4, 4, 4, 32, 16, 0.9),
                   (2, 4, 4, 32, 16, 0.9), (1, 4, 4, 32, 16, 0.9))
#: ... and for dots of K <= SHORT_K first: 8x4 on 4x32 threads (128 threads, 32x128 tiles: twice the blocks of the
#: first entry).  H200, session 8 (logs/gpu_s8k, 7 rounds interleaved with cuBLAS float32): transformer_block's
#: projection dot (4096 x 512, K 512) 39.6k GFLOP/s = 91.9 % of cuBLAS against 37.1k = 86.2 % for 8x4/8x32/BK16; its
#: output projection with the residual add level (39.4k / 39.6k, both 103 % of cuBLAS's addmm); 16x4, 4x4, 8x8, 4x8
#: and 512-thread tilings and the 3xTF32 tilings 51-98 %.  Against the old tiles in a second call: 54.1 / 57.7 us,
#: the attention's second dot (32 x [128 x 128] x [128 x 512], K 128) 16.5 / 20.7 us, the residual one 54.3 / 54.1;
#: transformer_block 284 -> 270 us
_SHORT_K_TILES = ((8, 4, 4, 32, 16, 3.5),)
SHORT_K = 512
#: ... then, with FFMA_SIMT_TILES, for dots of K > SHORT_K (K a multiple of 16) first: 8x16 on 16x16 threads (128x256
#: tiles, BK 16), the code generator's `cuda_simt` template (codegen.cuda.GEMM_SIMT; one block per SM), for grids of
#: 3.5 waves or more (not in _WARP_ROW_TILES, the search's default point).  H200, session 10 (logs/gpu_s10f, 7 rounds
#: interleaved with cuBLAS float32, docs/gpu.md "Session 10: FFMA GEMM"): the prototype of the template's design
#: (quads in the K loop, the tile exchanged through shared memory) 97.5 % of cuBLAS at 4096^3, against 85.7 % for
#: 8x4/8x32/BK16
FFMA_SIMT_TILES = True
_SIMT_TILES = ((8, 16, 16, 16, 16, 3.5),)
#: ... only where a block may take the template's shared memory (its tile exchange: 128 x (256 + 4) floats; not on
#: sm_86 / sm_89, 99 KB)
_SIMT_SHARED = 4 * 128 * (256 + 4)


def _pick(default: int, n: int, cap: int) -> int:
    """`default`, or with a random generator a random divisor of n that is at most cap."""
    if _RNG is None:
        return default
    ds = [d for d in range(1, min(n, cap) + 1) if n % d == 0]
    return int(_RNG.choice(ds))


def _schedule(cd: ComputeDef, max_threads: int, threads: int) -> list[Step]:
    row = _row_fused(cd) if _RNG is None and _OPTS.get("row_fused", True) else None
    if row is not None:
        return row
    cons = _consumers(cd)
    steps: list[Step] = []
    done: set[str] = set()
    inlined = {s.name for s in cd.stages if not s.is_reduction and s.name not in cd.outputs}
    for stage in reversed(cd.stages):
        if stage.name in done or stage.name in inlined:
            continue
        done.add(stage.name)
        prod = _fusable_producer(cd, stage, cons, inlined)
        skp = _fusable_producer(cd, stage, cons, inlined, outputs=True)
        sk = _split_k(cd, skp, stage, threads, max_threads) if skp is not None else \
            _split_k(cd, stage, None, threads, max_threads) if _is_tiled_reduction(stage) else None
        if sk is not None:
            done.update(sk[1])
            steps += sk[0]
        elif prod is not None:
            done.add(prod.name)
            steps += _tiled(cd, stage.name, prod.name, stage.axes, prod, max_threads)
        elif _skinny_dot(stage) and (col := _column_dot(stage)) is not None:
            steps += col
        elif _skinny_dot(stage):
            red = [a.name for a in stage.reduce_axes]
            steps += _warp_row_reduction(stage.name, [a.name for a in stage.axes], red,
                                         math.prod(a.extent for a in stage.reduce_axes), _work(stage))
        elif _is_tiled_reduction(stage):
            steps.append(CacheWrite(stage.name, "local"))
            steps += _tiled(cd, stage.name, stage.name + ".local", stage.axes, stage, max_threads)
        elif stage.is_reduction:
            steps += _reduction(stage, threads)
        else:
            t = threads
            if _RNG is None and "threads" not in _OPTS and any(
                    isinstance(e, Unary) and e.op in _SINCOS for x in cd.stages for e in walk(x.body)):
                t = min(threads, SINCOS_THREADS)
            steps += _elementwise(stage.name, stage.axes, t, vector=True)
    return [ComputeInline(n) for n in sorted(inlined, key=lambda n: -_pos(cd, n))] + steps


#: threads per block of elementwise kernels that evaluate sin / cos: on the H200 sin_mul_add ran at 36.0 us with 128
#: against 36.9 us with 256 (37.6 / 38.3 with the quadrant branch); gelu_tanh and relu_chain are the same either way
SINCOS_THREADS = 128
_SINCOS = frozenset({Op.SINE, Op.COSINE})


ROW_FUSED_MAX = 8192    # longest row of the one-kernel row schedule (a warp per row, N / 32 elements per lane)
#: the row-register schedule: the row's full-size inputs and kept stages in registers (each lane its own float4
#: columns, read once with float4 loads; the reductions over the same columns), where they take at most
#: ROW_REGISTERS_MAX registers per lane; else the row is re-read from L1 and the kept stages go to shared memory
ROW_REGISTERS = True
ROW_REGISTERS_MAX = 64
ROW_REGISTERS_ROWS = 16   # rows (warps) per block under the row-register schedule
ROW_REGISTERS_MIN_ROWS = 1024   # the default takes it from this many rows on (measured at 2048-8192 rows)
#: lanes per row under the row-register schedule: (row length, min rows, lanes), first match; 64 / 128: two / four
#: warps per row (a named barrier per row, the reductions' per-lane partials combined through shared memory by each
#: warp), ROW_REGISTERS_ROWS * 32 / lanes rows per block; other rows one warp (the "row_lanes" option overrides).
#: Measured on the H200 (session 7, interleaved in one process, 9 rounds): 2 warps x 8 rows per block against one warp
#: x 16 rows: softmax 4096 x 1024 9.9 / 11.0 us, layernorm 8192 x 1024 20.9 / 21.7 us (4 warps x 4 rows 20.9 / 11.1)
ROW_LANES: tuple[tuple[int, int, int], ...] = ((1024, 1024, 64),)
ROW_PIPE = 1     # rows per warp under the row-register schedule (> 1: the next row prefetched)
ROW_CACHE_BYTES = 48 * 1024   # shared memory for the rows of a block kept by the row-fused schedule


def _row_reductions(cd: ComputeDef) -> tuple[Stage, list[Stage]] | None:
    """(O, [R...]) when `cd` is a row-fused subgraph (softmax, layernorm, rmsnorm as XLA's GPU fusions or the
    front end's row fusion have them): one elementwise output O of shape (rows..., N); every other stage that is
    not inlined is a reduction over one contiguous axis of N elements whose space shape is O's leading shape
    (what O reads through broadcasts)."""
    outs = [s for s in cd.stages if s.name in cd.outputs]
    if len(outs) != 1 or outs[0].is_reduction or len(outs[0].axes) < 2:
        return None
    o = outs[0]
    n = o.axes[-1].extent
    lead = tuple(a.extent for a in o.axes[:-1])
    reds = [s for s in cd.stages if s.is_reduction]
    if not reds or n % 32 or not 64 <= n <= ROW_FUSED_MAX:
        return None
    for r in reds:
        if (r.name in cd.outputs or len(r.reduce_axes) != 1 or r.reduce_axes[0].extent != n
                or tuple(a.extent for a in r.axes) != lead or not _contiguous_in(r, r.reduce_axes[0].name)):
            return None
    return o, reds


def _row_fused(cd: ComputeDef) -> list[Step] | None:
    """One kernel for a row-fused subgraph: one warp per row (threadIdx.x: 32 lanes, threadIdx.y: up to 8 rows
    of a block), the row's reductions computed in the output's row loop in order (per-lane partials of
    coalesced reads, combined through one shared slot per lane and row), then the output's row written with
    float4 stores.  Per-row scalar expressions (mean, 1 / sqrt(var + eps)) are loop-invariant in the row loop,
    so they are computed once per row; the row is read from device memory once (later reads of the same row
    by the same warp hit L1)."""
    found = _row_reductions(cd)
    if found is None:
        return None
    o, reds = found
    name = o.name
    n = o.axes[-1].extent
    rows = _work(o) // n
    inlined = [s.name for s in cd.stages if not s.is_reduction and s.name not in cd.outputs]
    red_reads = {e.buffer for r in reds for e in walk(r.body) if isinstance(e, Load)}
    cons = _consumers(cd)
    kept = [x for x in cd.stages if x.name in inlined and x.shape == o.shape and len(cons[x.name]) > 1
            and _OPTS.get("row_keep", True) and any(isinstance(e, Unary) and e.op in _COSTLY for e in walk(x.body))]
    row_in = [b.name for b in cd.inputs if b.shape == o.shape and b.name in red_reads]
    regs = (bool(_OPTS.get("row_regs", ROW_REGISTERS and rows >= ROW_REGISTERS_MIN_ROWS)) and n % (32 * VEC) == 0
            and n // 32 * len(row_in + kept) <= ROW_REGISTERS_MAX)
    lanes = _row_lanes(n, rows) if regs else 32
    cached = row_in if regs or _OPTS.get("row_cache", False) else []
    inlined = [x for x in inlined if x not in {k.name for k in kept}]
    ry = _divisor_at_most(rows, int(_OPTS.get("rows", (ROW_REGISTERS_ROWS * 32 // lanes) if regs else ROWS_PER_BLOCK)))
    if not regs and (cached or kept) and n * 4 * len(cached + kept) > ROW_CACHE_BYTES:
        cached, kept, inlined = [], [], inlined + [k.name for k in kept]
    while not regs and (cached or kept) and ry * n * 4 * len(cached + kept) > ROW_CACHE_BYTES:
        ry = _divisor_at_most(rows, ry - 1)
    steps: list[Step] = []
    for b in cached:   # the row in shared memory (one copy per warp), fetched once with float4 loads
        readers = tuple(x.name for x in cd.stages if any(isinstance(e, Load) and e.buffer == b for e in walk(x.body)))
        steps.append(CacheRead(b, "local", readers))
    steps += [ComputeInline(x) for x in sorted(inlined, key=lambda x: -_pos(cd, x))]
    fs, s = _fuse_all(name, [a.name for a in o.axes[:-1]])
    last = o.axes[-1].name
    # rows per warp (the row-register schedule): a serial loop over K rows inside the warp, the next row's float4
    # loads issued before the current row's reductions and stores (`codegen.cuda.ROW_PREFETCH`)
    k = int(_OPTS.get("row_pipe", ROW_PIPE)) if regs and cached else 1
    k = _divisor_at_most(rows // ry, k) if k > 1 else 1
    steps += fs + [Split(name, s, (ry, k) if k > 1 else (ry,)), Annotate(name, f"{s}.0", ForKind.BLOCK_X),
                   Annotate(name, f"{s}.1", ForKind.THREAD_Y)]
    at = f"{s}.2" if k > 1 else f"{s}.1"
    if k > 1:   # an unrolled row loop whose body starts with the lane-register fill: codegen.cuda prefetches
        steps.append(Annotate(name, at, ForKind.UNROLLED))
    if n % (32 * VEC) == 0:
        steps += [Split(name, last, (lanes, VEC)), Annotate(name, f"{last}.1", ForKind.THREAD_X),
                  Annotate(name, f"{last}.2", ForKind.VECTORIZED)]
        outer = n // (lanes * VEC)
    else:
        steps += [Split(name, last, (32,)), Annotate(name, f"{last}.1", ForKind.THREAD_X)]
        outer = n // 32
    if outer <= 16:
        steps.append(Annotate(name, f"{last}.0", ForKind.UNROLLED))
    # consumers first, each placed in the row loop before its producers: the reductions (per-lane partials, a
    # warp all-reduce), the kept stages (a transcendental read by a reduction and the output, softmax's exp:
    # computed once per element into the warp's copy of the row), then the cached inputs
    keep_names = {k.name for k in kept}
    for r in reversed([x for x in cd.stages if x.is_reduction or x.name in keep_names]):
        if r.name in keep_names:
            steps += _row_copy(r.name, r.axes[-1].name, name, at, n, lanes)
            continue
        red = r.reduce_axes[0].name
        steps += [Split(r.name, red, (lanes, VEC) if regs else (32,)), RFactor(r.name, f"{red}.1"),
                  ComputeAt(r.name, name, at), ComputeAt(r.name + ".rf", r.name, r.axes[-1].name),
                  Annotate(r.name + ".rf", f"{red}.1", ForKind.THREAD_X)]
        if regs:   # each lane reduces its own float4 columns (the elements the output loop gives it)
            steps += [Annotate(r.name + ".rf", f"{red}.0", ForKind.UNROLLED),
                      Annotate(r.name + ".rf", f"{red}.2", ForKind.UNROLLED)]
        elif n // 32 <= 64:
            steps.append(Annotate(r.name + ".rf", f"{red}.0", ForKind.UNROLLED))
    for b in cached:
        steps += _row_copy(f"{b}.local", f"ax{len(o.axes) - 1}", name, at, n, lanes)
    return steps


def _row_lanes(n: int, rows: int) -> int:
    """Lanes per row under the row-register schedule: the "row_lanes" option (32, 64, 128: one, two, four warps per
    row, each lane n / lanes registers of each register row), else `ROW_LANES` (a rule per row length: the first
    (n, min rows, lanes) entry that matches), where lanes * 4 divides the row."""
    want = _OPTS.get("row_lanes")
    if want is None:
        want = next((ln for rn, mr, ln in ROW_LANES if n == rn and rows >= mr), 32)
    want = int(want)
    return want if want in (32, 64, 128) and n % (want * VEC) == 0 else 32


def _row_copy(c: str, ax: str, out: str, at: str, n: int, lanes: int = 32) -> list[Step]:
    """Stage `c` computed per row at `out`'s row loop `at`: lanes (float4 where 128 divides the row)."""
    steps: list[Step] = [ComputeAt(c, out, at), Split(c, ax, (lanes, VEC) if n % (32 * VEC) == 0 else (32,)),
                         Annotate(c, f"{ax}.1", ForKind.THREAD_X)]
    if n % (32 * VEC) == 0:
        steps.append(Annotate(c, f"{ax}.2", ForKind.VECTORIZED))
    if n // (lanes * VEC) <= 16:
        steps.append(Annotate(c, f"{ax}.0", ForKind.UNROLLED))
    return steps


_COSTLY = frozenset({Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.TANH, Op.LOGISTIC, Op.SINE, Op.COSINE, Op.ERF,
                     Op.POWER, Op.ATAN2})


def _pos(cd: ComputeDef, name: str) -> int:
    return [s.name for s in cd.stages].index(name)


def _is_tiled_reduction(stage: Stage) -> bool:
    """A dot- or conv-like reduction: a sum of products with two or more space axes."""
    if not stage.is_reduction or len(stage.axes) < 2 or stage.reducer is None or stage.reducer.op is not Op.ADD:
        return False
    if stage.axes[-1].extent < 2 or stage.axes[-2].extent < 2:
        return False
    return any(isinstance(e, Binary) and e.op is Op.MULTIPLY for e in walk(stage.body))


#: a dot with few rows or columns and few outputs (mlp's last layer and its gradients: [256, 256] x [256, 10],
#: [10, 256] x [256, 256]) gets one warp per output (the lanes split the reduction, warp shuffles for the total:
#: `_warp_row_reduction`) instead of register tiles: 2,560 outputs as tiles were 4 blocks of 80 threads, each thread
#: 256-512 products in sequence (H200: 11-27 us for 1.3-2.6 MFLOP; mlp2 50.1 -> 22.9 us, mlp_train_step 89 -> 56 us)
SKINNY_DOT_N = 16
SKINNY_DOT_OUTPUTS = 1 << 14
SKINNY_DOT_MIN_K = 64


def _skinny_dot(stage: Stage) -> bool:
    """A dot-like reduction (`_is_tiled_reduction`) with at most SKINNY_DOT_N rows or columns, at most
    SKINNY_DOT_OUTPUTS outputs and a reduction of at least SKINNY_DOT_MIN_K (the default only)."""
    if _RNG is not None or "tiles" in _OPTS or not _OPTS.get("skinny_dot", True) or not _is_tiled_reduction(stage):
        return False
    k = math.prod(a.extent for a in stage.reduce_axes)
    narrow = min(stage.axes[-1].extent, stage.axes[-2].extent)
    return narrow <= SKINNY_DOT_N and _work(stage) <= SKINNY_DOT_OUTPUTS and k >= SKINNY_DOT_MIN_K


#: ... unless the wide operand is read along the output's columns, not along K (the TN weight gradient [256, 10]^T x
#: [256, 256] of mlp_train_step: one warp per output read a column of 256 rows, 32 rows per load, 5.1 us on the H200):
#: then threads along those columns, coalesced, each all the narrow axis's outputs of its column in registers, K split
#: over COLUMN_SPLIT threadIdx.y slices whose partials row 0 sums (`_column_dot`)
COLUMN_DOT = True


def _column_dot(stage: Stage) -> list[Step] | None:
    """The column schedule above for a skinny dot (None where it does not apply)."""
    if not _OPTS.get("column_dot", COLUMN_DOT) or len(stage.axes) != 2 or len(stage.reduce_axes) != 1:
        return None
    (a0, a1), r = stage.axes, stage.reduce_axes[0]
    if (a0.extent > min(SKINNY_DOT_N, COLUMN_SPLIT) or a1.extent % 32 or _contiguous_in(stage, r.name)
            or not _contiguous_in(stage, a1.name)
            or r.extent % COLUMN_SPLIT or r.extent < 4 * COLUMN_SPLIT):
        return None
    name, rf = stage.name, stage.name + ".rf"
    i0, i1, k = a0.name, a1.name, r.name
    # the partials rf[K slice, i0, i1] in shared memory (a block's [COLUMN_SPLIT, i0, 32] at once, lanes along i1: no
    # bank conflicts), each thread's accumulated in registers (rf.local) first; then one output per (threadIdx.x,
    # threadIdx.y < i0's extent) sums its COLUMN_SPLIT partials
    return [Split(name, k, (COLUMN_SPLIT,)), RFactor(name, f"{k}.1"), CacheWrite(rf, "local"),
            Split(name, i1, (32,)), Reorder(name, (f"{i1}.0", f"{i1}.1", i0, f"{k}.1")),
            Annotate(name, f"{i1}.0", ForKind.BLOCK_X), Annotate(name, f"{i1}.1", ForKind.THREAD_X),
            Annotate(name, i0, ForKind.THREAD_Y), ComputeAt(rf, name, f"{i1}.0"),
            Reorder(rf, (f"{k}.1", i1, i0)), Annotate(rf, f"{k}.1", ForKind.THREAD_Y),
            Annotate(rf, i1, ForKind.THREAD_X), Annotate(rf, i0, ForKind.UNROLLED),
            ComputeAt(rf + ".local", rf, i1), Reorder(rf + ".local", (f"{k}.1", i1, f"{k}.0", i0)),
            Annotate(rf + ".local", f"{k}.0", ForKind.UNROLLED), Annotate(rf + ".local", i0, ForKind.UNROLLED)]


def _fusable_producer(cd: ComputeDef, stage: Stage, cons: dict[str, list[str]], inlined: set[str],
                      outputs: bool = False) -> Stage | None:
    """The tiled reduction that elementwise `stage` alone reads, at its own point (computed in its thread loop);
    `outputs`: also one that is an output of `cd` (a split-K dot's sum stores it there too)."""
    if stage.is_reduction:
        return None
    for name in sorted({e.buffer for e in walk(stage.body) if isinstance(e, Load)}):
        prod = cd.stage_by_name.get(name)
        if (prod is not None and (outputs or prod.name not in cd.outputs) and cons[prod.name] == [stage.name]
                and _is_tiled_reduction(prod) and prod.shape == stage.shape and _reads_same_point(stage, prod.name)):
            return prod
    return None


def _work(stage: Stage) -> int:
    n = 1
    for a in stage.axes:
        n *= a.extent
    return n


def _product_of_two_inputs(cd: ComputeDef, stage: Stage) -> tuple[str, str] | None:
    """(A, B) when the body is exactly Load(A) * Load(B) of two different inputs (shared-memory tiles)."""
    b = stage.body
    names = {x.name for x in cd.inputs}
    if (isinstance(b, Binary) and b.op is Op.MULTIPLY and isinstance(b.a, Load) and isinstance(b.b, Load)
            and b.a.buffer in names and b.b.buffer in names and b.a.buffer != b.b.buffer):
        return b.a.buffer, b.b.buffer
    return None


def _template_layout(stage: Stage) -> bool:
    """The product's loads are in the GEMM template's layout: A[..., i, k] and B[..., k, j] (i, j the last two
    space axes, k the last reduce axis).  Products of two inputs in another layout (the NT attention dot, the
    TN weight-gradient dot) get register tiles without shared-memory stages instead (the implicit-GEMM
    template of the code generator)."""
    b = stage.body
    if not (isinstance(b, Binary) and isinstance(b.a, Load) and isinstance(b.b, Load)) or len(stage.axes) < 2:
        return True
    i, j, k = stage.axes[-2].name, stage.axes[-1].name, stage.reduce_axes[-1].name

    def tail(ld: Load) -> tuple:
        return tuple(getattr(x, "name", None) for x in ld.indices[-2:])

    return {tail(b.a), tail(b.b)} == {(i, k), (k, j)}


#: the same for products of two inputs outside the GEMM template's layout (the implicit-GEMM template); H200,
#: transformer_block's NT attention dot (32 x 128 x 128, K 512): 8x4/8x16/BK8 22.5 us, 4x4/16x16/BK16 24.0,
#: 4x4/8x16/BK16 25.3, 4x4/8x32/BK16 (the template list's pick) 31.9; the generic code with shared stages 87.9
_IMPLICIT_TILES = ((8, 4, 8, 16, 8, 0.9), (4, 4, 16, 16, 16, 0.9), (4, 4, 8, 16, 16, 0.9)) + _WARP_ROW_TILES[2:]


#: dots on tensor cores (3xTF32, `codegen.cuda._gemm_mma_text`): (MR, NR, TI, TJ, BK, waves) as above, TJ = 4 (a warp is
#: the mma fragment's 8 x 4 lanes), BK 16; the first that divides the output and gives `waves` x SM count blocks
#: H200, 3xTF32 (docs/gpu.md, session 5): 4096^3 4x16 on 32x4 threads 48.1k GFLOP/s (230 registers) against 43.2k for
#: the FFMA template; 1024^3 4x8 on 32x4 (256 blocks) 36.8k against 35.4k (2x8 on 64x4 31.5k, 4x16 on 32x4 in 128
#: blocks 32.3k); rmsnorm_swiglu's dots (256-704 blocks, K 1024-2816) 4x16 on 32x4 0.6-9 % faster; dense_bias_relu
#: (512 x 1024, K 1024) 2x8 on 64x4 3 % faster.  Session 8 (logs/gpu_s8t, interleaved with cuBLAS, two calls): 4x8 on
#: 32x4 with BK 32 (3 stages, 67.6 KB of dynamic shared memory, 209 registers) for 1024^3: 39.8k GFLOP/s in both
#: calls against 38.0k / 37.6k for BK 16 (105 % of cuBLAS float32 against 99-100 %); for the 4x16 dots BK 32 was level
#: with BK 16 (4096^3 +2.6 % in one call, -1.5 % in the other; rmsnorm_swiglu's dots +/-7 % between calls)
_MMA_TILES = ((4, 16, 32, 4, 16, 1.9), (4, 8, 32, 4, 32, 1.9), (4, 8, 32, 4, 16, 1.9), (2, 8, 64, 4, 16, 0.9),
              (2, 16, 32, 4, 16, 0.9), (2, 8, 32, 4, 16, 0.9))
#: TF32 passes of the default's tensor-core dots (3: 3xTF32; 0: every dot on FFMA), the smallest dot (2 M N K flops)
#: and reduction (K) that get them (H200: transformer_block's dots of K 512 and 128 were 17-50 % slower than the FFMA
#: template, mlp2's and mlp_train_step's of K 784 11-20 %)
TENSOR_CORE = 3
TENSOR_CORE_MIN_FLOPS = 1 << 30
TENSOR_CORE_MIN_K = 1024
#: session 9: 3xTF32 dots on Hopper's warpgroup MMA (`codegen.cuda_wgmma`; the code generator's GEMM_WGMMA must be on
#: too): _WGMMA_TILES (MR 2, NR 16 / 32, TJ 4, BK 32, 128 or 256 threads) tried before _MMA_TILES for 3xTF32 dots, from
#: K = WGMMA_MIN_K (and TENSOR_CORE_MIN_FLOPS) on; 128x128 tiles where they make 0.9 of a wave, else 128x64.  H200
#: (session 9, logs/gpu_s9g/defaults_ab.json, whole models interleaved): 128x64 tiles for matmul's 1024^3 dot 48.1 ->
#: 40.4 us (1024^3 alone 138.8 % of cuBLAS against the mma template's 117.0 %); from K 512 (was 1024; before the
#: float4 epilogue the wgmma K-512 dots were at 83 % of cuBLAS against FFMA's 91 %) transformer_block 265.4 -> 212.7 us
TENSOR_CORE_WGMMA = True
_WGMMA_TILES = ((2, 32, 64, 4, 32, 0.9), (2, 16, 64, 4, 32, 0.9))
WGMMA_MIN_K = 512


def _tensor_core(I: int, J: int, K: int, batch: int, max_threads: int) -> int:
    """TF32 passes for a dot of two plain inputs in the GEMM template's layout (0: FFMA): options "tensor_core"
    (0, 1 or 3) where given (with options "tiles": those tiles, whether the template can take them or not), else
    TENSOR_CORE for dots of at least TENSOR_CORE_MIN_FLOPS and TENSOR_CORE_MIN_K that an _MMA_TILES entry divides
    (K a multiple of 16) unless options "tiles" are given."""
    if _RNG is not None:
        return 0
    if "tensor_core" in _OPTS:
        want = int(_OPTS["tensor_core"])
        if not want or "tiles" in _OPTS:
            return want
    elif "tiles" in _OPTS or 2 * I * J * K * batch < TENSOR_CORE_MIN_FLOPS or \
            K < (WGMMA_MIN_K if TENSOR_CORE == 3 and _wgmma_tiles(I, J, K, max_threads) else TENSOR_CORE_MIN_K):
        return 0
    else:
        want = TENSOR_CORE
    return want if _mma_tiles(I, J, K, max_threads) else 0


#: tensor-core dots: each thread's NR output columns stored as float4s (the epilogue's column loop split by 4, the inner
#: loop vectorized; `codegen.cuda`'s vector stores) instead of NR scalar stores per row, for the wgmma template's
#: tilings (MR 2, NR 16 / 32, TJ 4, BK 32: 32 consecutive floats per thread and row) and, with VEC_EPILOGUE_MMA, the
#: mma template's (NR 8 / 16).  H200 (session 9, call 4, % of cuBLAS float32 interleaved): wgmma 4096^3 140.1 ->
#: 149.9 %, 2048 x 2816 x 1024 118.1 -> 159.5 %, 2048 x 1024 x 2816 136.3 -> 161.4 %, rmsnorm_swiglu 721 -> 555 us;
#: mma template (VEC_EPILOGUE_MMA) 1024^3 104.9 -> 117.0 %, matmul 53.9 -> 48.9 us, dense_bias_relu 40.9 -> 37.9 us
#: (logs/gpu_s9g/defaults_ab.json), the same bits
VEC_EPILOGUE_WGMMA = True
VEC_EPILOGUE_MMA = True
#: ... and for the FFMA `_SIMT_TILES` (codegen's cuda_simt template, one block per SM: the epilogue is not overlapped
#: by another block's K loop): 16 consecutive floats per thread and row as 4 float4 stores (session 10)
VEC_EPILOGUE_SIMT = True


def _epilogue_columns(out: str, j: str, mma: int, mr: int, nr: int, ti: int, tj: int, bk: int) -> list[Step]:
    """The steps of the output stage's per-thread column loop `j`.2: unrolled, or split by 4 with the inner loop
    vectorized (see VEC_EPILOGUE_WGMMA).  The FFMA template keeps scalar stores: float4 stores measured 83.6 against
    85.3 % of cuBLAS at 4096^3 and level on the models (session 9, logs/gpu_s9g/ffma_epi)."""
    wg = mma == 3 and mr == 2 and nr in (16, 32) and tj == 4 and bk == 32 and ti * tj in (128, 256)
    simt = not mma and VEC_EPILOGUE_SIMT and (mr, nr, ti, tj) in ((8, 16, 16, 16), (16, 8, 16, 16))
    if simt or mma and nr % 4 == 0 and nr > 4 and (VEC_EPILOGUE_WGMMA if wg else VEC_EPILOGUE_MMA and tj == 4):
        return [Split(out, f"{j}.2", (4,)), Annotate(out, f"{j}.2.0", ForKind.UNROLLED),
                Annotate(out, f"{j}.2.1", ForKind.VECTORIZED)]
    return [Annotate(out, f"{j}.2", ForKind.UNROLLED)]


def _mma_tiles(I: int, J: int, K: int, max_threads: int) -> list[tuple]:
    """The _MMA_TILES entries that divide an (I, J, K) dot (K at least two K steps) within `max_threads`, after the
    _WGMMA_TILES ones with TENSOR_CORE_WGMMA."""
    return _wgmma_tiles(I, J, K, max_threads) + _fitting(_MMA_TILES, I, J, K, max_threads)


def _wgmma_tiles(I: int, J: int, K: int, max_threads: int) -> list[tuple]:
    ok = TENSOR_CORE_WGMMA and TENSOR_CORE == 3 and _OPTS.get("hopper", True)
    return _fitting(_WGMMA_TILES, I, J, K, max_threads) if ok else []


def _fitting(tiles, I: int, J: int, K: int, max_threads: int) -> list[tuple]:
    return [t for t in tiles if I % (t[0] * t[2]) == 0 and J % (t[1] * t[3]) == 0 and K % t[4] == 0
            and K > t[4] and t[2] * t[3] <= max_threads]


def _tile_sizes(I: int, J: int, K: int, max_threads: int, batch: int = 1,
                implicit: bool = False, mma: bool = False) -> tuple[int, int, int, int, int]:
    """(MR, NR, TI, TJ, BK): per-thread register tile, thread grid, reduction step (all divisors)."""
    if "tiles" in _OPTS:
        return tuple(int(x) for x in _OPTS["tiles"])  # type: ignore[return-value]
    if mma:
        wg = _wgmma_tiles(I, J, K, max_threads)
        fits = wg if wg and K < TENSOR_CORE_MIN_K else _mma_tiles(I, J, K, max_threads)
        for mr, nr, ti, tj, bk, waves in fits:
            if batch * (I // (mr * ti)) * (J // (nr * tj)) >= waves * _OPTS.get("sms", SMS) or \
                    (mr, nr, ti, tj, bk, waves) == fits[-1]:
                return mr, nr, ti, tj, bk
    if _RNG is None:
        tiles = _IMPLICIT_TILES if implicit else \
            (_SHORT_K_TILES if K <= SHORT_K else _SIMT_TILES if K % 16 == 0 and FFMA_SIMT_TILES
             and _OPTS.get("shared", _SIMT_SHARED) >= _SIMT_SHARED else ()) + \
            _WARP_ROW_TILES
        fits = [t for t in tiles
                if I % (t[0] * t[2]) == 0 and J % (t[1] * t[3]) == 0 and t[2] * t[3] <= max_threads]
        for mr, nr, ti, tj, bk, waves in fits:
            blocks = batch * (I // (mr * ti)) * (J // (nr * tj))
            if blocks >= waves * _OPTS.get("sms", SMS) or (mr, nr, ti, tj, bk, waves) == fits[-1]:
                return mr, nr, ti, tj, _divisor_at_most(K, bk)
    big = I * J >= 512 * 512
    mr = _pick(_divisor_at_most(I, 8 if big else 4), I, 8)
    nr = _pick(_divisor_at_most(J, 8 if big else 4), J, 8)
    ti = _pick(_divisor_at_most(I // mr, 16), I // mr, 32)
    tj = _pick(_divisor_at_most(J // nr, 16), J // nr, 32)
    while ti * tj > max_threads:
        ti = _divisor_at_most(ti, ti // 2)
    bk = _pick(_divisor_at_most(K, 8), K, 16)
    return mr, nr, ti, tj, bk


#: split K: a dot of two plain inputs whose output makes fewer SPLIT_K_TILES blocks than SMs and whose K is at least
#: SPLIT_K_MIN_K is computed as parts of K (an rfactor: partial dots of K / S each, a batch of S GEMMs on the GEMM
#: template, or the implicit-GEMM one for TN / NT layouts, reading K slices of the operands), then summed per output
#: (with the elementwise consumer: one kernel more).  H200, session 11 (benchmarks/gpu_split_k.py, each in a CUDA graph,
#: docs/gpu.md "Session 11"): mlp_train_step's forward dot 256 x 256 x 784 with bias + ReLU 14.4 -> 8.0 us (7 parts, 224
#: blocks; 8x4 tiles 8.6, 3xTF32 7.9), its weight gradient (TN, 784 x 256 x 256, SGD update) 11.8 -> 8.0 us (4 parts),
#: mlp2's first layer 15.0 -> 10.8 us, a 256^3 matmul 5.3 -> 4.1 us; mlp_train_step 56.1 -> 43.5 us with the two changes
#: below.  The GPU search space has it too (sketch_gpu's "splitk" kernels: the parts a knob beside the tiles)
SPLIT_K = True
SPLIT_K_TILES = (4, 4, 4, 32, 16)
SPLIT_K_MIN_K = 256
SPLIT_K_MIN_SLICE = 64
SPLIT_K_WAVES = 2


def _split_k_parts(I: int, J: int, K: int, nb: int) -> int:
    """Parts of K for a split-K dot (1: none): options "split_k" where given, else with SPLIT_K, for dots of fewer
    SPLIT_K_TILES blocks than SMs, the fewest parts of at least SPLIT_K_MIN_SLICE (a multiple of 16) that make
    SPLIT_K_WAVES waves, or else the most such parts."""
    if "split_k" in _OPTS:
        return int(_OPTS["split_k"])
    if _RNG is not None or "tiles" in _OPTS or not SPLIT_K or nb != 1 or K < SPLIT_K_MIN_K:
        return 1
    mr, nr, ti, tj, _ = SPLIT_K_TILES
    if I % (mr * ti) or J % (nr * tj):
        return 1
    tiles, sms = (I // (mr * ti)) * (J // (nr * tj)), _OPTS.get("sms", SMS)
    if tiles >= sms:
        return 1
    parts = [s for s in range(2, K // SPLIT_K_MIN_SLICE + 1) if K % s == 0 and (K // s) % 16 == 0]
    return next((s for s in parts if tiles * s >= SPLIT_K_WAVES * sms), parts[-1] if parts else 1)


def _split_k(cd: ComputeDef, red: Stage, cons_stage: Stage | None, threads: int,
             max_threads: int) -> tuple[list[Step], set[str]] | None:
    """Steps of a split-K dot `red` (see SPLIT_K) and of its elementwise consumer `cons_stage` (None: `red` is
    scheduled alone), and the stages they schedule; None where the dot does not take it."""
    layout = _template_layout(red)
    if _product_of_two_inputs(cd, red) is None or len(red.reduce_axes) != 1 or red.dtype is not DType.F32:
        return None     # (float32 only: partial sums of a bf16 / f16 dot would be rounded to it)
    *batch, ax_i, ax_j = red.axes
    k_ax = red.reduce_axes[0]
    parts = _split_k_parts(ax_i.extent, ax_j.extent, k_ax.extent, math.prod(a.extent for a in batch))
    if parts <= 1 or k_ax.extent % parts:
        return None
    ks = k_ax.extent // parts
    r = k_ax.name
    rf = f"{red.name}.rf"
    part = Axis(f"{r}.0", parts)
    rf_stage = Stage(rf, (part, *red.axes), red.body, red.dtype, (Axis(f"{r}.1", ks),), red.reducer)
    steps: list[Step] = [Split(red.name, r, (ks,)), RFactor(red.name, f"{r}.0"), CacheWrite(rf, "local")]
    steps += _tiled(cd, rf, rf + ".local", rf_stage.axes, rf_stage, max_threads,
                    split_k="gemm" if layout else "implicit")
    # the sum of the parts: per output, in the consumer's thread loop when there is one (one kernel; an output is
    # computed at root, a kernel of its own before its consumer's)
    names = {red.name}
    if cons_stage is None or red.name in cd.outputs:
        steps += _elementwise(red.name, red.axes, threads) + [Annotate(red.name, part.name, ForKind.UNROLLED)]
        if cons_stage is not None:
            names.add(cons_stage.name)
            steps += _elementwise(cons_stage.name, cons_stage.axes, threads, vector=True)
        return steps, names
    names.add(cons_stage.name)
    ew = _elementwise(cons_stage.name, cons_stage.axes, threads)
    thr = next(x.iter for x in ew if isinstance(x, Annotate) and x.kind is ForKind.THREAD_X)
    return steps + ew + [ComputeAt(red.name, cons_stage.name, thr), Annotate(red.name, part.name, ForKind.UNROLLED)], \
        names


def _tiled(cd: ComputeDef, out: str, red: str, axes, red_stage: Stage, max_threads: int,
           split_k: str = "") -> list[Step]:
    """Steps of a tiled dot / conv `red` computed in the thread loop of `out` (see the module map); `split_k`: the
    partial dots of `_split_k` (batch = the K part; "gemm": in the GEMM template's layout, "implicit": another, options
    "split_k" only; SPLIT_K_TILES unless options "tiles")."""
    *batch, ax_i, ax_j = list(axes)
    k_axes = list(red_stage.reduce_axes)
    K = 1
    for a in k_axes:
        K *= a.extent
    nb = 1
    for a in batch:
        nb *= a.extent
    pair = _product_of_two_inputs(cd, red_stage)
    if pair is None and _RNG is None and _OPTS.get("implicit_gemm", True) and not split_k:
        conv = _implicit_gemm(out, red, red_stage, max_threads)
        if conv is not None:
            return conv
    implicit = (pair is not None and _RNG is None and _OPTS.get("implicit_gemm", True)
                and (split_k == "implicit" or not split_k and not _template_layout(red_stage)))
    if implicit:
        pair = None   # register tiles only: the code generator's implicit-GEMM template fetches the shared tiles
    mma = _tensor_core(ax_i.extent, ax_j.extent, k_axes[-1].extent, nb, max_threads) \
        if pair is not None and (not split_k or "tensor_core" in _OPTS) else 0
    if split_k and "tiles" not in _OPTS and not mma:
        mr, nr, ti, tj, bk = SPLIT_K_TILES
    else:
        mr, nr, ti, tj, bk = _tile_sizes(ax_i.extent, ax_j.extent, k_axes[-1].extent, max_threads, nb, implicit,
                                         mma > 0)
    i, j = ax_i.name, ax_j.name
    steps: list[Step] = []
    if pair is not None:
        steps += [CacheRead(pair[0], "shared", (red,)), CacheRead(pair[1], "shared", (red,))]
    steps += [Split(out, i, (ti, mr)), Split(out, j, (tj, nr))]
    blocks = [a.name for a in batch] + [f"{i}.0", f"{j}.0"]
    steps.append(Reorder(out, tuple(blocks + [f"{i}.1", f"{j}.1", f"{i}.2", f"{j}.2"])))
    steps += [Fuse(out, tuple(blocks)), Annotate(out, "@".join(blocks), ForKind.BLOCK_X)]
    thr = f"{i}.1@{j}.1"
    steps += [Fuse(out, (f"{i}.1", f"{j}.1")), Annotate(out, thr, ForKind.THREAD_X)]
    steps += [Annotate(out, f"{i}.2", ForKind.UNROLLED), *_epilogue_columns(out, j, mma, mr, nr, ti, tj, bk)]
    steps.append(ComputeAt(red, out, thr))
    klast = k_axes[-1].name
    korder = [a.name for a in k_axes[:-1]]
    if bk > 1 and k_axes[-1].extent > bk:
        steps.append(Split(red, klast, (bk,)))
        korder += [f"{klast}.0", f"{klast}.1"]
        kin = f"{klast}.1"
    else:
        korder += [klast]
        kin = klast
    steps.append(Reorder(red, tuple([a.name for a in batch] + korder + [i, j])))
    steps += [Annotate(red, kin, ForKind.UNROLLED), Annotate(red, i, ForKind.UNROLLED),
              Annotate(red, j, ForKind.UNROLLED)]
    if mma and kin != klast:   # the K-tile loop: the GEMM template runs on tensor cores where its tiling fits
        steps.append(Pragma(red, f"{klast}.0", "tensor_core", mma))
    if pair is not None:
        at = korder[-2] if len(korder) >= 2 else None
        nthreads = ti * tj
        for src in pair:
            sh = f"{src}.shared"
            if at is None:
                steps.append(ComputeAt(sh, red, korder[0] if korder else i))
            else:
                steps.append(ComputeAt(sh, red, at))
            ax = [f"ax{d}" for d in range(len(_shape(cd, src)))]
            fused = "@".join(ax)
            if len(ax) > 1:
                steps.append(Fuse(sh, tuple(ax)))
            steps += [Split(sh, fused, (nthreads,)), Annotate(sh, f"{fused}.1", ForKind.THREAD_X)]
    return steps


def _conv_operand(stage: Stage) -> tuple[Load, list[str]] | None:
    """(B, K order) of a conv-like tiled reduction over (batch..., H, W, N): B is the one load of the body that
    reads the last (output channel) axis and no other space axis (the filter); K order is the reduce axes in the
    order B's indices read them (so the fused K axis walks B's rows in memory order)."""
    if len(stage.axes) < 3:
        return None
    space = {a.name for a in stage.axes}
    j = stage.axes[-1].name
    loads = [e for e in walk(stage.body) if isinstance(e, Load)]
    bs = [ld for ld in loads if any(j in _index_vars(x) for x in ld.indices)]
    if len(bs) != 1 or len(loads) < 2:
        return None
    b = bs[0]
    if set().union(*(_index_vars(x) for x in b.indices)) & space != {j}:
        return None
    first: dict[str, int] = {}
    for pos, x in enumerate(b.indices):
        for v in _index_vars(x):
            first.setdefault(v, pos)
    red = [a.name for a in stage.reduce_axes]
    return b, sorted(red, key=lambda r: (first.get(r, -1), red.index(r)))


def _index_vars(e) -> set[str]:
    from ..ir.expr import Var
    return {n.name for n in walk(e) if isinstance(n, Var)}


#: conv tiles (MR_H, MR_W, TH, TW, NR, TJ, BK) are drawn from these per-thread register tiles (MR x NR, MR = MR_H
#: x MR_W output pixels of one image), preferred first; the thread grid TH x TW x TJ (64 to 256 threads, TJ x NR
#: covering up to 128 output channels, the template's shared tiles within 48 KB) with at least one block per SM,
#: blocks spread evenly over the SMs (the busiest SM within 10 % of the mean), then the most channels per block,
#: then the most threads; when no register tile gets there (small convs), the choice with the most threads.
#: H200, conv2d_bias_relu at bench size (8 x 56 x 56 x 64, 3x3, 64 -> 64):
#: 8x8-pixel tiles, 1x8 x 4 per thread, 8 x 1 x 16 threads (392 blocks of 128) 56.8 us at BK 32, 60.2 at BK 16;
#: 2 x 56-pixel tiles, 224 blocks of 224 threads (the busiest SMs get 2 blocks, 40 SMs one) 69.4 / 69.9 us; 4x8
#: pixels, 784 blocks of 64: 61.0; 8 channels per thread: 75.8
_CONV_RT = ((8, 4), (4, 4), (2, 4), (1, 4), (1, 1))
#: K step of the implicit-GEMM conv (H200, conv2d_bias_relu at bench size with 2 x 56-pixel tiles: BK 8 80.3 us,
#: 16 70.3 us, 32 69.4 us; 8x8-pixel tiles: 16 60.2, 32 56.8)
CONV_BK = 32


def _conv_tiles(h: int, w: int, n: int, nbatch: int, max_threads: int, bk: int = 1) -> tuple[int, ...] | None:
    """(MH, MW, TH, TW, NR, TJ) of the implicit-GEMM conv schedule (see `_implicit_gemm`); the template's double-
    buffered tiles of BK must fit in 48 KB of shared memory."""
    sms = _OPTS.get("sms", SMS)
    fallback = None
    for mr, nr in _CONV_RT:
        if n % nr:
            continue
        best = None
        for mw in range(min(mr, w), 0, -1):
            if w % mw or mr % mw or h % (mr // mw):
                continue
            mh = mr // mw
            for tj in [d for d in range(1, min(n // nr, 32) + 1) if (n // nr) % d == 0]:
                for tw in [d for d in range(1, w // mw + 1) if (w // mw) % d == 0]:
                    for th in [d for d in range(1, h // mh + 1) if (h // mh) % d == 0]:
                        t = th * tw * tj
                        if t > min(256, max_threads) or 8 * bk * (th * mh * tw * mw + 4 + tj * nr) > 48 * 1024:
                            continue
                        blocks = nbatch * (h // (th * mh)) * (w // (tw * mw)) * (n // (tj * nr))
                        even = blocks / (-(-blocks // sms) * sms) >= 0.9   # the busiest SM has at most 10 % more
                        key = (blocks >= sms and t >= 64, even, tj * nr, t, mw, tw)
                        if best is None or key > best[0]:
                            best = (key, (mh, mw, th, tw, nr, tj))
                        fkey = (t >= 64, blocks * t, mr * nr, t)
                        if fallback is None or fkey > fallback[0]:
                            fallback = (fkey, (mh, mw, th, tw, nr, tj))
        if best is not None and best[0][0]:
            return best[1]
    return fallback[1] if fallback is not None else None


def _implicit_gemm(out: str, red: str, stage: Stage, max_threads: int) -> list[Step] | None:
    """A conv-like reduction (`_conv_operand`) over (batch..., H, W, N) as an implicit GEMM: M = the output
    pixels, N = the output channels, K = the reduce axes fused in the filter's memory order.  Block tiles of
    TH x MH rows by TW x MW columns of one image (batch axes and tile indices fused into blockIdx.x) and TJ x NR
    channels; threads TH x TW x TJ (threadIdx.x), each an MH x MW x NR register tile computed at its thread
    loop, the fused K axis split by BK.  No cache_read: the code generator's implicit-GEMM template fetches the
    shared tiles of the input (through the inlined pad, guard included) and of the filter itself, proven from the
    loop nest (`codegen.cuda._igemm_info`); without it, the generic register-tiled code runs."""
    found = _conv_operand(stage)
    if found is None:
        return None
    _, korder = found
    *batch, ah, aw, aj = [a for a in stage.axes]
    nb = 1
    for a in batch:
        nb *= a.extent
    k = 1
    for a in stage.reduce_axes:
        k *= a.extent
    bk = _divisor_at_most(k, min(CONV_BK, max(1, k // 2)))    # at least two K tiles
    tiles = (tuple(int(x) for x in _OPTS["conv_tiles"]) if "conv_tiles" in _OPTS
             else _conv_tiles(ah.extent, aw.extent, aj.extent, nb, max_threads, bk))
    if tiles is None:
        return None
    mh, mw, th, tw, nr, tj = tiles[:6]
    bk = tiles[6] if len(tiles) > 6 else bk
    h, w, j = ah.name, aw.name, aj.name
    bn = [a.name for a in batch]
    steps: list[Step] = [Split(out, h, (th, mh)), Split(out, w, (tw, mw)), Split(out, j, (tj, nr)),
                         Reorder(out, tuple(bn + [f"{h}.0", f"{w}.0", f"{j}.0", f"{h}.1", f"{w}.1", f"{j}.1",
                                                  f"{h}.2", f"{w}.2", f"{j}.2"]))]
    blocks = bn + [f"{h}.0", f"{w}.0", f"{j}.0"]
    thr = f"{h}.1@{w}.1@{j}.1"
    steps += [Fuse(out, tuple(blocks)), Annotate(out, "@".join(blocks), ForKind.BLOCK_X),
              Fuse(out, (f"{h}.1", f"{w}.1", f"{j}.1")), Annotate(out, thr, ForKind.THREAD_X)]
    steps += [Annotate(out, f"{x}.2", ForKind.UNROLLED) for x in (h, w, j)]
    steps.append(ComputeAt(red, out, thr))
    kf = "@".join(korder)
    steps.append(Reorder(red, tuple(korder + bn + [h, w, j])))
    if len(korder) > 1:
        steps.append(Fuse(red, tuple(korder)))
    kin = kf
    if bk > 1 and k > bk:
        steps.append(Split(red, kf, (bk,)))
        kin = f"{kf}.1"
    steps += [Annotate(red, kin, ForKind.UNROLLED)] + [Annotate(red, x, ForKind.UNROLLED) for x in (h, w, j)]
    return steps


def _shape(cd: ComputeDef, name: str) -> tuple[int, ...]:
    for b in cd.inputs:
        if b.name == name:
            return b.shape
    return cd.stage(name).shape


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def _reduction(stage: Stage, threads: int) -> list[Step]:
    name = stage.name
    space = [a.name for a in stage.axes]
    red = [a.name for a in stage.reduce_axes]
    rn = 1
    for a in stage.reduce_axes:
        rn *= a.extent
    if not space:
        return _full_reduction(stage, threads)
    if _contiguous_in(stage, red[-1]) and rn >= 64:
        return _row_reduction(name, space, red, rn, threads, _work(stage))
    col = _column_reduction(stage)
    if col is not None:
        return col
    return _elementwise(name, stage.axes, threads)  # one thread per output, serial reduction


#: a reduction over rows (column sums: the reduce axis is not the contiguous one) with few outputs: each block 32
#: columns (threadIdx.x, coalesced) times COLUMN_SPLIT slices of the rows (threadIdx.y), the slices' partials summed
#: by threadIdx.y 0 through shared memory; else one thread per output sums its whole column (mlp_train_step's bias
#: gradient, 256 columns of 256 rows: one block of 256 threads, each 256 loads in sequence)
COLUMN_SPLIT = 16
COLUMN_MAX_OUTPUTS = 1 << 14


def _column_reduction(stage: Stage) -> list[Step] | None:
    """The split column-sum schedule above for `stage` (None when it does not apply: see COLUMN_SPLIT)."""
    space, red = stage.axes, stage.reduce_axes
    if (_RNG is not None or not _OPTS.get("column_split", True) or len(red) != 1 or not space
            or space[-1].extent % 32 or _work(stage) > COLUMN_MAX_OUTPUTS or red[0].extent < 4 * COLUMN_SPLIT
            or red[0].extent % COLUMN_SPLIT or not _contiguous_in(stage, space[-1].name)):
        return None
    name, r = stage.name, red[0].name
    steps: list[Step] = [Split(name, r, (COLUMN_SPLIT,)), RFactor(name, f"{r}.1")]
    rf = name + ".rf"
    fs, j = _fuse_all(name, [a.name for a in space])
    steps += fs + [Split(name, j, (32,)), Annotate(name, f"{j}.0", ForKind.BLOCK_X),
                   Annotate(name, f"{j}.1", ForKind.THREAD_X), ComputeAt(rf, name, f"{j}.1"),
                   Annotate(rf, f"{r}.1", ForKind.THREAD_Y)]
    return steps


def _fuse_all(name: str, iters: list[str]) -> tuple[list[Step], str]:
    if len(iters) == 1:
        return [], iters[0]
    return [Fuse(name, tuple(iters))], "@".join(iters)


def _row_reduction(name: str, space: list[str], red: list[str], rn: int, threads: int,
                   rows: int = 1) -> list[Step]:
    if rn <= WARP_ROW_MAX and rows >= 1024 and _RNG is None and _OPTS.get("warp_rows", True):
        return _warp_row_reduction(name, space, red, rn, rows)
    t = _pow2_at_most(rn, threads)
    steps, r = _fuse_all(name, red)
    steps += [Split(name, r, (t,)), RFactor(name, f"{r}.1")]
    rf = name + ".rf"
    fs, s = _fuse_all(name, space)
    steps += fs + [Annotate(name, s, ForKind.BLOCK_X), ComputeAt(rf, name, s),
                   Annotate(rf, f"{r}.1", ForKind.THREAD_X)]
    if 1 < rn // t <= 32:   # the per-thread serial part: unrolled, so its loads are in flight together
        steps.append(Annotate(rf, f"{r}.0", ForKind.UNROLLED))
    return steps


WARP_ROW_MAX = 2048     # rows up to this long: one warp per row, several rows per block
ROWS_PER_BLOCK = 8


def _warp_row_reduction(name: str, space: list[str], red: list[str], rn: int, rows: int) -> list[Step]:
    """One warp per output row (threadIdx.x: 32 lanes with strided partials, coalesced; threadIdx.y: the rows
    of the block), warp shuffles for the total: no block-wide combine."""
    steps, r = _fuse_all(name, red)
    steps += [Split(name, r, (32,)), RFactor(name, f"{r}.1")]
    rf = name + ".rf"
    fs, s = _fuse_all(name, space)
    ry = _divisor_at_most(rows, ROWS_PER_BLOCK)
    steps += fs + [Split(name, s, (ry,)), Annotate(name, f"{s}.0", ForKind.BLOCK_X),
                   Annotate(name, f"{s}.1", ForKind.THREAD_Y), ComputeAt(rf, name, f"{s}.1"),
                   Annotate(rf, f"{r}.1", ForKind.THREAD_X)]
    if 1 < -(-rn // 32) <= 64:   # the per-lane serial part: unrolled, so its loads are in flight together
        steps.append(Annotate(rf, f"{r}.0", ForKind.UNROLLED))
    return steps


#: a full reduction of fewer than 4 x THREADS elements from this many on: one block (its threads' partials summed by a
#: cross-thread reduction) instead of one thread (mlp_train_step's loss, 256 elements: 2.8 us alone on the H200)
SMALL_REDUCTION_BLOCK = 64


def _full_reduction(stage: Stage, threads: int) -> list[Step]:
    name = stage.name
    red = [a.name for a in stage.reduce_axes]
    n = 1
    for a in stage.reduce_axes:
        n *= a.extent
    steps, r = _fuse_all(name, red)
    if n < 4 * threads:   # small: one block, a thread per element (or one thread below SMALL_REDUCTION_BLOCK)
        if n < SMALL_REDUCTION_BLOCK or not SMALL_REDUCTION_BLOCK:
            return []
        t = _divisor_at_most(n, threads)
        return steps + [Split(name, r, (t,)), RFactor(name, f"{r}.1"),
                        Annotate(name + ".rf", f"{r}.1", ForKind.THREAD_X)]
    t = _divisor_at_most(n, threads)
    per = n // t
    nblocks = _divisor_at_most(per, 264)          # about two blocks per SM of partials
    serial = per // nblocks
    steps += [Split(name, r, (serial, t)), Reorder(name, (f"{r}.0", f"{r}.2", f"{r}.1")),
              Fuse(name, (f"{r}.0", f"{r}.2")), RFactor(name, f"{r}.0@{r}.2")]
    rf = name + ".rf"
    p = f"{r}.0@{r}.2"
    steps += [Split(rf, p, (t,)), Annotate(rf, f"{p}.0", ForKind.BLOCK_X), Annotate(rf, f"{p}.1", ForKind.THREAD_X)]
    if nblocks > 1:  # second level: one block of t threads sums the partials, then one thread
        steps += [Split(name, p, (t,)), RFactor(name, f"{p}.1"), Annotate(name + ".rf_", f"{p}.1", ForKind.THREAD_X)]
    return steps


def _elementwise(name: str, axes, threads: int, vector: bool = False) -> list[Step]:
    its = [a.name for a in axes]
    if not its:
        return []
    n = 1
    for a in axes:
        n *= a.extent
    steps, f = _fuse_all(name, its)
    t = min(threads, n)
    if vector and _RNG is None and _OPTS.get("vector", True) and n % VEC == 0 and n >= VEC * t:
        return steps + _vector_elementwise(name, f, n, t)
    per = 4 if n >= t * 4 * 1024 else 1
    if "per" in _OPTS and n % (int(_OPTS["per"]) * t) == 0:
        per = int(_OPTS["per"])
    if _RNG is not None:
        per = int(_RNG.choice([1, 2, 4]))
    if per > 1:
        steps += [Split(name, f, (per, t)), Annotate(name, f"{f}.0", ForKind.BLOCK_X),
                  Annotate(name, f"{f}.1", ForKind.UNROLLED), Annotate(name, f"{f}.2", ForKind.THREAD_X)]
    else:
        steps += [Split(name, f, (t,)), Annotate(name, f"{f}.0", ForKind.BLOCK_X),
                  Annotate(name, f"{f}.1", ForKind.THREAD_X)]
    return steps


VEC = 4    # elements per vectorized access (float4) of elementwise stages


def _vector_elementwise(name: str, f: str, n: int, t: int) -> list[Step]:
    """blockIdx.x / [unrolled per] / threadIdx.x / vectorized 4: each thread stores VEC consecutive elements at
    once (a float4 store, and float4 loads of the inputs read at the same elements, see `codegen.cuda`), and
    `per` of those groups, a block's width apart (coalesced), in flight together."""
    per = int(_OPTS.get("per", 1))   # H200: one float4 per thread beat 2 and 4 (gelu_tanh 91 vs 89 %, sin 81 vs 76)
    if n % (per * t * VEC):
        per = 1
    if per > 1:
        return [Split(name, f, (per, t, VEC)), Annotate(name, f"{f}.0", ForKind.BLOCK_X),
                Annotate(name, f"{f}.1", ForKind.UNROLLED), Annotate(name, f"{f}.2", ForKind.THREAD_X),
                Annotate(name, f"{f}.3", ForKind.VECTORIZED)]
    return [Split(name, f, (t, VEC)), Annotate(name, f"{f}.0", ForKind.BLOCK_X),
            Annotate(name, f"{f}.1", ForKind.THREAD_X), Annotate(name, f"{f}.2", ForKind.VECTORIZED)]


__all__ = ["default_gpu_schedule"]
