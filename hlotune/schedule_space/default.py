"""Default schedules: a sound heuristic per stage kind, so every model runs fast untuned.

Map:
  default_schedule(cd, target) -> list[Step]      the whole compute definition
  _tiled_pair(O, D, ...)        dot / conv: register-tiled reduction D computed at a tile of its
                                elementwise consumer O (or of its own cache_write copy)
  _gemm / _gemm_plan            the packed, register-tiled GEMM form of such a pair; `_panel_tiles`: its
                                column-panel plan (each parallel task packs the B panel it reads);
                                `transposed_pack`: the loops of a packed copy of a B contiguous along k
  gemm_sketch(cd, target)       the default with the column-panel GEMM's row tile and k block as holes, a
                                sketch template for the search
  _gemv / _dot_tile             dots with a single row and B stored [K, N] (row streaming into partial rows), and
                                with a few rows and B stored [N, K] (a register tile of dot products along k)
  _reduction(R, ...)            row reductions vectorized through rfactor; column reductions
                                vectorized over the contiguous space axis; full reductions split
                                into parallel partials
  _elementwise(S, ...)          parallel outer loop, vectorized innermost axis
  _row_plan(cd, ...)            row (normalization) subgraphs, see `fusion` row fusion: the row
                                statistics (reductions over the trailing axes) and the full-row
                                intermediates computed at the parallel row loop of the output
  row_sketch(cd, target)        the same plan with holes, a sketch template for the search

Rules (CPU): every stage stays at root except a tiled reduction, which is computed inside the tile
loop of its consumer (Ansor's "fuse the elementwise consumer") or of a local cache_write copy (its
accumulator tile then lives in registers), and the stages of a row subgraph (softmax, layernorm, RMS
norm): the last output that reads row statistics (reductions over its trailing axes) is the host, parallel
over its (fused) row loops; every non-output stage with the same row axes whose consumers are all
inside the host is computed at the host's row loop, reductions vectorized along the row with up to
REDUCE_VECS accumulators (rfactor) folded by vector operations, so a row is read from memory once, stays
in cache for the next stage and the output is written once.  Rows too short for a vector (10 logits) keep
the per-stage defaults, which vectorize across rows.  Loops are parallel only when a stage has enough work
to pay for waking the thread pool; vector widths are the target's lanes for the element type;
tile sizes are divisors of the extents, so no guards are needed, except in dots whose rows or columns have no
good divisor: there the reduction is padded (`steps.Pad`, a padded `Pack` of B) or its last column tile shifted
inwards, and only the consumer keeps a tail guard (split off by `codegen.partition`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..ir.expr import Binary, ComputeDef, Load, Select, Stage, Unary, Var, walk
from ..ir.hlo import TRANSCENDENTAL, Op
from ..target import Target
from .loop_ir import ForKind
from .steps import Annotate, CacheWrite, ComputeAt, Fuse, Pack, Pad, Pragma, Reorder, RFactor, Split, Step

#: a stage with fewer scalar operations than this runs on one thread
PARALLEL_MIN_WORK = 1 << 16
#: register tile of the tiled reductions: rows x vectors of lanes
TILE_ROWS = 4
TILE_VECS = 2
#: rows of the register tile of a small-N dot (`_small_n_tile`): one accumulator vector each.  Measured (2-core
#: AVX-512 VM, mlp2's logits dot [256,512] x [512,10], parallel): 4 / 8 / 16 / 32 rows 20.7 / 19.8 / 19.1 / 47.7 us;
#: the dot-product plan it replaced (a dot per output over a transposed pack of B) 32-50 us
SMALL_N_ROWS = 16
#: GEMM blocking: most micro-tile rows, cache tile rows and columns (see `_gemm_plan`)
MAX_MR = 8
MAX_MR_PADDED = 4   # rows whose A loads are masked (padded convolutions): measured faster with fewer
#: a dot whose output columns take no full micro-tile width (2 vectors: 509, 500, 1000 or 197 columns with 16
#: lanes) computes them padded to a multiple of it (`steps.Pad`, out of a padded packed B) when the useful share of
#: the padded columns is at least this many times the width of the micro-tile that divides them over the full
#: width (197: 0.88 against 0, the dot-product form; 1000: 0.98 against 8 / 32; 784: 0.98 against 16 / 32, padded:
#: 256 x 256 x 784 1.05x, 512 x 1024 x 784 1.11x, 128 x 512 x 1040 1.14x, 256^2 x 784 with A transposed 1.25x
#: on the 2-core AVX-512 VM; 48: 0.75 against 16 / 32, kept, not measured)
PAD_GAIN = 1.75
TILE_M = 64
TILE_N = 64
#: the packed GEMM's wider micro-tiles (`_register_panel`): vectors per micro-tile row, the widest first (the
#: column-panel plan only), and the share of L1 the widest one's packed slab of B (K x nr floats) may take
REGISTER_PANEL_VECS = (8, 4)
REGISTER_PANEL_L1 = 2 / 3
#: a GEMM whose columns the plan would pad (B packed and padded in a pass of its own) reads B unpacked instead, with
#: two-vector micro-tiles over the whole reduction and cache tiles of UNPACKED_TILE_M rows x one micro-tile, when B
#: is contiguous along the columns, the target has 32 vector registers and the K x nr panel of B a tile reads fits
#: UNPACKED_L1 of L1 (`_unpacked_short_k`): at 256 rows the copy of B costs a fifth of the GEMM.  Measured on the
#: 2-core AVX-512 VM (docs/benchmarks.md, CPU "unpacked B for short reductions"): K = 64-256, 48-1024 rows, 500,
#: 784 and 1000 columns, compiled whole, 1.13-1.50x the padded plan on 8 of 10 shapes and ties on the others (the
#: kernels alone 1.01-1.60x; mlp_grad_dot_9's [256,256]^T x [256,784] 0.314 -> 0.271 ms).  With many
#: rows the pack pays for itself (its cost is 1/M of the GEMM's), and unpacked B's vector loads cross cache lines
#: when the caller's array is not 64-byte aligned (numpy's often are not): rows x K at most UNPACKED_MAX_ROWS_K
#: (512 x 256 x 784: 1.18x with B aligned, 0.94x at 16 bytes off; 256 x 256 x 784 1.26x and 1.02x; 1024 x 256 x 784
#: 0.96x compiled whole)
UNPACKED_TILE_M = 16
UNPACKED_L1 = 2 / 3
UNPACKED_MAX_ROWS_K = 1 << 16
#: with 16 vector registers (AVX2), a GEMM with a short reduction reads B unpacked and each cache tile is one mr x nr
#: micro-tile, its accumulators in registers over the whole reduction (`_unpacked_in_registers`): K at most
#: UNPACKED16_MAX_K (or UNPACKED16_LONG_K with at most UNPACKED16_LONG_K_EXTENT rows and columns), B contiguous
#: along the columns and its K x N floats within UNPACKED16_L2 of L2, rows x K at most UNPACKED_MAX_ROWS_K.  The plan it
#: replaces packs B and goes through an L1 copy of the tile's accumulators.  Measured on the 2-core Zen 1 host,
#: compiled dense layers and batch_matmul (docs/benchmarks.md, CPU "the Zen 1 host, tuned models and unpacked B in
#: registers" and "unpacked B in registers for longer reductions"): K = 32-96 1.03-1.20x; K = 128-1024 with at most
#: 128 rows and columns 1.17x over 13 shapes (0.94-1.75x, 64 x 1024 x 64 1.70x), but 256 rows or 512 columns tied or
#: lost from one run to the next (256 x 256 x 256 1.06x then 0.78x, 512 x 128 x 512 0.76-0.81x in two sessions)
UNPACKED16_MAX_K = 96
UNPACKED16_LONG_K = 1024
UNPACKED16_LONG_K_EXTENT = 128
UNPACKED16_L2 = 0.5
#: vector accumulators of a full reduction (hide the latency of the adds)
REDUCE_VECS = 4
#: row reductions (see `_row_reduction`): a narrower vector when a row has fewer than this many vectors, and
#: one more accumulator per this many vectors (at most REDUCE_VECS)
ROW_MIN_VECS = 4
ROW_VECS_PER_ACC = 4
#: the partials of a row reduction are folded by vector operations down to this many lanes, then added one
#: after the other.  Measured (softmax, 4M floats, rows of 32..4096): folding the 16..64 partials one by one
#: (a chain of dependent scalar ops per row) cost up to 40% (short rows); with the fold the accumulator
#: count (1..16 per row) changes the time by less than 3%
ROW_TREE_LANES = 4
#: parts of the reduction per core of a GEMV's row streaming (`_gemv`); 1 and 2 measured alike (4096 x 4096)
GEMV_PARTS_PER_CORE = 2
#: register tile of `_dot_tile` (dot products of x[.., M, K] and W[.., N, K] along k): up to this many rows of x
#: take all of them (more take 4 or 3, `_dot_tile_rows`), and rows x cols vector accumulators
DOT_TILE_ROWS = 6
DOT_TILE_ACCS = 16
#: pack B only when at least this many output rows reuse each of its elements
PACK_MIN_ROWS = 16
#: the column-panel GEMM plan (see `_gemm`): a parallel task owns the columns of a panel of at most
#: PANEL_N columns (packing that panel of B itself, into at most PANEL_BYTES), at least PANEL_TASKS_PER_CORE
#: tasks per core.  Measured (1024^3 matmul, one core, CPU time): 1.10-1.15x the per-call packed B of the
#: 64x64-tile plan (the panel stays in L2 between its packing and its use; no separate pass over memory)
PANEL_N = 128
PANEL_BYTES = 1 << 20
PANEL_TASKS_PER_CORE = 4
#: a transposed B (contiguous along k) is packed in blocks of this many k values: each block reads nr rows of
#: PACK_KB floats and writes PACK_KB contiguous rows of nr floats.  Measured (attention dot of transformer_block,
#: [32,128,512] x [32,128,512]^T, nr = 32): copying whole rows of k wrote a 64 KB panel 4 bytes per line 32 times
#: over (more than L1), 3.6 ms for the dot; in blocks of 16, 2.1 ms
PACK_KB = 16
#: stages that evaluate a polynomial math function per element (exp, tanh, sin, ...; not sqrt, one instruction)
#: are vectorized at twice the target's vector width, up to MATH_LANES lanes: each iteration then runs two
#: vectors whose long dependency chains overlap (`_math_lanes`)
POLY_MATH = TRANSCENDENTAL - {Op.SQRT, Op.RSQRT}
MATH_LANES = 16
#: a row plan's full-row stage that evaluates a POLY_MATH function prefetches the rows this far ahead of the row
#: loop (pragma `prefetch_rows`, codegen.llvm_emit) of the arguments the row loop walks, spread over its loop, so
#: the memory traffic of the next row overlaps the math of this one (the row's other passes read L1).  0: off.
#: Measured on an AMD Zen 1 (docs/benchmarks.md, session 51): softmax 4096 x 1024 1.12x alone, 1.32x with the
#: uniform division of codegen.llvm_emit (its last pass then no longer waits on `vdivps`).
ROW_PREFETCH_AHEAD = 1
#: largest row tile and k block the search tries in the column-panel GEMM sketch (`gemm_sketch`)
GEMM_MAX_ROWS = 256
GEMM_MAX_KC = 512


def default_schedule(cd: ComputeDef, target: Target | None = None, *, gemm_holes: bool = False) -> list[Step]:
    """Steps of the default schedule of `cd` for `target` (the host CPU if None).  With `gemm_holes`, the row
    tile and the k block of column-panel GEMMs are Split factors None (`gemm_sketch`)."""
    target = target or Target.host_cpu()
    lanes = max(1, target.vector_bits // 32)
    steps: list[Step] = []
    consumers = _consumers(cd)
    done: set[str] = set()
    names = {s.name for s in cd.stages} | {b.name for b in cd.inputs}
    row = _row_plan(cd, lanes, names, consumers)
    if row is not None:
        row_steps, attached = row
        steps += row_steps
        done |= attached
    for stage in reversed(cd.stages):
        if stage.name in done:
            continue
        done.add(stage.name)
        producer = _fusable_producer(cd, stage, consumers)
        if producer is not None:
            done.add(producer.name)
            gemm = _gemm(cd, stage.name, producer.name, producer, target, lanes, names, gemm_holes)
            steps += gemm if gemm is not None else _tiled_pair(stage.name, producer.name, stage.axes, producer, lanes)
        elif stage.is_reduction and _gemv_like(stage, lanes):
            steps += _gemv(stage, lanes, target.cores, names)
        elif stage.is_reduction and _few_rows_dot(stage, lanes):
            steps += _dot_tile(stage, lanes, names, stage.name not in cd.outputs)
        elif stage.is_reduction and _small_n_dot(stage, lanes):
            steps += _small_n_tile(stage, names)
        elif stage.is_reduction and _is_tiled_reduction(stage, lanes):
            steps.append(CacheWrite(stage.name, "local"))
            local = _fresh_name(names, stage.name + ".local")
            gemm = _gemm(cd, stage.name, local, stage, target, lanes, names, gemm_holes)
            steps += gemm if gemm is not None else _tiled_pair(stage.name, local, stage.axes, stage, lanes)
        elif stage.is_reduction:
            steps += _reduction(stage, lanes, target.cores, names)
        else:
            steps += _elementwise(stage, lanes, target.cores)
    return steps


# ----------------------------------------------------------------------------- row subgraphs

def _row_host(cd: ComputeDef) -> tuple[Stage, int] | None:
    """The host of a row subgraph and its number of row axes k: the last output that is not a reduction
    and whose first k axes are the space axes of every reduction (all of which reduce the rest)."""
    reds = [s for s in cd.stages if s.is_reduction]
    spaces = {(tuple(a.extent for a in r.axes), tuple(a.extent for a in r.reduce_axes)) for r in reds}
    if len(spaces) != 1:
        return None
    ((row, red),) = spaces
    k = len(row)
    if k < 1:
        return None
    for name in reversed(cd.outputs):
        h = cd.stage(name)
        if (not h.is_reduction and tuple(a.extent for a in h.axes) == row + red   # a dot's output is not
                and _reads_any(cd, h, reds)):
            return h, k
    return None


def _loaded(stage: Stage) -> set[str]:
    return {e.buffer for e in walk(stage.body) if isinstance(e, Load)}


def _reads_any(cd: ComputeDef, stage: Stage, reds: list[Stage]) -> bool:
    """`stage` reads one of `reds`, directly or through other stages."""
    want = {r.name for r in reds}
    seen, todo = set(), [stage.name]
    while todo:
        n = todo.pop()
        for b in _loaded(cd.stage(n)):
            if b in want:
                return True
            if b in cd.stage_by_name and b not in seen:
                seen.add(b)
                todo.append(b)
    return False


def _row_members(cd: ComputeDef, lanes: int, consumers: dict[str, list[str]]) -> tuple[Stage, int, list[Stage]] | None:
    """(host, number of row axes, the stages computed at its row loop, last first) of a row subgraph."""
    found = _row_host(cd)
    if found is None:
        return None
    host, k = found
    if not _vector_width(host.axes[-1].extent, lanes):
        return None     # rows that take no vector (e.g. 10 logits): per-stage defaults vectorize across rows
    row = tuple(a.extent for a in host.axes[:k])
    attached: list[Stage] = []
    inside = {host.name}
    for s in reversed(cd.stages):
        if (s.name in inside or s.name in cd.outputs or tuple(a.extent for a in s.axes[:k]) != row
                or not consumers[s.name] or not set(consumers[s.name]) <= inside):
            continue
        attached.append(s)
        inside.add(s.name)
    if not any(s.is_reduction for s in attached):
        return None
    return host, k, attached


def _row_steps(host: Stage, k: int, attached: list[Stage], lanes: int, names: set[str], holes: bool) -> list[Step]:
    """The row plan's steps; with `holes`, the Splits of the host's row loop (rows per parallel task) and of
    the innermost axes of the host and the full-row intermediates (vector lanes) have factor None."""
    steps: list[Step] = []
    for s in attached:
        if s.is_reduction:
            steps += _row_reduction(s, lanes, names)
    h = host.name
    outer = [a.name for a in host.axes[:k]]
    at = outer[0]
    if k > 1:
        steps.append(Fuse(h, tuple(outer)))
        at = "@".join(outer)
    if holes:
        steps += [Split(h, at, (None,)), Annotate(h, f"{at}.0", ForKind.PARALLEL)]
        at = f"{at}.1"
    elif _work(host) * (1 + len(attached)) >= PARALLEL_MIN_WORK:
        steps.append(Annotate(h, at, ForKind.PARALLEL))
    steps += _row_vectorize(host, lanes, holes)
    steps += [ComputeAt(s.name, h, at) for s in attached]
    for s in attached:
        if not s.is_reduction:
            steps += _row_vectorize(s, lanes, holes) + _row_prefetch(s, lanes)
    return steps


def _row_prefetch(stage: Stage, lanes: int) -> list[Step]:
    """The pragma `prefetch_rows` (ROW_PREFETCH_AHEAD) on the vector-split loop of a full-row stage that evaluates a
    POLY_MATH function: the row's memory traffic is then in flight while its math runs."""
    if ROW_PREFETCH_AHEAD <= 0 or not _calls_poly_math(stage):
        return []
    last = stage.axes[-1]
    if not _vector_width(last.extent, _math_lanes(stage, lanes)):
        return []
    return [Pragma(stage.name, f"{last.name}.0", "prefetch_rows", ROW_PREFETCH_AHEAD)]


def _row_plan(cd: ComputeDef, lanes: int, names: set[str],
              consumers: dict[str, list[str]]) -> tuple[list[Step], set[str]] | None:
    """The steps of a row subgraph (see the module docstring) and the stages they schedule; None when
    `cd` is not one (or the plan does not replay: then every stage gets its own default)."""
    from ..errors import ScheduleError
    from .state import replay

    found = _row_members(cd, lanes, consumers)
    if found is None:
        return None
    host, k, attached = found
    trial = set(names)
    steps = _row_steps(host, k, attached, lanes, trial, False)
    try:
        replay(cd, steps)
    except ScheduleError:
        return None
    names |= trial
    return steps, {host.name} | {s.name for s in attached}


def row_sketch(cd: ComputeDef, target: Target | None = None) -> tuple[list[Step], set[str]] | None:
    """The default's row plan as a sketch template for the search (`sketch.generate_sketches`): its steps with
    holes (Split factors None: rows per parallel task, vector lanes of the host and of the full-row
    intermediates) and the stages it schedules; None when `cd` is not a row subgraph."""
    target = target or Target.host_cpu()
    lanes = max(1, target.vector_bits // 32)
    consumers = _consumers(cd)
    names = {s.name for s in cd.stages} | {b.name for b in cd.inputs}
    if _row_plan(cd, lanes, set(names), consumers) is None:
        return None
    host, k, attached = _row_members(cd, lanes, consumers)
    return _row_steps(host, k, attached, lanes, names, True), {host.name} | {s.name for s in attached}


def gemm_sketch(cd: ComputeDef, target: Target | None = None) -> tuple[list[Step], list[tuple[int, int, int]]] | None:
    """The default schedule as a sketch template for the search when it has a column-panel GEMM
    (`sketch.generate_sketches`): its steps with the row tile of each such GEMM (Split of the output's row axis)
    and its k block (Split of the reduction's longest reduce axis) as holes, and per hole (step index, extent of
    the split axis, largest factor: GEMM_MAX_ROWS or GEMM_MAX_KC); None when there is no such GEMM.  Rows the
    GEMM pads (`_Gemm.ip`) give the row hole the padded extent (tiles dividing it) and at most the real rows as
    its largest factor (a larger tile would shrink to the rows in `lower`'s bound inference)."""
    target = target or Target.host_cpu()
    steps = default_schedule(cd, target, gemm_holes=True)
    padded = {st.iter: st.extent for st in steps if isinstance(st, Pad)}
    holes = []
    for k, st in enumerate(steps):
        if isinstance(st, Split) and None in st.factors:
            src = next(s for s in cd.stages if st.stage == s.name or st.stage.startswith(s.name + ".local"))
            ax = next(a for a in src.axes + src.reduce_axes if a.name == st.iter)
            if any(a.name == st.iter for a in src.reduce_axes):
                holes.append((k, ax.extent, GEMM_MAX_KC))
            else:
                holes.append((k, padded.get(st.iter, ax.extent), min(GEMM_MAX_ROWS, ax.extent)))
    return (steps, holes) if holes else None


def _row_reduction(stage: Stage, lanes: int, names: set[str]) -> list[Step]:
    """A row reduction computed per row: `nacc` vector accumulators of v lanes along the contiguous last
    reduce axis (rfactor), then a tree of rfactors that folds them (nacc vectors -> one, then halves down to
    ROW_TREE_LANES lanes, each level one vector operation) so that only ROW_TREE_LANES partials are combined
    one after the other; every partial stage is computed at the stage's last space loop.  The plain loop
    nest when the row is not contiguous or too short for a vector."""
    last = stage.reduce_axes[-1]
    v = _vector_width(last.extent, lanes)
    while v > 4 and last.extent < ROW_MIN_VECS * v:
        v //= 2
    if not v or not _contiguous_in(stage, last.name) or last.extent < 2 * v:
        return []
    nacc = _divisor_at_most(last.extent // v, max(1, min(REDUCE_VECS, last.extent // (v * ROW_VECS_PER_ACC))))
    name, rl = stage.name, last.name
    space = [a.name for a in stage.axes]
    others = [a.name for a in stage.reduce_axes[:-1]]
    partials = [_fresh_name(names, name + ".rf")]
    steps: list[Step] = [Split(name, rl, (v * nacc,)), RFactor(name, f"{rl}.1")]
    inner = [f"{rl}.1"]
    if nacc > 1:
        steps.append(Split(partials[0], f"{rl}.1", (v,)))
        inner = [f"{rl}.1.0", f"{rl}.1.1"]
    steps.append(Reorder(partials[0], tuple(space + others + [f"{rl}.0"] + inner)))
    if nacc > 1:
        steps.append(Annotate(partials[0], inner[0], ForKind.UNROLLED))
    steps.append(Annotate(partials[0], inner[-1], ForKind.VECTORIZED))
    ax, width = f"{rl}.1", v * nacc
    while width > ROW_TREE_LANES:
        part = width // nacc if nacc > 1 else width // 2
        nacc = 1
        rf = _fresh_name(names, name + ".rf")
        partials.append(rf)
        steps += [Split(name, ax, (part,)), RFactor(name, f"{ax}.1"),
                  Reorder(rf, tuple(space + [f"{ax}.0", f"{ax}.1"])), Annotate(rf, f"{ax}.1", ForKind.VECTORIZED)]
        ax, width = f"{ax}.1", part
    steps += [ComputeAt(rf, name, space[-1]) for rf in reversed(partials)]
    return steps


def _row_vectorize(stage: Stage, lanes: int, hole: bool = False) -> list[Step]:
    last = stage.axes[-1]
    v = _vector_width(last.extent, _math_lanes(stage, lanes))
    if not v:
        return []
    return [Split(stage.name, last.name, (None if hole else v,)),
            Annotate(stage.name, f"{last.name}.1", ForKind.VECTORIZED)]


def _consumers(cd: ComputeDef) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s.name: [] for s in cd.stages}
    for s in cd.stages:
        for n in {e.buffer for e in walk(s.body) if isinstance(e, Load)}:
            if n in out:
                out[n].append(s.name)
    return out


def _is_dot_like(stage: Stage) -> bool:
    """A dot- or conv-like reduction: a sum of products of loads over two or more space axes."""
    if not stage.is_reduction or len(stage.axes) < 2 or stage.reducer is None or stage.reducer.op is not Op.ADD:
        return False
    return any(isinstance(e, Binary) and e.op is Op.MULTIPLY for e in walk(stage.body))


def _is_tiled_reduction(stage: Stage, lanes: int) -> bool:
    """A dot-like reduction (`_is_dot_like`) whose last space axis takes a vector, or is padded to take two."""
    return _is_dot_like(stage) and bool(_gemm_width(stage, lanes)[0])


def _gemm_width(stage: Stage, lanes: int) -> tuple[int, int, int]:
    """(vl, nvec, jp) of a dot-like stage's micro-tile columns: vector lanes (0: none fits), vectors per row, and
    the padded extent of its last space axis (0: not padded).  Padded to a multiple of two full vectors when no
    such width divides the axis, padding pays (PAD_GAIN), and B can be packed (the padded columns read a padded
    copy of B: `_padding_ok`); two full vectors, not padded, when B is read unpacked along the columns
    (`_unpacked_contiguous`)."""
    J = stage.axes[-1].extent
    vl = _vector_width(J, lanes)
    nvec = 2 if vl and J % (2 * vl) == 0 else 1
    full = 2 * lanes
    if lanes < 4 or vl * nvec >= full or J < full:
        return vl, nvec, 0
    if _padding_ok(stage):
        jp = -(-J // full) * full
        if J * full >= PAD_GAIN * vl * nvec * jp:   # the useful share of the padded tile vs the narrower tile's
            return lanes, 2, jp
    elif _unpacked_contiguous(stage):
        return lanes, 2, 0
    return vl, nvec, 0


def _b_reuse(stage: Stage) -> tuple[bool, bool, int] | None:
    """The dot's B operand (`_b_operand`, not the stage itself): (contiguous along the columns j, contiguous along
    the reduction k, how many output rows reuse each element); None if it has none."""
    b = _b_operand(stage)
    if b is None or b[0].buffer == stage.name:
        return None
    last = len(b[0].indices) - 1
    return b[1] == last, b[2] == last, _reuse_rows(stage, b[0])


def _padding_ok(stage: Stage) -> bool:
    """The dot's B operand is reused by enough rows to be packed (`_gemm`), contiguous along the columns or along
    the reduction (q @ k^T: the copy reads along k, `transposed_pack`)."""
    b = _b_reuse(stage)
    return b is not None and b[2] >= PACK_MIN_ROWS


def _unpacked_contiguous(stage: Stage) -> bool:
    """The dot's B operand is read unpacked (too few rows reuse it to pay for a copy: a GEMV or a few rows) and
    contiguously along the columns: full-width column tiles that do not divide the columns need no padding then,
    the last one is shifted inwards (`lower`: the reduction's region at a tile of its consumer keeps its extent)."""
    b = _b_reuse(stage)
    return b is not None and b[0] and b[2] < PACK_MIN_ROWS


def _fusable_producer(cd: ComputeDef, stage: Stage, consumers: dict[str, list[str]]) -> Stage | None:
    """The tiled reduction that `stage` (elementwise, same axes) can host at its tile loop."""
    if stage.is_reduction:
        return None
    for name in {e.buffer for e in walk(stage.body) if isinstance(e, Load)}:
        prod = cd.stage_by_name.get(name)
        if (prod is not None and prod.name not in cd.outputs and consumers[prod.name] == [stage.name]
                and _is_tiled_reduction(prod, 8) and not _gemv_like(prod, 8) and not _few_rows_dot(prod, 8)
                and prod.shape == stage.shape
                and _reads_same_point(stage, prod.name)):
            return prod
    return None


def _at_point(stage: Stage, load: Load) -> bool:
    """`load` is at the stage's own index (i0, i1, ...)."""
    return tuple(getattr(i, "name", None) for i in load.indices) == tuple(a.name for a in stage.axes)


def _reads_same_point(stage: Stage, buf: str) -> bool:
    """Every load of `buf` in `stage` is at the stage's own index."""
    return all(_at_point(stage, e) for e in walk(stage.body) if isinstance(e, Load) and e.buffer == buf)


def _off_point(stage: Stage) -> bool:
    """Some non-scalar load of the body is not at the stage's own index (a broadcast or transposed operand):
    vectors over the fused axes would gather it lane by lane where they cross a row (`param_1[i0]` of a
    [256, 10] stage: 5.5 us fused in 16 lanes, 1.3 us in rows of 10)."""
    return any(isinstance(e, Load) and e.indices and not _at_point(stage, e) for e in walk(stage.body))


def _vector_width(extent: int, lanes: int) -> int:
    """The widest power-of-two vector (at most `lanes`, at least 4) that divides `extent`; 0 if none."""
    v = lanes
    while v >= 4:
        if extent % v == 0:
            return v
        v //= 2
    return 0


def _short_axis_width(extent: int, lanes: int) -> int:
    """Vector lanes along a contiguous last space axis: the power-of-two width if one divides it, else its widest
    divisor of at most `lanes` (a short axis such as 10 logits, whole: a column reduction's reduce loop outside
    it reads rows, 7x faster than walking each column's 256 strided floats); 0 below 3."""
    w = _vector_width(extent, lanes) or _divisor_at_most(extent, lanes)
    return w if w >= 3 else 0


def _divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def _work(stage: Stage) -> int:
    n = 1
    for a in stage.axes + stage.reduce_axes:
        n *= a.extent
    return n


def _tiled_pair(out: str, red: str, axes, red_stage: Stage, lanes: int) -> list[Step]:
    """Tile `out` over its last two axes and compute `red` at the tile (register blocking), B unpacked
    (the fallback of `_gemm` when B cannot be packed)."""
    *batch, ax_i, ax_j = [a for a in axes]
    I, J = ax_i.extent, ax_j.extent
    lanes = _vector_width(J, lanes) or 1
    nr = lanes * TILE_VECS if J % (lanes * TILE_VECS) == 0 else lanes
    mr = _divisor_at_most(I, TILE_ROWS)
    ti = _divisor_at_most(I // mr, max(1, 64 // mr))
    tj = _divisor_at_most(J // nr, max(1, 256 // nr))
    i, j = ax_i.name, ax_j.name
    steps: list[Step] = [Split(out, i, (ti, mr)), Split(out, j, (tj, nr))]
    outer = [a.name for a in batch] + [f"{i}.0", f"{j}.0"]
    steps.append(Reorder(out, tuple(outer + [f"{j}.1", f"{i}.1", f"{i}.2", f"{j}.2"])))
    steps.append(Fuse(out, tuple(outer)))
    if _work(red_stage) >= PARALLEL_MIN_WORK:
        steps.append(Annotate(out, "@".join(outer), ForKind.PARALLEL))
    steps.append(ComputeAt(red, out, f"{i}.1"))
    red_axes = [a.name for a in red_stage.reduce_axes]
    steps.append(Reorder(red, tuple([a.name for a in batch] + red_axes + [i, j])))
    if lanes > 1:
        steps += [Split(red, j, (lanes,)), Annotate(red, f"{j}.1", ForKind.VECTORIZED),
                  Annotate(red, f"{j}.0", ForKind.UNROLLED)]
        steps += [Split(out, f"{j}.2", (lanes,)), Annotate(out, f"{j}.2.1", ForKind.VECTORIZED)]
    steps.append(Annotate(red, i, ForKind.UNROLLED))
    return steps


def _small_n_dot(stage: Stage, lanes: int) -> bool:
    """A dot-like reduction (`_is_dot_like`) whose last space axis j is narrower than a vector and takes no
    power-of-two vector (N = 10 logits): B is read contiguously along j, A not indexed by j."""
    if not _is_dot_like(stage):
        return False
    J = stage.axes[-1].extent
    if not 2 <= J < lanes or _vector_width(J, lanes):
        return False
    j = stage.axes[-1].name
    b_ok = False
    for e in walk(stage.body):
        if isinstance(e, Load):
            names = [x.name if isinstance(x, Var) else None for x in e.indices]
            if j in names:
                if names[-1] != j or not any(a.name in names for a in stage.reduce_axes):
                    return False
                b_ok = True
    return b_ok


def _small_n_tile(stage: Stage, names: set[str]) -> list[Step]:
    """Register tile of a small-N dot (`_small_n_dot`): a local accumulator of up to SMALL_N_ROWS rows x the
    whole j axis (one vector of J lanes per row), per reduction step one load of B's row and a broadcast of A per
    row; parallel over the (batch, row tile) loops.  Convolutions with few output channels take it too (rows:
    the output columns)."""
    name = stage.name
    *batch, ax_i, ax_j = stage.axes
    i, j = ax_i.name, ax_j.name
    mr = _divisor_at_most(ax_i.extent, SMALL_N_ROWS)
    steps: list[Step] = [CacheWrite(name, "local"), Split(name, i, (mr,))]
    local = _fresh_name(names, name + ".local")
    outer = [a.name for a in batch] + [f"{i}.0"]
    if len(outer) > 1:
        steps.append(Fuse(name, tuple(outer)))
    fused = "@".join(outer)
    if _work(stage) >= PARALLEL_MIN_WORK:
        steps.append(Annotate(name, fused, ForKind.PARALLEL))
    red = [a.name for a in stage.reduce_axes]
    steps += [Annotate(name, j, ForKind.VECTORIZED), ComputeAt(local, name, fused),
              Split(local, i, (mr,)), Reorder(local, tuple([a.name for a in batch] + [f"{i}.0"] + red + [f"{i}.1", j])),
              Annotate(local, f"{i}.1", ForKind.UNROLLED), Annotate(local, j, ForKind.VECTORIZED)]
    return steps


# ----------------------------------------------------------------------------- GEMV-like stages

def _gemv_like(stage: Stage, lanes: int) -> bool:
    """A dot-like reduction over one axis with a single output row (x[1, K] @ W[K, N]: batch-1 inference) whose
    B is read contiguously along the N >= two vectors output columns, with enough work to run in parallel."""
    if not _is_dot_like(stage) or len(stage.reduce_axes) != 1 or _work(stage) < PARALLEL_MIN_WORK:
        return False
    if math.prod(a.extent for a in stage.axes[:-1]) != 1 or stage.axes[-1].extent < 2 * lanes:
        return False
    b = _b_reuse(stage)
    return b is not None and b[0]


def _gemv(stage: Stage, lanes: int, cores: int, names: set[str]) -> list[Step]:
    """Row streaming: K split into GEMV_PARTS_PER_CORE parts per core (rfactor), each task adding its rows of W,
    one after the other and each along its whole length, into a partial row of N accumulators (which stays in
    L1/L2); then the partial rows are added.  W is read once, contiguously, as the hardware prefetchers like it; the
    tile plan reads it in short segments with a row's stride between them (4096 x 4096 on the 2-core AVX-512 VM:
    2.28 -> 1.06-1.15 ms, numpy 1.12; 4096 x 1024: 0.45 -> 0.34-0.40)."""
    name, k = stage.name, stage.reduce_axes[0]
    rows = [a.name for a in stage.axes[:-1]]
    j = stage.axes[-1].name
    want = GEMV_PARTS_PER_CORE * max(1, cores)
    parts = _divisor_at_most(k.extent, want)
    if parts < max(2, cores):      # a prime K: parts that do not divide it (the rfactor guards the last one)
        parts = want
    v = _vector_width(stage.axes[-1].extent, lanes) or lanes
    rf = _fresh_name(names, name + ".rf")
    k0, k1 = f"{k.name}.0", f"{k.name}.1"
    steps: list[Step] = [Split(name, k.name, (parts,), inner_to_outer=False), RFactor(name, k0)]
    inner = [k1]
    if k.extent % parts == 0 and (k.extent // parts) % 2 == 0:
        steps.append(Split(rf, k1, (2,)))
        inner = [f"{k1}.0", f"{k1}.1"]
    steps += [Split(rf, j, (v,)), Reorder(rf, tuple([k0] + rows + inner + [f"{j}.0", f"{j}.1"])),
              Annotate(rf, k0, ForKind.PARALLEL), Annotate(rf, f"{j}.1", ForKind.VECTORIZED)]
    if len(inner) == 2:
        steps.append(Annotate(rf, inner[1], ForKind.UNROLLED))
    return steps + [Reorder(name, tuple(rows + [k0, j])), Split(name, j, (v,)),
                    Annotate(name, f"{j}.1", ForKind.VECTORIZED)]


def _few_rows_dot(stage: Stage, lanes: int) -> bool:
    """A dot over one axis k that both operands hold contiguously (x[.., M, K] @ W[.., N, K]^T: weights stored
    [out, in], attention scores) with too few rows reusing W to pack it (a GEMV, a small batch)."""
    if not _is_dot_like(stage) or len(stage.reduce_axes) != 1 or len(stage.axes) < 2:
        return False
    k = stage.reduce_axes[0]
    v = _vector_width(k.extent, lanes)
    b = _b_reuse(stage)
    if not v or k.extent < 4 * v or b is None or not b[1] or b[2] >= PACK_MIN_ROWS:
        return False
    w = _b_operand(stage)[0].buffer
    a = [e for e in walk(stage.body) if isinstance(e, Load) and e.buffer != w]
    return bool(a) and all(getattr(e.indices[-1], "name", None) == k.name for e in a if e.indices)


def _dot_tile(stage: Stage, lanes: int, names: set[str], can_pad: bool = False) -> list[Step]:
    """A register tile of dot products for `_few_rows_dot`: per parallel task `cols` rows of W (the output
    columns) against `rows` rows of x (`_dot_tile_rows`), rows x cols vector accumulators along k (rfactor over the
    lanes), one load of each operand's vector per step shared by the tile; the lanes are added at the end.
    Measured on the 2-core AVX-512 VM (x @ W^T): 1 x 4096 x 4096 7.4 -> 1.06 ms (numpy 1.16), 8 x 4096 x 4099
    17.0 -> 1.9 ms (numpy 4.8), 4 x 1024 x 1000 0.38 -> 0.08 ms (numpy 0.27).  Rows or columns with no divisor
    above half the tile (4099 columns, 11 rows) are padded to a multiple of it when the stage is not an output
    (`steps.Pad`: the padded columns re-read W's last row, a whole vector along k)."""
    name, k = stage.name, stage.reduce_axes[0]
    *batch, ax_i, ax_j = stage.axes
    i, j = ax_i.name, ax_j.name
    v = _vector_width(k.extent, lanes)
    steps: list[Step] = []
    rows, pad_i = _tile_or_pad(ax_i.extent, _dot_tile_rows(ax_i.extent), can_pad)
    cols, pad_j = _tile_or_pad(ax_j.extent, max(1, DOT_TILE_ACCS // rows), can_pad)
    steps += [Pad(name, a, e) for a, e in ((i, pad_i), (j, pad_j)) if e]
    rf = _fresh_name(names, name + ".rf")
    k0, k1 = f"{k.name}.0", f"{k.name}.1"
    outer = [a.name for a in batch] + [f"{j}.0"]
    steps += [Split(name, k.name, (v,)), RFactor(name, k1), Split(name, i, (rows,)), Split(name, j, (cols,)),
              Reorder(name, tuple(outer + [f"{i}.0", f"{i}.1", f"{j}.1", k1]))]
    if len(outer) > 1:
        steps.append(Fuse(name, tuple(outer)))
    if _work(stage) >= PARALLEL_MIN_WORK:
        steps.append(Annotate(name, "@".join(outer), ForKind.PARALLEL))
    steps += [ComputeAt(rf, name, f"{i}.0"),
              Reorder(rf, tuple([k0] + [a.name for a in batch] + [i, j, k1])),
              Annotate(rf, i, ForKind.UNROLLED), Annotate(rf, j, ForKind.UNROLLED),
              Annotate(rf, k1, ForKind.VECTORIZED)]
    return steps


def _dot_tile_rows(M: int) -> int:
    """Rows of `_dot_tile`: all of them up to DOT_TILE_ROWS, else 4 or 3, whichever pads fewer (4 on a tie): a
    square 4 x 4 tile loads 8 vectors per 16 products, an 8 x 2 one 10 (measured, 2-core AVX-512 VM, W [N, K],
    against 8 x 2: 8 x 4096 x 4099 2.17 -> 1.91 ms, 11 x 4096 x 4096 3.25 -> 2.41, 9 x 2048 x 2048 0.83 -> 0.50;
    6 rows as 6 x 2 1.57 ms, as 3 x 5 1.68)."""
    if M <= DOT_TILE_ROWS:
        return M
    return 3 if -M % 3 < -M % 4 else 4


def _tile_or_pad(extent: int, want: int, can_pad: bool) -> tuple[int, int]:
    """(tile, padded extent or 0): the largest divisor of `extent` of at most `want`, or `want` over the extent
    padded to a multiple of it when that divisor is at most half of it and padding is allowed."""
    d = _divisor_at_most(extent, want)
    if d * 2 <= want and can_pad:
        return want, -(-extent // want) * want
    return d, 0


# ----------------------------------------------------------------------------- GEMM-like stages

@dataclass(frozen=True)
class _Gemm:
    """The register/cache blocking of one dot-like stage for a target."""

    vl: int        # lanes of one vector
    nvec: int      # vectors per micro-tile row (nr = vl * nvec)
    mr: int        # micro-tile rows
    tm: int        # rows of the cache tile (one parallel task)
    tn: int        # columns of the cache tile
    kc: int        # block of the last reduce axis (0: not blocked)
    panel: int = 0  # columns of B one parallel task packs and owns (the column-panel plan; 0: not used)
    jp: int = 0    # the columns padded to this extent (`_gemm_width`; 0: not padded)
    ip: int = 0    # the rows padded to this extent, a multiple of mr (`_tile_or_pad`; 0: not padded)
    unpacked: bool = False   # B read as it is, never packed (`_unpacked_short_k`)

    @property
    def nr(self) -> int:
        return self.vl * self.nvec


def _gemm_plan(red_stage: Stage, target: Target, lanes: int) -> _Gemm | None:
    """Micro-tile mr x nr (nr = 1 or 2 vectors) sized to the vector registers (32 with AVX-512, else 16:
    mr*nvec accumulators + nvec B vectors + a broadcast), cache tile tm x tn, k blocked so that an
    nr-wide panel of packed B (kc x nr) stays in half of L1.  Measured on the 2-core AVX-512 dev VM
    (1024^3 matmul): mr=8 beats 4 and 6; tm=64, tn=64 beat 8 to 32; packing B doubles the rate."""
    if len(red_stage.axes) < 2 or not red_stage.reduce_axes:
        return None
    *_, ax_i, ax_j = red_stage.axes
    I = ax_i.extent
    vl, nvec, jp = _gemm_width(red_stage, lanes)
    if not vl:
        return None
    J = jp or ax_j.extent
    regs = 32 if target.vector_bits >= 512 else 16
    padded = any(isinstance(e, Select) for e in walk(red_stage.body))   # conv with padding: masked A loads
    mr, ip = _micro_rows(I, nvec, regs, padded)
    nr = vl * nvec
    # at most I rows per tile: a tile of the padded rows then keeps its extent in `lower`'s bound inference
    tm = mr * _divisor_at_most((ip or I) // mr, max(1, min(TILE_M, I) // mr))
    tn = nr * _divisor_at_most(J // nr, max(1, TILE_N // nr))
    K = _inner_reduce(red_stage).extent
    l1 = target.l1d_bytes or 32 * 1024
    cap = max(16, l1 // 2 // (nr * 4))
    kc = _divisor_at_most(K, cap) if K > cap else 0
    if kc and kc < 16:
        kc = 0
    if jp and not padded and _unpacked_short_k(red_stage, I, K, mr, nr, regs, l1):
        return _Gemm(vl, nvec, mr, UNPACKED_TILE_M, nr, 0, unpacked=True)
    if not padded and not ip and _unpacked_in_registers(red_stage, I, K, regs, target):
        return _Gemm(vl, nvec, mr, mr, nr, 0, unpacked=True)
    plan = _Gemm(vl, nvec, mr, tm, tn, kc, _panel_width(red_stage, target, nr, K, J), jp, ip)
    if padded or jp or not _padding_ok(red_stage):   # B packed (`_gemm`), its columns not padded
        return plan
    return _register_panel(plan, I, J, K, regs, l1)


def _unpacked_short_k(red_stage: Stage, I: int, K: int, mr: int, nr: int, regs: int, l1: int) -> bool:
    """Whether a GEMM whose plan pads its columns reads B unpacked instead: 32 vector registers, B contiguous
    along the columns, rows a multiple of UNPACKED_TILE_M (a multiple of the micro-tile's mr rows), rows x K at most
    UNPACKED_MAX_ROWS_K and a K x nr panel of B within UNPACKED_L1 of L1.  Its last column tile overlaps the one
    before where nr does not divide the columns (`lower`: a region at a tile of its consumer keeps its extent), so
    no tail guard runs in the micro-kernel."""
    b = _b_reuse(red_stage)
    return (regs >= 32 and b is not None and b[0] and I % UNPACKED_TILE_M == 0 and UNPACKED_TILE_M % mr == 0
            and I * K <= UNPACKED_MAX_ROWS_K and K * nr * 4 <= l1 * UNPACKED_L1)


def _unpacked_in_registers(red_stage: Stage, I: int, K: int, regs: int, target: Target) -> bool:
    """Whether a GEMM on a target with 16 vector registers reads B unpacked with cache tiles of one micro-tile (its
    accumulators in registers over the whole reduction): one reduce axis of at most UNPACKED16_MAX_K (at most
    UNPACKED16_LONG_K when neither rows nor columns exceed UNPACKED16_LONG_K_EXTENT), B contiguous along the columns
    with its K x N floats within UNPACKED16_L2 of L2 (every row tile sweeps all of it), rows x K at most
    UNPACKED_MAX_ROWS_K.  As in `_unpacked_short_k`, a last column tile that nr does not divide overlaps the one
    before."""
    b = _b_reuse(red_stage)
    l2 = target.l2_bytes or 256 * 1024
    J = red_stage.axes[-1].extent
    short = K <= UNPACKED16_MAX_K or (K <= UNPACKED16_LONG_K and max(I, J) <= UNPACKED16_LONG_K_EXTENT)
    return (regs < 32 and len(red_stage.reduce_axes) == 1 and b is not None and b[0] and short
            and K * J * 4 <= l2 * UNPACKED16_L2 and I * K <= UNPACKED_MAX_ROWS_K)


def _micro_rows(I: int, nvec: int, regs: int, padded: bool = False) -> tuple[int, int]:
    """(micro-tile rows, padded rows or 0) for `nvec` vectors per row: as many rows as the vector registers hold
    (mr x nvec accumulators, nvec B vectors and a broadcast), at most MAX_MR (MAX_MR_PADDED with masked A loads).
    Rows with no divisor above half of that (251) take the full tile over rows padded to a multiple of it (the
    reduction's A loads clamped, `steps.Pad`), so the micro-kernel has no tail guard; the consumer's own tail guard
    is split off by the code generator (`codegen.partition`)."""
    most = min(MAX_MR_PADDED if padded else MAX_MR, (regs - nvec - 2) // nvec)
    return _tile_or_pad(I, most, I >= 2 * most)


def _register_panel(plan: _Gemm, I: int, J: int, K: int, regs: int, l1: int) -> _Gemm:
    """A packed GEMM's plan with a wider micro-tile and a cache tile of one micro-tile row (tm = mr), on targets with
    32 vector registers.  The column-panel plan: REGISTER_PANEL_VECS[0] vectors (2 x 128 with 16 lanes) when the
    packed slab of B they read (K x nr floats) fits REGISTER_PANEL_L1 of L1, else REGISTER_PANEL_VECS[1] (64 columns,
    up to 6 rows), each only where it divides the panel.  The tile plan (B packed once, shared): the narrower one,
    over a cache tile of one micro-tile (tn = nr), where it divides the columns.  The plan as it is elsewhere.  The
    accumulators of a cache tile then stay in registers over the whole reduction (a 2 x 128 tile is all of the
    cache tile) instead of going through an L1 copy per micro-tile.  Measured on the 2-core AVX-512 + AMX VM
    (`benchmarks/awkward_gemm.py --shapes short`, docs/benchmarks.md): batched GEMMs with K = 16-64 1.25-1.8x,
    K = 96-192 1.1-1.2x, 1024^3 1.07x; the tile plan 1.04-1.19x (dense layers with K = 64-1024).  With 16 registers
    (AVX2) the plan is unchanged."""
    if regs < 32 or plan.nvec != 2:
        return plan
    panel = plan.panel
    for nvec in REGISTER_PANEL_VECS:
        nr = plan.vl * nvec
        wide = nvec == REGISTER_PANEL_VECS[0]
        if (panel or J) % nr or (wide and (not panel or K * nr * 4 > l1 * REGISTER_PANEL_L1)):
            continue
        mr, ip = _micro_rows(I, nvec, regs)
        return replace(plan, nvec=nvec, mr=mr, tm=mr, tn=nr * max(1, plan.tn // nr) if panel else nr, ip=ip)
    return plan


def _panel_width(red_stage: Stage, target: Target, nr: int, K: int, J: int) -> int:
    """Columns per parallel task of the column-panel plan: the widest multiple (2 or more) of nr dividing the last
    space axis, at most PANEL_N, whose packed B panel (K x width floats) fits PANEL_BYTES, that still gives every core
    PANEL_TASKS_PER_CORE tasks (tasks: panels times the batch axes); 0 when none does (too few columns for the
    cores), when B is shared by a batch axis (then the tasks are tiles of rows and columns, B packed once
    before) or when the stage has too little work for threads (`PARALLEL_MIN_WORK`: the tile plan, serial).
    Measured on 1 core (CPU time, 2-core AVX-512 VM): matmul 1024^3 1.07-1.13x the tile plan, dense_bias_relu
    1.12-1.16x, the attention dots of transformer_block 1.05-1.14x; its projections (B shared by the batch)
    0.97-0.98x and a [784,256]x[256,256] dot with one-panel tasks 0.86x, hence the exclusions."""
    b = _b_operand(red_stage)
    if b is None or _work(red_stage) < PARALLEL_MIN_WORK:
        return 0
    used = {x.name for i in b[0].indices for x in walk(i) if isinstance(x, Var)}
    *batch, _, _ = red_stage.axes
    if any(a.name not in used for a in batch):
        return 0    # B shared by a batch (x[b, m, k] @ w[k, n]): measured no faster than the tile plan
    per = math.prod(a.extent for a in batch)
    want = PANEL_TASKS_PER_CORE * max(1, target.cores)
    for d in range(min(J // nr, PANEL_N // nr), 1, -1):   # at least two nr-wide panels: A is reused
        w = nr * d
        if J % w == 0 and K * w * 4 <= PANEL_BYTES and per * (J // w) >= want:
            return w
    return 0


def _inner_reduce(stage: Stage):
    """The reduce axis the micro-kernel runs along: the longest (the last of equals), e.g. the input
    channels of a convolution rather than its 3-wide kernel window."""
    best = stage.reduce_axes[-1]
    for a in reversed(stage.reduce_axes):
        if a.extent > best.extent:
            best = a
    return best


def _b_operand(stage: Stage) -> tuple[Load, int, int] | None:
    """The load of the dot's B operand (indexed by the last space axis j as a plain variable at dim p,
    and by the last reduce axis as a plain variable at dim q): (load, p, q); None if there is none."""
    j = stage.axes[-1].name
    r = _inner_reduce(stage).name
    found = None
    for e in walk(stage.body):
        if not isinstance(e, Load):
            continue
        names = [getattr(x, "name", None) if isinstance(x, Var) else None for x in e.indices]
        if j in names and r in names:
            if found is not None and found[0].buffer != e.buffer:
                return None
            found = (e, names.index(j), names.index(r))
    return found


def _reuse_rows(stage: Stage, b: Load) -> int:
    """How many output rows read the same B element: the extents of space axes B is not indexed by."""
    used = {x.name for i in b.indices for x in walk(i) if isinstance(x, Var)}
    n = 1
    for a in stage.axes[:-1]:
        if a.name not in used:
            n *= a.extent
    return n


def _gemm(cd: ComputeDef, out: str, red: str, red_stage: Stage, target: Target, lanes: int,
          names: set[str], holes: bool = False) -> list[Step] | None:
    """GEMM blocking of dot-like `red` computed at a cache tile of its consumer `out` (which has the same
    space axes): B packed into nr-wide panels (contiguous along the reduction), the last reduce axis
    blocked by kc, an mr x nr register micro-tile (rows unrolled, columns vectorized).  Column-panel plan
    (plan.panel, when there are enough panels for the cores): parallel over panels of columns, each task
    packing its own panel of B and running over tm-row tiles, one nr-wide B panel at a time against every
    mr-row panel of A; else parallel over the (batch, tile) loops with B packed in a pass of its own.  With
    `holes`, the column-panel plan's tm and kc are Split factors None (`gemm_sketch`).  None when the stage
    does not fit that form (the caller falls back)."""
    plan = _gemm_plan(red_stage, target, lanes)
    b = _b_operand(red_stage)
    if plan is None or b is None:
        return None
    load, p, q = b
    nr = plan.nr
    packable = not plan.unpacked and (
        plan.jp > 0 or (load.buffer not in (red_stage.name, out) and red_stage.axes[-1].extent % nr == 0
                        and _reuse_rows(red_stage, load) >= PACK_MIN_ROWS))
    if not packable and p != len(load.indices) - 1:
        return None                                   # B strided along j: the fallback vectorizes less
    *batch, ax_i, ax_j = red_stage.axes
    i, j = ax_i.name, ax_j.name
    par = _work(red_stage) >= PARALLEL_MIN_WORK
    panel = plan.panel if packable else 0   # `_panel_width`: 0 without the work for threads
    steps: list[Step] = []
    pk = None
    if packable:
        rest = [d for d in range(len(load.indices)) if d != p]
        steps.append(Pack(load.buffer, (red,), p, nr, rest.index(q)))
        pk = _fresh_name(names, f"{load.buffer}.pack")
        steps += _pack_schedule(pk, load, p, q, rest.index(q), plan, _buffer_shape(cd, load.buffer)[q],
                                not panel and _buffer_elems(cd, load.buffer) >= PARALLEL_MIN_WORK)
    if plan.jp:
        steps.append(Pad(red, red_stage.axes[-1].name, plan.jp))
    if plan.ip:
        steps.append(Pad(red, red_stage.axes[-2].name, plan.ip))
    holes = holes and bool(panel)
    if panel:
        steps += _panel_tiles(out, red, pk, red_stage, load, plan, holes)
    else:
        outer = [a.name for a in batch] + [f"{i}.0", f"{j}.0"]
        steps += [Split(out, i, (plan.tm,)), Split(out, j, (plan.tn,)),
                  Reorder(out, tuple(outer + [f"{i}.1", f"{j}.1"])), Fuse(out, tuple(outer))]
        fused = "@".join(outer)
        if par:
            steps.append(Annotate(out, fused, ForKind.PARALLEL))
        steps += [Split(out, f"{j}.1", (plan.vl,)), Annotate(out, f"{j}.1.1", ForKind.VECTORIZED),
                  ComputeAt(red, out, fused)]
    k_ax = _inner_reduce(red_stage)
    inner = k_ax.name
    others = [a.name for a in red_stage.reduce_axes if a.name != inner]
    if plan.kc or panel:   # the column-panel plan always splits k (all of k when kc = 0), so that its default is a
        steps.append(Split(red, inner, (None if holes else plan.kc or k_ax.extent,)))   # point of `gemm_panel`
        r_out, r_in = others + [f"{inner}.0"], [f"{inner}.1"]
    else:
        r_out, r_in = others, [inner]
    steps += [Split(red, i, (plan.mr,)), Split(red, j, (plan.nvec, plan.vl))]
    # column panel: one nr-wide panel of packed B (kc x nr, in L1) meets every mr-row panel of A in turn
    tiles = [f"{j}.0", f"{i}.0"] if panel else [f"{i}.0", f"{j}.0"]
    order = [a.name for a in batch] + r_out + tiles + r_in + [f"{i}.1", f"{j}.1", f"{j}.2"]
    steps += [Reorder(red, tuple(order)), Annotate(red, f"{i}.1", ForKind.UNROLLED),
              Annotate(red, f"{j}.1", ForKind.UNROLLED), Annotate(red, f"{j}.2", ForKind.VECTORIZED)]
    return steps


def _panel_tiles(out: str, red: str, pk: str, red_stage: Stage, load: Load, plan: _Gemm,
                 holes: bool = False) -> list[Step]:
    """The column-panel plan's loops of `out`: parallel over (the batch axes B is indexed by, panels of
    plan.panel columns); inside, the other batch axes and tiles of plan.tm rows, each the cache tile of `red`
    (tm x panel); the panel of packed B `pk` is computed at the parallel loop (each task packs what it reads,
    once, and finds it in its own L2)."""
    *batch, ax_i, ax_j = red_stage.axes
    i, j = ax_i.name, ax_j.name
    used = {x.name for e in load.indices for x in walk(e) if isinstance(x, Var)}
    par = [a.name for a in batch if a.name in used] + [f"{j}.0"]
    serial = [a.name for a in batch if a.name not in used] + [f"{i}.0"]
    steps: list[Step] = [Split(out, i, (None if holes else plan.tm,)), Split(out, j, (plan.panel,)),
                         Reorder(out, tuple(par + serial + [f"{i}.1", f"{j}.1"]))]
    if len(par) > 1:
        steps.append(Fuse(out, tuple(par)))
    fused = "@".join(par)
    return steps + [Annotate(out, fused, ForKind.PARALLEL),
                    Split(out, f"{j}.1", (plan.vl,)), Annotate(out, f"{j}.1.1", ForKind.VECTORIZED),
                    ComputeAt(red, out, f"{i}.0"), ComputeAt(pk, out, fused)]


def _buffer_elems(cd: ComputeDef, name: str) -> int:
    return math.prod(_buffer_shape(cd, name))


def _buffer_shape(cd: ComputeDef, name: str) -> tuple[int, ...]:
    for b in cd.inputs:
        if b.name == name:
            return tuple(b.shape)
    return tuple(cd.stage(name).shape)


def _pack_schedule(pk: str, load: Load, p: int, q: int, outer_pos: int, plan: _Gemm, k_extent: int,
                   par: bool) -> list[Step]:
    """The pack stage [.., j/nr, .., k, j%nr]: vectorized along j%nr when B is contiguous along j
    (p last), else the copy reads along k (B transposed: k contiguous) in blocks (`transposed_pack`)."""
    nd = len(load.indices) + 1
    axes = [f"ax{d}" for d in range(nd)]
    inner = axes[-1]
    steps: list[Step] = []
    if p == len(load.indices) - 1:
        steps += [Split(pk, inner, (plan.vl,)), Annotate(pk, f"{inner}.1", ForKind.VECTORIZED)]
        outer = axes[:-1]
    else:
        kax = _packed_axis(len(load.indices), p, q, outer_pos)
        more, outer = transposed_pack(pk, axes, kax, k_extent)
        steps += more
    if par and outer:
        if len(outer) > 1:
            steps += [Fuse(pk, tuple(outer)), Annotate(pk, "@".join(outer), ForKind.PARALLEL)]
        else:
            steps.append(Annotate(pk, outer[0], ForKind.PARALLEL))
    return steps


def transposed_pack(pk: str, axes: list[str], kax: str, k_extent: int) -> tuple[list[Step], list[str]]:
    """Loops of a packed copy [.., k, j%nr] of a B contiguous along k: the k axis split into blocks of PACK_KB
    (a divisor of its extent; whole rows when none of 4 or more divides it), the copy ordered (.., k block, j%nr,
    k in block) so that the reads run along k and the writes of a block stay within a few lines.  Returns the
    steps and the loops outside the k block (the ones a caller may parallelize)."""
    inner = axes[-1]
    rest = [a for a in axes if a not in (kax, inner)]
    kb = _divisor_at_most(k_extent, PACK_KB)
    if kb < 4 or kb == k_extent:
        return [Reorder(pk, tuple(rest + [inner, kax]))], rest
    return [Split(pk, kax, (kb,)), Reorder(pk, tuple(rest + [f"{kax}.0", inner, f"{kax}.1"]))], rest


def _packed_axis(nd: int, p: int, q: int, outer_pos: int) -> str:
    """Name of the packed stage's axis that holds source dimension q (p split, outer part at outer_pos)."""
    rest = [d for d in range(nd) if d != p]
    dims = rest[:outer_pos] + [-1] + rest[outer_pos:]
    return f"ax{dims.index(q)}"


def _fresh_name(names: set[str], base: str) -> str:
    """The name a new stage gets (state._fresh's rule), recorded in `names`."""
    n = base
    while n in names:
        n += "_"
    names.add(n)
    return n


def _contiguous_in(stage: Stage, axis: str) -> bool:
    """Some load of the body has `axis` as its innermost index (unit stride)."""
    for e in walk(stage.body):
        if isinstance(e, Load) and e.indices and getattr(e.indices[-1], "name", None) == axis:
            return True
    return False


def _full_reduction(stage: Stage, lanes: int, cores: int, names: set[str], par: bool = True) -> list[Step]:
    """A reduction to a scalar: partial results [P, W] (P parallel parts of the outermost reduce axis,
    W = REDUCE_VECS vectors of lanes along the contiguous last one) accumulated in registers (a local
    cache_write computed at the parallel loop), then reduced over P and W.  Two rfactors: the first
    makes the W lanes a space axis, the second the P parts.  Too little work to share (`par` false): only
    the first, W vector accumulators in one loop (a scalar loop's add chain is 7x slower on 8,192 floats)."""
    name = stage.name
    last = stage.reduce_axes[-1]
    v = _vector_width(last.extent, lanes)
    if not v or not _contiguous_in(stage, last.name):
        return []
    nacc = _divisor_at_most(last.extent // v, REDUCE_VECS)
    w = v * nacc
    rl, rl0, rl1 = last.name, f"{last.name}.0", f"{last.name}.1"
    rf = _fresh_name(names, name + ".rf")
    steps: list[Step] = [Split(name, rl, (w,)), RFactor(name, rl1)]
    first = stage.reduce_axes[0].name if len(stage.reduce_axes) > 1 else rl0
    ext = stage.reduce_axes[0].extent if len(stage.reduce_axes) > 1 else last.extent // w
    parts = _divisor_at_most(ext, 4 * cores) if par else 1
    if parts < 2:   # one part: the W accumulators in a local buffer (registers), reduced in one loop nest
        loc = _fresh_name(names, rf + ".local")
        red = [a.name for a in stage.reduce_axes[:-1]] + [rl0]
        return steps + [CacheWrite(rf, "local"), Split(loc, rl1, (v,)),
                        Reorder(loc, tuple(red + [f"{rl1}.0", f"{rl1}.1"])),
                        Annotate(loc, f"{rl1}.0", ForKind.UNROLLED), Annotate(loc, f"{rl1}.1", ForKind.VECTORIZED)]
    p0, p1 = f"{first}.0", f"{first}.1"
    rf2 = _fresh_name(names, rf + ".rf")
    steps += [Split(rf, first, (parts,), inner_to_outer=False), RFactor(rf, p0), CacheWrite(rf2, "local")]
    loc = _fresh_name(names, rf2 + ".local")
    steps += [Annotate(rf2, p0, ForKind.PARALLEL), ComputeAt(loc, rf2, p0)]
    mids = [a.name for a in stage.reduce_axes[1:-1]] if len(stage.reduce_axes) > 1 else []
    red = [p1] + mids + [rl0] if len(stage.reduce_axes) > 1 else [p1]
    steps += [Split(loc, rl1, (v,)), Reorder(loc, tuple([p0] + red + [f"{rl1}.0", f"{rl1}.1"])),
              Annotate(loc, f"{rl1}.0", ForKind.UNROLLED), Annotate(loc, f"{rl1}.1", ForKind.VECTORIZED)]
    return steps


def _reduction(stage: Stage, lanes: int, cores: int = 1, names: set[str] | None = None) -> list[Step]:
    name = stage.name
    space = [a.name for a in stage.axes]
    last_r = stage.reduce_axes[-1]
    par = _work(stage) >= PARALLEL_MIN_WORK
    steps: list[Step] = []
    if not space:
        return _full_reduction(stage, lanes, cores, names if names is not None else set(), par)
    rv = _vector_width(last_r.extent, lanes)
    sv = _short_axis_width(stage.axes[-1].extent, lanes) if stage.axes else 0
    if _contiguous_in(stage, last_r.name) and rv and last_r.extent >= 4 * rv:
        lanes = rv
        names = names if names is not None else set()
        steps += _transpose_strided(stage, names)
        rf = _fresh_name(names, name + ".rf")
        r0, r1 = f"{last_r.name}.0", f"{last_r.name}.1"
        others = [a.name for a in stage.reduce_axes[:-1]]
        steps += [Split(name, last_r.name, (lanes,)), RFactor(name, r1),
                  Reorder(rf, tuple(space + others + [r0, r1])),
                  Annotate(rf, r1, ForKind.VECTORIZED), ComputeAt(rf, name, space[-1])]
    elif sv and _contiguous_in(stage, space[-1]):
        lanes, j = sv, space[-1]
        steps += [Split(name, j, (lanes,))]
        order = space[:-1] + [f"{j}.0"] + [a.name for a in stage.reduce_axes] + [f"{j}.1"]
        steps += [Reorder(name, tuple(order)), Annotate(name, f"{j}.1", ForKind.VECTORIZED)]
        space = space[:-1] + [f"{j}.0"]
    if par:
        steps += _parallel_outer(name, space)
    return steps


def _transpose_strided(stage: Stage, names: set[str]) -> list[Step]:
    """Pack (transpose) each reused operand that a row reduction reads across its rows, `B[r, j]` with
    r the last reduce axis: `B.pack[j, r, 0]` is contiguous along r, so the vectorized reduction loads
    it as a vector instead of gathering lanes (dots with a small N, e.g. [256, 512] x [512, 10])."""
    r = stage.reduce_axes[-1].name
    space = {a.name for a in stage.axes}
    out: list[Step] = []
    seen: set[str] = set()
    for e in walk(stage.body):
        if not isinstance(e, Load) or e.buffer in seen or len(e.indices) < 2:
            continue
        idx = [x.name if isinstance(x, Var) else None for x in e.indices]
        p = len(idx) - 1
        if r not in idx or idx.index(r) == p or idx[p] not in space or _reuse(stage, e) < PACK_MIN_ROWS:
            continue
        seen.add(e.buffer)
        rest = [d for d in range(len(idx)) if d != p]
        out.append(Pack(e.buffer, (stage.name,), p, 1, rest.index(idx.index(r))))
        _fresh_name(names, e.buffer + ".pack")
    return out


def _reuse(stage: Stage, load: Load) -> int:
    """How many points of the stage's space read the same element of `load` (axes it is not indexed by)."""
    used = {x.name for i in load.indices for x in walk(i) if isinstance(x, Var)}
    return math.prod(a.extent for a in stage.axes if a.name not in used)


def _parallel_outer(name: str, space: list[str]) -> list[Step]:
    """Parallel on the outermost space loop (inner ones may host compute_at stages)."""
    return [Annotate(name, space[0], ForKind.PARALLEL)] if space else []


def _math_lanes(stage: Stage, lanes: int) -> int:
    """Vector lanes for an elementwise stage: twice `lanes` (at most MATH_LANES) when it evaluates a POLY_MATH
    function.  Such a function is a chain of some 25 dependent instructions per vector; with two vectors per
    iteration (LLVM splits a vector twice the register width into two interleaved halves) the out-of-order core
    overlaps their chains.  Measured on an AMD Zen 1 (AVX2: 8 -> 16 lanes; docs/benchmarks.md): gelu_tanh
    1.25x, sin_mul_add 1.11x, softmax 1.04x (its exp stage).  With 16 lanes already (AVX-512) it stays (not
    measured)."""
    return 2 * lanes if 2 * lanes <= MATH_LANES and _calls_poly_math(stage) else lanes


def _calls_poly_math(stage: Stage) -> bool:
    """Whether the stage's expression evaluates a POLY_MATH function."""
    return any(isinstance(e, Unary | Binary) and e.op in POLY_MATH for e in walk(stage.body))


def _elementwise(stage: Stage, lanes: int, cores: int) -> list[Step]:
    name = stage.name
    axes = [a.name for a in stage.axes]
    if not axes:
        return []
    par = _work(stage) >= PARALLEL_MIN_WORK
    last = stage.axes[-1]
    steps: list[Step] = []
    wide = _math_lanes(stage, lanes)   # power-of-two vectors only: a short axis's own width stays as it was
    w = _vector_width(last.extent, wide) or (_short_axis_width(last.extent, lanes) if _off_point(stage) else 0)
    if w and len(axes) > 1:
        steps += [Split(name, last.name, (w,)), Annotate(name, f"{last.name}.1", ForKind.VECTORIZED)]
        outer = axes[:-1]
        if par:
            if len(outer) > 1:
                steps += [Fuse(name, tuple(outer)), Annotate(name, "@".join(outer), ForKind.PARALLEL)]
            else:
                steps.append(Annotate(name, outer[0], ForKind.PARALLEL))
        return steps
    fused = axes[0]
    if len(axes) > 1:
        steps.append(Fuse(name, tuple(axes)))
        fused = "@".join(axes)
    n = _work(stage)
    v = _vector_width(n, wide) or 1
    if v > 1:
        chunks = _divisor_at_most(n // v, 16 * cores) if par else 1
        inner = (n // v) // chunks
        steps += [Split(name, fused, (inner, v)), Annotate(name, f"{fused}.2", ForKind.VECTORIZED)]
        if par:
            steps.append(Annotate(name, f"{fused}.0", ForKind.PARALLEL))
    elif par:
        steps += [Split(name, fused, (n // _divisor_at_most(n, 16 * cores),)),
                  Annotate(name, f"{fused}.0", ForKind.PARALLEL)]
    return steps
