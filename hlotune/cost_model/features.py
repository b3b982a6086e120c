"""Loop-nest features of a lowered candidate: one vector per store statement (Ansor's feature set).

Map:
  FEATURE_TABLE / FEATURE_NAMES   the features, in column order, with their meaning (the one table)
  StoreNest, Access               one store statement for N candidates at once: its enclosing loops
                                  (kinds; extents as an (N, L) array), arithmetic counts, buffer accesses
                                  (per-loop index coefficients, buffer shapes) -- the common input of both paths
  store_features(nest)            StoreNest -> (N, NUM_FEATURES) raw features (numpy, vectorized over N)
  log_scale(x)                    sign(x) * log2(1 + |x|), applied to every column
  nests_of_func(func)             exact path: walk a LoopFunc, one StoreNest (N=1) per Store
  add_program_features(X, ideal)  the prog_* columns (aggregates over a program's statements), both paths; then
  add_estimates(X, ideal)         the est_* columns: a roofline-like time per statement and program, and the same
                                  against the workload's ideal time (`ideal_log2(cd)`)
  features_of_func(func, ideal)   exact path: (S, NUM_FEATURES) log-scaled features of a LoopFunc
  machine()                       (threads, vector bits, L1d, L2) of the host, for the parallel/vector/cache columns
  (the fast path, many schedules of one structure at once, is in `fast_features.py`)

Definitions (loops outermost first; only loops of extent > 1 count, so a loop of extent 1, which the
lowering drops, changes no feature -- the fast path relies on it):
- coefficient c[l, d]: how much index dimension d of an access moves per iteration of loop l (the
  index is linearized: x // k gives 1/k, x % k and min/max clamps pass x through);
  flat stride s[l] = sum_d c[l, d] * row-major stride of d, in elements.
- touched region at level k (the loops k.. innermost): per dimension min(size_d, 1 + sum_{l>=k}
  |c[l, d]| * (extent_l - 1)); unique elements = product over dimensions.
- bytes = accesses x element size (accesses = product of all extents x number of accesses of the
  buffer in the statement); unique_bytes = region at level 0 x element size;
  lines = accesses / elements per line along the innermost loop with a non-zero stride
  (min(line/stride bytes, extent), at least 1); unique_lines = region at level 0 with its last dimension
  counted in lines.
- reuse: walking from the innermost loop outwards, the first loop whose stride is 0 gives "loop
  reuse" (reuse_ct = its extent, reuse_dis_iter = product of the loops inside it, reuse_dis_bytes =
  the bytes all accesses of the statement touch inside it); else a buffer both read and written
  ("serial reuse", count 1, distance 1); else none (zeros).
- stride = |flat stride| of the innermost loop with a non-zero stride (0 if none), counting only whole
  coefficients (x // k moves its dimension once every k steps, so a fused loop indexing (f // 32, f % 32)
  has stride 1, not 1 + 32/32) unless only fractional ones move it.
- arithmetic intensity curve: at each loop level k, flops inside k / unique bytes touched inside k;
  sample j (1..10) is the value at the outermost level whose log2(flops inside) <= j/10 x log2(total flops).
- guards (version 4): the stored buffer's per-dimension span 1 + sum_l |c[l, d]| (extent_l - 1) over the
  loops that do not index it through a division (`_divides`: those wrap around, x % k) beyond its shape is
  a split tail, i.e. a bounds check around the store; idx_div counts accesses indexed through a division;
  the register tile is what lies inside the innermost loop whose step does not move the store.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..ir.expr import Binary, Cast, Compare, Const, Expr, Load, Select, Unary, Var
from ..ir.hlo import DType, Op
from ..schedule_space.loop_ir import Allocate, For, ForKind, If, LoopFunc, Seq, Store

CACHE_LINE = 64
TOP_BUFFERS = 5
CURVE_SAMPLES = 10

#: arithmetic kinds counted per statement (values are per store execution; features multiply by the loops)
OP_KINDS = ("float_mad", "float_addsub", "float_mul", "float_divmod", "float_cmp", "float_math_func",
            "float_other_func", "int_mad", "int_addsub", "int_mul", "int_divmod", "int_cmp", "int_math_func",
            "int_other_func", "bool_op", "select_op")
_OPK = {k: i for i, k in enumerate(OP_KINDS)}
_MATH = {Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.LOGISTIC, Op.TANH, Op.SINE, Op.COSINE, Op.SQRT, Op.RSQRT,
         Op.ERF, Op.POWER, Op.ATAN2}
_BOOL = {Op.AND, Op.OR, Op.XOR, Op.NOT}
_POSITIONS = ("none", "innermost", "inner", "outer")
_ANN_KINDS = (("vec", ForKind.VECTORIZED), ("unroll", ForKind.UNROLLED), ("parallel", ForKind.PARALLEL))
_GPU_KINDS = (ForKind.BLOCK_X, ForKind.BLOCK_Y, ForKind.BLOCK_Z, ForKind.THREAD_X, ForKind.THREAD_Y,
              ForKind.THREAD_Z, ForKind.VTHREAD)
_BUF_FEATURES = ("acc_read", "acc_write", "acc_readwrite", "bytes", "unique_bytes", "lines", "unique_lines",
                 "reuse_none", "reuse_loop", "reuse_serial", "reuse_dis_iter", "reuse_dis_bytes", "reuse_ct",
                 "bytes_d_reuse_ct", "unique_bytes_d_reuse_ct", "lines_d_reuse_ct", "unique_lines_d_reuse_ct",
                 "stride")


def _table() -> tuple[tuple[str, str], ...]:
    rows = [(k, f"{k.replace('_', ' ')} operations: per-execution count x product of loop extents")
            for k in OP_KINDS]
    for name, _ in _ANN_KINDS:
        rows += [(f"{name}_num", f"number of {name} loops"), (f"{name}_prod", f"product of {name} loop extents"),
                 (f"{name}_len", f"extent of the innermost {name} loop")]
        rows += [(f"{name}_pos_{p}", f"one-hot: innermost {name} loop is {p} (none / the innermost loop / in "
                                     f"the inner half / in the outer half of the nest)") for p in _POSITIONS]
    rows += [(f"gpu_{k.value}", f"product of the extents of loops bound to {k.value}") for k in _GPU_KINDS]
    for b in range(TOP_BUFFERS):
        rows += [(f"B{b}.{f}", f"buffer {b} (by bytes, descending): {f.replace('_', ' ')}") for f in _BUF_FEATURES]
    rows += [(f"intensity_{j}", f"arithmetic intensity curve sample {j} (flops / unique bytes)")
             for j in range(1, CURVE_SAMPLES + 1)]
    rows += [("alloc_size", "bytes of the stored buffer when it is a temporary (else 0)"),
             ("alloc_outer_prod", "product of the loop extents around the temporary's allocation"),
             ("alloc_inner_prod", "product of the loop extents inside the allocation (its store count)"),
             ("alloc_local", "1 when the stored buffer is a local (register/stack) temporary")]
    rows += [("outer_prod", "product of all loop extents (executions of the statement)"),
             ("num_loops", "number of loops of extent > 1 around the statement"),
             ("auto_unroll_max_step", "auto_unroll_max_step pragma of the enclosing loops (max)"),
             ("is_init", "1 for the init statement of a reduction"),
             ("is_update", "1 for a statement that reads the element it writes (reduction update)")]
    rows += [("par_launches", "launches of the parallel loop: product of the loop extents outside the outermost "
                              "parallel loop (0 without one; parallel loops inside it run serially)"),
             ("par_extent", "extent of the outermost parallel loop (the iterations the threads share; 0 without)"),
             ("par_balance", "parallel efficiency: P / (T * ceil(P / T)) for P parallel iterations on T threads; "
                             "1 / T without a parallel loop"),
             ("par_work", "executions of the statement per parallel iteration and launch (all without one)"),
             ("vec_ok", "1 when the innermost vectorized loop is the innermost loop and moves the stored element "
                        "(the code generator emits vector instructions)"),
             ("vec_regs", "vectorized extent / lanes (lanes = vector bits / element bits of the stored buffer)"),
             ("vec_rem", "vectorized extent modulo the lanes (a partial vector)"),
             ("vec_contig", "accesses with stride 1 along the vectorized loop (vector loads/stores; 0 if not vec_ok)"),
             ("vec_bcast", "accesses with stride 0 along the vectorized loop (scalar load + broadcast)"),
             ("vec_gather", "accesses with another stride along the vectorized loop (gathered lane by lane)"),
             ("inner_len", "extent of the innermost loop"),
             ("inner_contig", "accesses with stride 1 along the innermost loop"),
             ("inner_bcast", "accesses with stride 0 along the innermost loop"),
             ("inner_gather", "accesses with another stride along the innermost loop"),
             ("unroll_copies", "statement copies the code generator unrolls: the innermost serial loops (explicitly "
                               "unrolled, or whose stores stay within auto_unroll_max_step; vectorized ones count 1)"),
             ("write_ratio", "executions / unique elements written (reduction length x padding of split tails)"),
             ("l1_fit_prod", "executions inside the outermost loop whose footprint (unique bytes of all buffers "
                             "inside it) fits the L1 data cache"),
             ("l2_fit_prod", "the same for the L2 cache")]
    rows += [("guard_dims", "dimensions of the stored buffer whose index span over all loops exceeds the buffer (a "
                            "split tail: the code guards the store with a bounds check; loops that also divide the "
                            "index, x // k and x % k of a fused loop, wrap around and do not count)"),
             ("guard_inner", "1 when the innermost loop moves a guarded dimension (the check runs every innermost "
                             "iteration and keeps the loop from vectorizing)"),
             ("guard_execs", "executions of the bounds check: product of the loop extents down to the innermost loop "
                             "that moves a guarded dimension (0 without a guard)"),
             ("pad_ratio", "product of the stored buffer's index spans / its elements written (>= 1: padded "
                           "iterations of split tails)"),
             ("idx_div", "accesses whose index divides a loop variable (a fractional coefficient: x // k, usually "
                         "with x % k, from a fused-then-split loop or a packed layout; only of a loop that alone moves "
                         "its dimension by a whole step)"),
             ("idx_div_inner", "the same, divided along the innermost loop (a division and remainder every innermost "
                               "iteration)")]
    rows += [("rt_elems", "register tile: elements of the stored buffer written inside its innermost reuse loop (the "
                          "innermost loop that does not move the store, e.g. the inner reduction loop of a GEMM: the "
                          "accumulators; 0 without one)"),
             ("rt_regs", "rt_elems / vector lanes (vector registers of the accumulators)"),
             ("rt_loads", "unique elements read inside that loop (all read buffers): loads per iteration of it"),
             ("rt_inten", "executions inside that loop / rt_loads (statement executions per loaded element)")]
    rows += [("prog_statements", "program: number of store statements (the same in every row of a program)"),
             ("prog_ops", "program: arithmetic operations of all statements (sum of the operation columns)"),
             ("prog_outer_prod", "program: statement executions (sum of outer_prod)"),
             ("prog_bytes", "program: bytes accessed (sum of the buffer bytes columns)"),
             ("prog_intensity", "program: prog_ops / prog_bytes")]
    rows += [(n, f"estimate (version 5; log2 seconds, not log-scaled): {m}") for n, m in _EST_TABLE]
    return tuple(rows)


#: the analytic columns (`add_estimates`): a roofline-like time of each statement from the columns above; the
#: model gets the combinations that trees cannot form from log-scaled columns (quotients, maxima, sums over a
#: program) and, through the est_rel_* columns, each one against its workload's ideal time (`ideal_log2`)
_EST_TABLE = (
    ("est_compute", "weighted operations / (vector lanes used x threads used) / EST_OPS_PER_S"),
    ("est_memory", "bytes from memory / EST_BYTES_PER_S (x EST_PAR_BW with threads): the unique bytes, or the line "
                   "traffic of what does not fit L2"),
    ("est_launch", "parallel launches x EST_LAUNCH_S"),
    ("est_stmt", "max(est_compute, est_memory) + est_launch (monotone: the model's score may only fall as it rises)"),
    ("est_prog", "program: sum of est_stmt over its statements (monotone)"),
    ("est_lines_thread", "cache-line bytes accessed per thread used"),
    ("est_l1_traffic", "cache-line bytes of the accesses outside the outermost loop that fits L1"),
    ("est_ops_lane", "weighted operations per vector lane used"),
    ("est_rel_stmt", "est_stmt - the workload's ideal time (monotone)"),
    ("est_rel_prog", "est_prog - the workload's ideal time (monotone)"),
    ("est_rel_compute", "est_compute - the workload's ideal time"),
    ("est_rel_memory", "est_memory - the workload's ideal time"),
)


#: (name, meaning) of every feature, in column order
FEATURE_TABLE: tuple[tuple[str, str], ...] = _table()
FEATURE_NAMES: tuple[str, ...] = tuple(n for n, _ in FEATURE_TABLE)
NUM_FEATURES = len(FEATURE_NAMES)
_COL = {n: i for i, n in enumerate(FEATURE_NAMES)}
FEATURE_VERSION = 5


_KIND_CODE = {k: i for i, k in enumerate(ForKind)}


def kind_matrix(kinds) -> np.ndarray:
    """Loop kinds as integer codes: (1, L) from a tuple of ForKind, or an (N, L) code array as is."""
    if isinstance(kinds, np.ndarray):
        return kinds
    return np.array([[_KIND_CODE[k] for k in kinds]], dtype=np.int64).reshape(1, len(kinds))


@dataclass
class Access:
    """One buffer of a statement: `mode` 0 read, 1 write, 2 read+write; `count` accesses per execution;
    `coef` (N, L, D) index coefficients per loop; `shape` (N, D) the buffer's shape."""

    buffer: str
    mode: int
    count: int
    elem_bytes: int
    coef: np.ndarray
    shape: np.ndarray


@dataclass
class StoreNest:
    """One store statement for N candidates of one structure."""

    kinds: tuple[ForKind, ...] | np.ndarray   # loop kinds, or (N, L) kind codes (`kind_matrix`) when stacked
    ext: np.ndarray                      # (N, L) loop extents
    ops: np.ndarray                      # (len(OP_KINDS),) per execution, or (N, len(OP_KINDS)) when stacked
    accesses: list[Access]
    unroll_step: np.ndarray              # (N,)
    alloc: np.ndarray                    # (N, 4): size bytes, outer prod, inner prod, local
    is_init: bool = False
    is_update: bool = False
    extra: dict = field(default_factory=dict)


def nest_signature(nest: StoreNest) -> tuple:
    """Nests with equal signatures can be stacked (`stack_nests`) and featurized in one call."""
    return (nest.ext.shape[1], nest.is_init, nest.is_update,
            tuple((a.mode, a.count, a.elem_bytes, a.coef.shape[2]) for a in nest.accesses))


def stack_nests(nests: list[StoreNest]) -> StoreNest:
    """One StoreNest of all rows of `nests` (equal `nest_signature`s; kinds and ops become per-row arrays)."""
    if len(nests) == 1:
        return nests[0]
    sizes = [x.ext.shape[0] for x in nests]
    kinds = np.concatenate([np.broadcast_to(kind_matrix(x.kinds), (k, x.ext.shape[1])) for x, k in zip(nests, sizes)])
    ops = np.concatenate([np.broadcast_to(np.atleast_2d(x.ops), (k, len(OP_KINDS))) for x, k in zip(nests, sizes)])
    accs = [Access(a.buffer, a.mode, a.count, a.elem_bytes, np.concatenate([x.accesses[j].coef for x in nests]),
                   np.concatenate([x.accesses[j].shape for x in nests])) for j, a in enumerate(nests[0].accesses)]
    return StoreNest(kinds, np.concatenate([x.ext for x in nests]), ops, accs,
                     np.concatenate([np.broadcast_to(x.unroll_step, (k,)) for x, k in zip(nests, sizes)]),
                     np.concatenate([np.broadcast_to(x.alloc, (k, 4)) for x, k in zip(nests, sizes)]),
                     nests[0].is_init, nests[0].is_update)


def log_scale(x: np.ndarray) -> np.ndarray:
    """sign(x) * log2(1 + |x|), elementwise."""
    a = np.abs(x)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    a += 1.0                    # the same numbers as 1.0 + |x|, without more temporaries of a large x
    np.log2(a, out=a)
    return np.sign(x) * a


# ----------------------------------------------------------------------------- the core

def store_features(nest: StoreNest) -> np.ndarray:
    """Raw (unscaled) features of one statement for N candidates: (N, NUM_FEATURES)."""
    ext = np.asarray(nest.ext, dtype=np.float64)
    n, nloops = ext.shape
    out = np.zeros((n, NUM_FEATURES))
    real = ext > 1
    prod = np.prod(ext, axis=1) if nloops else np.ones(n)
    ops = np.atleast_2d(nest.ops)                # (1 or N, K)
    out[:, : len(OP_KINDS)] = prod[:, None] * ops
    km = kind_matrix(nest.kinds)                 # (1 or N, L) kind codes
    rank = np.cumsum(real, axis=1) - 1          # index among real loops (outer first)
    nreal = real.sum(axis=1)
    for name, kind in _ANN_KINDS:
        m = real & (km == _KIND_CODE[kind])
        out[:, _COL[f"{name}_num"]] = m.sum(axis=1)
        out[:, _COL[f"{name}_prod"]] = np.prod(np.where(m, ext, 1.0), axis=1)
        has = m.any(axis=1)
        last = nloops - 1 - np.argmax(m[:, ::-1], axis=1) if nloops else np.zeros(n, int)
        e_last = ext[np.arange(n), last] if nloops else np.zeros(n)
        r_last = rank[np.arange(n), last] if nloops else np.zeros(n)
        out[:, _COL[f"{name}_len"]] = np.where(has, e_last, 0)
        innermost = has & (r_last == nreal - 1)
        inner = has & ~innermost & (2 * (r_last + 1) > nreal)
        out[:, _COL[f"{name}_pos_none"]] = ~has
        out[:, _COL[f"{name}_pos_innermost"]] = innermost
        out[:, _COL[f"{name}_pos_inner"]] = inner
        out[:, _COL[f"{name}_pos_outer"]] = has & ~innermost & ~inner
    for k in _GPU_KINDS:
        m = real & (km == _KIND_CODE[k])
        out[:, _COL[f"gpu_{k.value}"]] = np.where(m.any(axis=1), np.prod(np.where(m, ext, 1.0), axis=1), 0.0)
    memo = _buffer_features(nest, ext, real, prod, out)
    out[:, _COL["alloc_size"]:_COL["alloc_local"] + 1] = nest.alloc
    out[:, _COL["outer_prod"]] = prod
    out[:, _COL["num_loops"]] = nreal
    out[:, _COL["auto_unroll_max_step"]] = nest.unroll_step
    out[:, _COL["is_init"]] = float(nest.is_init)
    out[:, _COL["is_update"]] = float(nest.is_update)
    _loop_features(nest, ext, real, km, rank, nreal, prod, out, memo)
    return out


@functools.cache
def machine() -> tuple[int, int, int, int]:
    """(threads of parallel loops, vector bits, L1d bytes, L2 bytes) of the host (cached): the numbers the
    parallel / vector / cache features compare against."""
    from .. import config
    from ..target import Target

    t = Target.host_cpu()
    n = int(config.get("num_threads") or 0)
    return (n if n > 0 else max(1, t.cores)), max(128, t.vector_bits), t.l1d_bytes or 32768, t.l2_bytes or 1 << 20


def _flat_strides(a: Access, step: np.ndarray | None = None, frac: np.ndarray | None = None) -> np.ndarray:
    """(N, L) elements one iteration of each loop moves the access by (whole coefficients, as `stride`).
    `step` / `frac`: the two |flat strides| (whole coefficients only / all) when already computed."""
    if step is not None:
        return np.where(step > 1e-12, step, np.where(frac > 1e-12, 0.5, 0.0))
    n, nl = a.coef.shape[:2]
    if not a.coef.size:
        return np.zeros((n, nl))
    rs = _row_strides(a.shape)
    whole = np.where(np.abs(a.coef) >= 1 - 1e-9, a.coef, 0.0)
    step = np.abs(np.einsum("nld,nd->nl", whole, rs))
    frac = np.abs(np.einsum("nld,nd->nl", a.coef, rs))
    return np.where(step > 1e-12, step, np.where(frac > 1e-12, 0.5, 0.0))   # only fractional moves: "other"


def _loop_features(nest: StoreNest, ext, real, km, rank, nreal, prod, out: np.ndarray, memo) -> None:
    """`memo`: per access (regions, unique elements per level, whole / all flat strides) from _buffer_features."""
    n, nl = ext.shape
    rows = np.arange(n)
    threads, vbits, l1, l2 = machine()
    # parallel: only the outermost parallel loop is launched, the ones inside it run serially
    par = real & (km == _KIND_CODE[ForKind.PARALLEL])
    has_p = par.any(axis=1)
    first = np.argmax(par, axis=1) if nl else np.zeros(n, int)
    pre = np.cumprod(np.where(real, ext, 1.0), axis=1) if nl else np.ones((n, 0))
    launches = np.where(first > 0, pre[rows, np.maximum(first - 1, 0)], 1.0) if nl else np.ones(n)
    p_ext = ext[rows, first] if nl else np.zeros(n)
    out[:, _COL["par_launches"]] = np.where(has_p, launches, 0.0)
    out[:, _COL["par_extent"]] = np.where(has_p, p_ext, 0.0)
    rounds = np.maximum(np.ceil(p_ext / threads), 1.0)            # iterations of the busiest thread
    out[:, _COL["par_balance"]] = np.where(has_p, p_ext / (threads * rounds), 1.0 / threads)
    out[:, _COL["par_work"]] = np.where(has_p, prod / np.maximum(launches * p_ext, 1.0), prod)
    inner = nl - 1 - np.argmax(real[:, ::-1], axis=1) if nl else np.zeros(n, int)
    has_i = nreal > 0
    vec = real & (km == _KIND_CODE[ForKind.VECTORIZED])
    has_v = vec.any(axis=1)
    vl = nl - 1 - np.argmax(vec[:, ::-1], axis=1) if nl else np.zeros(n, int)
    strides = [_flat_strides(a, m[2], m[3]) for a, m in zip(nest.accesses, memo)]
    w = next((j for j, a in enumerate(nest.accesses) if a.mode != 0), None)
    vec_ok = has_v & (rank[rows, vl] == nreal - 1) if nl else np.zeros(n, bool)
    if w is not None and nl:
        vec_ok &= strides[w][rows, vl] > 1e-12
        eb = nest.accesses[w].elem_bytes
    else:
        eb = 4
    lanes = max(1, vbits // (8 * eb))
    v_ext = np.where(has_v, ext[rows, vl] if nl else 0.0, 0.0)
    out[:, _COL["vec_ok"]] = vec_ok
    out[:, _COL["vec_regs"]] = v_ext / lanes
    out[:, _COL["vec_rem"]] = np.mod(v_ext, lanes)
    for pre_name, loop, on in (("vec", vl, vec_ok), ("inner", inner, has_i)):
        cnt = np.zeros((3, n))
        for a, s in zip(nest.accesses, strides):
            sl = s[rows, loop] if nl else np.zeros(n)
            cnt += a.count * np.stack([np.abs(sl - 1) < 1e-9, sl < 1e-12, (sl > 1e-12) & (np.abs(sl - 1) >= 1e-9)])
        for j, kind in enumerate(("contig", "bcast", "gather")):
            out[:, _COL[f"{pre_name}_{kind}"]] = np.where(on, cnt[j], 0.0)
    out[:, _COL["inner_len"]] = np.where(has_i, ext[rows, inner] if nl else 0.0, 0.0)
    # unrolled copies: from the innermost loop outwards while the loops unroll
    copies = np.ones(n)
    going = np.ones(n, bool)
    step = np.asarray(nest.unroll_step, dtype=np.float64)
    for li in range(nl - 1, -1, -1):
        k = km[:, li] if km.shape[0] == n else np.broadcast_to(km[0, li], (n,))
        e = np.where(k == _KIND_CODE[ForKind.VECTORIZED], 1.0, ext[:, li])
        ok = going & (k != _KIND_CODE[ForKind.PARALLEL]) & ((k == _KIND_CODE[ForKind.UNROLLED]) | (copies * e <= step))
        ok |= going & ~real[:, li]
        going &= ok
        copies = np.where(ok, copies * np.where(real[:, li], e, 1.0), copies)
    out[:, _COL["unroll_copies"]] = np.where(nreal > 0, copies, 0.0)
    if w is not None:
        a = nest.accesses[w]
        uw = memo[w][1][:, 0] if a.shape.shape[1] else np.ones(n)     # the product over dimensions at level 0
        out[:, _COL["write_ratio"]] = prod / np.maximum(uw, 1.0)
    # cache fit: footprint of all buffers inside each level
    if nest.accesses and nl:
        foot = sum(m[1] * a.elem_bytes for a, m in zip(nest.accesses, memo))   # (N, L+1)
        suffix = _suffix_prod(ext)
        for name, cap in (("l1_fit_prod", l1), ("l2_fit_prod", l2)):
            k = np.argmax(foot <= cap, axis=1)     # outermost level that fits (level L always does: one point)
            out[:, _COL[name]] = np.where(nreal > 0, suffix[rows, k], 0.0)   # extent-1 loops alone: none
    _guard_features(nest, ext, real, inner, has_i, w, out)
    if w is not None and nl:
        _tile_features(nest, ext, real, strides, w, lanes, out, memo)


def _divides(a: Access, ext: np.ndarray, real: np.ndarray) -> np.ndarray:
    """(N, L, D): loop l indexes dimension d of `a` through a division: a fractional coefficient of a loop that
    alone moves the dimension by a whole step (x // k with the loop's span >= k; a smaller one is simplified away
    by the lowering, e.g. (4 * i + j) // 4 = i for j < 4), in a dimension of more than one element."""
    c = np.abs(a.coef)
    return (c > 1e-12) & (np.abs(c - np.round(c)) > 1e-9) & (c * (ext - 1.0)[:, :, None] >= 1 - 1e-9) & \
        real[:, :, None] & (a.shape[:, None, :] > 1)


def _tile_features(nest: StoreNest, ext, real, strides, w, lanes, out: np.ndarray, memo) -> None:
    """rt_*: the register tile inside the innermost loop that does not move the stored element."""
    n, nl = ext.shape
    rows = np.arange(n)
    zero = real & (strides[w] < 1e-12)
    has = zero.any(axis=1)
    lvl = np.where(has, nl - np.argmax(zero[:, ::-1], axis=1), nl)     # the level just inside that loop
    elems = loads = 0.0
    for j, a in enumerate(nest.accesses):
        u = memo[j][1][rows, lvl] if a.shape.shape[1] else np.ones(n)
        if j == w:
            elems = u
        elif a.mode == 0:
            loads = loads + u
    execs = _suffix_prod(ext)[rows, lvl]
    out[:, _COL["rt_elems"]] = np.where(has, elems, 0.0)
    out[:, _COL["rt_regs"]] = np.where(has, elems / lanes, 0.0)
    out[:, _COL["rt_loads"]] = np.where(has, loads, 0.0)
    out[:, _COL["rt_inten"]] = np.where(has, execs / np.maximum(loads, 1.0), 0.0)


def _guard_features(nest: StoreNest, ext, real, inner, has_i, w, out: np.ndarray) -> None:
    """guard_* / pad_ratio (spans of the stored buffer beyond its shape) and idx_div* (fractional coefficients)."""
    n, nl = ext.shape
    rows = np.arange(n)
    if w is not None and nl and nest.accesses[w].shape.shape[1]:
        a = nest.accesses[w]
        # loops that index the buffer through a division (x // k with x % k: a fused loop) wrap around rather
        # than overrun it: they do not count
        frac_w = _divides(a, ext, real)
        whole = ~np.any(frac_w, axis=2)                                         # (N, L)
        moves = (np.abs(a.coef) > 1e-12) & (real & whole)[:, :, None]              # (N, L, D)
        span = 1.0 + np.floor(np.sum(np.where(moves, np.abs(a.coef) * (ext - 1.0)[:, :, None], 0.0), axis=1) + 1e-9)
        guarded = span > a.shape + 1e-9
        out[:, _COL["guard_dims"]] = guarded.sum(axis=1)
        out[:, _COL["pad_ratio"]] = np.prod(span, axis=1) / np.maximum(np.prod(np.minimum(span, a.shape), axis=1), 1.0)
        gl = np.any(moves & guarded[:, None, :], axis=2)                          # (N, L) loops moving a guarded dim
        has_g = gl.any(axis=1)
        last = nl - 1 - np.argmax(gl[:, ::-1], axis=1)
        pre = np.cumprod(np.where(real, ext, 1.0), axis=1)
        out[:, _COL["guard_execs"]] = np.where(has_g, pre[rows, last], 0.0)
        out[:, _COL["guard_inner"]] = has_g & has_i & gl[rows, inner]
    else:
        out[:, _COL["pad_ratio"]] = 1.0
        frac_w = None
    div = np.zeros(n)
    div_in = np.zeros(n)
    for j, a in enumerate(nest.accesses):
        if not nl or not a.coef.shape[2]:
            continue
        frac = frac_w if j == w and frac_w is not None else _divides(a, ext, real)
        div += a.count * frac.any(axis=(1, 2))
        div_in += a.count * (frac[rows, inner].any(axis=1) & has_i)
    out[:, _COL["idx_div"]] = div
    out[:, _COL["idx_div_inner"]] = div_in


def _suffix_prod(ext: np.ndarray) -> np.ndarray:
    """(N, L+1): product of extents of loops k.. innermost (column L = 1)."""
    n, nl = ext.shape
    out = np.ones((n, nl + 1))
    for k in range(nl - 1, -1, -1):
        out[:, k] = out[:, k + 1] * ext[:, k]
    return out


def _regions(acc: Access, ext: np.ndarray) -> np.ndarray:
    """(N, L+1, D) touched extent per dimension at each level (column L: a single point)."""
    span = np.abs(acc.coef) * (ext - 1.0)[:, :, None]          # (N, L, D)
    n, nl, d = span.shape
    cum = np.zeros((n, nl + 1, d))
    cum[:, :nl] = np.cumsum(span[:, ::-1], axis=1)[:, ::-1]
    return np.minimum(acc.shape[:, None, :], 1.0 + np.floor(cum + 1e-9))


def _buffer_features(nest: StoreNest, ext: np.ndarray, real: np.ndarray, prod: np.ndarray, out: np.ndarray) -> list:
    """The B*.* and intensity columns; returns per access what the loop columns reuse (`_loop_features`)."""
    n, nl = ext.shape
    accs = nest.accesses
    if not accs:
        return []
    memo = []
    suffix = _suffix_prod(ext)
    rows = np.arange(n)
    per = []   # per access: dict of (N,) arrays
    uniq_levels = np.zeros((n, nl + 1))
    for a in accs:
        reg = _regions(a, ext)                                   # (N, L+1, D)
        eb = float(a.elem_bytes)
        uniq = np.prod(reg, axis=2)                              # (N, L+1) elements
        last_lines = np.ceil(reg[:, :, -1] * eb / CACHE_LINE) if reg.shape[2] else np.ones((n, nl + 1))
        ulines_lvl = np.prod(reg[:, :, :-1], axis=2) * last_lines if reg.shape[2] else last_lines
        uniq_levels += uniq * eb
        rowstride = _row_strides(a.shape)                        # (N, D)
        stride = np.abs(np.einsum("nld,nd->nl", a.coef, rowstride)) if a.coef.size else np.zeros((n, nl))
        moving = real & (stride > 1e-12)
        has_mv = moving.any(axis=1)
        inner_mv = nl - 1 - np.argmax(moving[:, ::-1], axis=1) if nl else np.zeros(n, int)
        # the step of one iteration: a fractional coefficient (x // k) moves its dimension once every k steps
        whole = np.where(np.abs(a.coef) >= 1 - 1e-9, a.coef, 0.0)
        step = np.abs(np.einsum("nld,nd->nl", whole, rowstride)) if a.coef.size else np.zeros((n, nl))
        memo.append((reg, uniq, step, stride))
        step = np.where(step > 1e-12, step, stride)
        s_in = np.where(has_mv, step[rows, inner_mv] if nl else 0.0, 0.0)
        e_in = np.where(has_mv, ext[rows, inner_mv] if nl else 1.0, 1.0)
        per_line = np.where(has_mv, np.clip(CACHE_LINE / np.maximum(s_in * eb, 1e-9), 1.0, e_in), 1.0)
        accesses = prod * a.count
        zero = real & ~(stride > 1e-12)
        has_zero = zero.any(axis=1)
        rl = nl - 1 - np.argmax(zero[:, ::-1], axis=1) if nl else np.zeros(n, int)
        per.append(dict(bytes=accesses * eb, unique_bytes=uniq[:, 0] * eb, lines=accesses / per_line,
                        unique_lines=ulines_lvl[:, 0], stride=s_in, has_zero=has_zero, rl=rl, mode=a.mode,
                        uniq=uniq, eb=eb))
    for p in per:
        p["reuse_ct"] = np.where(p["has_zero"], ext[rows, p["rl"]] if nl else 0.0, 0.0)
        p["dis_iter"] = np.where(p["has_zero"], suffix[rows, p["rl"] + 1] if nl else 0.0, 0.0)
        inside = sum(q["uniq"][rows, np.minimum(p["rl"] + 1, nl)] * q["eb"] for q in per)
        p["dis_bytes"] = np.where(p["has_zero"], inside, 0.0)
        serial = ~p["has_zero"] & (p["mode"] == 2)
        p["kind"] = np.where(p["has_zero"], 1, np.where(serial, 2, 0))
        p["reuse_ct"] = np.where(serial, 1.0, p["reuse_ct"])
        p["dis_iter"] = np.where(serial, 1.0, p["dis_iter"])
        p["dis_bytes"] = np.where(serial, p["eb"], p["dis_bytes"])
    byts = np.stack([p["bytes"] for p in per], axis=1)           # (N, B)
    order = np.argsort(-byts, axis=1, kind="stable")[:, :TOP_BUFFERS]
    base = _COL["B0.acc_read"]
    nb = len(_BUF_FEATURES)
    keys = ("kind", "reuse_ct", "bytes", "unique_bytes", "lines", "unique_lines", "dis_iter", "dis_bytes", "stride")
    M = np.empty((len(keys), n, len(per)))                      # (key, N, B)
    for b, p in enumerate(per):
        for j, key in enumerate(keys):
            M[j, :, b] = p[key]
    modes = np.array([p["mode"] for p in per])
    for slot in range(order.shape[1]):
        idx = order[:, slot]
        col = base + slot * nb
        kind, rc, byts_, ub, ln, ul, di, db, sd = M[:, rows, idx]
        mode = modes[idx]
        div = np.maximum(rc, 1.0)
        out[:, col:col + nb] = np.stack(
            [mode == 0, mode == 1, mode == 2, byts_, ub, ln, ul, kind == 0, kind == 1, kind == 2, di, db, rc,
             byts_ / div, ub / div, ln / div, ul / div, sd], axis=1)
    flops = np.atleast_2d(nest.ops).sum(axis=1)          # (1 or N,)
    if np.any(flops > 0):
        fl = flops[:, None] * suffix                                      # (N, L+1) flops inside level k
        inten = fl / np.maximum(uniq_levels, 1.0)
        logf = np.log2(np.maximum(fl, 1.0))
        total = logf[:, 0]
        for j in range(1, CURVE_SAMPLES + 1):
            thr = total * j / CURVE_SAMPLES + 1e-9
            k = np.argmax(logf <= thr[:, None], axis=1)
            out[:, _COL[f"intensity_{j}"]] = inten[rows, k]
    return memo


def _row_strides(shape: np.ndarray) -> np.ndarray:
    n, d = shape.shape
    out = np.ones((n, d))
    for k in range(d - 2, -1, -1):
        out[:, k] = out[:, k + 1] * shape[:, k + 1]
    return out


# ----------------------------------------------------------------------------- expressions

def count_ops(e: Expr) -> np.ndarray:
    """Arithmetic counts (OP_KINDS order) of a data expression; index arithmetic inside Loads is not counted.
    A float add or subtract with a float multiply operand counts as one mad."""
    out = np.zeros(len(OP_KINDS))
    stack = [e]
    fused: set[int] = set()
    while stack:
        x = stack.pop()
        if isinstance(x, Load | Var | Const):
            continue
        pre = "float" if x.dtype.is_float else "int"
        if isinstance(x, Binary):
            kids = (x.a, x.b)
            if x.op in (Op.ADD, Op.SUBTRACT):
                m = next((c for c in kids if isinstance(c, Binary) and c.op is Op.MULTIPLY and c.dtype == x.dtype
                          and id(c) not in fused), None)
                if m is not None and x.dtype is not DType.PRED:
                    fused.add(id(m))
                    out[_OPK[f"{pre}_mad"]] += 1
                else:
                    out[_OPK[_bin_kind(x, pre)]] += 1
            elif not (x.op is Op.MULTIPLY and id(x) in fused):
                out[_OPK[_bin_kind(x, pre)]] += 1
            stack.extend(kids)
        elif isinstance(x, Unary):
            kind = "bool_op" if x.op in _BOOL else (f"{pre}_math_func" if x.op in _MATH else f"{pre}_other_func")
            out[_OPK[kind]] += 1
            stack.append(x.a)
        elif isinstance(x, Compare):
            out[_OPK[("float" if x.a.dtype.is_float else "int") + "_cmp"]] += 1
            stack.extend((x.a, x.b))
        elif isinstance(x, Select):
            out[_OPK["select_op"]] += 1
            stack.extend((x.cond, x.t, x.f))
        elif isinstance(x, Cast):
            stack.append(x.a)
    return out


def _bin_kind(x: Binary, pre: str) -> str:
    if x.dtype is DType.PRED or x.op in _BOOL:
        return "bool_op"
    if x.op in (Op.ADD, Op.SUBTRACT):
        return f"{pre}_addsub"
    if x.op is Op.MULTIPLY:
        return f"{pre}_mul"
    if x.op in (Op.DIVIDE, Op.REMAINDER):
        return f"{pre}_divmod"
    if x.op in (Op.MAXIMUM, Op.MINIMUM):
        return f"{pre}_cmp"
    if x.op in _MATH:
        return f"{pre}_math_func"
    return f"{pre}_other_func"


def lin_coefs(e: Expr, ext: dict[str, float] | None = None) -> dict[str, float]:
    """Coefficients of loop variables in an index expression: x // k -> x / k, x % k and clamps pass x
    through, anything else non-linear: coefficient 1 for each variable inside.  With the loop extents
    `ext`, what the step of a loop really does: in x % k a variable whose coefficient is a multiple of k
    drops out (it moves x by whole periods); in x // k the variables with coefficients that are not
    multiples of k drop out when together they move x by less than k (x = a * k + b, 0 <= b < k)."""
    if isinstance(e, Var):
        return {e.name: 1.0}
    if isinstance(e, Const):
        return {}
    if isinstance(e, Binary):
        if e.op in (Op.ADD, Op.SUBTRACT):
            a, b = lin_coefs(e.a, ext), lin_coefs(e.b, ext)
            sg = 1.0 if e.op is Op.ADD else -1.0
            for k, v in b.items():
                o = a.get(k)
                # ((f // m) % n) * m + f % m, a fused loop reaching both halves: one step of f moves the sum
                # by 1 (it is f % (m * n)), as the fast path's split relation has it, not by 2
                a[k] = v if sg > 0 and o is not None and v and abs(o - v) < 1e-12 else (o or 0.0) + sg * v
            return a
        if e.op is Op.MULTIPLY:
            if isinstance(e.b, Const):
                return {k: v * float(e.b.value) for k, v in lin_coefs(e.a, ext).items()}
            if isinstance(e.a, Const):
                return {k: v * float(e.a.value) for k, v in lin_coefs(e.b, ext).items()}
        if e.op is Op.DIVIDE and isinstance(e.b, Const) and e.b.value:
            kk = float(e.b.value)
            inner = lin_coefs(e.a, ext)
            if ext is not None:
                frac = [v for v, c in inner.items() if c % kk]
                if sum(abs(inner[v]) * (ext.get(v, 1.0) - 1.0) for v in frac) < kk:
                    inner = {v: c for v, c in inner.items() if v not in frac}
            return {k: v / kk for k, v in inner.items()}
        if e.op is Op.REMAINDER and isinstance(e.b, Const):
            inner = lin_coefs(e.a, ext)
            if ext is not None and e.b.value:
                inner = {v: c for v, c in inner.items() if c % float(e.b.value)}
            return inner
        if e.op in (Op.MAXIMUM, Op.MINIMUM):
            if isinstance(e.b, Const):
                return lin_coefs(e.a, ext)
            if isinstance(e.a, Const):
                return lin_coefs(e.b, ext)
    from ..ir.expr import walk
    return {x.name: 1.0 for x in walk(e) if isinstance(x, Var)}


# ----------------------------------------------------------------------------- exact path

def _merge(accs: list[tuple[str, int, tuple[Expr, ...], DType]]) -> list[tuple[str, int, int, list, DType]]:
    """Group accesses by buffer: (buffer, mode, count, [indices...], dtype); write first, then by name."""
    by: dict[str, list] = {}
    for buf, mode, idx, dt in accs:
        if buf not in by:
            by[buf] = [buf, mode, 0, [], dt]
        g = by[buf]
        if g[1] != mode:
            g[1] = 2
        g[2] += 1
        g[3].append(idx)
    return sorted((tuple(g) for g in by.values()), key=lambda g: (g[1] == 0, g[0]))


def nests_of_func(func: LoopFunc) -> list[StoreNest]:
    """Exact path: one StoreNest (N = 1) per Store of `func`, in program order."""
    shapes = {b.name: b.shape for b in func.params}
    allocs: dict[str, tuple[tuple[int, ...], bool, float]] = {}
    out: list[StoreNest] = []

    def visit(s, loops: list[For]) -> None:
        if isinstance(s, For):
            visit(s.body, loops + [s])
        elif isinstance(s, Seq):
            for b in s.body:
                visit(b, loops)
        elif isinstance(s, If):
            visit(s.then, loops)
            if s.otherwise is not None:
                visit(s.otherwise, loops)
        elif isinstance(s, Allocate):
            shapes[s.buffer] = s.shape
            outer = float(np.prod([lp.const_extent or 1 for lp in loops])) if loops else 1.0
            allocs[s.buffer] = (s.shape, s.scope == "local", outer, s.dtype)
            visit(s.body, loops)
        elif isinstance(s, Store):
            out.append(_nest_of_store(s, loops, shapes, allocs, func))

    visit(func.body, [])
    return out


def _dtype_of(func: LoopFunc, buf: str, allocs: dict) -> DType:
    for b in func.params:
        if b.name == buf:
            return b.dtype
    return allocs[buf][3]


def _nest_of_store(st: Store, loops: list[For], shapes: dict, allocs: dict, func: LoopFunc) -> StoreNest:
    accs = [(st.buffer, 1, st.indices, _dtype_of(func, st.buffer, allocs))]
    from ..ir.expr import walk
    for x in walk(st.value):
        if isinstance(x, Load):
            accs.append((x.buffer, 0, x.indices, x.dtype))
    vars_ = [lp.var.name for lp in loops]
    ext = np.array([[float(lp.const_extent or 1) for lp in loops]])
    loop_ext = {lp.var.name: float(lp.const_extent or 1) for lp in loops}
    is_update = any(b == st.buffer and m == 0 for b, m, _, _ in accs)
    accesses = []
    for buf, mode, count, idxs, dt in _merge(accs):
        shape = shapes[buf]
        coef = np.zeros((1, len(loops), len(shape)))
        for idx in idxs:
            for d, e in enumerate(idx):
                cs = lin_coefs(e, loop_ext)
                for li, v in enumerate(vars_):
                    c = cs.get(v, 0.0)
                    if abs(c) > abs(coef[0, li, d]):
                        coef[0, li, d] = c
        accesses.append(Access(buf, mode, count, _nbytes(dt), coef,
                               np.array([shape], dtype=np.float64).reshape(1, len(shape))))
    step = 0
    for lp in loops:
        for k, v in lp.annotations:
            if k == "auto_unroll_max_step":
                step = max(step, int(v))
    alloc = np.zeros((1, 4))
    if st.buffer in allocs:
        shape, local, outer, dt = allocs[st.buffer]
        alloc[0] = (float(np.prod(shape)) * _nbytes(dt), outer, float(np.prod(ext)) / outer if outer else 0.0,
                    float(local))
    return StoreNest(tuple(lp.kind for lp in loops), ext, count_ops(st.value), accesses, np.array([float(step)]),
                     alloc, is_init=isinstance(st.value, Const), is_update=is_update)


def _nbytes(dt: DType) -> int:
    try:
        return int(dt.np.itemsize)
    except Exception:  # noqa: BLE001 - pred and exotic types
        return 1


def add_program_features(X: np.ndarray, ideal: float | None) -> np.ndarray:
    """Fill the prog_* columns of log-scaled statement rows X (..., S, NUM_FEATURES), in place: aggregates over
    the S statements of each program, the same value in each of its rows (so a per-statement model sees the
    whole program); then the est_* columns (`add_estimates`, against `ideal`, the workload's `ideal_log2`; None:
    left for the caller, which computes them for many structures' programs at once).  Returns X."""
    if X.shape[-2] == 0:
        return X
    raw = lambda cols: np.exp2(np.abs(X[..., cols])) - 1.0     # noqa: E731 - inverse of log_scale (counts >= 0)
    ops = raw(slice(0, len(OP_KINDS))).sum(axis=(-1, -2))
    outer = raw(_COL["outer_prod"]).sum(axis=-1)
    byts = raw([_COL[f"B{b}.bytes"] for b in range(TOP_BUFFERS)]).sum(axis=(-1, -2))
    prog = np.stack([np.full(ops.shape, float(X.shape[-2])), ops, outer, byts, ops / np.maximum(byts, 1.0)], axis=-1)
    X[..., _COL["prog_statements"]:_COL["prog_intensity"] + 1] = log_scale(prog)[..., None, :]
    return X if ideal is None else add_estimates(X, ideal)


#: the estimate's machine constants (per thread; `machine()` gives the threads and lanes): operations per second
#: of one vector lane, memory bytes per second of one thread, the gain in bandwidth with more threads, the cost
#: of one parallel launch; weights of the operation kinds (a multiply-add counts 2, a math function 20)
EST_OPS_PER_S = 6e9
EST_BYTES_PER_S = 15e9
EST_PAR_BW = 1.6
EST_LAUNCH_S = 3e-6
#: FLOPs per second of one thread in the ideal time (`ideal_log2`): the compute and memory terms' balance point.
#: 48e9 (8 lanes at EST_OPS_PER_S) measured better held out than 96e9 (16 lanes): docs/cost_model.md, session 15
EST_IDEAL_FLOPS_PER_S = 48e9
EST_OP_WEIGHTS = {"float_mad": 2, "float_addsub": 1, "float_mul": 1, "float_divmod": 8, "float_cmp": 1,
                  "float_math_func": 20, "float_other_func": 4, "int_mad": 0.5, "int_addsub": 0.25, "int_mul": 0.25,
                  "int_divmod": 4, "int_cmp": 0.25, "int_math_func": 1, "int_other_func": 1, "bool_op": 0.25,
                  "select_op": 1}
#: columns the model's score may only fall along (XGBoost monotone constraints, `model.monotone_constraints`)
MONOTONE_DECREASING = ("est_stmt", "est_prog", "est_rel_stmt", "est_rel_prog")


_EST_OPS = [_COL[k] for k in EST_OP_WEIGHTS]
_EST_W = np.array(list(EST_OP_WEIGHTS.values()), dtype=np.float64)
_EST_UNIQ = [_COL[f"B{b}.unique_bytes"] for b in range(TOP_BUFFERS)]
_EST_LINES = [_COL[f"B{b}.lines"] for b in range(TOP_BUFFERS)]
_EST_ONE = [_COL[n] for n in ("vec_ok", "vec_len", "par_extent", "par_balance", "l2_fit_prod", "par_launches",
                             "l1_fit_prod")]
_EST_IN = _EST_OPS + _EST_UNIQ + _EST_LINES + _EST_ONE     # the columns read, gathered in one call
#: the est_rel_* columns' est_* columns, as positions among est_compute .. est_ops_lane
_EST_REL = [_COL["est_" + n[len("est_rel_"):]] - _COL["est_compute"]
            for n in ("est_rel_stmt", "est_rel_prog", "est_rel_compute", "est_rel_memory")]


def add_estimates(X: np.ndarray, ideal: float) -> np.ndarray:
    """Fill the est_* columns (`_EST_TABLE`) of log-scaled rows X (..., S, NUM_FEATURES) in place from the other
    columns of the same rows, so both feature paths get them alike.  Returns X."""
    R = np.exp2(np.abs(X[..., _EST_IN])) - 1.0          # inverse of log_scale (these columns are >= 0)
    nops, nb = len(_EST_OPS), TOP_BUFFERS
    vec_ok, vec_len, par_ext, par_bal, l2fit, launches, l1fit = np.moveaxis(R[..., nops + 2 * nb:], -1, 0)
    threads, vbits, _, _ = machine()
    lanes = max(1, vbits // 32)
    flops = R[..., :nops] @ _EST_W
    lane_use = np.where(vec_ok > 0.5, np.clip(vec_len, 1.0, lanes), 1.0)
    thr = np.where(par_ext > 0, threads * par_bal, 1.0)
    t_cmp = flops / (lane_use * thr) / EST_OPS_PER_S
    uniq = R[..., nops:nops + nb].sum(axis=-1)
    lines = R[..., nops + nb:nops + 2 * nb].sum(axis=-1) * CACHE_LINE
    mem = np.maximum(uniq, np.minimum(lines, lines / np.maximum(l2fit, 1.0) + uniq))
    t_mem = mem / (np.where(thr > 1.0, EST_PAR_BW, 1.0) * EST_BYTES_PER_S)
    t_par = launches * EST_LAUNCH_S
    est = np.maximum(t_cmp, t_mem) + t_par
    prog = np.broadcast_to(est.sum(axis=-1, keepdims=True), est.shape)
    cols = np.stack([t_cmp, t_mem, t_par + 1e-9, est, prog, lines / thr, lines / np.maximum(l1fit, 1.0),
                     flops / lane_use], axis=-1)
    cols = np.log2(1e-12 + cols)
    X[..., _COL["est_compute"]:_COL["est_ops_lane"] + 1] = cols
    X[..., _COL["est_rel_stmt"]:_COL["est_rel_memory"] + 1] = cols[..., _EST_REL] - ideal
    return X


def ideal_log2(cd) -> float:
    """log2 of a compute definition's ideal time on this machine (seconds): its FLOPs at EST_IDEAL_FLOPS_PER_S on
    every thread, or its bytes (`ir.workload.bytes_moved`) at the bandwidth of all threads, whichever is longer.  The
    est_rel_* columns are the estimates against it, so that workloads of every size share one scale."""
    from ..ir.workload import bytes_moved, flops

    threads = machine()[0]
    return float(np.log2(max(flops(cd) / (EST_IDEAL_FLOPS_PER_S * threads),
                             bytes_moved(cd) / (EST_BYTES_PER_S * EST_PAR_BW), 1e-12)))


def features_of_func(func: LoopFunc, ideal: float) -> np.ndarray:
    """Exact path: (S, NUM_FEATURES) log-scaled features, one row per Store of `func` (program and estimate
    columns included; `ideal`: `ideal_log2` of the compute definition `func` was lowered from)."""
    rows = [store_features(n)[0] for n in nests_of_func(func)]
    if not rows:
        return np.zeros((0, NUM_FEATURES))
    return add_program_features(log_scale(np.stack(rows)), ideal)
