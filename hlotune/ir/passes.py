"""Optimization passes on HLO modules: each a pure function `Module -> Module`.

Map:
  _Rewriter              builds one computation's new instruction list (aliases, fresh names)
  rewrite_computations   applies a per-instruction rule to every computation (the pass skeleton)
  inline_calls           `call` -> the callee's instructions (nested calls too)
  inline_fusions         nested `fusion` inside fused computations -> their instructions
  legalize_custom_calls  cuBLAS gemm -> dot (+ epilogue), cuDNN conv -> convolution (+ bias, activation)
  dce                    dead instructions and unreachable computations
  cse                    structurally equal instructions merged
  dedupe_computations    structurally equal computations (modulo names) merged; callers redirected
  constant_folding       instructions of constants evaluated with the interpreter (small results)
  ALGEBRAIC_RULES        the table of algebraic simplifications, keyed by Op (power by a constant in
                         POWER_BY_MULTIPLY -> multiplies, 1, x or 1/x)
  algebraic_simplify     applies ALGEBRAIC_RULES
  simplify_tuples        get-tuple-element(tuple) and tuple(get-tuple-element...) cleanups
  optimize               the whole pipeline, iterated to a fixed point

Nothing is mutated: every pass builds new frozen Instructions/Computations and returns a new
Module (the same object when nothing changed is not promised; compare with ==).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import config
from ..errors import HlotuneError
from .hlo import ArrayShape, Computation, DType, Instruction, Module, Op, TupleShape, make_attrs

#: a rule answers None (keep the instruction), a name (the instruction is replaced by that
#: value), or an Instruction (emitted in its place; a different name aliases the old one to it)
Rule = Callable[[Instruction, "_Rewriter"], "str | Instruction | None"]


# --------------------------------------------------------------------------- skeleton

class _Rewriter:
    """Accumulates the new instructions of one computation while a pass walks the old ones."""

    def __init__(self, comp: Computation, module: Module):
        self.comp = comp
        self.module = module
        self.out: list[Instruction] = []
        self.alias: dict[str, str] = {}
        self.defs: dict[str, Instruction] = {}
        self.taken: set[str] = {i.name for i in comp}

    def get(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def inst(self, name: str) -> Instruction:
        """The (new) instruction that now defines the value `name`."""
        return self.defs[self.get(name)]

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}.{n}"
        self.taken.add(name)
        return name

    def emit(self, inst: Instruction) -> str:
        self.taken.add(inst.name)
        self.out.append(inst)
        self.defs[inst.name] = inst
        return inst.name

    def add(self, base: str, op: Op, shape, operands: tuple[str, ...] = (), **attrs) -> str:
        """Emit a new instruction with a fresh name based on `base`; returns its name."""
        return self.emit(Instruction(self.fresh(base), op, shape, tuple(operands), make_attrs(attrs)))

    def resolved(self, inst: Instruction) -> Instruction:
        ops = tuple(self.get(o) for o in inst.operands)
        return inst if ops == inst.operands else inst.replace(operands=ops)

    def finish(self) -> Computation:
        return Computation(self.comp.name, tuple(self.out), self.get(self.comp.root), self.comp.is_entry,
                           self.comp.line)


def rewrite_computation(comp: Computation, module: Module, rule: Rule) -> Computation:
    """Walk `comp` in definition order applying `rule` to each instruction (operands renamed)."""
    rw = _Rewriter(comp, module)
    for old in comp:
        inst = rw.resolved(old)
        res = rule(inst, rw)
        if res is None:
            rw.emit(inst)
        elif isinstance(res, str):
            rw.alias[old.name] = rw.get(res)
        else:
            if res.name not in rw.defs:
                rw.emit(res)
            if res.name != old.name:
                rw.alias[old.name] = res.name
    new = rw.finish()
    return comp if new == comp else new


def rewrite_computations(module: Module, rule: Rule, only: Callable[[Computation], bool] | None = None) -> Module:
    """Apply `rule` to every computation of `module` (or those `only` accepts)."""
    comps = tuple(rewrite_computation(c, module, rule) if only is None or only(c) else c
                  for c in module.computations)
    return module if comps == module.computations else module.with_computations(comps)


def _same_value_shape(a, b) -> bool:
    """Equal element type and dimensions (layouts ignored), or equal tuple shapes."""
    if isinstance(a, ArrayShape) and isinstance(b, ArrayShape):
        return a.dtype == b.dtype and a.dims == b.dims
    return a == b


def _default_layout(s) -> bool:
    return isinstance(s, ArrayShape) and (s.layout is None or s.layout == tuple(range(s.rank - 1, -1, -1)))


def topo_sort(comp: Computation) -> Computation:
    """`comp` with instructions in an order where operands come before users (stable)."""
    done: set[str] = set()
    out: list[Instruction] = []
    for start in comp:
        stack = [(start, 0)]
        while stack:
            inst, k = stack.pop()
            if inst.name in done:
                continue
            if k < len(inst.operands):
                stack.append((inst, k + 1))
                o = inst.operands[k]
                if o not in done and o in comp.by_name:
                    stack.append((comp[o], 0))
                continue
            done.add(inst.name)
            out.append(inst)
    new = tuple(out)
    return comp if new == comp.instructions else Computation(comp.name, new, comp.root, comp.is_entry, comp.line)


# --------------------------------------------------------------------------- inlining

def _inline_body(rw: _Rewriter, callee: Computation, args: tuple[str, ...]) -> str:
    """Copy `callee` into `rw` with parameters bound to `args`; returns the name of its root."""
    local: dict[str, str] = {}
    for inst in callee:
        if inst.op is Op.PARAMETER:
            local[inst.name] = args[inst.attr("parameter_number")]
            continue
        ops = tuple(local[o] for o in inst.operands)
        local[inst.name] = rw.emit(inst.replace(name=rw.fresh(inst.name), operands=ops))
    return local[callee.root]


def _inline_ops(module: Module, ops: frozenset[Op], inside: Callable[[Computation], bool] | None) -> Module:
    """Inline every instruction of an op in `ops`, callees first (so nested calls disappear too)."""
    done: dict[str, Computation] = {}

    def visit(comp: Computation) -> Computation:
        if comp.name in done:
            return done[comp.name]

        def rule(inst: Instruction, rw: _Rewriter):
            if inst.op not in ops:
                return None
            callee = visit(module.computation(inst.attr("to_apply") or inst.attr("calls")))
            return _inline_body(rw, callee, inst.operands)

        done[comp.name] = rewrite_computation(topo_sort(comp), module, rule)
        return done[comp.name]

    comps = tuple(visit(c) if inside is None or inside(c) else c for c in module.computations)
    return dce(module.with_computations(comps)) if comps != module.computations else module


def inline_calls(module: Module) -> Module:
    """Replace every `call` by a copy of the called computation (fresh names, nested calls too)."""
    return _inline_ops(module, frozenset({Op.CALL}), None)


def inline_fusions(module: Module, computation_names: set[str] | None = None) -> Module:
    """Inline `fusion` instructions found inside the named computations (all when None)."""
    inside = None if computation_names is None else (lambda c: c.name in computation_names)
    return _inline_ops(module, frozenset({Op.FUSION}), inside)


# --------------------------------------------------------------------------- dce / cse

def _reachable_computations(module: Module) -> set[str]:
    seen, todo = set(), [module.entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in module.by_name:
            continue
        seen.add(name)
        for inst in module.computation(name):
            todo.extend(inst.called)
    return seen


def _dce_computation(comp: Computation) -> Computation:
    live, todo = set(), [comp.root]
    while todo:
        n = todo.pop()
        if n not in live:
            live.add(n)
            todo.extend(comp[n].operands)
    keep = tuple(i for i in comp if i.name in live or i.op is Op.PARAMETER)
    return comp if len(keep) == len(comp.instructions) else Computation(comp.name, keep, comp.root, comp.is_entry,
                                                                        comp.line)


def dce(module: Module) -> Module:
    """Remove instructions the ROOT does not use (parameters stay) and computations nobody calls."""
    reach = _reachable_computations(module)
    comps = tuple(_dce_computation(c) for c in module.computations if c.name in reach)
    return module if comps == module.computations else module.with_computations(comps)


_CSE_IGNORED_ATTRS = frozenset({"metadata", "frontend_attributes"})


def _cse_key(inst: Instruction):
    attrs = tuple((k, v) for k, v in inst.attrs if k not in _CSE_IGNORED_ATTRS)
    return (inst.op, inst.shape, inst.operands, attrs)


def cse(module: Module) -> Module:
    """Merge instructions with the same op, operands, attributes and shape (not parameters,
    not custom-calls marked with side effects)."""
    def run(comp: Computation) -> Computation:
        seen: dict = {}

        def rule(inst: Instruction, rw: _Rewriter):
            if inst.op is Op.PARAMETER or (inst.op is Op.CUSTOM_CALL and inst.has("custom_call_has_side_effect")):
                return None
            key = _cse_key(inst)
            if key in seen:
                return seen[key]
            seen[key] = inst.name
            return None
        return rewrite_computation(comp, module, rule)

    comps = tuple(run(c) for c in module.computations)
    return module if comps == module.computations else module.with_computations(comps)


def _computation_key(comp: Computation, rep: dict[str, str]):
    """`comp` modulo names: per instruction (op, shape, operand positions, attributes without
    metadata, called computations by their representative), and the root's position."""
    pos = {inst.name: k for k, inst in enumerate(comp)}

    def attr(k: str, v):
        if k in _CALL_ATTRS:
            return tuple(rep.get(c, c) for c in v) if isinstance(v, tuple) else rep.get(v, v)
        return v

    items = tuple((inst.op, inst.shape, tuple(pos.get(o, o) for o in inst.operands),
                   tuple((k, attr(k, v)) for k, v in inst.attrs if k not in _CSE_IGNORED_ATTRS))
                  for inst in comp)
    return items, pos[comp.root]


_CALL_ATTRS = ("to_apply", "calls")


def _redirect_calls(inst: Instruction, rep: dict[str, str]) -> Instruction:
    updates = {}
    for k in _CALL_ATTRS:
        v = inst.attr(k)
        if v is not None:
            new = tuple(rep.get(c, c) for c in v) if isinstance(v, tuple) else rep.get(v, v)
            if new != v:
                updates[k] = new
    return inst.with_attrs(**updates) if updates else inst


def dedupe_computations(module: Module) -> Module:
    """Merge non-entry computations that are structurally equal (the same instructions in the same
    order modulo names; metadata ignored) into the first one met, callees first, and redirect every
    caller to it, so that CSE can merge e.g. two reduces whose combiners differ only in name."""
    rep: dict[str, str] = {}
    by_key: dict = {}

    def visit(name: str) -> None:
        if name in rep or name not in module.by_name:
            return
        rep[name] = name  # provisional (also stops cycles)
        comp = module.computation(name)
        for inst in comp:
            for callee in inst.called:
                visit(callee)
        if not comp.is_entry:
            rep[name] = by_key.setdefault(_computation_key(comp, rep), name)

    for c in module.computations:
        visit(c.name)
    if all(k == v for k, v in rep.items()):
        return module
    comps = tuple(Computation(c.name, tuple(_redirect_calls(i, rep) for i in c), c.root, c.is_entry, c.line)
                  for c in module.computations if rep[c.name] == c.name)
    return module.with_computations(comps)


# --------------------------------------------------------------------------- constants

def scalar_value(inst: Instruction) -> float | bool | None:
    """The value of a scalar constant, or of a broadcast of one (None otherwise)."""
    if inst.op is not Op.CONSTANT or not isinstance(inst.shape, ArrayShape) or inst.shape.rank:
        return None
    text = str(inst.attr("literal")).strip()
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text)
    except ValueError:
        return None


def _splat(rw: _Rewriter, name: str) -> float | bool | None:
    """The value every element of `name` has, when it is a scalar constant or a broadcast of one."""
    inst = rw.inst(name)
    if inst.op is Op.BROADCAST:
        inst = rw.inst(inst.operands[0])
    return scalar_value(inst)


#: results bigger than this are not materialized by constant folding
FOLD_MAX_ELEMENTS = 1024


def _fold(inst: Instruction, rw: _Rewriter) -> Instruction | None:
    from .interp import evaluate
    from .literal import format_literal
    operands = [rw.inst(o) for o in dict.fromkeys(inst.operands)]
    entry = Computation("__fold_entry", tuple(operands) + (inst,), inst.name, is_entry=True)
    comps = tuple(c for c in rw.module.computations if not c.is_entry) + (entry,)
    try:
        (value,) = evaluate(rw.module.with_computations(comps, entry.name), ())
        text = format_literal(np.asarray(value).reshape(inst.array_shape.dims), inst.array_shape.dtype)
    except (HlotuneError, NotImplementedError):
        return None
    return Instruction(inst.name, Op.CONSTANT, inst.shape, (), make_attrs({"literal": text}))


def _foldable(inst: Instruction, rw: _Rewriter) -> bool:
    if inst.op in (Op.PARAMETER, Op.CONSTANT, Op.CUSTOM_CALL, Op.CALL, Op.FUSION, Op.TUPLE) or not inst.operands:
        return False
    if not isinstance(inst.shape, ArrayShape) or inst.shape.size > FOLD_MAX_ELEMENTS:
        return False
    if inst.op is Op.BROADCAST and rw.inst(inst.operands[0]).shape.rank == 0:
        return False  # broadcasts of scalars stay broadcasts
    return all(rw.inst(o).op is Op.CONSTANT for o in inst.operands)


def constant_folding(module: Module) -> Module:
    """Evaluate instructions whose operands are all constants (results up to FOLD_MAX_ELEMENTS
    elements; a broadcast of a scalar stays a broadcast)."""
    def rule(inst: Instruction, rw: _Rewriter):
        return _fold(inst, rw) if _foldable(inst, rw) else None
    return rewrite_computations(module, rule)


# --------------------------------------------------------------------------- algebraic rules

def _identity_if(cond: bool, inst: Instruction, operand: str, rw: _Rewriter) -> str | None:
    return operand if cond and _same_value_shape(rw.inst(operand).shape, inst.shape) else None


def _binary_identity(left_unit: float | None, right_unit: float | None) -> Rule:
    """x op unit -> x (and unit op x -> x when left_unit is given)."""
    def rule(inst: Instruction, rw: _Rewriter):
        a, b = inst.operands
        if right_unit is not None and _splat(rw, b) == right_unit:
            return _identity_if(True, inst, a, rw)
        if left_unit is not None and _splat(rw, a) == left_unit:
            return _identity_if(True, inst, b, rw)
        return None
    return rule


def _same_operands(inst: Instruction, rw: _Rewriter):
    a, b = inst.operands
    return _identity_if(a == b, inst, a, rw)


def _negate(inst: Instruction, rw: _Rewriter):
    inner = rw.inst(inst.operands[0])
    return _identity_if(inner.op is Op.NEGATE, inst, inner.operands[0] if inner.operands else "", rw)


def _transpose(inst: Instruction, rw: _Rewriter):
    perm = tuple(inst.attr("dimensions"))
    x = inst.operands[0]
    if perm == tuple(range(len(perm))):
        return _identity_if(True, inst, x, rw)
    inner = rw.inst(x)
    if inner.op is Op.TRANSPOSE:
        p1 = tuple(inner.attr("dimensions"))
        composed = tuple(p1[p] for p in perm)
        if composed == tuple(range(len(perm))):
            return _identity_if(True, inst, inner.operands[0], rw)
        return inst.replace(operands=inner.operands).with_attrs(dimensions=composed)
    return None


def _reshape(inst: Instruction, rw: _Rewriter):
    x = inst.operands[0]
    inner = rw.inst(x)
    if _same_value_shape(inner.shape, inst.shape):
        return x
    if inner.op is Op.RESHAPE:
        if _same_value_shape(rw.inst(inner.operands[0]).shape, inst.shape):
            return inner.operands[0]
        return inst.replace(operands=inner.operands)
    if inner.op is Op.BROADCAST and rw.inst(inner.operands[0]).shape.rank == 0:
        return inst.replace(op=Op.BROADCAST, operands=inner.operands).with_attrs(dimensions=())
    return None


def _broadcast(inst: Instruction, rw: _Rewriter):
    x = inst.operands[0]
    dims = tuple(inst.attr("dimensions", ()))
    inner = rw.inst(x)
    if dims == tuple(range(inst.array_shape.rank)) and _same_value_shape(inner.shape, inst.shape):
        return x
    if inner.op is Op.BROADCAST:
        d1 = tuple(inner.attr("dimensions", ()))
        return inst.replace(operands=inner.operands).with_attrs(dimensions=tuple(dims[d] for d in d1))
    return None


_EXACT_WIDENING = {
    DType.F16: {DType.F32, DType.F64}, DType.BF16: {DType.F32, DType.F64}, DType.F32: {DType.F64},
    DType.S8: {DType.S32, DType.S64, DType.F32, DType.F64}, DType.S32: {DType.S64, DType.F64},
    DType.U8: {DType.S32, DType.S64, DType.U32, DType.F32, DType.F64}, DType.U32: {DType.S64, DType.F64},
    DType.PRED: {DType.S8, DType.S32, DType.S64, DType.U8, DType.U32, DType.F32, DType.F64},
}


def _convert(inst: Instruction, rw: _Rewriter):
    x = inst.operands[0]
    inner = rw.inst(x)
    if _same_value_shape(inner.shape, inst.shape):
        return x
    if inner.op is Op.CONVERT:
        src = rw.inst(inner.operands[0])
        mid = inner.array_shape.dtype
        if src.array_shape.dtype == inst.array_shape.dtype and mid in _EXACT_WIDENING.get(src.array_shape.dtype, ()):
            return inner.operands[0]
    return None


def _slice(inst: Instruction, rw: _Rewriter):
    x = inst.operands[0]
    dims = rw.inst(x).array_shape.dims
    full = tuple((0, d, 1) for d in dims)
    return _identity_if(tuple(tuple(s) for s in inst.attr("slice")) == full, inst, x, rw)


def _select(inst: Instruction, rw: _Rewriter):
    pred, on_true, on_false = inst.operands
    if on_true == on_false:
        return _identity_if(True, inst, on_true, rw)
    v = _splat(rw, pred)
    if v is None:
        return None
    return _identity_if(True, inst, on_true if v else on_false, rw)


def _layout_identity(inst: Instruction, rw: _Rewriter):
    """bitcast/copy to the very same shape and layout (or default layouts) -> the operand."""
    x = inst.operands[0]
    s = rw.inst(x).shape
    same = s == inst.shape or (_same_value_shape(s, inst.shape) and _default_layout(s) and _default_layout(inst.shape))
    return x if same else None


def _pad(inst: Instruction, rw: _Rewriter):
    x = inst.operands[0]
    return _identity_if(all(tuple(p) == (0, 0, 0) for p in inst.attr("padding")), inst, x, rw)


def _concatenate(inst: Instruction, rw: _Rewriter):
    return _identity_if(len(inst.operands) == 1, inst, inst.operands[0], rw)


#: constant float exponents that `_power` turns into multiplies (n: x**n with at most two roundings)
POWER_BY_MULTIPLY = (0.0, 1.0, 2.0, 3.0, 4.0, -1.0)


def _power(inst: Instruction, rw: _Rewriter):
    """power(x, c) for a splat constant c in POWER_BY_MULTIPLY (float types): 1, x, x*x, (x*x)*x, (x*x)*(x*x),
    1/x.  Exact where pow is (0, 1, 2, -1: one correctly rounded op, C99 special cases included); 3 and 4
    round twice (under 2 ulp; x*x can only overflow or underflow where x**3, x**4 do too)."""
    x, c = inst.operands
    n = _splat(rw, c)
    s = inst.shape
    if not isinstance(s, ArrayShape) or not s.dtype.is_float or isinstance(n, bool) or n not in POWER_BY_MULTIPLY:
        return None
    if n == 1.0:
        return _identity_if(True, inst, x, rw)
    if n == 0.0:
        return _splat_of(rw, inst.name, 1.0, s)
    if n == -1.0:
        return inst.replace(op=Op.DIVIDE, operands=(_splat_of(rw, inst.name, 1.0, s), x))
    if n == 2.0:
        return inst.replace(op=Op.MULTIPLY, operands=(x, x))
    sq = rw.add(inst.name, Op.MULTIPLY, s, (x, x))
    return inst.replace(op=Op.MULTIPLY, operands=(sq, x if n == 3.0 else sq))


ALGEBRAIC_RULES: dict[Op, Rule] = {
    Op.ADD: _binary_identity(0.0, 0.0),
    Op.SUBTRACT: _binary_identity(None, 0.0),
    Op.MULTIPLY: _binary_identity(1.0, 1.0),
    Op.DIVIDE: _binary_identity(None, 1.0),
    Op.POWER: _power,
    Op.MAXIMUM: _same_operands,
    Op.MINIMUM: _same_operands,
    Op.AND: _same_operands,
    Op.OR: _same_operands,
    Op.NEGATE: _negate,
    Op.TRANSPOSE: _transpose,
    Op.RESHAPE: _reshape,
    Op.BROADCAST: _broadcast,
    Op.CONVERT: _convert,
    Op.SLICE: _slice,
    Op.SELECT: _select,
    Op.BITCAST: _layout_identity,
    Op.COPY: _layout_identity,
    Op.PAD: _pad,
    Op.CONCATENATE: _concatenate,
}


def algebraic_simplify(module: Module) -> Module:
    """Apply ALGEBRAIC_RULES (x*1, x+0, transpose of transpose, identity reshape, ...) everywhere."""
    def rule(inst: Instruction, rw: _Rewriter):
        f = ALGEBRAIC_RULES.get(inst.op)
        return f(inst, rw) if f is not None else None
    return rewrite_computations(module, rule)


# --------------------------------------------------------------------------- tuples

def simplify_tuples(module: Module) -> Module:
    """get-tuple-element(tuple(a, b), 1) -> b; tuple(gte(t,0), ..., gte(t,n-1)) -> t."""
    def rule(inst: Instruction, rw: _Rewriter):
        if inst.op is Op.GET_TUPLE_ELEMENT:
            t = rw.inst(inst.operands[0])
            if t.op is Op.TUPLE:
                return t.operands[inst.attr("index")]
        elif inst.op is Op.TUPLE and inst.operands:
            parts = [rw.inst(o) for o in inst.operands]
            if all(p.op is Op.GET_TUPLE_ELEMENT for p in parts):
                src = parts[0].operands[0]
                shape = rw.inst(src).shape
                if (all(p.operands[0] == src and p.attr("index") == k for k, p in enumerate(parts))
                        and isinstance(shape, TupleShape) and len(shape.elements) == len(parts)):
                    return src
        return None
    return rewrite_computations(module, rule)


# --------------------------------------------------------------------------- custom calls

def _const(rw: _Rewriter, base: str, value: float, dtype: DType) -> str:
    from .literal import format_literal
    text = format_literal(np.asarray(value, dtype=dtype.np), dtype)
    return rw.add(base, Op.CONSTANT, ArrayShape(dtype, ()), literal=text)


def _splat_of(rw: _Rewriter, base: str, value: float, shape: ArrayShape) -> str:
    return rw.add(base, Op.BROADCAST, shape, (_const(rw, base, value, shape.dtype),), dimensions=())


def _scaled(rw: _Rewriter, base: str, x: str, scale: float, shape: ArrayShape) -> str:
    if scale == 1.0:
        return x
    return rw.add(base, Op.MULTIPLY, shape, (x, _splat_of(rw, base, scale, shape)))


def _gelu(rw: _Rewriter, b: str, x: str, s: ArrayShape) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh approximation cuBLAS/cuDNN use."""
    x3 = rw.add(b, Op.MULTIPLY, s, (rw.add(b, Op.MULTIPLY, s, (x, x)), x))
    inner = rw.add(b, Op.ADD, s, (x, _scaled(rw, b, x3, 0.044715, s)))
    t = rw.add(b, Op.TANH, s, (_scaled(rw, b, inner, float(np.sqrt(2.0 / np.pi)), s),))
    one_plus = rw.add(b, Op.ADD, s, (t, _splat_of(rw, b, 1.0, s)))
    return _scaled(rw, b, rw.add(b, Op.MULTIPLY, s, (x, one_plus)), 0.5, s)


def _positive(rw: _Rewriter, b: str, x: str, s: ArrayShape) -> str:
    return rw.add(b, Op.COMPARE, s.with_dtype(DType.PRED), (x, _splat_of(rw, b, 0.0, s)), direction="GT")


#: activation name -> builder (rewriter, base name, value, shape, leaky alpha) -> name of the result
ACTIVATIONS: dict[str, Callable[..., str]] = {
    "relu": lambda rw, b, x, s, a: rw.add(b, Op.MAXIMUM, s, (x, _splat_of(rw, b, 0.0, s))),
    "relu6": lambda rw, b, x, s, a: rw.add(b, Op.CLAMP, s, (_splat_of(rw, b, 0.0, s), x, _splat_of(rw, b, 6.0, s))),
    "tanh": lambda rw, b, x, s, a: rw.add(b, Op.TANH, s, (x,)),
    "sigmoid": lambda rw, b, x, s, a: rw.add(b, Op.LOGISTIC, s, (x,)),
    "elu": lambda rw, b, x, s, a: rw.add(b, Op.SELECT, s, (_positive(rw, b, x, s), x,
                                                           rw.add(b, Op.EXPM1, s, (x,)))),
    "leaky_relu": lambda rw, b, x, s, a: rw.add(b, Op.SELECT, s, (_positive(rw, b, x, s), x,
                                                                  _scaled(rw, b, x, a, s))),
    "gelu": lambda rw, b, x, s, a: _gelu(rw, b, x, s),
}


def _bias_add(rw: _Rewriter, b: str, x: str, bias: str, dim: int, s: ArrayShape) -> str:
    bb = rw.add(b, Op.BROADCAST, ArrayShape(s.dtype, s.dims), (bias,), dimensions=(dim,))
    return rw.add(b, Op.ADD, s, (x, bb))


def _lower_gemm(inst: Instruction, spec, rw: _Rewriter, s: ArrayShape) -> str:
    b = inst.name
    ops = inst.operands
    y = rw.add(b + ".dot", Op.DOT, s, ops[:2], lhs_batch_dims=spec.lhs_batch_dims,
               rhs_batch_dims=spec.rhs_batch_dims, lhs_contracting_dims=spec.lhs_contracting_dims,
               rhs_contracting_dims=spec.rhs_contracting_dims)
    y = _scaled(rw, b, y, spec.alpha, s)
    if spec.c_operand is not None:
        y = rw.add(b, Op.ADD, s, (y, _scaled(rw, b, ops[spec.c_operand], spec.beta, s)))
    if spec.bias_operand is not None:
        y = _bias_add(rw, b, y, ops[spec.bias_operand], s.rank - 1, s)
    if spec.activation is not None:
        y = ACTIVATIONS[spec.activation](rw, b, y, s, 0.0)
    return y


def _lower_conv(inst: Instruction, spec, rw: _Rewriter, s: ArrayShape) -> str:
    b = inst.name
    ops = inst.operands
    y = rw.add(b + ".conv", Op.CONVOLUTION, s, ops[:2], window=spec.window, dim_labels=spec.dim_labels,
               feature_group_count=spec.feature_group_count, batch_group_count=spec.batch_group_count)
    y = _scaled(rw, b, y, spec.conv_result_scale, s)
    if spec.side_input_operand is not None and spec.side_input_scale != 0.0:
        y = rw.add(b, Op.ADD, s, (y, _scaled(rw, b, ops[spec.side_input_operand], spec.side_input_scale, s)))
    if spec.bias_operand is not None:
        y = _bias_add(rw, b, y, ops[spec.bias_operand], spec.dim_labels.output_feature, s)
    if spec.activation is not None:
        y = ACTIVATIONS[spec.activation](rw, b, y, s, spec.leakyrelu_alpha)
    return y


def legalize_custom_calls(module: Module) -> Module:
    """cuBLAS gemm custom-calls -> dot (+ alpha/beta/bias/activation as ordinary ops), cuDNN conv
    forward -> convolution (+ scale, side input, bias broadcast/add, activation).

    The call returns (result, workspace); every `get-tuple-element(call, index=0)` is redirected to
    the new result.  A call used any other way is left alone."""
    from .custom_calls import ConvSpec, describe_custom_call, result_shape
    from .hlo import CUBLAS_TARGETS, CUDNN_CONV_TARGETS
    targets = CUBLAS_TARGETS | CUDNN_CONV_TARGETS

    def lowerable(inst: Instruction, comp: Computation) -> bool:
        if inst.op is not Op.CUSTOM_CALL or inst.attr("custom_call_target") not in targets:
            return False
        if not isinstance(inst.shape, TupleShape):
            return True
        return all(comp[u].op is Op.GET_TUPLE_ELEMENT and comp[u].attr("index") == 0 for u in comp.users[inst.name])

    def run(comp: Computation) -> Computation:
        results: set[str] = set()

        def rule(inst: Instruction, rw: _Rewriter):
            if inst.op is Op.GET_TUPLE_ELEMENT and inst.operands[0] in results:
                return inst.operands[0]
            if not lowerable(comp[inst.name], comp):
                return None
            spec = describe_custom_call(inst)
            lower = _lower_conv if isinstance(spec, ConvSpec) else _lower_gemm
            y = lower(inst, spec, rw, result_shape(inst))
            if isinstance(inst.shape, TupleShape):
                results.add(y)
            return y
        return rewrite_computation(comp, module, rule)

    comps = tuple(run(c) for c in module.computations)
    return module if comps == module.computations else module.with_computations(comps)


# --------------------------------------------------------------------------- pipeline

def _log(name: str, module: Module) -> Module:
    if config.debug_level() >= 5:
        try:
            from .printer import print_module
            text = print_module(module)
        except ImportError:  # printer not available yet
            text = repr(module)
        config.debug(5, "IR after %s:\n%s", name, text)
    return module


def _topo_all(module: Module) -> Module:
    comps = tuple(topo_sort(c) for c in module.computations)
    return module if comps == module.computations else module.with_computations(comps)


#: the simplification steps iterated to a fixed point
SIMPLIFY_STEPS: tuple[tuple[str, Callable[[Module], Module]], ...] = (
    ("simplify_tuples", simplify_tuples),
    ("algebraic_simplify", algebraic_simplify),
    ("constant_folding", constant_folding),
    ("dedupe_computations", dedupe_computations),
    ("cse", cse),
    ("dce", dce),
)
MAX_ROUNDS = 10


def optimize(module: Module) -> Module:
    """The pass pipeline: order, inline calls, legalize custom-calls, then simplify until nothing changes."""
    m = _log("topo_sort", _topo_all(module))
    m = _log("inline_calls", inline_calls(m))
    m = _log("legalize_custom_calls", legalize_custom_calls(m))
    for _ in range(MAX_ROUNDS):
        before = m
        for name, step in SIMPLIFY_STEPS:
            m = _log(name, step(m))
        if m == before:
            break
    return m
