"""Loop IR -> LLVM IR (llvmlite.ir) for the CPU.

Map:
  emit_module(func, triple, ...)  LoopFunc -> (llvmlite ir.Module, entry name, has_parallel); guarded tails are
                                  split off their loops first (`partition.partition_tails`, setting `loop_partition`)
  FuncEmitter                     one LLVM function: statements (For/Seq/Store/Allocate/If) and
                                  expressions, in scalar mode or in vector mode (inside a VECTORIZED loop)
  nontemporal_buffers()           the kernel arguments whose vector stores are non-temporal
  vector_plan()                   can a VECTORIZED loop be emitted with vector instructions?
  lin_coeff()                     the stride of an index expression in a loop variable (None: not affine)
  math_op()                       the ONE switch point to the vector math library (vecmath.emit_math)
  type tables                     DType -> LLVM storage / register types

Conventions (see loop_ir's docstring for the IR's own):
- The kernel is `void NAME(T0* noalias p0, ..., Tn* noalias pn)` over the LoopFunc's params.
- pred is i8 in memory and i1 in registers; bf16 is held as float32 in memory (numpy has no bf16) and
  as f32 in registers, rounded to bf16 (nearest even) after every operation that produces bf16;
  f16 is `half` (LLVM promotes the arithmetic to f32 and rounds back per operation).
- Index arithmetic is i64 with `nsw`.  Float mul/add/sub carry the `contract` flag (f32/f64 only)
  so LLVM forms FMAs, as XLA's CPU backend allows; no other fast-math flag (NaN semantics kept).
- Loads inside an arm of a `select` are speculative: their offset is clamped into the buffer
  (pad/guarded accesses never fault); in vector mode a contiguous speculative load checks its bounds
  and falls back to clamped lanes.
- VECTORIZED loops: each expression is either uniform (a scalar) or varying (an <N x T> vector).
  Loads/stores whose offset has stride 1 in the loop variable are vector loads/stores (align = element
  size), stride 0 is a scalar load then a broadcast, anything else is gathered/scattered lane by lane.
  An `If` whose condition varies runs the vector body when all lanes agree and the lanes one by one
  otherwise (tail guards cost one test per vector).  A loop that would change meaning when vectorized
  (a lane reading what another lane writes) is emitted as a scalar loop instead.
- UNROLLED loops and serial loops under an `auto_unroll_max_step` pragma whose fully unrolled size
  (stores executed) is at most the pragma are unrolled in the IR, so local accumulator tiles get
  constant offsets and SROA turns them into registers.
- Non-temporal stores (x86): in a kernel without local buffers, a kernel argument of at least
  `nontemporal_store_bytes` (config) that the kernel never reads gets its contiguous vector stores (a multiple of
  16 bytes) as 16-byte non-temporal stores: such an output does not fit the caches anyway, and a normal store
  first reads the line it writes (read for ownership), a third of the traffic of a copy.  A non-temporal store
  needs an address aligned to its size, which neither the buffer's base nor the offset promises, so each vector
  store tests its address and stores normally when it is not 16-byte aligned (a predictable branch per vector).
  Every function that made one ends with `sfence`, so the stores are visible before the parallel runtime reports
  the chunk done.
- Loops under the pragma `prefetch_rows` = d (`_prefetch_plan`) prefetch, spread over their iterations, the rows d
  ahead of their enclosing serial loop of every kernel argument that loop walks with one constant stride (for
  writing where it stores to it): a row plan's math then runs while the next row's memory traffic does.
- A float vector divided by a uniform (scalar) value is multiplied by its reciprocal, computed once, as XLA rewrites
  A / broadcast(B) (`_uniform_division`; the division where the reciprocal is not a normal number).
- Allocate: scope "local" (at most LOCAL_STACK_LIMIT bytes) is an alloca in the function's entry block;
  "global", "shared" and large ones are `aligned_alloc(64, ...)` before the body and `free` after it.
- PARALLEL loops (outermost of their nest) are outlined: `NAME_parK(bufs..., vars..., begin, end)`
  runs a chunk; `NAME_taskK(ctx, tid, nthreads)` unpacks the context and picks the chunk; the kernel
  packs the context and calls `hlotune_rt_launch(task, ctx)` (see cpu_runtime).
"""

from __future__ import annotations

import math
import re
import struct
from contextlib import contextmanager

import llvmlite.ir as ir
import numpy as np

from .. import config
from ..errors import CompileError
from ..ir.expr import INDEX, Binary, Cast, Compare, Const, Expr, Load, Select, Unary, Var, substitute, walk
from ..ir.hlo import DType, Op
from ..schedule_space.loop_ir import Allocate, Barrier, For, ForKind, If, LoopFunc, Seq, Stmt, Store, walk_stmts
from .cpu_runtime import LAUNCH_NAME, TASK_PTR, is_x86
from .partition import partition_tails

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()
#: the loop pragma (`Pragma(stage, iter, "prefetch_rows", d)`) whose loop prefetches, spread over its iterations, the
#: rows `d` ahead of its enclosing loop's of the kernel arguments that loop walks row by row (`_prefetch_plan`)
PREFETCH_ROWS = "prefetch_rows"
#: a float vector divided by a uniform divisor is multiplied by its reciprocal (`FuncEmitter._uniform_division`)
UNIFORM_DIVISION = True
CACHE_LINE = 64
VOID = ir.VoidType()
LOCAL_STACK_LIMIT = 256 * 1024

_STORE_T = {DType.PRED: I8, DType.S8: I8, DType.U8: I8, DType.S32: I32, DType.U32: I32, DType.S64: I64,
            DType.F16: F16, DType.BF16: F32, DType.F32: F32, DType.F64: F64}
_BYTES = {DType.PRED: 1, DType.S8: 1, DType.U8: 1, DType.S32: 4, DType.U32: 4, DType.S64: 8,
          DType.F16: 2, DType.BF16: 4, DType.F32: 4, DType.F64: 8}
_FCMP = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
#: ops computed by the vector math library (vecmath.emit_math)
MATH_OPS = frozenset({Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.TANH, Op.LOGISTIC, Op.SINE, Op.COSINE, Op.ERF,
                      Op.SQRT, Op.RSQRT, Op.POWER, Op.ATAN2})


def store_type(dt: DType) -> ir.Type:
    """The LLVM type of one element of a buffer of `dt` in memory."""
    return _STORE_T[dt]


def reg_type(dt: DType) -> ir.Type:
    """The LLVM type of a value of `dt` in registers."""
    return I1 if dt is DType.PRED else _STORE_T[dt]


def elem_bytes(dt: DType) -> int:
    return _BYTES[dt]


def _signed(dt: DType) -> bool:
    return dt in (DType.S8, DType.S32, DType.S64)


def bf16_round_const(v: float) -> float:
    """Round a Python float to the nearest bf16 value (ties to even), as a float."""
    if math.isnan(v) or math.isinf(v):
        return v
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
    return struct.unpack("<f", struct.pack("<I", bits))[0]


# ---- vector math: the one switch point ------------------------------------------------------------

def math_op(builder: ir.IRBuilder, op: Op, args: list[ir.Value]) -> ir.Value:
    """Emit a transcendental op on float/double scalars or vectors (vecmath: polynomial approximations)."""
    from .vecmath import emit_math
    return emit_math(builder, op, args)


def _intrinsic_suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_intrinsic_suffix(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    return {F32: "f32", F64: "f64", F16: "f16"}[t]


def intrinsic(builder: ir.IRBuilder, name: str, args: list[ir.Value], ret: ir.Type | None = None,
              overload: list[ir.Type] | None = None) -> ir.Value:
    """Call `llvm.NAME.<suffixes>`; the suffixes are the overload types (default: the first arg's type)."""
    mod = builder.module
    types = overload if overload is not None else [args[0].type]
    full = "llvm." + name + "".join("." + _intrinsic_suffix(t) for t in types)
    fn = mod.globals.get(full)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret or args[0].type, [a.type for a in args]), full)
    return builder.call(fn, args)


# ---- index analysis -------------------------------------------------------------------------------

def lin_coeff(e: Expr, var: str, lanes: int = 1, consts: dict[str, int] | None = None,
              base: int | None = 0) -> int | None:
    """The constant c with e(var + 1) - e(var) == c for var in [v0, v0 + lanes) (v0 the loop's first
    value, all indices non-negative), or None when that cannot be shown.  `consts` are variables known
    to be constants (unrolled loops), which lets `(j0*64 + j2*8 + v) // 16` be seen as uniform; `base` is
    the loop's first value when constant."""
    a = _affine(e, var, max(lanes, 1), consts or {}, base)
    return None if a is None else a[0]


def _affine(e: Expr, var: str, n: int, consts: dict[str, int], base: int | None = 0) -> tuple[int, int, int] | None:
    """(a, m, r): e == U + a*var where U == r (mod m); m == 0 means U == r exactly."""
    if isinstance(e, Var):
        if e.name == var:
            return (1, 0, base) if base is not None else (1, 1, 0)
        k = consts.get(e.name)
        return (0, 0, k) if k is not None else (0, 1, 0)
    if isinstance(e, Const):
        return (0, 0, int(e.value)) if not e.dtype.is_float else (0, 1, 0)
    if isinstance(e, Binary) and e.op in (Op.ADD, Op.SUBTRACT):
        x, y = _affine(e.a, var, n, consts, base), _affine(e.b, var, n, consts, base)
        if x is None or y is None:
            return None
        m = math.gcd(x[1], y[1])
        sign = 1 if e.op is Op.ADD else -1
        r = x[2] + sign * y[2]
        return (x[0] + sign * y[0], m, r % m if m else r)
    if isinstance(e, Binary) and e.op is Op.MULTIPLY:
        x, y = _affine(e.a, var, n, consts, base), _affine(e.b, var, n, consts, base)
        if x is None or y is None:
            return None
        if x[0] == 0 and x[1] == 0:
            x, y = y, x
        if y[0] == 0 and y[1] == 0:  # times an exact constant k
            k = y[2]
            m = abs(x[1] * k)
            return (x[0] * k, m, (x[2] * k) % m if m else x[2] * k)
        if x[0] == 0 and y[0] == 0:
            return (0, 1, 0)
        return None
    if isinstance(e, Binary) and e.op in (Op.DIVIDE, Op.REMAINDER):
        x, d = _affine(e.a, var, n, consts, base), _affine(e.b, var, n, consts, base)
        if x is None or d is None:
            return None
        if d[0] != 0 or d[1] != 0 or d[2] <= 0:
            return (0, 1, 0) if x[0] == 0 and d[0] == 0 else None
        c = d[2]
        a, m, r = x
        if m != 0 and m % c != 0:
            return (0, 1, 0) if a == 0 else None
        rr = r % c
        vals = [((rr + a * lane) // c if e.op is Op.DIVIDE else (rr + a * lane) % c) for lane in range(n)]
        step = vals[1] - vals[0] if n > 1 else 0
        if any(vals[i + 1] - vals[i] != step for i in range(n - 1)):
            return None
        if e.op is Op.REMAINDER:
            return (step, 0, vals[0])
        if m == 0:
            return (step, 0, (r - rr) // c + vals[0])
        mq = m // c
        return (step, mq, ((r - rr) // c + vals[0]) % mq if mq else 0)
    return (0, 1, 0) if not _mentions(e, var) else None


def _mentions(e: Expr, var: str) -> bool:
    return any(isinstance(n, Var) and n.name == var for n in walk(e))


def strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


def _access_coeff(indices: tuple[Expr, ...], shape: tuple[int, ...], var: str, lanes: int = 1,
                  consts: dict[str, int] | None = None, base: int | None = 0) -> int | None:
    total = 0
    for idx, st in zip(indices, strides_of(shape)):
        c = lin_coeff(idx, var, lanes, consts, base)
        if c is None:
            return None
        total += c * st
    return total


def _stmt_exprs(s: Stmt):
    if isinstance(s, Store):
        yield from s.indices
        yield s.value
    elif isinstance(s, If):
        yield s.cond
    elif isinstance(s, For):
        yield s.min
        yield s.extent


def _loads(s: Stmt):
    for st in walk_stmts(s):
        for e in _stmt_exprs(st):
            for n in walk(e):
                if isinstance(n, Load):
                    yield n


def nontemporal_buffers(func: LoopFunc, min_bytes: int) -> frozenset[str]:
    """The parameters of `func` of at least `min_bytes` (> 0) that it stores to and never loads, when it has no
    local buffer (`Allocate`).  Kernels with local buffers (reductions, row plans, packed GEMM tiles) compute
    between their loads and stores; there non-temporal stores measured slower (layernorm's row plan 1.51 ->
    1.73 ms, softmax's 1.52 -> 1.61 ms), while elementwise kernels gained (relu_chain 1.72 -> 1.24 ms)."""
    if min_bytes <= 0 or any(isinstance(st, Allocate) for st in walk_stmts(func.body)):
        return frozenset()
    big = {p.name for p in func.params if math.prod(p.shape) * elem_bytes(p.dtype) >= min_bytes}
    if not big:
        return frozenset()
    stored = {st.buffer for st in walk_stmts(func.body) if isinstance(st, Store)}
    loaded = {ld.buffer for ld in _loads(func.body)}
    return frozenset(big & stored - loaded)


def vector_plan(loop: For, shapes: dict[str, tuple[int, ...]], consts: dict[str, int] | None = None) -> bool:
    """True when `loop` (VECTORIZED) can run all lanes of each statement at once without changing
    its meaning: no nested loops/allocations, and every buffer written in it is read and written
    only at the same element of the current lane (with a stride != 0 in the loop variable)."""
    n = loop.const_extent
    if n is None or n < 2:
        return False
    var = loop.var.name
    written: dict[str, set[tuple[Expr, ...]]] = {}
    for st in walk_stmts(loop.body):
        if isinstance(st, For | Allocate | Barrier):
            return False
        if isinstance(st, Store):
            written.setdefault(st.buffer, set()).add(st.indices)
    reads: dict[str, set[tuple[Expr, ...]]] = {}
    for ld in _loads(loop.body):
        reads.setdefault(ld.buffer, set()).add(ld.indices)
    for buf, idxs in written.items():
        if len(idxs) != 1:
            return False
        (idx,) = idxs
        if any(r != idx for r in reads.get(buf, ())):
            return False
        base = loop.min.value if isinstance(loop.min, Const) else None
        c = _access_coeff(idx, shapes[buf], var, n, consts, base)
        if c == 0 or (c is None and buf in reads):
            return False
    return True


def unroll_size(s: Stmt) -> float:
    """Stores executed if `s` were fully unrolled (vectorized loops count once); inf if not constant."""
    if isinstance(s, Store):
        return 1
    if isinstance(s, Seq):
        return sum(unroll_size(x) for x in s.body)
    if isinstance(s, If):
        return unroll_size(s.then) + (unroll_size(s.otherwise) if s.otherwise is not None else 0)
    if isinstance(s, Allocate):
        return unroll_size(s.body)
    if isinstance(s, For):
        n = s.const_extent
        if n is None or s.kind is ForKind.PARALLEL:
            return math.inf
        return unroll_size(s.body) * (1 if s.kind is ForKind.VECTORIZED else n)
    return 0


# ---- the emitter ----------------------------------------------------------------------------------

class _Buf:
    __slots__ = ("name", "dtype", "shape", "strides", "ptr", "size")

    def __init__(self, name: str, dtype: DType, shape: tuple[int, ...], ptr: ir.Value):
        self.name, self.dtype, self.shape, self.ptr = name, dtype, tuple(shape), ptr
        self.strides = strides_of(self.shape)
        self.size = math.prod(max(int(d), 0) for d in self.shape)


class ModuleEmitter:
    """Holds the module and the state shared by the kernel and its outlined parallel bodies."""

    def __init__(self, func: LoopFunc, triple: str, parallel: bool = True, nontemporal_bytes: int = 0):
        self.func = func
        self.nt_bufs = nontemporal_buffers(func, nontemporal_bytes) if is_x86(triple) else frozenset()
        self.name = sanitize(func.name)
        self.module = ir.Module(name=self.name)
        self.module.triple = triple
        self.allow_parallel = parallel
        self.n_parallel = 0
        self._aligned_alloc: ir.Function | None = None
        self._free: ir.Function | None = None

    def libc(self, name: str) -> ir.Function:
        if name == "aligned_alloc":
            if self._aligned_alloc is None:
                self._aligned_alloc = ir.Function(self.module, ir.FunctionType(PTR, [I64, I64]), "aligned_alloc")
            return self._aligned_alloc
        if self._free is None:
            self._free = ir.Function(self.module, ir.FunctionType(VOID, [PTR]), "free")
        return self._free

    def sfence(self) -> ir.Function:
        fn = self.module.globals.get("llvm.x86.sse.sfence")
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(VOID, []), "llvm.x86.sse.sfence")
        return fn

    def launcher(self) -> ir.Function:
        fn = self.module.globals.get(LAUNCH_NAME)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(VOID, [TASK_PTR, PTR]), LAUNCH_NAME)
        return fn


def sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "kernel"
    return s if not s[0].isdigit() else "k_" + s


def _new_function(mod: ir.Module, name: str, arg_types: list[ir.Type], internal: bool) -> ir.Function:
    fn = ir.Function(mod, ir.FunctionType(VOID, arg_types), name)
    fn.attributes.add("nounwind")
    if internal:
        fn.linkage = "internal"
    for a, t in zip(fn.args, arg_types):
        if isinstance(t, ir.PointerType):
            a.add_attribute("noalias")
    return fn


class FuncEmitter:
    """Emits statements into one LLVM function."""

    def __init__(self, me: ModuleEmitter, fn: ir.Function, bufs: dict[str, _Buf], vars_: dict[str, ir.Value],
                 in_parallel: bool):
        self.me = me
        self.fn = fn
        self.entry = ir.IRBuilder(fn.append_basic_block("entry"))
        self.b = ir.IRBuilder(fn.append_basic_block("body"))
        self.bufs = dict(bufs)
        self.vars = dict(vars_)
        self.in_parallel = in_parallel
        self.unroll_max = 0
        self.vec: tuple[str, int, ir.Value] | None = None   # (var, lanes, scalar base) in vector mode
        self.spec = False
        self.ranges: dict[str, tuple[int, int]] = {}   # loop variables with constant bounds (inclusive)
        self.memo: dict[tuple, tuple[Expr, ir.Value]] = {}
        self.consts: dict[str, int] = {}   # variables of unrolled loops (constant right now)
        self.vec_base: int | None = 0       # the vectorized loop's first value when constant
        self.nt_used = False                # made a non-temporal store: sfence before returning
        self.outer: list[tuple[str, Stmt]] = []   # the serial loops being emitted (var, body), outermost first

    def finish(self) -> None:
        self.entry.branch(self.fn.basic_blocks[1])
        if self.nt_used:
            self.b.call(self.me.sfence(), [])
        self.b.ret_void()

    # ---- statements ----
    def stmt(self, s: Stmt) -> None:
        self.memo = {}
        if isinstance(s, Seq):
            for x in s.body:
                self.stmt(x)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, For):
            self.for_(s)
        elif isinstance(s, Allocate):
            self.allocate(s)
        elif isinstance(s, If):
            self.if_(s)
        elif isinstance(s, Barrier):
            pass
        else:
            raise CompileError(f"cannot generate CPU code for statement {type(s).__name__}")

    def for_(self, s: For) -> None:
        ann = dict(s.annotations)
        saved = self.unroll_max
        if "auto_unroll_max_step" in ann:
            self.unroll_max = int(ann["auto_unroll_max_step"])  # type: ignore[arg-type]
        try:
            self._for(s)
        finally:
            self.unroll_max = saved

    def _for(self, s: For) -> None:
        kind = s.kind
        if kind in (ForKind.BLOCK_X, ForKind.BLOCK_Y, ForKind.BLOCK_Z, ForKind.THREAD_X, ForKind.THREAD_Y,
                    ForKind.THREAD_Z):
            raise CompileError(f"loop {s.var.name} is bound to {kind.value}, which the CPU has no use for")
        if kind is ForKind.PARALLEL and not self.in_parallel and self.me.allow_parallel and self.vec is None:
            with self._range_of(s):
                return self.parallel(s)
        if kind is ForKind.VECTORIZED and self.vec is None and vector_plan(s, self._shapes(), self.consts):
            with self._range_of(s):
                return self.vector_loop(s)
        n = s.const_extent
        if n is not None and self.vec is None and kind is not ForKind.PARALLEL and (
                kind is ForKind.UNROLLED or (self.unroll_max > 0 and unroll_size(s) <= self.unroll_max)):
            with self._range_of(s):
                return self.unrolled(s, n)
        self.memo = {}
        lo = self.index(s.min)
        hi = self.b.add(lo, self.index(s.extent), flags=["nsw"])
        ahead = int(dict(s.annotations).get(PREFETCH_ROWS, 0) or 0)
        plan = (n, self._prefetch_plan(ahead)) if ahead > 0 and n and self.outer else None
        with self._range_of(s):
            self.serial(s.var.name, lo, hi, s.body, plan)

    # ---- prefetch_rows ----
    def _prefetch_plan(self, ahead: int) -> list[tuple[_Buf, Expr, int, bool]]:
        """What a loop under the pragma `prefetch_rows` = `ahead` prefetches: for each kernel argument that the
        enclosing serial loop (the row loop) walks with one constant positive stride (elements per row), the offset
        expression of the start of the row `ahead` rows on (the variables of loops inside the row loop at their first
        value), its cache lines per row and whether the row loop stores to it."""
        rvar, rbody = self.outer[-1]
        params = {p.name for p in self.me.func.params}
        first = {st.var.name: st.min for st in walk_stmts(rbody) if isinstance(st, For)}
        if not all(isinstance(m, Const) for m in first.values()):
            return []
        acc: dict[str, list[tuple[tuple[Expr, ...], bool]]] = {}
        for st in walk_stmts(rbody):
            if isinstance(st, Store) and st.buffer in params:
                acc.setdefault(st.buffer, []).append((st.indices, True))
        for ld in _loads(rbody):
            if ld.buffer in params:
                acc.setdefault(ld.buffer, []).append((ld.indices, False))
        plan = []
        for name, uses in sorted(acc.items()):
            buf = self.bufs[name]
            strides = {_access_coeff(idx, buf.shape, rvar) for idx, _ in uses}
            stride = strides.pop() if len(strides) == 1 else None
            if not stride or stride < 0:
                continue
            start = sum((Binary(Op.MULTIPLY, substitute(e, first), Const(st, INDEX), INDEX)
                         for e, st in zip(uses[0][0], buf.strides)), Const(ahead * stride, INDEX))
            lines = -(-stride * elem_bytes(buf.dtype) // CACHE_LINE)
            plan.append((buf, start, lines, any(w for _, w in uses)))
        return plan

    def _prefetch(self, n: int, plan: list[tuple[_Buf, Expr, int, bool]], i: ir.Value, lo: ir.Value) -> None:
        """One iteration's share (of a loop of `n`) of the rows `_prefetch_plan` names: with `per` prefetches per
        iteration, slot k of the n * per prefetches fetches line k * lines // (n * per) of the row, so the lines are
        spread evenly over the iterations."""
        b = self.b
        fn = self.me.module.globals.get("llvm.prefetch.p0") or ir.Function(
            self.me.module, ir.FunctionType(VOID, [PTR, I32, I32, I32]), "llvm.prefetch.p0")
        j = b.sub(i, lo, flags=["nsw"])
        for buf, start, lines, write in plan:
            row = self.index(start)
            per = -(-lines // n)
            per_line = CACHE_LINE // elem_bytes(buf.dtype)
            for q in range(per):
                slot = b.add(b.mul(j, ir.Constant(I64, per), flags=["nsw"]), ir.Constant(I64, q), flags=["nsw"])
                line = b.sdiv(b.mul(slot, ir.Constant(I64, lines), flags=["nsw"]), ir.Constant(I64, n * per))
                off = b.add(row, b.mul(line, ir.Constant(I64, per_line), flags=["nsw"]), flags=["nsw"])
                ptr = b.gep(buf.ptr, [off], inbounds=False, source_etype=store_type(buf.dtype))
                b.call(fn, [ptr, ir.Constant(I32, int(write)), ir.Constant(I32, 3), ir.Constant(I32, 1)])

    @contextmanager
    def _range_of(self, s: For):
        """Record the loop variable's bounds while its body is emitted (constant min and extent only)."""
        v = s.var.name
        old = self.ranges.pop(v, None)
        if isinstance(s.min, Const) and isinstance(s.extent, Const) and int(s.extent.value) > 0:
            self.ranges[v] = (int(s.min.value), int(s.min.value) + int(s.extent.value) - 1)
        try:
            yield
        finally:
            self.ranges.pop(v, None)
            if old is not None:
                self.ranges[v] = old

    def _bounds(self, e: Expr) -> tuple[int, int] | None:
        """Inclusive bounds of an integer index expression from the enclosing loops' bounds; None if unknown."""
        if isinstance(e, Var):
            return self.ranges.get(e.name)
        if isinstance(e, Const):
            return None if e.dtype.is_float else (int(e.value), int(e.value))
        if not isinstance(e, Binary) or e.dtype.is_float or e.dtype is DType.PRED:
            return None
        a, c = self._bounds(e.a), self._bounds(e.b)
        if a is None or c is None:
            return None
        op = e.op
        if op is Op.ADD:
            return a[0] + c[0], a[1] + c[1]
        if op is Op.SUBTRACT:
            return a[0] - c[1], a[1] - c[0]
        if op is Op.MULTIPLY:
            ps = [x * y for x in a for y in c]
            return min(ps), max(ps)
        if op is Op.MAXIMUM:
            return max(a[0], c[0]), max(a[1], c[1])
        if op is Op.MINIMUM:
            return min(a[0], c[0]), min(a[1], c[1])
        if op in (Op.DIVIDE, Op.REMAINDER) and c[0] == c[1] and c[0] > 0 and a[0] >= 0:
            return (a[0] // c[0], a[1] // c[0]) if op is Op.DIVIDE else (0, min(a[1], c[0] - 1))
        return None

    def _in_bounds(self, buf: _Buf, indices: tuple[Expr, ...]) -> bool:
        """Every index provably within its dimension (a speculative load then needs no clamp)."""
        if len(indices) != len(buf.shape):
            return False
        for idx, d in zip(indices, buf.shape):
            bd = self._bounds(idx)
            if bd is None or bd[0] < 0 or bd[1] >= d:
                return False
        return True

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v.shape for k, v in self.bufs.items()}

    def serial(self, var: str, lo: ir.Value, hi: ir.Value, body: Stmt, prefetch: tuple | None = None) -> None:
        b = self.b
        pre = b.block
        loop = b.append_basic_block(f"for.{var}")
        done = b.append_basic_block(f"end.{var}")
        b.cbranch(b.icmp_signed("<", lo, hi), loop, done)
        b.position_at_end(loop)
        i = b.phi(I64, name=var)
        i.add_incoming(lo, pre)
        old = self.vars.get(var)
        self.vars[var] = i
        if prefetch:
            self._prefetch(*prefetch, i, lo)
        self.outer.append((var, body))
        try:
            self.stmt(body)
        finally:
            self.outer.pop()
        nxt = b.add(i, ir.Constant(I64, 1), flags=["nsw"])
        i.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, hi), loop, done)
        b.position_at_end(done)
        self._restore(var, old)
        self.memo = {}

    def _restore(self, var: str, old: ir.Value | None) -> None:
        if old is None:
            self.vars.pop(var, None)
        else:
            self.vars[var] = old

    def unrolled(self, s: For, n: int) -> None:
        var = s.var.name
        old = self.vars.get(var)
        self.memo = {}
        lo = self.index(s.min)
        const_lo = s.min.value if isinstance(s.min, Const) else None
        for k in range(n):
            if const_lo is not None:
                self.vars[var] = ir.Constant(I64, const_lo + k)
                self.consts[var] = const_lo + k
            else:
                self.vars[var] = self.b.add(lo, ir.Constant(I64, k), flags=["nsw"])
            self.stmt(s.body)
        self.consts.pop(var, None)
        self._restore(var, old)

    def vector_loop(self, s: For) -> None:
        n = s.const_extent
        assert n is not None
        self.memo = {}
        base = self.index(s.min)
        self.vec = (s.var.name, n, base)
        self.vec_base = s.min.value if isinstance(s.min, Const) else None
        try:
            self.stmt(s.body)
        finally:
            self.vec = None
            self.memo = {}

    def allocate(self, s: Allocate) -> None:
        ty = store_type(s.dtype)
        count = max(1, math.prod(s.shape))
        nbytes = count * elem_bytes(s.dtype)
        old = self.bufs.get(s.buffer)
        if s.scope == "local" and nbytes <= LOCAL_STACK_LIMIT:
            p = _alloca(self.entry, ir.ArrayType(ty, count), s.buffer)
            self.bufs[s.buffer] = _Buf(s.buffer, s.dtype, s.shape, p)
            self.stmt(s.body)
        else:
            size = ir.Constant(I64, (nbytes + 63) // 64 * 64)
            p = self.b.call(self.me.libc("aligned_alloc"), [ir.Constant(I64, 64), size], name=s.buffer)
            self.bufs[s.buffer] = _Buf(s.buffer, s.dtype, s.shape, p)
            self.stmt(s.body)
            self.b.call(self.me.libc("free"), [p])
        if old is None:
            self.bufs.pop(s.buffer, None)
        else:
            self.bufs[s.buffer] = old

    def if_(self, s: If) -> None:
        c = self.expr(s.cond)
        if isinstance(c.type, ir.VectorType):
            return self.vector_if(s, c)
        if s.otherwise is None:
            with self.b.if_then(c):
                self.stmt(s.then)
        else:
            with self.b.if_else(c) as (then, other):
                with then:
                    self.stmt(s.then)
                with other:
                    self.stmt(s.otherwise)
        self.memo = {}

    def vector_if(self, s: If, c: ir.Value) -> None:
        """All lanes true: vector `then`; all false: vector `otherwise`; mixed: lane by lane."""
        b = self.b
        n = c.type.count
        bits = b.bitcast(c, ir.IntType(n))
        all_t = b.icmp_unsigned("==", bits, ir.Constant(ir.IntType(n), (1 << n) - 1))
        none_t = b.icmp_unsigned("==", bits, ir.Constant(ir.IntType(n), 0))
        with b.if_else(all_t) as (then, other):
            with then:
                self.stmt(s.then)
            with other:
                if s.otherwise is not None:
                    with b.if_else(none_t) as (t2, o2):
                        with t2:
                            self.stmt(s.otherwise)
                        with o2:
                            self.lanes_one_by_one(s)
                else:
                    with b.if_then(b.not_(none_t)):
                        self.lanes_one_by_one(s)
        self.memo = {}

    def lanes_one_by_one(self, s: Stmt) -> None:
        assert self.vec is not None
        var, n, base = self.vec
        self.vec = None
        old = self.vars.get(var)
        try:
            self.serial(var, base, self.b.add(base, ir.Constant(I64, n), flags=["nsw"]), s)
        finally:
            self._restore(var, old)
            self.vec = (var, n, base)
            self.memo = {}

    # ---- parallel loops ----
    def parallel(self, s: For) -> None:
        me = self.me
        k = me.n_parallel
        me.n_parallel += 1
        self.memo = {}
        lo = self.index(s.min)
        ext = self.index(s.extent)
        bufs = list(self.bufs.values())
        vnames = [v for v in self.vars if v != s.var.name]
        # the chunk body: NAME_parK(bufs..., vars..., begin, end)
        arg_types: list[ir.Type] = [PTR] * len(bufs) + [I64] * (len(vnames) + 2)
        body_fn = _new_function(me.module, f"{me.name}_par{k}", arg_types, internal=True)
        nb = {bf.name: _Buf(bf.name, bf.dtype, bf.shape, a) for bf, a in zip(bufs, body_fn.args)}
        nv = dict(zip(vnames, body_fn.args[len(bufs):]))
        sub = FuncEmitter(me, body_fn, nb, nv, in_parallel=True)
        sub.unroll_max = self.unroll_max
        sub.ranges = dict(self.ranges)
        sub.serial(s.var.name, body_fn.args[-2], body_fn.args[-1], s.body)
        sub.finish()
        # the task: NAME_taskK(ctx, tid, nthreads) -> chunk [ext*tid/n, ext*(tid+1)/n) + lo
        task = _new_function(me.module, f"{me.name}_task{k}", [PTR, I64, I64], internal=True)
        tb = ir.IRBuilder(task.append_basic_block("entry"))
        ctx, tid, nth = task.args
        nslots = len(bufs) + len(vnames) + 2

        def slot(i: int, ty: ir.Type) -> ir.Value:
            return tb.load(tb.gep(ctx, [ir.Constant(I64, i)], source_etype=I64), typ=ty)

        args = [slot(i, PTR) for i in range(len(bufs))] + [slot(len(bufs) + i, I64) for i in range(len(vnames))]
        t_lo, t_ext = slot(nslots - 2, I64), slot(nslots - 1, I64)
        begin = tb.add(t_lo, tb.sdiv(tb.mul(t_ext, tid), nth))
        end = tb.add(t_lo, tb.sdiv(tb.mul(t_ext, tb.add(tid, ir.Constant(I64, 1))), nth))
        with tb.if_then(tb.icmp_signed("<", begin, end)):
            tb.call(body_fn, args + [begin, end])
        tb.ret_void()
        # pack the context and launch
        ctx_p = _alloca(self.entry, ir.ArrayType(I64, nslots), f"ctx{k}")
        b = self.b

        def put(i: int, v: ir.Value) -> None:
            b.store(v, b.gep(ctx_p, [ir.Constant(I64, i)], source_etype=I64))

        for i, bf in enumerate(bufs):
            put(i, b.ptrtoint(bf.ptr, I64))
        for i, v in enumerate(vnames):
            put(len(bufs) + i, self.vars[v])
        put(nslots - 2, lo)
        put(nslots - 1, ext)
        b.call(me.launcher(), [task, ctx_p])
        self.memo = {}

    # ---- stores ----
    def store(self, s: Store) -> None:
        buf = self._buf(s.buffer)
        val = self.expr(s.value)
        if self.vec is None:
            self._scalar_store(buf, self._offset(buf, s.indices), val)
            return
        var, n, base = self.vec
        val = self._widen(val, n)
        mem = self._to_memory(buf.dtype, val)
        c = _access_coeff(s.indices, buf.shape, var, n, self.consts, self.vec_base)
        if c == 1:
            off = self._scalar_offset(buf, s.indices)
            if buf.name in self.me.nt_bufs and n * elem_bytes(buf.dtype) % 16 == 0:
                self._nontemporal_store(mem, self._gep(buf, off), n * elem_bytes(buf.dtype), buf.dtype)
            else:
                self.b.store(mem, self._gep(buf, off), align=elem_bytes(buf.dtype))
            return
        offs = self._offset(buf, s.indices)
        offs = self._widen(offs, n)
        for lane in range(n):
            o = self.b.extract_element(offs, ir.Constant(I32, lane))
            self.b.store(self.b.extract_element(mem, ir.Constant(I32, lane)), self._gep(buf, o),
                         align=elem_bytes(buf.dtype))

    def _nontemporal_store(self, mem: ir.Value, ptr: ir.Value, nbytes: int, dt: DType) -> None:
        """`mem` (a vector of `nbytes`) at `ptr` as non-temporal stores of 16 bytes each when `ptr` is 16-byte
        aligned, else one normal store.  16 bytes: any offset that is a multiple of 4 floats qualifies (on numpy's
        own 16-byte alignment too), where one 64-byte store would need the offset a multiple of 16 floats."""
        b = self.b
        low = b.and_(b.ptrtoint(ptr, I64), ir.Constant(I64, 15))
        with b.if_else(b.icmp_unsigned("==", low, ir.Constant(I64, 0)), likely=True) as (aligned, other):
            with aligned:
                lanes = mem.type.count
                per = lanes * 16 // nbytes
                meta = self.me.module.add_metadata([ir.Constant(I32, 1)])
                for k in range(0, lanes, per):
                    part = mem if per == lanes else b.shuffle_vector(
                        mem, ir.Constant(mem.type, None), ir.Constant(ir.VectorType(I32, per), list(range(k, k + per))))
                    p = ptr if k == 0 else b.gep(ptr, [ir.Constant(I64, k)], inbounds=True,
                                                 source_etype=mem.type.element)
                    b.store(part, p, align=16).set_metadata("nontemporal", meta)
            with other:
                b.store(mem, ptr, align=elem_bytes(dt))
        self.nt_used = True

    def _scalar_store(self, buf: _Buf, off: ir.Value, val: ir.Value) -> None:
        self.b.store(self._to_memory(buf.dtype, val), self._gep(buf, off), align=elem_bytes(buf.dtype))

    def _to_memory(self, dt: DType, v: ir.Value) -> ir.Value:
        if dt is DType.PRED:
            t = ir.VectorType(I8, v.type.count) if isinstance(v.type, ir.VectorType) else I8
            return self.b.zext(v, t)
        return v

    def _buf(self, name: str) -> _Buf:
        try:
            return self.bufs[name]
        except KeyError:
            raise CompileError(f"buffer {name!r} is used but not declared (params or Allocate)") from None

    def _gep(self, buf: _Buf, off: ir.Value) -> ir.Value:
        return self.b.gep(buf.ptr, [off], inbounds=True, source_etype=store_type(buf.dtype))

    def _offset(self, buf: _Buf, indices: tuple[Expr, ...]) -> ir.Value:
        """Linear element offset (scalar, or a vector in vector mode when it varies)."""
        if len(indices) != len(buf.shape):
            raise CompileError(f"buffer {buf.name!r} has rank {len(buf.shape)} but is indexed with "
                               f"{len(indices)} indices")
        total: ir.Value | None = None
        for idx, st in zip(indices, buf.strides):
            v = self.index(idx)
            if st != 1:
                v = self._binop("mul", v, self._const_like(v, st), flags=["nsw"])
            total = v if total is None else self._binop("add", total, v, flags=["nsw"])
        return total if total is not None else ir.Constant(I64, 0)

    def _scalar_offset(self, buf: _Buf, indices: tuple[Expr, ...]) -> ir.Value:
        """The offset of lane 0 (vector mode: the loop variable bound to the base)."""
        with self._scalar_mode():
            return self._offset(buf, indices)

    @contextmanager
    def _scalar_mode(self):
        vec = self.vec
        if vec is None:
            yield
            return
        var, n, base = vec
        old = self.vars.get(var)
        self.vec = None
        self.vars[var] = base
        try:
            yield
        finally:
            self.vec = vec
            self._restore(var, old)

    # ---- expressions ----
    def index(self, e: Expr) -> ir.Value:
        v = self.expr(e, index=True)
        et = _elem(v.type)
        if et == I64:
            return v
        if not isinstance(et, ir.IntType):
            raise CompileError(f"index expression {e} is not an integer")
        t = _like_type(v.type, I64)
        return self.b.sext(v, t) if et.width > 1 and _signed(e.dtype) else self.b.zext(v, t)

    def expr(self, e: Expr, index: bool = False) -> ir.Value:
        key = (id(e), self.vec is not None, self.spec, index)
        hit = self.memo.get(key)
        if hit is not None:
            return hit[1]
        v = self._expr(e, index)
        self.memo[key] = (e, v)
        return v

    def _expr(self, e: Expr, index: bool) -> ir.Value:
        if isinstance(e, Var):
            if self.vec is not None and e.name == self.vec[0]:
                _, n, base = self.vec
                iota = ir.Constant(ir.VectorType(I64, n), list(range(n)))
                return self.b.add(self._splat(base, n), iota, flags=["nsw"])
            try:
                return self.vars[e.name]
            except KeyError:
                raise CompileError(f"variable {e.name!r} is used outside of its loop") from None
        if isinstance(e, Const):
            return const_value(e)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Unary):
            return self.unary(e)
        if isinstance(e, Binary):
            return self.binary(e, index and e.dtype is INDEX)
        if isinstance(e, Compare):
            a, b = self._pair(self.expr(e.a, index), self.expr(e.b, index))
            return self.compare(e.direction, e.a.dtype, a, b)
        if isinstance(e, Select):
            return self.select(e, index)
        if isinstance(e, Cast):
            return self.convert(self.expr(e.a, index), e.a.dtype, e.dtype)
        raise CompileError(f"cannot generate code for expression {type(e).__name__}")

    def _splat(self, v: ir.Value, n: int) -> ir.Value:
        vt = ir.VectorType(v.type, n)
        one = self.b.insert_element(ir.Constant(vt, None), v, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, ir.Constant(vt, None), ir.Constant(ir.VectorType(I32, n), [0] * n))

    def _widen(self, v: ir.Value, n: int) -> ir.Value:
        return v if isinstance(v.type, ir.VectorType) else self._splat(v, n)

    def _pair(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        av, bv = isinstance(a.type, ir.VectorType), isinstance(b.type, ir.VectorType)
        if av and not bv:
            return a, self._splat(b, a.type.count)
        if bv and not av:
            return self._splat(a, b.type.count), b
        return a, b

    def _const_like(self, like: ir.Value, value) -> ir.Value:
        t = like.type
        if isinstance(t, ir.VectorType):
            return ir.Constant(t, [ir.Constant(t.element, value)] * t.count)
        return ir.Constant(t, value)

    def _binop(self, name: str, a: ir.Value, b: ir.Value, flags=()) -> ir.Value:
        a, b = self._pair(a, b)
        return getattr(self.b, name)(a, b, flags=list(flags))

    # loads
    def load(self, e: Load) -> ir.Value:
        buf = self._buf(e.buffer)
        align = elem_bytes(buf.dtype)
        sty = store_type(buf.dtype)
        spec = self.spec and not self._in_bounds(buf, e.indices)
        if self.vec is None:
            off = self._offset(buf, e.indices)
            if spec:
                off = self._clamp(off, buf.size)
            return self._from_memory(buf.dtype, self.b.load(self._gep(buf, off), typ=sty, align=align))
        var, n, base = self.vec
        c = _access_coeff(e.indices, buf.shape, var, n, self.consts, self.vec_base)
        if c == 0:
            with self._scalar_mode():
                return self.load(e)
        if c == 1 and not (spec and buf.size < n):
            off = self._scalar_offset(buf, e.indices)
            vt = ir.VectorType(sty, n)
            if not spec:
                return self._from_memory(buf.dtype, self.b.load(self._gep(buf, off), typ=vt, align=align))
            return self._from_memory(buf.dtype, self._guarded_vector_load(buf, e, off, vt))
        clamped = None if spec or c is not None else self._clamped_run(buf, e, var, n)
        if clamped is not None:
            return self._from_memory(buf.dtype, self._clamped_vector_load(buf, e, *clamped))
        return self._from_memory(buf.dtype, self._gather(buf, e.indices, n))

    def _clamped_run(self, buf: _Buf, e: Load, var: str, n: int) -> tuple[tuple[Expr, ...], int] | None:
        """A load whose last index is `minimum(x, C)` with x of stride 1 in the vector loop (a padded copy's
        clamped read, `state._pack`): (the indices with x unclamped, C); None for any other form."""
        last = e.indices[-1] if e.indices else None
        if not (isinstance(last, Binary) and last.op is Op.MINIMUM and isinstance(last.b, Const)):
            return None
        free = e.indices[:-1] + (last.a,)
        if (lin_coeff(last.a, var, n, self.consts, self.vec_base) != 1
                or _access_coeff(free, buf.shape, var, n, self.consts, self.vec_base) != 1):
            return None
        return free, int(last.b.value)

    def _clamped_vector_load(self, buf: _Buf, e: Load, free: tuple[Expr, ...], cap: int) -> ir.Value:
        """One vector load where the clamp does not bite on any lane (x of lane 0 + lanes - 1 <= C), the lanes
        one by one where it does."""
        n = self.vec[1]
        with self._scalar_mode():
            x0 = self.index(free[-1])
        ok = self.b.icmp_signed("<=", x0, ir.Constant(I64, cap - n + 1))
        vt = ir.VectorType(store_type(buf.dtype), n)
        return self._vector_or_gather(ok, buf, e, self._scalar_offset(buf, free), vt, "vclamp")

    def _gather(self, buf: _Buf, indices: tuple[Expr, ...], n: int) -> ir.Value:
        sty = store_type(buf.dtype)
        offs = self._widen(self._offset(buf, indices), n)
        if self.spec:
            offs = self._clamp(offs, buf.size)
        out = ir.Constant(ir.VectorType(sty, n), None)
        for lane in range(n):
            o = self.b.extract_element(offs, ir.Constant(I32, lane))
            x = self.b.load(self._gep(buf, o), typ=sty, align=elem_bytes(buf.dtype))
            out = self.b.insert_element(out, x, ir.Constant(I32, lane))
        return out

    def _guarded_vector_load(self, buf: _Buf, e: Load, off: ir.Value, vt: ir.VectorType) -> ir.Value:
        b = self.b
        ok = b.and_(b.icmp_signed(">=", off, ir.Constant(I64, 0)),
                    b.icmp_signed("<=", off, ir.Constant(I64, buf.size - vt.count)))
        return self._vector_or_gather(ok, buf, e, off, vt, "vload")

    def _vector_or_gather(self, ok: ir.Value, buf: _Buf, e: Load, off: ir.Value, vt: ir.VectorType,
                          tag: str) -> ir.Value:
        """Where `ok`: one vector load at `off`; else `e`'s lanes gathered one by one (blocks `<tag>.in/.edge`)."""
        b = self.b
        fast = b.append_basic_block(f"{tag}.in")
        slow = b.append_basic_block(f"{tag}.edge")
        join = b.append_basic_block(f"{tag}.join")
        b.cbranch(ok, fast, slow)
        b.position_at_end(fast)
        v1 = b.load(self._gep(buf, off), typ=vt, align=elem_bytes(buf.dtype))
        b.branch(join)
        b.position_at_end(slow)
        saved = self.memo
        self.memo = {}
        v2 = self._gather(buf, e.indices, vt.count)
        self.memo = saved
        slow_end = b.block
        b.branch(join)
        b.position_at_end(join)
        phi = b.phi(vt)
        phi.add_incoming(v1, fast)
        phi.add_incoming(v2, slow_end)
        return phi

    def _clamp(self, off: ir.Value, size: int) -> ir.Value:
        b = self.b
        zero = self._const_like(off, 0)
        hi = self._const_like(off, max(size - 1, 0))
        off = b.select(b.icmp_signed("<", off, zero), zero, off)
        return b.select(b.icmp_signed(">", off, hi), hi, off)

    def _from_memory(self, dt: DType, v: ir.Value) -> ir.Value:
        if dt is DType.PRED:
            return self.b.icmp_unsigned("!=", v, self._const_like(v, 0))
        return v

    # select (arms with loads are speculative)
    def select(self, e: Select, index: bool) -> ir.Value:
        c = self.expr(e.cond, index)
        arms = []
        for arm in (e.t, e.f):
            has_load = any(isinstance(n, Load) for n in walk(arm))
            saved = self.spec
            self.spec = self.spec or has_load
            try:
                arms.append(self.expr(arm, index))
            finally:
                self.spec = saved
        t, f = self._pair(*arms)
        if isinstance(c.type, ir.VectorType) and not isinstance(t.type, ir.VectorType):
            t, f = self._splat(t, c.type.count), self._splat(f, c.type.count)
        return self.b.select(c, t, f)

    # unary ops
    def unary(self, e: Unary) -> ir.Value:
        dt, src = e.dtype, e.a.dtype
        x = self.expr(e.a)
        b = self.b
        op = e.op
        if op is Op.IS_FINITE:
            ax = self._fabs(x)
            return b.fcmp_ordered("!=", ax, self._const_like(ax, math.inf))
        if op is Op.NOT:
            return b.xor(x, self._const_like(x, -1 if x.type != I1 and not _is_i1(x) else 1))
        if src.is_float:
            return self._round_result(dt, self._float_unary(op, x))
        return self._int_unary(op, x, src)

    def _fabs(self, x: ir.Value) -> ir.Value:
        return intrinsic(self.b, "fabs", [x])

    def _float_unary(self, op: Op, x: ir.Value) -> ir.Value:
        b = self.b
        if op is Op.NEGATE:
            return b.fneg(x)
        if op is Op.ABS:
            return self._fabs(x)
        if op in (Op.FLOOR, Op.CEIL, Op.ROUND_NEAREST_EVEN):
            return intrinsic(b, {Op.FLOOR: "floor", Op.CEIL: "ceil", Op.ROUND_NEAREST_EVEN: "roundeven"}[op], [x])
        if op is Op.SIGN:
            one = self._const_like(x, 1.0)
            pos = b.select(b.fcmp_ordered(">", x, self._const_like(x, 0.0)), one, x)
            return b.select(b.fcmp_ordered("<", x, self._const_like(x, 0.0)), b.fneg(one), pos)
        if op in MATH_OPS:
            return self._math(op, [x])
        raise CompileError(f"unary op {op.value} is not supported on floats by the CPU code generator")

    def _int_unary(self, op: Op, x: ir.Value, dt: DType) -> ir.Value:
        b = self.b
        zero = self._const_like(x, 0)
        if op is Op.NEGATE:
            return b.sub(zero, x)
        if op is Op.ABS:
            return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x) if _signed(dt) else x
        if op in (Op.FLOOR, Op.CEIL, Op.ROUND_NEAREST_EVEN):
            return x
        if op is Op.SIGN:
            if not _signed(dt):
                return b.zext(b.icmp_unsigned("!=", x, zero), x.type)
            gt = b.zext(b.icmp_signed(">", x, zero), x.type)
            lt = b.zext(b.icmp_signed("<", x, zero), x.type)
            return b.sub(gt, lt)
        raise CompileError(f"unary op {op.value} is not supported on {dt.value} by the CPU code generator")

    def _math(self, op: Op, args: list[ir.Value]) -> ir.Value:
        """Transcendentals on f32/f64; f16 goes through f32."""
        et = _elem(args[0].type)
        if et == F16:
            wide = [self.b.fpext(a, _like_type(a.type, F32)) for a in args]
            return self.b.fptrunc(math_op(self.b, op, wide), args[0].type)
        return math_op(self.b, op, args)

    # binary ops
    def binary(self, e: Binary, index: bool) -> ir.Value:
        a, b_ = self.expr(e.a, index), self.expr(e.b, index)
        if (e.op is Op.DIVIDE and e.dtype in (DType.F32, DType.F64) and e.a.dtype is e.dtype and UNIFORM_DIVISION
                and isinstance(a.type, ir.VectorType) and not isinstance(b_.type, ir.VectorType)):
            return self._uniform_division(a, b_)
        a, b_ = self._pair(a, b_)
        dt = e.a.dtype
        if dt.is_float:
            return self._round_result(e.dtype, self._float_binary(e.op, a, b_, dt))
        if dt is DType.PRED:
            return self._pred_binary(e.op, a, b_)
        return self._int_binary(e.op, a, b_, dt, index, e.b)

    def _float_binary(self, op: Op, a: ir.Value, c: ir.Value, dt: DType) -> ir.Value:
        b = self.b
        contract = ["contract"] if dt in (DType.F32, DType.F64) else []
        if op is Op.ADD:
            return b.fadd(a, c, flags=contract)
        if op is Op.SUBTRACT:
            return b.fsub(a, c, flags=contract)
        if op is Op.MULTIPLY:
            return b.fmul(a, c, flags=contract)
        if op is Op.DIVIDE:
            return b.fdiv(a, c)
        if op is Op.REMAINDER:
            return b.frem(a, c)
        if op in (Op.MAXIMUM, Op.MINIMUM):
            # XLA: NaN in either operand gives NaN
            better = b.fcmp_ordered(">" if op is Op.MAXIMUM else "<", a, c)
            pick = b.or_(better, b.fcmp_unordered("uno", a, a))
            return b.select(pick, a, c)
        if op in MATH_OPS:
            return self._math(op, [a, c])
        raise CompileError(f"binary op {op.value} is not supported on floats by the CPU code generator")

    def _uniform_division(self, a: ir.Value, c: ir.Value) -> ir.Value:
        """a / c for a float vector a and a uniform (scalar) c: a * (1 / c), one division per loop instead of one per
        vector, as XLA's algebraic simplifier rewrites A / broadcast(B) into A * broadcast(1 / B) (softmax's
        e / sum and layernorm's (x - mean) / sqrt(var + eps) are such quotients; the result differs from the
        division by at most an ulp and a half, as XLA's does).  Where 1 / c would not be a normal number (|c| above
        2^(emax - 1) or below the smallest normal, zero, inf, NaN) the vector division runs instead, a branch on
        a value uniform over the loop."""
        b = self.b
        fty = c.type
        tiny = 2.0 ** (-1022 if isinstance(fty, ir.DoubleType) else -126)
        y = b.fdiv(ir.Constant(fty, 1.0), c)
        ac = intrinsic(b, "fabs", [c])
        ok = b.and_(b.fcmp_ordered(">=", ac, ir.Constant(fty, tiny)),
                    b.fcmp_ordered("<=", ac, ir.Constant(fty, 0.5 / tiny)))
        n = a.type.count
        with b.if_else(ok) as (fast, slow):
            with fast:
                fast_v = b.fmul(a, self._splat(y, n))
                fast_bb = b.block
            with slow:
                slow_v = b.fdiv(a, self._splat(c, n))
                slow_bb = b.block
        out = b.phi(a.type)
        out.add_incoming(fast_v, fast_bb)
        out.add_incoming(slow_v, slow_bb)
        return out

    def _pred_binary(self, op: Op, a: ir.Value, c: ir.Value) -> ir.Value:
        b = self.b
        if op in (Op.AND, Op.MULTIPLY, Op.MINIMUM):
            return b.and_(a, c)
        if op in (Op.OR, Op.ADD, Op.MAXIMUM):
            return b.or_(a, c)
        if op in (Op.XOR, Op.SUBTRACT):
            return b.xor(a, c)
        raise CompileError(f"binary op {op.value} is not supported on pred by the CPU code generator")

    def _int_binary(self, op: Op, a: ir.Value, c: ir.Value, dt: DType, index: bool, rhs: Expr) -> ir.Value:
        b = self.b
        fl = ["nsw"] if index else []
        signed = _signed(dt)
        if op is Op.ADD:
            return b.add(a, c, flags=fl)
        if op is Op.SUBTRACT:
            return b.sub(a, c, flags=fl)
        if op is Op.MULTIPLY:
            return b.mul(a, c, flags=fl)
        if op in (Op.DIVIDE, Op.REMAINDER):
            if isinstance(rhs, Const) and int(rhs.value) > 0 and (index or not signed or int(rhs.value) != -1):
                # a known positive divisor: no zero/overflow cases
                fn = (b.sdiv if op is Op.DIVIDE else b.srem) if signed else (b.udiv if op is Op.DIVIDE else b.urem)
                return fn(a, c)
            return self._safe_divrem(op, a, c, signed, dt)
        if op in (Op.MAXIMUM, Op.MINIMUM):
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp(">" if op is Op.MAXIMUM else "<", a, c), a, c)
        if op is Op.AND:
            return b.and_(a, c)
        if op is Op.OR:
            return b.or_(a, c)
        if op is Op.XOR:
            return b.xor(a, c)
        if op is Op.POWER:
            return self._int_pow(a, c, dt)
        raise CompileError(f"binary op {op.value} is not supported on {dt.value} by the CPU code generator")

    def _safe_divrem(self, op: Op, a: ir.Value, c: ir.Value, signed: bool, dt: DType) -> ir.Value:
        """HLO integer division: x/0 = -1, x%0 = x, MIN/-1 = MIN, MIN%-1 = 0 (never traps)."""
        b = self.b
        zero = self._const_like(c, 0)
        one = self._const_like(c, 1)
        is0 = b.icmp_unsigned("==", c, zero)
        bad = is0
        if signed:
            mn = self._const_like(a, -(1 << (dt.bits - 1)))
            ovf = b.and_(b.icmp_signed("==", a, mn), b.icmp_signed("==", c, self._const_like(c, -1)))
            bad = b.or_(is0, ovf)
        safe = b.select(bad, one, c)
        if op is Op.DIVIDE:
            q = (b.sdiv if signed else b.udiv)(a, safe)
            return b.select(is0, self._const_like(a, -1), q)
        r = (b.srem if signed else b.urem)(a, safe)
        return b.select(is0, a, r)

    def _int_pow(self, a: ir.Value, e: ir.Value, dt: DType) -> ir.Value:
        """Square-and-multiply over the exponent's bits (XLA: negative exponent -> 0 unless |a| == 1)."""
        b = self.b
        one = self._const_like(a, 1)
        zero = self._const_like(a, 0)
        res, base, ex = one, a, e
        for _ in range(dt.bits):
            bit = b.icmp_unsigned("!=", b.and_(ex, one), zero)
            res = b.select(bit, b.mul(res, base), res)
            base = b.mul(base, base)
            ex = b.lshr(ex, one)
        if not _signed(dt):
            return res
        neg = b.icmp_signed("<", e, zero)
        minus1 = self._const_like(a, -1)
        odd = b.icmp_unsigned("!=", b.and_(e, one), zero)
        neg_val = b.select(b.icmp_signed("==", a, one), one,
                           b.select(b.icmp_signed("==", a, minus1), b.select(odd, minus1, one), zero))
        return b.select(neg, neg_val, res)

    # compare / convert
    def compare(self, direction: str, dt: DType, a: ir.Value, c: ir.Value) -> ir.Value:
        b = self.b
        sym = _FCMP[direction]
        if dt.is_float:
            if direction == "NE":
                return b.fcmp_unordered("!=", a, c)
            return b.fcmp_ordered(sym, a, c)
        if _signed(dt):
            return b.icmp_signed(sym, a, c)
        return b.icmp_unsigned(sym, a, c)

    def convert(self, x: ir.Value, src: DType, dst: DType) -> ir.Value:
        b = self.b
        if src is dst:
            return x
        dt_t = _like_type(x.type, reg_type(dst))
        if dst is DType.PRED:
            if src.is_float:
                return b.fcmp_unordered("!=", x, self._const_like(x, 0.0))
            return b.icmp_unsigned("!=", x, self._const_like(x, 0))
        if src is DType.PRED:
            return b.uitofp(x, dt_t) if dst.is_float else b.zext(x, dt_t)
        if src.is_float and dst.is_float:
            return self._round_result(dst, self._float_resize(x, dt_t))
        if src.is_float:  # float -> int: saturating, NaN -> 0
            if _elem(x.type) == F16:
                x = b.fpext(x, _like_type(x.type, F32))
            name = "fptosi.sat" if _signed(dst) else "fptoui.sat"
            return intrinsic(b, name, [x], ret=dt_t, overload=[dt_t, x.type])
        if dst.is_float:
            v = (b.sitofp if _signed(src) else b.uitofp)(x, dt_t)
            return self._round_result(dst, v)
        sw, dw = src.bits, dst.bits
        if sw == dw:
            return x
        if dw < sw:
            return b.trunc(x, dt_t)
        return (b.sext if _signed(src) else b.zext)(x, dt_t)

    def _float_resize(self, x: ir.Value, t: ir.Type) -> ir.Value:
        sw = _float_bits(_elem(x.type))
        dw = _float_bits(_elem(t))
        if sw == dw:
            return x
        return self.b.fpext(x, t) if dw > sw else self.b.fptrunc(x, t)

    def _round_result(self, dt: DType, v: ir.Value) -> ir.Value:
        """bf16 values live in f32 registers: round every bf16 result to nearest even."""
        if dt is not DType.BF16:
            return v
        b = self.b
        it = _like_type(v.type, I32)
        bits = b.bitcast(v, it)
        lsb = b.and_(b.lshr(bits, self._const_like(bits, 16)), self._const_like(bits, 1))
        r = b.add(b.add(bits, self._const_like(bits, 0x7FFF)), lsb)
        r = b.and_(r, self._const_like(bits, -65536))
        nan = b.or_(b.and_(bits, self._const_like(bits, -65536)), self._const_like(bits, 0x00400000))
        r = b.select(b.fcmp_unordered("uno", v, v), nan, r)
        return b.bitcast(r, v.type)


def _alloca(b: ir.IRBuilder, ty: ir.Type, name: str) -> ir.Value:
    """An alloca (align 64) typed as an opaque `ptr`, so GEPs with an element type apply to it."""
    p = b.alloca(ty, name=name)
    p.align = 64
    p.type = PTR
    return p


def _is_i1(x: ir.Value) -> bool:
    return _elem(x.type) == I1


def _elem(t: ir.Type) -> ir.Type:
    return t.element if isinstance(t, ir.VectorType) else t


def _like_type(shape_of: ir.Type, elem: ir.Type) -> ir.Type:
    return ir.VectorType(elem, shape_of.count) if isinstance(shape_of, ir.VectorType) else elem


def _float_bits(t: ir.Type) -> int:
    return {F16: 16, F32: 32, F64: 64}[t]


def const_value(c: Const) -> ir.Constant:
    t = reg_type(c.dtype)
    if c.dtype is DType.PRED:
        return ir.Constant(I1, int(bool(c.value)))
    if c.dtype.is_float:
        v = float(c.value)
        if c.dtype is DType.BF16:
            v = bf16_round_const(v)
        elif c.dtype in (DType.F32, DType.F16):  # LLVM wants constants exactly representable in the type
            with np.errstate(over="ignore"):
                v = float(np.float32(v) if c.dtype is DType.F32 else np.float16(v))
        return ir.Constant(t, v)
    v = int(c.value)
    bits = c.dtype.bits
    v &= (1 << bits) - 1
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return ir.Constant(t, v)


def emit_module(func: LoopFunc, triple: str, parallel: bool = True,
                nontemporal_bytes: int | None = None) -> tuple[ir.Module, str, bool]:
    """The LLVM module of `func`: (module, kernel function name, whether it launches parallel loops).
    `nontemporal_bytes`: see the module docstring (None: config `nontemporal_store_bytes`)."""
    if nontemporal_bytes is None:
        nontemporal_bytes = int(config.get("nontemporal_store_bytes"))
    if config.get("loop_partition"):
        func = partition_tails(func)
    me = ModuleEmitter(func, triple, parallel, nontemporal_bytes)
    params = func.params
    fn = _new_function(me.module, me.name, [PTR] * len(params), internal=False)
    bufs = {p.name: _Buf(p.name, p.dtype, p.shape, a) for p, a in zip(params, fn.args)}
    for p, a in zip(params, fn.args):
        a.name = sanitize(p.name)
    fe = FuncEmitter(me, fn, bufs, {}, in_parallel=False)
    fe.stmt(func.body)
    fe.finish()
    return me.module, me.name, me.n_parallel > 0


__all__ = ["emit_module", "math_op", "lin_coeff", "vector_plan", "unroll_size", "store_type", "reg_type"]
