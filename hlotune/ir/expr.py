"""Scalar expressions and the Halide-style algorithm (compute definition).

Map:
  Expr nodes      Var, Const, Load, Unary, Binary, Compare, Select, Cast (frozen, tuple children)
  helpers         const(), var(), idx arithmetic operators (+ - * // %) on Expr, simplify-free
  Axis, Reducer   an iteration axis (name, extent); a reduction combiner with its init value
  Stage           name[axes] = body, or a reduction of body over reduce_axes
  Buffer          an input of a compute definition (name, dims, dtype)
  ComputeDef      inputs + stages (topological) + outputs; prints readably
  expr_str()      readable text of an expression

The same `Expr` nodes are used by compute definitions (here) and by the loop IR
(`hlotune.schedule_space.loop_ir`).  Arithmetic ops are keyed by the HLO `Op` enum
(ADD, MULTIPLY, SINE, ...); index arithmetic is `Binary` on `DType.S64` with DIVIDE and
REMAINDER (indices are never negative, so truncating and flooring division agree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from .hlo import DType, Op

INDEX = DType.S64
_NAN = float("nan")  # one NaN object so that Const(nan) == Const(nan) (tuple identity shortcut)


class Expr:
    """Base of scalar expressions; every node has a `dtype`."""

    __slots__ = ()
    dtype: DType

    # index-building conveniences (ints are promoted to Const of the index type)
    def __add__(self, o: Expr | int) -> Expr:
        return Binary(Op.ADD, self, _e(o), self.dtype)

    def __radd__(self, o: Expr | int) -> Expr:
        return Binary(Op.ADD, _e(o), self, self.dtype)

    def __sub__(self, o: Expr | int) -> Expr:
        return Binary(Op.SUBTRACT, self, _e(o), self.dtype)

    def __mul__(self, o: Expr | int) -> Expr:
        return Binary(Op.MULTIPLY, self, _e(o), self.dtype)

    def __rmul__(self, o: Expr | int) -> Expr:
        return Binary(Op.MULTIPLY, _e(o), self, self.dtype)

    def __floordiv__(self, o: Expr | int) -> Expr:
        return Binary(Op.DIVIDE, self, _e(o), self.dtype)

    def __mod__(self, o: Expr | int) -> Expr:
        return Binary(Op.REMAINDER, self, _e(o), self.dtype)

    @cached_property
    def key(self) -> str:
        """A structural key (the readable text; names included)."""
        return expr_str(self)

    def __str__(self) -> str:
        return expr_str(self)


def _e(x: Expr | int | float) -> Expr:
    return x if isinstance(x, Expr) else Const(x, INDEX if isinstance(x, int) else DType.F32)


@dataclass(frozen=True, eq=True)
class Var(Expr):
    name: str
    dtype: DType = INDEX


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: float | int | bool
    dtype: DType

    def __post_init__(self) -> None:
        v = self.value
        if self.dtype.is_float:
            v = float(v)
            if math.isnan(v):
                v = _NAN
        elif self.dtype is DType.PRED:
            v = bool(v)
        else:
            v = int(v)
        object.__setattr__(self, "value", v)


@dataclass(frozen=True, eq=True)
class Load(Expr):
    """`buffer[indices]`: an input buffer or an earlier stage."""

    buffer: str
    indices: tuple[Expr, ...]
    dtype: DType


@dataclass(frozen=True, eq=True)
class Unary(Expr):
    op: Op
    a: Expr
    dtype: DType


@dataclass(frozen=True, eq=True)
class Binary(Expr):
    op: Op
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True, eq=True)
class Compare(Expr):
    """`a <direction> b` with direction one of EQ NE LT LE GT GE (NaN: only NE is true)."""

    direction: str
    a: Expr
    b: Expr
    dtype: DType = DType.PRED


@dataclass(frozen=True, eq=True)
class Select(Expr):
    cond: Expr
    t: Expr
    f: Expr
    dtype: DType


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    """Convert `a` to `dtype` with HLO `convert` semantics."""

    a: Expr
    dtype: DType


def const(value: float | int | bool, dtype: DType) -> Const:
    return Const(value, dtype)


def var(name: str) -> Var:
    return Var(name, INDEX)


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of `e`."""
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Unary | Cast):
        return (e.a,)
    if isinstance(e, Binary | Compare):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.t, e.f)
    return ()


def walk(e: Expr):
    """Every node of `e`, pre-order, without recursion limits."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


_BIN_SYM = {Op.ADD: "+", Op.SUBTRACT: "-", Op.MULTIPLY: "*", Op.DIVIDE: "/", Op.REMAINDER: "%"}
_CMP_SYM = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


def _const_str(c: Const) -> str:
    if c.dtype is DType.PRED:
        return "true" if c.value else "false"
    if c.dtype.is_float:
        v = float(c.value)
        if math.isnan(v):
            text = "nan"
        elif math.isinf(v):
            text = "inf" if v > 0 else "-inf"
        else:
            text = repr(v)
        return text if c.dtype is DType.F32 else f"{c.dtype.value}({text})"
    return str(c.value) if c.dtype is INDEX else f"{c.dtype.value}({c.value})"


def expr_str(e: Expr) -> str:
    """Readable text: `A[i, k] * B[k, j]`, `exp(x[i])`, `select(c, a, b)`."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return _const_str(e)
    if isinstance(e, Load):
        return f"{e.buffer}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Unary):
        return f"{e.op.value}({expr_str(e.a)})"
    if isinstance(e, Binary):
        sym = _BIN_SYM.get(e.op)
        if sym is not None:
            return f"({expr_str(e.a)} {sym} {expr_str(e.b)})"
        return f"{e.op.value}({expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, Compare):
        return f"({expr_str(e.a)} {_CMP_SYM[e.direction]} {expr_str(e.b)})"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.t)}, {expr_str(e.f)})"
    if isinstance(e, Cast):
        return f"{e.dtype.value}({expr_str(e.a)})"
    raise TypeError(f"not an Expr: {e!r}")


@dataclass(frozen=True)
class Axis:
    """An iteration axis: index variable `name` over [0, extent)."""

    name: str
    extent: int

    @property
    def var(self) -> Var:
        return Var(self.name, INDEX)


#: combiners the code generators know by name; anything else is a general `combiner` Expr
REDUCER_OPS = frozenset({Op.ADD, Op.MULTIPLY, Op.MAXIMUM, Op.MINIMUM, Op.AND, Op.OR})
ACC = "_acc"   # the accumulator variable of a general combiner expression
VAL = "_val"   # the incoming value variable of a general combiner expression


@dataclass(frozen=True)
class Reducer:
    """How a reduction combines: `op` for the common cases, or a general `combiner`
    expression over Var(ACC) and Var(VAL) (both of the stage's dtype); `init` is the
    init value (HLO reduce's second operand)."""

    init: Const
    op: Op | None = None
    combiner: Expr | None = None

    def combine(self, acc: Expr, val: Expr) -> Expr:
        """The expression acc (+) val."""
        if self.op is not None:
            return Binary(self.op, acc, val, acc.dtype)
        assert self.combiner is not None
        return substitute(self.combiner, {ACC: acc, VAL: val})


@dataclass(frozen=True)
class Stage:
    """`name[axes] = body`, or `name[axes] = reduce(reducer, body over reduce_axes)`."""

    name: str
    axes: tuple[Axis, ...]
    body: Expr
    dtype: DType
    reduce_axes: tuple[Axis, ...] = ()
    reducer: Reducer | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.extent for a in self.axes)

    @property
    def is_reduction(self) -> bool:
        return self.reducer is not None

    def __str__(self) -> str:
        lhs = f"{self.name}[{', '.join(a.name for a in self.axes)}]"
        dom = ", ".join(f"{a.name}<{a.extent}" for a in self.axes)
        if self.reducer is None:
            return f"{lhs} = {expr_str(self.body)}    # {self.dtype.value} {{{dom}}}"
        r = self.reducer
        how = r.op.value if r.op is not None else f"lambda {ACC}, {VAL}: {expr_str(r.combiner)}"
        rdom = ", ".join(f"{a.name}<{a.extent}" for a in self.reduce_axes)
        return (f"{lhs} = reduce({how}, init={_const_str(r.init)}, {expr_str(self.body)}) over {{{rdom}}}"
                f"    # {self.dtype.value} {{{dom}}}")


@dataclass(frozen=True)
class Buffer:
    """An input of a compute definition."""

    name: str
    shape: tuple[int, ...]
    dtype: DType

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype.value}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class ComputeDef:
    """The algorithm of one fused subgraph: inputs, stages in topological order, outputs.

    `constants` gives the values of input buffers that hold array constants of the subgraph:
    (buffer name, canonical literal text) pairs; those buffers come last in `inputs` and callers
    do not supply them (`compute.constant_values(cd)` reads them as arrays).
    """

    name: str
    inputs: tuple[Buffer, ...]
    stages: tuple[Stage, ...]
    outputs: tuple[str, ...]
    constants: tuple[tuple[str, str], ...] = ()

    @cached_property
    def stage_by_name(self) -> dict[str, Stage]:
        return {s.name: s for s in self.stages}

    def stage(self, name: str) -> Stage:
        return self.stage_by_name[name]

    def __str__(self) -> str:
        lines = [f"compute {self.name}({', '.join(str(b) for b in self.inputs)}) -> {', '.join(self.outputs)}"]
        lines += [f"  {s}" for s in self.stages]
        return "\n".join(lines)


def rebuild(e: Expr, fn) -> Expr:
    """Rebuild `e` bottom-up: each node with its children rebuilt is passed to `fn`, whose result
    replaces it (expressions are small, so plain recursion is fine)."""
    if isinstance(e, Load):
        e = Load(e.buffer, tuple(rebuild(i, fn) for i in e.indices), e.dtype)
    elif isinstance(e, Unary):
        e = Unary(e.op, rebuild(e.a, fn), e.dtype)
    elif isinstance(e, Binary):
        e = Binary(e.op, rebuild(e.a, fn), rebuild(e.b, fn), e.dtype)
    elif isinstance(e, Compare):
        e = Compare(e.direction, rebuild(e.a, fn), rebuild(e.b, fn), e.dtype)
    elif isinstance(e, Select):
        e = Select(rebuild(e.cond, fn), rebuild(e.t, fn), rebuild(e.f, fn), e.dtype)
    elif isinstance(e, Cast):
        e = Cast(rebuild(e.a, fn), e.dtype)
    elif not isinstance(e, Var | Const):
        raise TypeError(f"not an Expr: {e!r}")
    return fn(e)


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace Vars by name."""
    return rebuild(e, lambda n: mapping.get(n.name, n) if isinstance(n, Var) else n)
