"""A slow but exact interpreter of the loop IR (for tests on small shapes).

Map:
  evaluate_loop_func(f, inputs)   run a LoopFunc on numpy inputs, return its outputs
  _Gen                            translates the LoopFunc to Python source (one function), then exec
  _UNARY, _BINARY                 Op -> scalar function with numpy scalar semantics of the dtype

Semantics: index arithmetic in Python ints; values are numpy scalars of their dtype, so float32
arithmetic is done in float32 and transcendentals go through numpy in float32 (erf via math.erf,
rounded).  Integer division and remainder truncate (HLO).  Every Load and Store checks its indices
against the buffer shape (negative or too-large indices raise, they never wrap).  Allocations and
outputs start as NaN (integers: a sentinel), so reading an element never written shows up in the
result.  `Select` evaluates only the chosen branch.  Parallel and GPU-bound loops run in reverse
order (a dependence between iterations then gives a different answer); a vectorized loop runs
statement by statement over all lanes, as vector code does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import InputError
from ..ir.expr import INDEX, Binary, Cast, Compare, Const, Expr, Load, Select, Unary, Var
from ..ir.hlo import DType, Op
from .loop_ir import Allocate, Barrier, For, ForKind, If, LoopFunc, Seq, Stmt, Store


def _erf(x):
    return type(x)(math.erf(float(x)))


def _logistic(x):
    one = type(x)(1)
    return one / (one + np.exp(-x))


def _not(x):
    return not x if isinstance(x, bool | np.bool_) else ~x


_UNARY = {
    Op.ABS: np.abs, Op.CEIL: np.ceil, Op.COSINE: np.cos, Op.ERF: _erf, Op.EXP: np.exp, Op.EXPM1: np.expm1,
    Op.FLOOR: np.floor, Op.IS_FINITE: np.isfinite, Op.LOG: np.log, Op.LOG1P: np.log1p, Op.LOGISTIC: _logistic,
    Op.NEGATE: np.negative, Op.NOT: _not, Op.ROUND_NEAREST_EVEN: np.rint, Op.RSQRT: lambda x: type(x)(1) / np.sqrt(x),
    Op.SIGN: np.sign, Op.SINE: np.sin, Op.SQRT: np.sqrt, Op.TANH: np.tanh,
}


def _trunc_div(a, b):
    t = type(a)
    ia, ib = int(a), int(b)
    if ib == 0:
        return t(-1)
    q = abs(ia) // abs(ib)
    return t(-q if (ia < 0) != (ib < 0) else q)


def _trunc_rem(a, b):
    t = type(a)
    ia, ib = int(a), int(b)
    if ib == 0:
        return t(ia)
    return t(ia - ib * int(_trunc_div(a, b)))


def _div(a, b):
    if isinstance(a, np.floating):
        return a / b
    return _trunc_div(a, b)


def _rem(a, b):
    if isinstance(a, np.floating):
        return np.fmod(a, b)
    return _trunc_rem(a, b)


def _and(a, b):
    return (a and b) if isinstance(a, bool | np.bool_) else a & b


def _or(a, b):
    return (a or b) if isinstance(a, bool | np.bool_) else a | b


_BINARY = {
    Op.ADD: lambda a, b: a + b, Op.SUBTRACT: lambda a, b: a - b, Op.MULTIPLY: lambda a, b: a * b,
    Op.DIVIDE: _div, Op.REMAINDER: _rem, Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum, Op.POWER: np.power,
    Op.ATAN2: np.arctan2, Op.AND: _and, Op.OR: _or, Op.XOR: lambda a, b: a ^ b,
}
_INDEX_OPS = {Op.ADD: "+", Op.SUBTRACT: "-", Op.MULTIPLY: "*", Op.DIVIDE: "//", Op.REMAINDER: "%"}
_CMP = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


def _cast(x, dtype: DType):
    if dtype is DType.PRED:
        return np.bool_(x != 0)
    t = dtype.np.type
    if dtype.is_int and isinstance(x, float | np.floating):
        if not math.isfinite(float(x)):
            return t(0)
        info = np.iinfo(t)
        return t(min(max(math.trunc(float(x)), info.min), info.max))
    return t(x)


def _ck(i: int, n: int) -> int:
    if not 0 <= i < n:
        raise IndexError(f"index {i} out of range [0, {n})")
    return i


class _Gen:
    def __init__(self, f: LoopFunc):
        self.f = f
        self.lines: list[str] = []
        self.names: dict[str, str] = {}
        self.bufs: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.consts: dict[str, object] = {}

    def ident(self, name: str) -> str:
        if name not in self.names:
            self.names[name] = f"v{len(self.names)}"
        return self.names[name]

    def const(self, c: Const) -> str:
        if c.dtype is INDEX:
            return repr(int(c.value))
        k = f"k{len(self.consts)}"
        self.consts[k] = np.bool_(c.value) if c.dtype is DType.PRED else c.dtype.np.type(c.value)
        return k

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.ident(e.name)
        if isinstance(e, Const):
            return self.const(e)
        if isinstance(e, Load):
            b, shape = self.bufs[e.buffer]
            if len(e.indices) != len(shape):
                raise IndexError(f"load of {e.buffer} with {len(e.indices)} indices, rank {len(shape)}")
            idx = ", ".join(f"_ck({self.expr(i)}, {n})" for i, n in zip(e.indices, shape))
            return f"{b}[{idx}{',' if len(shape) == 1 else ''}]" if shape else f"{b}[()]"
        if isinstance(e, Binary):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.dtype is INDEX and e.op in _INDEX_OPS:
                return f"({a} {_INDEX_OPS[e.op]} {b})"
            if e.dtype is INDEX and e.op in (Op.MAXIMUM, Op.MINIMUM):
                return f"{'max' if e.op is Op.MAXIMUM else 'min'}({a}, {b})"
            if e.op is Op.AND and e.dtype is DType.PRED:
                return f"({a} and {b})"
            return f"_B[{e.op.name!r}]({a}, {b})"
        if isinstance(e, Unary):
            return f"_U[{e.op.name!r}]({self.expr(e.a)})"
        if isinstance(e, Compare):
            return f"({self.expr(e.a)} {_CMP[e.direction]} {self.expr(e.b)})"
        if isinstance(e, Select):
            return f"({self.expr(e.t)} if {self.expr(e.cond)} else {self.expr(e.f)})"
        if isinstance(e, Cast):
            return f"_cast({self.expr(e.a)}, _DT[{e.dtype.name!r}])"
        raise TypeError(f"not an Expr: {e!r}")

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def stmt(self, s: Stmt, d: int) -> None:
        if isinstance(s, Seq):
            for b in s.body:
                self.stmt(b, d)
            if not s.body:
                self.emit("pass", d)
        elif isinstance(s, For):
            self.loop(s, d)
        elif isinstance(s, Store):
            b, shape = self.bufs[s.buffer]
            if len(s.indices) != len(shape):
                raise IndexError(f"store to {s.buffer} with {len(s.indices)} indices, rank {len(shape)}")
            idx = ", ".join(f"_ck({self.expr(i)}, {n})" for i, n in zip(s.indices, shape))
            target = f"{b}[{idx}{',' if len(shape) == 1 else ''}]" if shape else f"{b}[()]"
            self.emit(f"{target} = {self.expr(s.value)}", d)
        elif isinstance(s, Allocate):
            b = f"b{len(self.bufs)}"
            old = self.bufs.get(s.buffer)
            self.bufs[s.buffer] = (b, tuple(s.shape))
            self.emit(f"{b} = _alloc({tuple(s.shape)!r}, _DT[{s.dtype.name!r}])", d)
            self.stmt(s.body, d)
            if old is not None:
                self.bufs[s.buffer] = old
            else:
                del self.bufs[s.buffer]
        elif isinstance(s, If):
            self.emit(f"if {self.expr(s.cond)}:", d)
            self.stmt(s.then, d + 1)
            if s.otherwise is not None:
                self.emit("else:", d)
                self.stmt(s.otherwise, d + 1)
        elif isinstance(s, Barrier):
            self.emit("pass", d)
        else:
            raise TypeError(f"not a Stmt: {s!r}")

    def loop(self, s: For, d: int) -> None:
        v = self.ident(s.var.name)
        lo, n = self.expr(s.min), self.expr(s.extent)
        if s.kind is ForKind.VECTORIZED:
            body = s.body.body if isinstance(s.body, Seq) else (s.body,)
            for b in body:
                self.emit(f"for {v} in range({lo}, {lo} + {n}):", d)
                self.stmt(b, d + 1)
            return
        if s.kind is ForKind.PARALLEL or s.kind.is_gpu_binding:
            self.emit(f"for {v} in range({lo} + {n} - 1, {lo} - 1, -1):", d)
        else:
            self.emit(f"for {v} in range({lo}, {lo} + {n}):", d)
        self.stmt(s.body, d + 1)


def _alloc(shape, dtype: DType) -> np.ndarray:
    if dtype.is_float:
        return np.full(shape, np.nan, dtype.np)
    if dtype is DType.PRED:
        return np.zeros(shape, bool)
    return np.full(shape, np.iinfo(dtype.np).max // 3, dtype.np)


def compile_loop_func(f: LoopFunc):
    """The Python function (taking the param arrays, inputs then outputs) that runs `f`."""
    g = _Gen(f)
    params = []
    for k, b in enumerate(f.params):
        g.bufs[b.name] = (f"p{k}", tuple(b.shape))
        params.append(f"p{k}")
    g.emit(f"def _run({', '.join(params)}):", 0)
    g.stmt(f.body, 1)
    g.emit("return None", 1)
    src = "\n".join(g.lines)
    env = {"_ck": _ck, "_U": {k.name: v for k, v in _UNARY.items()}, "_B": {k.name: v for k, v in _BINARY.items()},
           "_cast": _cast, "_DT": {d.name: d for d in DType}, "_alloc": _alloc, "np": np}
    env.update(g.consts)
    exec(compile(src, f"<loop_eval {f.name}>", "exec"), env)  # noqa: S102 - our own generated code
    return env["_run"], src


def evaluate_loop_func(f: LoopFunc, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Run `f` on `inputs` (one array per input buffer, in order) and return its outputs."""
    if len(inputs) != len(f.inputs):
        raise InputError(f"{f.name}: expected {len(f.inputs)} inputs, got {len(inputs)}")
    arrays = []
    for b, x in zip(f.inputs, inputs):
        x = np.asarray(x)
        if tuple(x.shape) != tuple(b.shape):
            raise InputError(f"{f.name}: input {b.name} has shape {list(x.shape)}, expected {list(b.shape)}")
        arrays.append(np.array(x, dtype=b.dtype.np))
    outs = [_alloc(tuple(b.shape), b.dtype) for b in f.outputs]
    run, _ = compile_loop_func(f)
    with np.errstate(all="ignore"):
        run(*arrays, *outs)
    return tuple(outs)
