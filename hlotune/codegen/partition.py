"""Loop partitioning (index-set splitting) of guarded tails: a loop-IR pass run before CPU code generation.

Map:
  partition_tails(func)         LoopFunc -> LoopFunc (pure); the CPU code generator calls it when the setting
                                `loop_partition` is on
  _Conjunct                     one conjunct of an If's condition read as `k * v + rest < 0`, linear in a loop var
  _breaks(g, lo, hi)            the cut points of one conjunct in a loop's range: where it stops being always true
                                and where it becomes always false
  _partition(loop, ranges)      the loop split at the cuts of its guards, when the rules below allow
  _specialize(stmt, ranges)     the statement with every guard conjunct decided by the ranges dropped (true) or its
                                If removed (false); None when nothing is left

Why.  A tile that does not divide its extent leaves a guard `i_o * f + i_i < N` inside the tile (`lower` hoists it
to the loop binding its last variable).  Inside a register tile the guard is re-tested on every iteration of the
reduction loops around it and keeps LLVM from holding the accumulators in registers: a 133-row packed GEMM block
(256 rows) ran 1.7x slower than a 128-row one.  Halide splits such loops into a steady part without the guard
and a tail with it; so does this pass.

Rules.  For a serial or unrolled loop `v` with constant bounds, every conjunct of an If inside it that is linear
in `v` (other variables: enclosing or inner loops with known bounds) cuts v's range where it stops being always
true and where it becomes always false.  The loop is split at those cuts when the guard is *hot* (re-tested inside
a loop whose variable it does not use, or inside an unrolled or vectorized loop), the loop's body is small
(`MAX_BODY` statements) and at most `MAX_PIECES` pieces are left; or, at any size, when the split leaves one piece
(the guard only shrinks the loop).  In each piece the decided conjuncts are dropped and dead Ifs removed; a piece
of one iteration has its variable replaced by the constant, so guards on inner loops can be decided in turn.
Iterations run in the original order, so results are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir.expr import INDEX, Binary, Compare, Const, Expr, Load, Var, substitute, walk
from ..ir.hlo import DType, Op
from ..schedule_space.loop_ir import Allocate, For, ForKind, If, LoopFunc, Seq, Stmt, Store, walk_stmts
from ..schedule_space.simplify import Ranges, bounds, ic, lin_bounds, linear, simplify

MAX_BODY = 512      # statements in a loop body that a hot guard may duplicate
MAX_PIECES = 3      # pieces a loop may be split into
_SPLITTABLE = (ForKind.SERIAL, ForKind.UNROLLED)


def partition_tails(func: LoopFunc) -> LoopFunc:
    """`func` with guarded tails split off their loops (see the module docstring)."""
    body = _walk(func.body, {})
    return func if body is func.body else replace(func, body=body)


# ---- the walk ----
def _walk(s: Stmt, ranges: Ranges) -> Stmt:
    if isinstance(s, For):
        split = _partition(s, ranges) if s.kind in _SPLITTABLE else None
        if split is not None:
            return split
        body = _walk(s.body, _with_loop(ranges, s))
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, Seq):
        parts = tuple(_walk(x, ranges) for x in s.body)
        return s if all(a is b for a, b in zip(parts, s.body)) else Seq(parts)
    if isinstance(s, Allocate):
        body = _walk(s.body, ranges)
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, If):
        then = _walk(s.then, ranges)
        other = None if s.otherwise is None else _walk(s.otherwise, ranges)
        return s if then is s.then and other is s.otherwise else replace(s, then=then, otherwise=other)
    return s


def _with_loop(ranges: Ranges, loop: For) -> Ranges:
    r = dict(ranges)
    r.pop(loop.var.name, None)
    b = _loop_range(loop, ranges)
    if b is not None:
        r[loop.var.name] = b
    return r


def _loop_range(loop: For, ranges: Ranges) -> tuple[int, int] | None:
    """Inclusive bounds of a loop's variable (None: unknown or empty)."""
    lo, ext = bounds(loop.min, ranges), bounds(loop.extent, ranges)
    if lo is None or ext is None or ext[1] <= 0:
        return None
    return lo[0], lo[1] + ext[1] - 1


# ---- guards ----
@dataclass(frozen=True)
class _Conjunct:
    """`k * v + rest < 0` where rest lies in [rlo, rhi]; `hot`: re-tested where it need not be."""

    k: int
    rlo: int
    rhi: int
    hot: bool


def _conjuncts(cond: Expr) -> list[Expr]:
    if isinstance(cond, Binary) and cond.op is Op.AND and cond.dtype is DType.PRED:
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _as_negative(c: Expr) -> Expr | None:
    """An index expression e with c <=> e < 0, or None."""
    if not (isinstance(c, Compare) and c.a.dtype is INDEX and c.b.dtype is INDEX):
        return None
    d = Binary(Op.SUBTRACT, c.a, c.b, INDEX)
    one = ic(1)
    return {"LT": d, "LE": Binary(Op.SUBTRACT, d, one, INDEX),
            "GT": Binary(Op.SUBTRACT, ic(0), d, INDEX),
            "GE": Binary(Op.SUBTRACT, Binary(Op.SUBTRACT, ic(0), d, INDEX), one, INDEX)}.get(c.direction)


def _read(c: Expr, v: str, ranges: Ranges, hot: bool) -> _Conjunct | None:
    """`c` as k * v + rest < 0 with rest's bounds, when c is linear in v (v not inside another atom)."""
    e = _as_negative(c)
    if e is None:
        return None
    terms, const = linear(e)
    k = 0
    rest = {}
    for key, (atom, coef) in terms.items():
        if isinstance(atom, Var) and atom.name == v:
            k = coef
        elif any(isinstance(n, Var) and n.name == v for n in walk(atom)) or isinstance(atom, Load):
            return None
        else:
            rest[key] = (atom, coef)
    if k == 0:
        return None
    b = lin_bounds((rest, const), ranges)
    return None if b is None else _Conjunct(k, b[0], b[1], hot)


def _guards(s: Stmt, v: str, ranges: Ranges, path: tuple[For, ...], out: list[_Conjunct]) -> None:
    """The conjuncts linear in `v` of every If in `s` (`path`: the loops between v's loop and `s`)."""
    if isinstance(s, For):
        _guards(s.body, v, _with_loop(ranges, s), path + (s,), out)
    elif isinstance(s, Seq):
        for x in s.body:
            _guards(x, v, ranges, path, out)
    elif isinstance(s, Allocate):
        _guards(s.body, v, ranges, path, out)
    elif isinstance(s, If):
        for c in _conjuncts(s.cond):
            names = {n.name for n in walk(c) if isinstance(n, Var)}
            if v not in names:
                continue
            hot = any(f.var.name not in names or f.kind in (ForKind.UNROLLED, ForKind.VECTORIZED) for f in path)
            g = _read(c, v, ranges, hot)
            if g is not None:
                out.append(g)
        _guards(s.then, v, ranges, path, out)
        if s.otherwise is not None:
            _guards(s.otherwise, v, ranges, path, out)


def _breaks(g: _Conjunct, lo: int, hi: int) -> set[int]:
    """Cut points in (lo, hi]: always true below the first (k > 0), always false from the second."""
    if g.k > 0:   # true for k*x + rhi < 0; false for k*x + rlo >= 0
        t, f = (-g.rhi - 1) // g.k + 1, -(g.rlo // g.k)
    else:
        m = -g.k  # true for x > rhi / m; false for x <= rlo / m
        t, f = g.rlo // m + 1, g.rhi // m + 1
    return {x for x in (t, f) if lo < x <= hi}


# ---- splitting ----
def _partition(loop: For, ranges: Ranges) -> Stmt | None:
    """`loop` split into pieces with its guards decided (each piece walked in turn), or None to leave it."""
    if not (isinstance(loop.min, Const) and isinstance(loop.extent, Const)) or int(loop.extent.value) < 2:
        return None
    v, lo = loop.var.name, int(loop.min.value)
    hi = lo + int(loop.extent.value) - 1
    found: list[_Conjunct] = []
    inner = dict(ranges)
    inner.pop(v, None)
    _guards(loop.body, v, inner, (), found)
    if not found:
        return None
    cuts = sorted(set().union(*(_breaks(g, lo, hi) for g in found)))
    edges = [lo] + cuts + [hi + 1]
    pieces = []
    for a, b in zip(edges, edges[1:]):
        r = dict(ranges)
        r[v] = (a, b - 1)
        body = _specialize(loop.body, r)
        if body is not None:
            pieces.append((a, b, body))
    if len(pieces) == 1 and pieces[0][2] is loop.body and pieces[0][:2] == (lo, hi + 1):
        return None   # nothing decided
    hot = any(g.hot for g in found)
    small = sum(1 for _ in walk_stmts(loop.body)) <= MAX_BODY
    if len(pieces) > 1 and not (hot and small and len(pieces) <= MAX_PIECES):
        return None
    out = []
    for a, b, body in pieces:
        if b - a == 1:
            body = _substitute(body, v, a)
        r = dict(ranges)
        r[v] = (a, b - 1)
        out.append(replace(loop, min=ic(a), extent=ic(b - a), body=_walk(body, r)))
    if not out:
        return Seq(())
    return out[0] if len(out) == 1 else Seq(tuple(out))


def _decide(c: Expr, ranges: Ranges) -> bool | None:
    """The truth of conjunct `c` over the ranges, where `simplify` (which folds a decided comparison) finds one."""
    d = simplify(c, ranges)
    return bool(d.value) if isinstance(d, Const) else None


def _specialize(s: Stmt, ranges: Ranges) -> Stmt | None:
    """`s` with the guard conjuncts that `ranges` decide dropped or their Ifs removed; None if nothing is left."""
    if isinstance(s, For):
        r = _with_loop(ranges, s)
        body = _specialize(s.body, r)
        if body is None:
            return None
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, Seq):
        parts = [_specialize(x, ranges) for x in s.body]
        kept = tuple(p for p in parts if p is not None)
        if not kept:
            return None
        return s if len(kept) == len(s.body) and all(a is b for a, b in zip(kept, s.body)) else Seq(kept)
    if isinstance(s, Allocate):
        body = _specialize(s.body, ranges)
        if body is None:
            return None
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, If):
        keep = []
        for c in _conjuncts(s.cond):
            d = _decide(c, ranges)
            if d is False:
                return None if s.otherwise is None else _specialize(s.otherwise, ranges)
            if d is None:
                keep.append(c)
        then = _specialize(s.then, ranges)
        other = None if s.otherwise is None else _specialize(s.otherwise, ranges)
        if not keep:
            return then
        if then is None and other is None:
            return None
        cond = keep[0]
        for c in keep[1:]:
            cond = Binary(Op.AND, cond, c, DType.PRED)
        if then is None:
            then = Seq(())
        if cond == s.cond and then is s.then and other is s.otherwise:
            return s
        return If(cond, then, other)
    return s


def _substitute(s: Stmt, v: str, value: int) -> Stmt:
    """`s` with loop variable `v` replaced by a constant (index expressions simplified)."""
    m = {v: ic(value)}

    def ex(e: Expr) -> Expr:
        return simplify(substitute(e, m))

    if isinstance(s, For):
        return replace(s, min=ex(s.min), extent=ex(s.extent), body=_substitute(s.body, v, value))
    if isinstance(s, Seq):
        return Seq(tuple(_substitute(x, v, value) for x in s.body))
    if isinstance(s, Allocate):
        return replace(s, body=_substitute(s.body, v, value))
    if isinstance(s, If):
        other = None if s.otherwise is None else _substitute(s.otherwise, v, value)
        return If(ex(s.cond), _substitute(s.then, v, value), other)
    if isinstance(s, Store):
        return Store(s.buffer, tuple(ex(i) for i in s.indices), ex(s.value))
    return s


__all__ = ["partition_tails", "MAX_BODY", "MAX_PIECES"]
