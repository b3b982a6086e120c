"""HLO fused computation -> Halide-style compute definition (`ComputeDef`).

Map:
  compute_definition(comp, module)   the entry point: a ComputeDef for one fused computation
  constant_values(cd)                array constants of a ComputeDef as numpy arrays (by buffer name)
  simplify_index(e, extents)         the small index simplifier (linear forms, div/mod by bounds)
  _Builder                           per-definition state: buffers, stages, what is materialized
  _RULES                             Op -> rule(builder, inst, index) -> Expr (inlined ops)
  _REDUCTIONS                        Op -> rule(builder, inst, axes) -> (body, reduce axes, reducer)

Which instructions become stages (everything else is inlined into its consumers' expressions):
  - every reduction-bearing op (reduce, reduce-window, dot, convolution);
  - every output (the ROOT, or each element of a ROOT tuple; a parameter, an array constant or a
    repeated element that is an output gets a copy stage `<name>_out<k>`);
  - an instruction with several users whose expression holds a transcendental or is large
    (more than `_MAX_INLINE_NODES` nodes), so that it is not recomputed.
Stages index their own axes `i0, i1, ...` and their reduction axes `r0, r1, ...`.

Buffers: the computation's parameters in parameter order (named after the parameter instruction),
then array constants `const_0, const_1, ...`.  A scalar constant becomes a `Const`.  Array constants
are extra input buffers whose values travel inside the ComputeDef (`ComputeDef.constants`, canonical
literal text); `constant_values(cd)` gives them as arrays, and `compute_eval.evaluate_compute`
supplies them itself, so callers pass only the parameters.

A reduce whose init value is not a constant (XLA's wrapped reductions take it as a parameter) reduces
from the combiner's identity in a stage `<name>_red` and combines the init value in the stage `<name>`.

Loads are always in bounds: index expressions that may leave their buffer under a select (pad,
concatenate, convolution padding, dynamic offsets) are clamped; bounds analysis removes the clamps
that are provably unneeded.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from .expr import (
    ACC,
    INDEX,
    REDUCER_OPS,
    VAL,
    Axis,
    Binary,
    Buffer,
    Cast,
    Compare,
    ComputeDef,
    Const,
    Expr,
    Load,
    Reducer,
    Select,
    Stage,
    Unary,
    Var,
    walk,
)
from .hlo import (
    BINARY_MATH,
    REDUCTION,
    TRANSCENDENTAL,
    UNARY_MATH,
    ArrayShape,
    Computation,
    DType,
    Instruction,
    Module,
    Op,
    TupleShape,
    literal_array,
)

#: float types whose sums and products accumulate in f32
_NARROW_FLOATS = frozenset({DType.F16, DType.BF16})
#: a multi-user instruction whose inlined expression is bigger than this is materialized
_MAX_INLINE_NODES = 64

Index = tuple[Expr, ...]


# ----------------------------------------------------------------------------- public API

def compute_definition(comp: Computation, module: Module, name: str | None = None) -> ComputeDef:
    """The compute definition of fused computation `comp` (callees looked up in `module`).

    Raises UnsupportedError naming the instruction for ops it cannot express (variadic reduce,
    custom-call, nested fusion, ...).
    """
    return _Builder(comp, module).build(name or _sanitize(comp.name))


def constant_values(cd: ComputeDef) -> dict[str, np.ndarray]:
    """The values of the array-constant input buffers of `cd`, by buffer name."""
    from .literal import parse_literal
    shapes = {b.name: b for b in cd.inputs}
    return {n: parse_literal(text, ArrayShape(shapes[n].dtype, shapes[n].shape))
            for n, text in cd.constants}


# ----------------------------------------------------------------------------- index simplifier

def _ic(v: int) -> Const:
    return Const(int(v), INDEX)


def _is_index(e: Expr) -> bool:
    return e.dtype is INDEX


def bounds(e: Expr, extents: dict[str, int]) -> tuple[int, int] | None:
    """Inclusive integer bounds of an index expression, or None when unknown."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if _is_index(e) else None
    if isinstance(e, Var):
        n = extents.get(e.name)
        return (0, n - 1) if n is not None else None
    if isinstance(e, Binary) and _is_index(e):
        a, b = bounds(e.a, extents), bounds(e.b, extents)
        if a is None or b is None:
            return None
        if e.op is Op.ADD:
            return a[0] + b[0], a[1] + b[1]
        if e.op is Op.SUBTRACT:
            return a[0] - b[1], a[1] - b[0]
        if e.op is Op.MULTIPLY:
            ps = [x * y for x in a for y in b]
            return min(ps), max(ps)
        if e.op is Op.MAXIMUM:
            return max(a[0], b[0]), max(a[1], b[1])
        if e.op is Op.MINIMUM:
            return min(a[0], b[0]), min(a[1], b[1])
        if e.op is Op.DIVIDE and b[0] == b[1] and b[0] > 0 and a[0] >= 0:
            return a[0] // b[0], a[1] // b[0]
        if e.op is Op.REMAINDER and b[0] == b[1] and b[0] > 0 and a[0] >= 0:
            return (a[0], a[1]) if a[1] < b[0] else (0, b[0] - 1)
    if isinstance(e, Select) and _is_index(e):
        t, f = bounds(e.t, extents), bounds(e.f, extents)
        if t is not None and f is not None:
            return min(t[0], f[0]), max(t[1], f[1])
    return None


def _linear(e: Expr, extents: dict[str, int]) -> tuple[dict[Expr, int], int]:
    """e as sum(coef * atom) + const; atoms are simplified non-linear sub-expressions."""
    if isinstance(e, Const):
        return {}, int(e.value)
    if isinstance(e, Binary) and e.op in (Op.ADD, Op.SUBTRACT):
        ta, ca = _linear(e.a, extents)
        tb, cb = _linear(e.b, extents)
        s = 1 if e.op is Op.ADD else -1
        out = dict(ta)
        for k, v in tb.items():
            out[k] = out.get(k, 0) + s * v
        return {k: v for k, v in out.items() if v != 0}, ca + s * cb
    if isinstance(e, Binary) and e.op is Op.MULTIPLY:
        ta, ca = _linear(e.a, extents)
        tb, cb = _linear(e.b, extents)
        if not tb:
            return {k: v * cb for k, v in ta.items() if v * cb != 0}, ca * cb
        if not ta:
            return {k: v * ca for k, v in tb.items() if v * ca != 0}, ca * cb
        return {_from_linear(ta, ca) * _from_linear(tb, cb): 1}, 0
    atom = _simplify_atom(e, extents)
    if isinstance(atom, Const):
        return {}, int(atom.value)
    if isinstance(atom, Binary) and atom.op in (Op.ADD, Op.SUBTRACT, Op.MULTIPLY):
        return _linear(atom, extents)
    return {atom: 1}, 0


def _from_linear(terms: dict[Expr, int], c: int) -> Expr:
    pos = [(k, v) for k, v in terms.items() if v > 0]
    neg = [(k, -v) for k, v in terms.items() if v < 0]
    out: Expr | None = None
    for k, v in pos:
        t = k if v == 1 else Binary(Op.MULTIPLY, k, _ic(v), INDEX)
        out = t if out is None else Binary(Op.ADD, out, t, INDEX)
    if out is None and (neg or c):
        out = _ic(c) if not neg or c else None
        c = 0 if out is not None else c
    for k, v in neg:
        t = k if v == 1 else Binary(Op.MULTIPLY, k, _ic(v), INDEX)
        out = Binary(Op.SUBTRACT, out if out is not None else _ic(0), t, INDEX)
    if out is None:
        return _ic(c)
    if c > 0:
        out = Binary(Op.ADD, out, _ic(c), INDEX)
    elif c < 0:
        out = Binary(Op.SUBTRACT, out, _ic(-c), INDEX)
    return out


def _div_mod(e: Binary, extents: dict[str, int]) -> Expr:
    """x // c or x % c for a constant c > 0, splitting off the multiples of c."""
    terms, k = _linear(e.a, extents)
    c = int(e.b.value)
    if c == 1:
        return _from_linear(terms, k) if e.op is Op.DIVIDE else _ic(0)
    if not terms:
        return _ic(k // c if e.op is Op.DIVIDE else k % c)
    q = {t: v // c for t, v in terms.items() if v % c == 0}
    rest = {t: v for t, v in terms.items() if v % c != 0}
    qc, rc = divmod(k, c)
    rest_e = _from_linear(rest, rc)
    rb = bounds(rest_e, extents)
    whole = bounds(_from_linear(terms, k), extents)
    if rb is None or rb[0] < 0 or whole is None or whole[0] < 0:
        return Binary(e.op, _from_linear(terms, k), e.b, INDEX)
    if e.op is Op.REMAINDER:
        return rest_e if rb[1] < c else Binary(Op.REMAINDER, rest_e, e.b, INDEX)
    qe = _from_linear(q, qc)
    if rb[1] < c:
        return qe
    return simplify_index(Binary(Op.ADD, qe, Binary(Op.DIVIDE, rest_e, e.b, INDEX), INDEX), extents) \
        if q or qc else Binary(Op.DIVIDE, rest_e, e.b, INDEX)


def _simplify_atom(e: Expr, extents: dict[str, int]) -> Expr:
    if isinstance(e, Binary) and _is_index(e):
        a, b = simplify_index(e.a, extents), simplify_index(e.b, extents)
        if e.op in (Op.DIVIDE, Op.REMAINDER) and isinstance(b, Const) and int(b.value) > 0:
            return _div_mod(Binary(e.op, a, b, INDEX), extents)
        if e.op in (Op.MAXIMUM, Op.MINIMUM):
            ba, bb = bounds(a, extents), bounds(b, extents)
            if ba is not None and bb is not None:
                if e.op is Op.MAXIMUM:
                    if ba[0] >= bb[1]:
                        return a
                    if bb[0] >= ba[1]:
                        return b
                else:
                    if ba[1] <= bb[0]:
                        return a
                    if bb[1] <= ba[0]:
                        return b
        return Binary(e.op, a, b, INDEX)
    if isinstance(e, Cast) and _is_index(e):
        a = e.a
        if isinstance(a, Const) and not a.dtype.is_float:
            return _ic(int(a.value))
        if a.dtype is INDEX:
            return simplify_index(a, extents)
        return Cast(a, INDEX)
    if isinstance(e, Select) and _is_index(e):
        return Select(e.cond, simplify_index(e.t, extents), simplify_index(e.f, extents), INDEX)
    return e


def simplify_index(e: Expr, extents: dict[str, int]) -> Expr:
    """Fold constants, `x*1`, `x+0`, `(x*c) // c`, `(x*c + y) % c` with 0 <= y < c, and
    max/min/clamps decided by the bounds of the variables (`extents`: var name -> extent)."""
    if not _is_index(e):
        return e
    terms, c = _linear(e, extents)
    return _from_linear(terms, c)


# ----------------------------------------------------------------------------- value helpers

def _sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if s and not s[0].isdigit() else "_" + s


def _identity(op: Op, dtype: DType) -> Const:
    """The identity element of a known combiner."""
    if dtype is DType.PRED:
        return Const(op in (Op.AND, Op.MULTIPLY, Op.MINIMUM), dtype)
    if op in (Op.ADD, Op.OR):
        return Const(0, dtype)
    if op is Op.MULTIPLY:
        return Const(1, dtype)
    if dtype.is_float:
        if op is Op.AND:
            raise UnsupportedError(f"{op} reduction of {dtype}")
        return Const(float("-inf") if op is Op.MAXIMUM else float("inf"), dtype)
    info = np.iinfo(dtype.np)
    if op is Op.AND:
        return Const(-1 if dtype.is_signed else int(info.max), dtype)
    return Const(int(info.min) if op is Op.MAXIMUM else int(info.max), dtype)


def _fold_cast(e: Expr, dtype: DType) -> Expr:
    """Cast with trivial folding (same type; a constant whose conversion is exact and simple)."""
    if e.dtype is dtype:
        return e
    if isinstance(e, Const) and dtype is not DType.BF16:
        v = e.value
        if dtype is DType.PRED:
            return Const(v != 0, dtype)
        if dtype.is_float:
            return Const(float(np.asarray(v).astype(dtype.np)), dtype)
        if not e.dtype.is_float or (np.isfinite(v) and float(v) == int(v)):
            iv = int(v)
            info = np.iinfo(dtype.np)
            if info.min <= iv <= info.max:
                return Const(iv, dtype)
    return Cast(e, dtype)


def _and(conds: list[Expr]) -> Expr | None:
    out: Expr | None = None
    for c in conds:
        out = c if out is None else Binary(Op.AND, out, c, DType.PRED)
    return out


def _has_transcendental(e: Expr) -> bool:
    return any(isinstance(n, Unary | Binary) and n.op in TRANSCENDENTAL for n in walk(e))


def _size(e: Expr) -> int:
    return sum(1 for _ in walk(e))


def _dims(inst: Instruction) -> tuple[int, ...]:
    if not isinstance(inst.shape, ArrayShape):
        raise UnsupportedError(f"tuple-shaped {inst.op} inside a fused computation", line=inst.line, op=inst.name)
    return inst.shape.dims


def _dtype(inst: Instruction) -> DType:
    _dims(inst)
    return inst.array_shape.dtype


# ----------------------------------------------------------------------------- the builder

@dataclass
class _Ctx:
    """The stage being built: extents of its variables (for the simplifier)."""

    extents: dict[str, int]


class _Builder:
    def __init__(self, comp: Computation, module: Module, params_as: dict[str, Expr] | None = None):
        self.comp = comp
        self.module = module
        self.loads: dict[str, str] = {}          # instruction -> buffer/stage name
        self.params_as = params_as or {}         # parameter name -> fixed expression (combiners)
        self.buffers: list[Buffer] = []
        self.constants: list[tuple[str, str]] = []
        self.stages: list[Stage] = []
        self.used: set[str] = set()
        self.ctx = _Ctx({})
        self.memo: dict[tuple[str, Index], Expr] = {}

    # -- names
    def fresh(self, base: str) -> str:
        name, k = _sanitize(base), 1
        while name in self.used or name in (ACC, VAL):
            name = f"{_sanitize(base)}_{k}"
            k += 1
        self.used.add(name)
        return name

    # -- index helpers
    def ix(self, e: Expr) -> Expr:
        return simplify_index(e, self.ctx.extents)

    def clamp(self, e: Expr, n: int) -> Expr:
        """e clamped into [0, n)."""
        return self.ix(Binary(Op.MINIMUM, Binary(Op.MAXIMUM, e, _ic(0), INDEX), _ic(n - 1), INDEX))

    def cmp(self, direction: str, a: Expr, b: int) -> Expr | None:
        """`a <dir> b` on indices, or None when the bounds prove it true."""
        a = self.ix(a)
        bd = bounds(a, self.ctx.extents)
        if bd is not None:
            lo, hi = bd
            if (direction == "GE" and lo >= b) or (direction == "LT" and hi < b) or \
               (direction == "LE" and hi <= b) or (direction == "EQ" and lo == hi == b):
                return None
        return Compare(direction, a, _ic(b))

    def divisible(self, e: Expr, s: int) -> Expr | None:
        if s == 1:
            return None
        return self.cmp("EQ", Binary(Op.REMAINDER, e, _ic(s), INDEX), 0)

    # -- values
    def value(self, name: str, idx: Index) -> Expr:
        """The value of instruction `name` at index `idx` (a Load when materialized)."""
        inst = self.comp[name]
        if name in self.params_as:
            return self.params_as[name]
        if name in self.loads:
            return Load(self.loads[name], idx, _dtype(inst))
        key = (name, idx)
        got = self.memo.get(key)
        if got is None:
            rule = _RULES.get(inst.op)
            if rule is None:
                raise UnsupportedError(f"{inst.op} inside a fused computation is not supported",
                                       line=inst.line, op=name)
            got = rule(self, inst, idx)
            self.memo[key] = got
        return got

    def operand(self, inst: Instruction, k: int, idx: Index) -> Expr:
        """Operand k of inst at idx (a scalar operand of an elementwise op is read at ())."""
        o = self.comp[inst.operands[k]]
        return self.value(o.name, idx if _dims(o) or not idx else ())

    def scalar(self, inst: Instruction, k: int) -> Expr:
        return self.value(inst.operands[k], ())

    def start(self, inst: Instruction, k: int) -> Expr:
        """A start-index operand as an index expression."""
        return self.ix(_fold_cast(self.scalar(inst, k), INDEX))

    # -- stages
    def begin(self, extents: dict[str, int]) -> None:
        self.ctx = _Ctx(dict(extents))
        self.memo = {}

    def space_axes(self, dims: tuple[int, ...]) -> tuple[Axis, ...]:
        return tuple(Axis(f"i{k}", n) for k, n in enumerate(dims))

    def add_stage(self, base: str, inst: Instruction) -> str:
        dims, dtype = _dims(inst), _dtype(inst)
        axes = self.space_axes(dims)
        self.begin({a.name: a.extent for a in axes})
        red = _REDUCTIONS.get(inst.op)
        name = self.fresh(base)
        if red is None:
            body = _RULES[inst.op](self, inst, tuple(a.var for a in axes)) if inst.op in _RULES else None
            if body is None:
                raise UnsupportedError(f"{inst.op} inside a fused computation is not supported",
                                       line=inst.line, op=inst.name)
            self.stages.append(Stage(name, axes, body, dtype))
            return name
        body, raxes, reducer, post = red(self, inst, axes)
        wide = dtype in _NARROW_FLOATS and reducer.op in (Op.ADD, Op.MULTIPLY)
        if post is None and not wide:
            self.stages.append(Stage(name, axes, body, dtype, raxes, reducer))
            return name
        if wide:  # f16/bf16 sums and products accumulate in f32 and round once, as XLA does
            inner = self.fresh(base + "_acc")
            self.stages.append(Stage(inner, axes, Cast(body, DType.F32), DType.F32, raxes,
                                     Reducer(Const(reducer.init.value, DType.F32), op=reducer.op)))
            acc: Expr = Cast(Load(inner, tuple(a.var for a in axes), DType.F32), dtype)
        else:
            inner = self.fresh(base + "_red")
            self.stages.append(Stage(inner, axes, body, dtype, raxes, reducer))
            acc = Load(inner, tuple(a.var for a in axes), dtype)
        self.stages.append(Stage(name, axes, post(acc) if post is not None else acc, dtype))
        return name

    def copy_stage(self, base: str, src: str, inst: Instruction) -> str:
        axes = self.space_axes(_dims(inst))
        name = self.fresh(base)
        self.stages.append(Stage(name, axes, Load(src, tuple(a.var for a in axes), _dtype(inst)), _dtype(inst)))
        return name

    def build(self, name: str) -> ComputeDef:
        comp = self.comp
        root = comp.root_instruction
        outs = list(root.operands) if root.op is Op.TUPLE else [root.name]
        live = _live(comp)
        users = {n: [u for u in us if u in live] for n, us in comp.users.items()}
        for p in comp.parameters:
            if not isinstance(p.shape, ArrayShape):
                raise UnsupportedError("tuple-shaped parameter of a fused computation", line=p.line, op=p.name)
            b = Buffer(self.fresh(p.name), p.shape.dims, p.shape.dtype)
            self.buffers.append(b)
            self.loads[p.name] = b.name
        for inst in comp.instructions:
            if inst.name not in live or inst.op is Op.PARAMETER or inst is root and inst.op is Op.TUPLE:
                continue
            if inst.op is Op.CONSTANT and isinstance(inst.shape, ArrayShape) and inst.shape.rank > 0 \
                    and inst.shape.size > 1:
                self.add_constant(inst)
                continue
            if self.must_materialize(inst, outs, users[inst.name]):
                self.loads[inst.name] = self.add_stage(inst.name, inst)
        outputs: list[str] = []
        stage_names = {s.name for s in self.stages}
        for k, o in enumerate(outs):
            src = self.loads[o]
            if src not in stage_names or src in outputs:
                src = self.copy_stage(f"{o}_out{k}", src, comp[o])
            outputs.append(src)
        extra = {"constants": tuple(self.constants)} if self.constants else {}
        return ComputeDef(name, tuple(self.buffers), tuple(self.stages), tuple(outputs), **extra)

    def add_constant(self, inst: Instruction) -> None:
        from .literal import format_literal
        arr = literal_array(inst)
        bname = self.fresh(f"const_{len(self.constants)}")
        self.buffers.append(Buffer(bname, inst.shape.dims, inst.shape.dtype))
        self.constants.append((bname, format_literal(arr, inst.shape.dtype)))
        self.loads[inst.name] = bname

    def must_materialize(self, inst: Instruction, outs: list[str], users: list[str]) -> bool:
        if inst.op in REDUCTION or inst.name in outs:
            return True
        if len(users) <= 1 or inst.op in (Op.CONSTANT, Op.IOTA) or not _dims(inst):
            return False
        axes = self.space_axes(_dims(inst))
        self.begin({a.name: a.extent for a in axes})
        e = self.value(inst.name, tuple(a.var for a in axes))
        return _has_transcendental(e) or _size(e) > _MAX_INLINE_NODES


def _live(comp: Computation) -> set[str]:
    seen: set[str] = set()
    stack = [comp.root]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(comp[n].operands)
    return seen


# ----------------------------------------------------------------------------- combiners

def _reducer(b: _Builder, inst: Instruction, init_operand: int, dtype: DType):
    """(Reducer, post) of a reduce-like instruction; post combines a non-constant init value."""
    comp = b.module.computation(inst.attr("to_apply"))
    init = b.scalar(inst, init_operand)
    init = _fold_cast(init, dtype) if isinstance(init, Const) else init
    op = _combiner_op(comp)
    if isinstance(init, Const):
        if op is not None:
            return Reducer(init, op=op), None
        return Reducer(init, combiner=_combiner_expr(comp, b.module, dtype)), None
    if op is None:
        raise UnsupportedError("reduction with a general combiner and a non-constant init value",
                               line=inst.line, op=inst.name)
    return Reducer(_identity(op, dtype), op=op), (lambda acc: Binary(op, init, acc, dtype))


def _combiner_op(comp: Computation) -> Op | None:
    ps = comp.parameters
    root = comp.root_instruction
    if len(ps) == 2 and root.op in REDUCER_OPS and set(root.operands) == {ps[0].name, ps[1].name} \
            and len(root.operands) == 2:
        return root.op
    return None


def _combiner_expr(comp: Computation, module: Module, dtype: DType) -> Expr:
    ps = comp.parameters
    if len(ps) != 2 or not isinstance(comp.root_instruction.shape, ArrayShape):
        raise UnsupportedError(f"variadic reduction combiner {comp.name}", line=comp.line, op=comp.name)
    sub = _Builder(comp, module, {ps[0].name: Var(ACC, dtype), ps[1].name: Var(VAL, dtype)})
    sub.begin({})
    e = sub.value(comp.root, ())
    if sub.stages or sub.constants:
        raise UnsupportedError(f"combiner {comp.name} is not elementwise", op=comp.name)
    return e


def _check_single(inst: Instruction) -> None:
    if isinstance(inst.shape, TupleShape) or len(inst.operands) != 2:
        raise UnsupportedError(f"variadic {inst.op} ({len(inst.operands) // 2} operands) is not supported",
                               line=inst.line, op=inst.name)


# ----------------------------------------------------------------------------- reduction rules

def _reduce(b: _Builder, inst: Instruction, axes: tuple[Axis, ...]):
    _check_single(inst)
    x = b.comp[inst.operands[0]]
    xd = _dims(x)
    dims = sorted(inst.attr("dimensions", ()))
    raxes = tuple(Axis(f"r{k}", xd[d]) for k, d in enumerate(dims))
    b.ctx.extents.update({a.name: a.extent for a in raxes})
    it, rt = iter(axes), iter(raxes)
    idx = tuple(next(rt).var if d in dims else next(it).var for d in range(len(xd)))
    reducer, post = _reducer(b, inst, 1, _dtype(inst))
    return b.value(x.name, idx), raxes, reducer, post


def _dot(b: _Builder, inst: Instruction, axes: tuple[Axis, ...]):
    lhs, rhs = (b.comp[o] for o in inst.operands)
    ld, rd = _dims(lhs), _dims(rhs)
    lb, lc = inst.attr("lhs_batch_dims", ()), inst.attr("lhs_contracting_dims", ())
    rb, rc = inst.attr("rhs_batch_dims", ()), inst.attr("rhs_contracting_dims", ())
    raxes = tuple(Axis(f"r{k}", ld[d]) for k, d in enumerate(lc))
    b.ctx.extents.update({a.name: a.extent for a in raxes})
    out = iter(a.var for a in axes)
    bvars = [next(out) for _ in lb]
    lidx: list[Expr | None] = [None] * len(ld)
    ridx: list[Expr | None] = [None] * len(rd)
    for k, (dl, dr) in enumerate(zip(lb, rb)):
        lidx[dl] = ridx[dr] = bvars[k]
    for k, (dl, dr) in enumerate(zip(lc, rc)):
        lidx[dl] = ridx[dr] = raxes[k].var
    for d in range(len(ld)):
        if lidx[d] is None:
            lidx[d] = next(out)
    for d in range(len(rd)):
        if ridx[d] is None:
            ridx[d] = next(out)
    dtype = _dtype(inst)
    a = _fold_cast(b.value(lhs.name, tuple(lidx)), dtype)
    c = _fold_cast(b.value(rhs.name, tuple(ridx)), dtype)
    combine = Op.OR if dtype is DType.PRED else Op.ADD
    body = Binary(Op.AND if dtype is DType.PRED else Op.MULTIPLY, a, c, dtype)
    return body, raxes, Reducer(Const(0, dtype), op=combine), None


def _window_pos(b: _Builder, out: Expr, w, r: Expr | None, n: int) -> tuple[Expr, list[Expr]]:
    """Operand index along one windowed dim and the conditions for it to be real data."""
    p = out * w.stride - w.pad_lo if w.stride != 1 else out - w.pad_lo
    if r is not None:
        p = p + (r * w.rhs_dilate if w.rhs_dilate != 1 else r)
    p = b.ix(p)
    s = w.lhs_dilate
    conds = [b.cmp("GE", p, 0), b.cmp("LT", p, (n - 1) * s + 1), b.divisible(p, s)]
    q = b.ix(Binary(Op.DIVIDE, p, _ic(s), INDEX)) if s != 1 else p
    return b.clamp(q, n), [c for c in conds if c is not None]


def _convolution(b: _Builder, inst: Instruction, axes: tuple[Axis, ...]):
    x, k = (b.comp[o] for o in inst.operands)
    xd, kd = _dims(x), _dims(k)
    lab = inst.attr("dim_labels")
    win = inst.attr("window")
    g = inst.attr("feature_group_count", 1)
    if inst.attr("batch_group_count", 1) != 1:
        raise UnsupportedError("convolution with batch_group_count > 1", line=inst.line, op=inst.name)
    ns = len(lab.input_spatial)
    wdims = win.dims if win is not None else ()
    cin = kd[lab.kernel_input_feature]
    cout = kd[lab.kernel_output_feature]
    raxes = (Axis("r0", cin),) + tuple(Axis(f"r{s + 1}", kd[lab.kernel_spatial[s]]) for s in range(ns))
    b.ctx.extents.update({a.name: a.extent for a in raxes})
    ov = [a.var for a in axes]
    o = ov[lab.output_feature]
    xidx: list[Expr] = [_ic(0)] * len(xd)
    kidx: list[Expr] = [_ic(0)] * len(kd)
    xidx[lab.input_batch] = ov[lab.output_batch]
    group = b.ix(Binary(Op.DIVIDE, o, _ic(cout // g), INDEX)) if g > 1 else None
    xidx[lab.input_feature] = b.ix(group * cin + raxes[0].var) if group is not None else raxes[0].var
    kidx[lab.kernel_input_feature] = raxes[0].var
    kidx[lab.kernel_output_feature] = o
    conds: list[Expr] = []
    for s in range(ns):
        w = wdims[s]
        r = raxes[s + 1].var
        xidx[lab.input_spatial[s]], c = _window_pos(b, ov[lab.output_spatial[s]], w, r, xd[lab.input_spatial[s]])
        conds += c
        kidx[lab.kernel_spatial[s]] = b.ix(_ic(raxes[s + 1].extent - 1) - r) if w.reversal else r
    dtype = _dtype(inst)
    xv = _fold_cast(b.value(x.name, tuple(xidx)), dtype)
    cond = _and(conds)
    if cond is not None:
        xv = Select(cond, xv, Const(0, dtype), dtype)
    body = Binary(Op.MULTIPLY, xv, _fold_cast(b.value(k.name, tuple(kidx)), dtype), dtype)
    return body, raxes, Reducer(Const(0, dtype), op=Op.ADD), None


def _reduce_window(b: _Builder, inst: Instruction, axes: tuple[Axis, ...]):
    _check_single(inst)
    x = b.comp[inst.operands[0]]
    xd = _dims(x)
    wdims = inst.attr("window").dims
    raxes: list[Axis] = []
    rvars: list[Expr | None] = []
    for w in wdims:
        if w.size > 1:
            raxes.append(Axis(f"r{len(raxes)}", w.size))
            rvars.append(raxes[-1].var)
        else:
            rvars.append(None)
    b.ctx.extents.update({a.name: a.extent for a in raxes})
    idx: list[Expr] = []
    conds: list[Expr] = []
    for d, w in enumerate(wdims):
        q, c = _window_pos(b, axes[d].var, w, rvars[d], xd[d])
        idx.append(q)
        conds += c
    dtype = _dtype(inst)
    reducer, post = _reducer(b, inst, 1, dtype)
    body = b.value(x.name, tuple(idx))
    cond = _and(conds)
    if cond is not None:
        body = Select(cond, body, b.scalar(inst, 1), dtype)
    return body, tuple(raxes), reducer, post


_REDUCTIONS: dict[Op, Callable] = {
    Op.REDUCE: _reduce,
    Op.DOT: _dot,
    Op.CONVOLUTION: _convolution,
    Op.REDUCE_WINDOW: _reduce_window,
}


# ----------------------------------------------------------------------------- inlined rules

def _unary(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return Unary(inst.op, b.operand(inst, 0, idx), _dtype(inst))


def _binary(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return Binary(inst.op, b.operand(inst, 0, idx), b.operand(inst, 1, idx), _dtype(inst))


def _compare(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return Compare(inst.attr("direction"), b.operand(inst, 0, idx), b.operand(inst, 1, idx))


def _select(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return Select(b.operand(inst, 0, idx), b.operand(inst, 1, idx), b.operand(inst, 2, idx), _dtype(inst))


def _clamp(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    dt = _dtype(inst)
    lo, x, hi = (b.operand(inst, k, idx) for k in range(3))
    return Binary(Op.MINIMUM, Binary(Op.MAXIMUM, x, lo, dt), hi, dt)


def _convert(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return _fold_cast(b.operand(inst, 0, idx), _dtype(inst))


def _copy(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return b.operand(inst, 0, idx)


def _constant(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    arr = literal_array(inst)
    if arr.size != 1:  # array constants are buffers (see _Builder.add_constant)
        raise UnsupportedError("array constant used before its definition", line=inst.line, op=inst.name)
    return Const(arr.reshape(()).item(), _dtype(inst))


def _iota(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return _fold_cast(idx[inst.attr("iota_dimension")], _dtype(inst))


def _broadcast(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    return b.value(inst.operands[0], tuple(idx[d] for d in inst.attr("dimensions", ())))


def _transpose(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    perm = inst.attr("dimensions")
    src: list[Expr] = [_ic(0)] * len(perm)
    for k, d in enumerate(perm):
        src[d] = idx[k]
    return b.value(inst.operands[0], tuple(src))


def _delinearize(b: _Builder, out_idx: Index, out_dims: tuple[int, ...], in_dims: tuple[int, ...]) -> Index:
    """Row-major reshape index mapping, grouped by runs of dims with equal products."""
    res: list[Expr] = []
    i = j = 0
    while i < len(out_dims) or j < len(in_dims):
        gi, gj = [i], [j]
        po = out_dims[i] if i < len(out_dims) else 1
        pi = in_dims[j] if j < len(in_dims) else 1
        i, j = i + 1, j + 1
        while po != pi:
            if po < pi:
                po *= out_dims[i]
                gi.append(i)
                i += 1
            else:
                pi *= in_dims[j]
                gj.append(j)
                j += 1
        gi = [k for k in gi if k < len(out_dims)]
        gj = [k for k in gj if k < len(in_dims)]
        lin: Expr = _ic(0)
        for k in gi:
            lin = lin * out_dims[k] + out_idx[k]
        lin = b.ix(lin)
        for pos, k in enumerate(gj):
            inner = 1
            for m in gj[pos + 1:]:
                inner *= in_dims[m]
            e = Binary(Op.DIVIDE, lin, _ic(inner), INDEX) if inner != 1 else lin
            res.append(b.ix(Binary(Op.REMAINDER, e, _ic(in_dims[k]), INDEX)))
    return tuple(res)


def _reshape(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    src = b.comp[inst.operands[0]]
    return b.value(src.name, _delinearize(b, idx, _dims(inst), _dims(src)))


def _layout_of(s: ArrayShape) -> tuple[int, ...]:
    return s.layout if s.layout is not None else tuple(range(s.rank - 1, -1, -1))


def _bitcast(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    """A reshape of the physical (layout-ordered) element sequence."""
    src = b.comp[inst.operands[0]]
    out_s, in_s = inst.array_shape, src.array_shape
    out_major = tuple(reversed(_layout_of(out_s)))
    in_major = tuple(reversed(_layout_of(in_s)))
    phys_out = tuple(idx[d] for d in out_major)
    phys_in = _delinearize(b, phys_out, tuple(out_s.dims[d] for d in out_major),
                           tuple(in_s.dims[d] for d in in_major))
    logical: list[Expr] = [_ic(0)] * in_s.rank
    for k, d in enumerate(in_major):
        logical[d] = phys_in[k]
    return b.value(src.name, tuple(logical))


def _slice(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    src = tuple(b.ix(i * st + lo) for i, (lo, _, st) in zip(idx, inst.attr("slice")))
    return b.value(inst.operands[0], src)


def _pad(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    x = b.comp[inst.operands[0]]
    conds: list[Expr] = []
    src: list[Expr] = []
    for i, n, (lo, _hi, interior) in zip(idx, _dims(x), inst.attr("padding")):
        s = interior + 1
        p = b.ix(i - lo)
        conds += [c for c in (b.cmp("GE", p, 0), b.cmp("LT", p, (n - 1) * s + 1), b.divisible(p, s)) if c is not None]
        src.append(b.clamp(b.ix(Binary(Op.DIVIDE, p, _ic(s), INDEX)) if s != 1 else p, n))
    v = b.value(x.name, tuple(src))
    cond = _and(conds)
    return v if cond is None else Select(cond, v, b.scalar(inst, 1), _dtype(inst))


def _concatenate(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    d = inst.attr("dimensions")[0]
    parts = [(o, _dims(b.comp[o])[d]) for o in inst.operands]
    offsets = []
    off = 0
    for _, n in parts:
        offsets.append(off)
        off += n
    out: Expr | None = None
    for (o, n), off in reversed(list(zip(parts, offsets))):
        src = list(idx)
        src[d] = b.clamp(b.ix(idx[d] - off), n)
        v = b.value(o, tuple(src))
        if out is None:
            out = v
            continue
        cond = b.cmp("LT", idx[d], off + n)
        out = v if cond is None else Select(cond, v, out, _dtype(inst))
    assert out is not None
    return out


def _reverse(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    dims = _dims(inst)
    rev = set(inst.attr("dimensions", ()))
    return b.value(inst.operands[0], tuple(b.ix(_ic(dims[k] - 1) - i) if k in rev else i for k, i in enumerate(idx)))


def _starts(b: _Builder, inst: Instruction, first: int, rank: int) -> list[Expr]:
    """Start indices (scalar operands, or the old form: one index vector)."""
    ops = inst.operands[first:]
    if len(ops) == 1 and len(_dims(b.comp[ops[0]])) == 1:
        return [b.ix(_fold_cast(b.value(ops[0], (_ic(k),)), INDEX)) for k in range(rank)]
    return [b.start(inst, first + k) for k in range(rank)]


def _dynamic_slice(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    x = b.comp[inst.operands[0]]
    xd, sizes = _dims(x), inst.attr("dynamic_slice_sizes")
    starts = _starts(b, inst, 1, len(xd))
    src = tuple(b.ix(b.clamp(st, n - s + 1) + i) for st, n, s, i in zip(starts, xd, sizes, idx))
    return b.value(x.name, src)


def _dynamic_update_slice(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    x, u = b.comp[inst.operands[0]], b.comp[inst.operands[1]]
    xd, ud = _dims(x), _dims(u)
    starts = [b.clamp(st, n - m + 1) for st, n, m in zip(_starts(b, inst, 2, len(xd)), xd, ud)]
    conds: list[Expr] = []
    uidx: list[Expr] = []
    for i, st, m in zip(idx, starts, ud):
        rel = b.ix(i - st)
        conds += [c for c in (b.cmp("GE", rel, 0), b.cmp("LT", rel, m)) if c is not None]
        uidx.append(b.clamp(rel, m))
    cond = _and(conds)
    upd = b.value(u.name, tuple(uidx))
    return upd if cond is None else Select(cond, upd, b.value(x.name, idx), _dtype(inst))


def _gather(b: _Builder, inst: Instruction, idx: Index) -> Expr:
    x, ind = b.comp[inst.operands[0]], b.comp[inst.operands[1]]
    xd, idims = _dims(x), _dims(ind)
    if inst.attr("operand_batching_dims", ()) or inst.attr("start_indices_batching_dims", ()):
        raise UnsupportedError("gather with batching dims", line=inst.line, op=inst.name)
    offset_dims = tuple(inst.attr("offset_dims", ()))
    collapsed = set(inst.attr("collapsed_slice_dims", ()))
    index_map = tuple(inst.attr("start_index_map", ()))
    sizes = tuple(inst.attr("slice_sizes"))
    ivd = inst.attr("index_vector_dim", len(idims))
    batch = [idx[d] for d in range(len(idx)) if d not in offset_dims]
    starts: dict[int, Expr] = {}
    for k, d in enumerate(index_map):
        iidx = list(batch)
        if ivd < len(idims):
            iidx.insert(ivd, _ic(k))
        s = b.ix(_fold_cast(b.value(ind.name, tuple(iidx)), INDEX))
        starts[d] = b.clamp(s, xd[d] - sizes[d] + 1)
    keep = [d for d in range(len(xd)) if d not in collapsed]
    src: list[Expr] = []
    for d in range(len(xd)):
        st = starts.get(d, _ic(0))
        off = idx[offset_dims[keep.index(d)]] if d in keep else _ic(0)
        src.append(b.ix(st + off))
    return b.value(x.name, tuple(src))


_RULES: dict[Op, Callable[[_Builder, Instruction, Index], Expr]] = {
    **{op: _unary for op in UNARY_MATH},
    **{op: _binary for op in BINARY_MATH},
    Op.COMPARE: _compare,
    Op.SELECT: _select,
    Op.CLAMP: _clamp,
    Op.CONVERT: _convert,
    Op.COPY: _copy,
    Op.CONSTANT: _constant,
    Op.IOTA: _iota,
    Op.BROADCAST: _broadcast,
    Op.TRANSPOSE: _transpose,
    Op.RESHAPE: _reshape,
    Op.BITCAST: _bitcast,
    Op.SLICE: _slice,
    Op.PAD: _pad,
    Op.CONCATENATE: _concatenate,
    Op.REVERSE: _reverse,
    Op.DYNAMIC_SLICE: _dynamic_slice,
    Op.DYNAMIC_UPDATE_SLICE: _dynamic_update_slice,
    Op.GATHER: _gather,
}

