"""Index-expression simplification for lowered loop nests (fast, bounds-aware).

Map:
  Ranges            var name -> (lo, hi) inclusive bounds of loop variables
  bounds(e, r)      integer interval of an index expression, or None when unknown
  linear(e)         e as const + sum(coef * atom) (atoms: vars and non-linear sub-expressions)
  from_linear()     rebuild a canonical sum (terms ordered by their text, constant last)
  simplify(e, r)    constant folding, x*1, x+0, canonical sums, (c*x + y) // c -> x + y // c and
                    (c*x + y) % c -> y % c when 0 <= y < c is provable, (x // a) // b -> x // (a*b);
                    non-index expressions are rebuilt with simplified Load indices and conditions
  is_index(e)       whether e is integer index arithmetic (dtype s64 and no Loads)

Index arithmetic follows `hlotune.ir.expr`: `Binary` on s64 with ADD SUBTRACT MULTIPLY DIVIDE
REMAINDER MAXIMUM MINIMUM; index values are non-negative, so floor and truncating division agree.
"""

from __future__ import annotations

from ..ir.expr import INDEX, Binary, Cast, Compare, Const, Expr, Load, Select, Unary, Var
from ..ir.hlo import Op

Ranges = dict[str, tuple[int, int]]
Lin = tuple[dict[str, tuple[Expr, int]], int]

_ZERO = Const(0, INDEX)
_ONE = Const(1, INDEX)


def ic(v: int) -> Const:
    """An index constant."""
    return Const(int(v), INDEX)


def bounds(e: Expr, r: Ranges) -> tuple[int, int] | None:
    """Inclusive integer bounds of index expression `e` given variable ranges, or None."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if e.dtype is INDEX or e.dtype.is_int else None
    if isinstance(e, Var):
        return r.get(e.name)
    if not isinstance(e, Binary):
        return None
    a = bounds(e.a, r)
    if a is None:
        return None
    if e.op is Op.DIVIDE or e.op is Op.REMAINDER:
        if not isinstance(e.b, Const) or e.b.value <= 0 or a[0] < 0:
            return None
        c = int(e.b.value)
        if e.op is Op.DIVIDE:
            return (a[0] // c, a[1] // c)
        return (a[0] % c, a[1] % c) if a[0] // c == a[1] // c else (0, min(c - 1, a[1]))
    b = bounds(e.b, r)
    if b is None:
        return None
    if e.op is Op.ADD:
        return (a[0] + b[0], a[1] + b[1])
    if e.op is Op.SUBTRACT:
        return (a[0] - b[1], a[1] - b[0])
    if e.op is Op.MULTIPLY:
        ps = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        return (min(ps), max(ps))
    if e.op is Op.MAXIMUM:
        return (max(a[0], b[0]), max(a[1], b[1]))
    if e.op is Op.MINIMUM:
        return (min(a[0], b[0]), min(a[1], b[1]))
    return None


def is_index(e: Expr) -> bool:
    return e.dtype is INDEX and isinstance(e, Var | Const | Binary)


def linear(e: Expr, r: Ranges | None = None) -> Lin:
    """`e` as (terms, const): terms map an atom's text to (atom, coefficient)."""
    if isinstance(e, Const):
        return {}, int(e.value)
    if isinstance(e, Binary) and e.op in (Op.ADD, Op.SUBTRACT):
        ta, ca = linear(e.a, r)
        tb, cb = linear(e.b, r)
        sign = 1 if e.op is Op.ADD else -1
        out = dict(ta)
        for k, (atom, c) in tb.items():
            old = out.get(k)
            nc = (old[1] if old else 0) + sign * c
            if nc:
                out[k] = (atom, nc)
            else:
                out.pop(k, None)
        out, extra = _merge_divmod(out, r)
        return out, ca + sign * cb + extra
    if isinstance(e, Binary) and e.op is Op.MULTIPLY:
        ta, ca = linear(e.a, r)
        tb, cb = linear(e.b, r)
        if not tb:
            return _scale(ta, ca, cb)
        if not ta:
            return _scale(tb, cb, ca)
        prod = Binary(Op.MULTIPLY, from_linear((ta, ca)), from_linear((tb, cb)), INDEX)
        return {prod.key: (prod, 1)}, 0
    atom = e if isinstance(e, Var) else _simplify_atom(e, r)
    if isinstance(atom, Const):
        return {}, int(atom.value)
    if not isinstance(atom, Var) and isinstance(atom, Binary) and atom.op in (Op.ADD, Op.SUBTRACT, Op.MULTIPLY):
        return linear(atom, r)
    return {atom.key: (atom, 1)}, 0


def _merge_divmod(t: dict[str, tuple[Expr, int]], r: Ranges | None) -> tuple[dict[str, tuple[Expr, int]], int]:
    """(x // c) * c * a + (x % c) * a -> x * a; returns the terms and a constant to add."""
    extra = 0
    for key, (atom, k) in list(t.items()):
        if key not in t or not (isinstance(atom, Binary) and atom.op is Op.REMAINDER and isinstance(atom.b, Const)):
            continue
        c = int(atom.b.value)
        dkey = Binary(Op.DIVIDE, atom.a, atom.b, INDEX).key
        if dkey in t and t[dkey][1] == k * c:
            del t[key], t[dkey]
            xt, xc = linear(atom.a, r)
            for xk, (xa, xv) in xt.items():
                nv = t.get(xk, (xa, 0))[1] + xv * k
                if nv:
                    t[xk] = (xa, nv)
                else:
                    t.pop(xk, None)
            extra += xc * k
    return t, extra


def _scale(t: dict[str, tuple[Expr, int]], c: int, k: int) -> Lin:
    if k == 0:
        return {}, 0
    return {key: (a, v * k) for key, (a, v) in t.items()}, c * k


def from_linear(lin: Lin) -> Expr:
    """A canonical expression: positive terms (ordered by text), then negative ones, then the constant."""
    terms, c = lin
    out: Expr | None = None
    items = sorted(terms.items())
    for _, (atom, k) in items:
        if k > 0:
            t = atom if k == 1 else Binary(Op.MULTIPLY, atom, ic(k), INDEX)
            out = t if out is None else Binary(Op.ADD, out, t, INDEX)
    for _, (atom, k) in items:
        if k < 0:
            t = atom if k == -1 else Binary(Op.MULTIPLY, atom, ic(-k), INDEX)
            out = Binary(Op.SUBTRACT, _ZERO if out is None else out, t, INDEX)
    if out is None:
        return ic(c)
    if c > 0:
        return Binary(Op.ADD, out, ic(c), INDEX)
    if c < 0:
        return Binary(Op.SUBTRACT, out, ic(-c), INDEX)
    return out


def lin_bounds(lin: Lin, r: Ranges) -> tuple[int, int] | None:
    terms, c = lin
    lo = hi = c
    for atom, k in terms.values():
        b = bounds(atom, r)
        if b is None:
            return None
        lo += min(k * b[0], k * b[1])
        hi += max(k * b[0], k * b[1])
    return lo, hi


def _div_mod(op: Op, a: Expr, c: int, r: Ranges | None) -> Expr:
    """Simplify a // c or a % c (c > 0) with index a >= 0."""
    terms, k = linear(a, r)
    if not terms:
        q, m = _trunc_divmod(k, c)
        return ic(q if op is Op.DIVIDE else m)
    if c == 1:
        return from_linear((terms, k)) if op is Op.DIVIDE else _ZERO
    qt = {key: (at, v // c) for key, (at, v) in terms.items() if v % c == 0}
    rt = {key: (at, v) for key, (at, v) in terms.items() if v % c != 0}
    qk, m = divmod(k, c)
    rb = lin_bounds((rt, m), r or {})
    if rb is not None and rb[0] >= 0 and rb[0] // c == rb[1] // c:
        j = rb[0] // c
        if op is Op.DIVIDE:
            return from_linear((qt, qk + j))
        return from_linear((rt, m - j * c))
    inner = from_linear((terms, k))
    if op is Op.DIVIDE and isinstance(inner, Binary) and inner.op is Op.DIVIDE and isinstance(inner.b, Const):
        return Binary(Op.DIVIDE, inner.a, ic(int(inner.b.value) * c), INDEX)
    if op is Op.REMAINDER and r is not None:
        b = lin_bounds((terms, k), r)
        if b is not None and 0 <= b[0] and b[1] < c:
            return inner
    return Binary(op, inner, ic(c), INDEX)


def _trunc_divmod(a: int, b: int) -> tuple[int, int]:
    q = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        q = -q
    return q, a - b * q


def _simplify_atom(e: Expr, r: Ranges | None) -> Expr:
    """Simplify a non-linear index node (div, mod, max, min) or rebuild anything else."""
    if isinstance(e, Binary) and e.dtype is INDEX:
        if e.op in (Op.DIVIDE, Op.REMAINDER) and isinstance(e.b, Const) and e.b.value > 0:
            return _div_mod(e.op, e.a, int(e.b.value), r)
        a, b = simplify(e.a, r), simplify(e.b, r)
        if isinstance(a, Const) and isinstance(b, Const):
            return ic(_fold(e.op, int(a.value), int(b.value)))
        if e.op in (Op.MAXIMUM, Op.MINIMUM) and r is not None:
            ba, bb = bounds(a, r), bounds(b, r)
            if ba is not None and bb is not None:
                a_ge_b, b_ge_a = ba[0] >= bb[1], bb[0] >= ba[1]
                if a_ge_b or b_ge_a:
                    return a if a_ge_b == (e.op is Op.MAXIMUM) else b
        return Binary(e.op, a, b, INDEX)
    return simplify(e, r)


def _fold(op: Op, a: int, b: int) -> int:
    if op is Op.ADD:
        return a + b
    if op is Op.SUBTRACT:
        return a - b
    if op is Op.MULTIPLY:
        return a * b
    if op is Op.DIVIDE:
        return _trunc_divmod(a, b)[0] if b else 0
    if op is Op.REMAINDER:
        return _trunc_divmod(a, b)[1] if b else a
    if op is Op.MAXIMUM:
        return max(a, b)
    if op is Op.MINIMUM:
        return min(a, b)
    raise ValueError(op)


_ARITH = (Op.ADD, Op.SUBTRACT, Op.MULTIPLY)


def simplify(e: Expr, r: Ranges | None = None) -> Expr:
    """Simplify `e` (index arithmetic canonicalized; other nodes rebuilt around simplified parts)."""
    if isinstance(e, Var | Const):
        return e
    if isinstance(e, Binary):
        if e.dtype is INDEX and e.op in _ARITH:
            return from_linear(linear(e, r))
        if e.dtype is INDEX:
            return _simplify_atom(e, r)
        return Binary(e.op, simplify(e.a, r), simplify(e.b, r), e.dtype)
    if isinstance(e, Load):
        return Load(e.buffer, tuple(simplify(i, r) for i in e.indices), e.dtype)
    if isinstance(e, Unary):
        return Unary(e.op, simplify(e.a, r), e.dtype)
    if isinstance(e, Compare):
        a, b = simplify(e.a, r), simplify(e.b, r)
        if r is not None and a.dtype is INDEX and b.dtype is INDEX:
            t = _decide(e.direction, a, b, r)
            if t is not None:
                return Const(t, e.dtype)
        return Compare(e.direction, a, b, e.dtype)
    if isinstance(e, Select):
        c = simplify(e.cond, r)
        if isinstance(c, Const):
            return simplify(e.t if c.value else e.f, r)
        return Select(c, simplify(e.t, r), simplify(e.f, r), e.dtype)
    if isinstance(e, Cast):
        a = simplify(e.a, r)
        if isinstance(a, Const) and a.dtype is INDEX and (e.dtype.is_int or e.dtype.is_float):
            return Const(a.value, e.dtype)
        return Cast(a, e.dtype)
    raise TypeError(f"not an Expr: {e!r}")


def _decide(direction: str, a: Expr, b: Expr, r: Ranges) -> bool | None:
    """Truth of `a <dir> b` when the bounds of a - b decide it, else None."""
    d = lin_bounds(linear(Binary(Op.SUBTRACT, a, b, INDEX), r), r)
    if d is None:
        return None
    lo, hi = d
    table = {"LT": (hi < 0, lo >= 0), "LE": (hi <= 0, lo > 0), "GT": (lo > 0, hi <= 0),
             "GE": (lo >= 0, hi < 0), "EQ": (lo == hi == 0, lo > 0 or hi < 0),
             "NE": (lo > 0 or hi < 0, lo == hi == 0)}
    yes, no = table[direction]
    return True if yes else (False if no else None)


def prove_lt(a: Expr, n: int, r: Ranges) -> bool:
    """Whether a < n holds for all values in the ranges."""
    b = lin_bounds(linear(a, r), r)
    return b is not None and b[1] < n
