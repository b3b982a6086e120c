"""The loop-nest IR that schedules lower to and code generators read.

Map:
  ForKind         serial, parallel, vectorized, unrolled, GPU block/thread/vthread bindings
  Stmt nodes      For, Seq, Store, Allocate, If, Barrier (frozen dataclasses, tuple children)
  BufferDecl      a buffer of a LoopFunc (inputs, outputs, temporaries): name, shape, dtype, scope
  LoopFunc        one kernel: params (inputs then outputs, in a fixed order) + body
  stmt_str()      readable pseudo-code (what `hlotune inspect --schedule` shows)

Conventions the code generators rely on:
- Buffers are dense row-major arrays of `shape`; `Load`/`Store` carry one index per dimension.
- A `For` runs `var` over [min, min + extent); `extent` and `min` are index expressions that
  may depend on outer loop variables (bound inference); most are constants.
- A VECTORIZED loop has a constant extent (the lane count) and a body of Stores/Ifs only
  (no nested For); the code generator emits vector instructions for it, gathering where
  an access is not contiguous in `var`.
- An UNROLLED loop has a constant extent.  `For.annotations` carries pragmas such as
  ("auto_unroll_max_step", 64) and ("storage_align", ...).
- A PARALLEL loop is the outermost loop of its nest; iterations are independent.
- `Allocate` declares a temporary visible inside its `body` (scope "global", "local" or "shared").
- Reductions appear as an init Store followed by update Stores that read the same element.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

from ..ir.expr import Const, Expr, Var, expr_str
from ..ir.hlo import DType


class ForKind(str, enum.Enum):
    SERIAL = "for"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    BLOCK_X = "blockIdx.x"
    BLOCK_Y = "blockIdx.y"
    BLOCK_Z = "blockIdx.z"
    THREAD_X = "threadIdx.x"
    THREAD_Y = "threadIdx.y"
    THREAD_Z = "threadIdx.z"
    VTHREAD = "vthread"

    @property
    def is_gpu_binding(self) -> bool:
        return self.value.startswith(("blockIdx", "threadIdx")) or self is ForKind.VTHREAD


class Stmt:
    __slots__ = ()

    def __str__(self) -> str:
        return stmt_str(self)


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    min: Expr
    extent: Expr
    kind: ForKind
    body: Stmt
    annotations: tuple[tuple[str, object], ...] = ()

    @property
    def const_extent(self) -> int | None:
        return self.extent.value if isinstance(self.extent, Const) else None  # type: ignore[return-value]


@dataclass(frozen=True)
class Seq(Stmt):
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Store(Stmt):
    buffer: str
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True)
class Allocate(Stmt):
    buffer: str
    dtype: DType
    shape: tuple[int, ...]
    scope: str
    body: Stmt


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: Stmt
    otherwise: Stmt | None = None


@dataclass(frozen=True)
class Barrier(Stmt):
    """GPU: __syncthreads() for the given scope ("shared")."""

    scope: str = "shared"


@dataclass(frozen=True)
class BufferDecl:
    name: str
    shape: tuple[int, ...]
    dtype: DType
    scope: str = "global"


@dataclass(frozen=True)
class LoopFunc:
    """One kernel: `inputs` and `outputs` are the buffers passed in by the caller, in this
    order (inputs first); `body` computes the outputs."""

    name: str
    inputs: tuple[BufferDecl, ...]
    outputs: tuple[BufferDecl, ...]
    body: Stmt

    @property
    def params(self) -> tuple[BufferDecl, ...]:
        return self.inputs + self.outputs

    @cached_property
    def key(self) -> str:
        return func_str(self)

    def __str__(self) -> str:
        return func_str(self)


def func_str(f: LoopFunc) -> str:
    sig = ", ".join(f"{b.name}: {b.dtype.value}[{','.join(map(str, b.shape))}]" for b in f.params)
    return f"func {f.name}({sig}) {{\n{stmt_str(f.body, 1)}}}\n"


def _ann(a: tuple[tuple[str, object], ...]) -> str:
    return "" if not a else "  @" + " @".join(f"{k}={v}" for k, v in a)


def stmt_str(s: Stmt, depth: int = 0) -> str:
    """Readable pseudo-code, one statement per line, two spaces per level."""
    pad = "  " * depth
    if isinstance(s, For):
        lo = expr_str(s.min)
        rng = expr_str(s.extent) if lo == "0" else f"{lo}, {lo} + {expr_str(s.extent)}"
        head = f"{pad}{s.kind.value} {s.var.name} in range({rng}):{_ann(s.annotations)}\n"
        return head + stmt_str(s.body, depth + 1)
    if isinstance(s, Seq):
        return "".join(stmt_str(b, depth) for b in s.body)
    if isinstance(s, Store):
        return f"{pad}{s.buffer}[{', '.join(expr_str(i) for i in s.indices)}] = {expr_str(s.value)}\n"
    if isinstance(s, Allocate):
        head = f"{pad}alloc {s.buffer}: {s.dtype.value}[{','.join(map(str, s.shape))}] in {s.scope}\n"
        return head + stmt_str(s.body, depth)
    if isinstance(s, If):
        out = f"{pad}if {expr_str(s.cond)}:\n" + stmt_str(s.then, depth + 1)
        if s.otherwise is not None:
            out += f"{pad}else:\n" + stmt_str(s.otherwise, depth + 1)
        return out
    if isinstance(s, Barrier):
        return f"{pad}sync_threads({s.scope})\n"
    raise TypeError(f"not a Stmt: {s!r}")


def stmt_children(s: Stmt) -> tuple[Stmt, ...]:
    if isinstance(s, For | Allocate):
        return (s.body,)
    if isinstance(s, Seq):
        return s.body
    if isinstance(s, If):
        return (s.then,) if s.otherwise is None else (s.then, s.otherwise)
    return ()


def walk_stmts(s: Stmt):
    """Every statement, pre-order."""
    stack = [s]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(stmt_children(n)))
