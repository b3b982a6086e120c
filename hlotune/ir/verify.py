"""Shape inference and module verification.

Map:
  infer_shape(inst, operand_shapes, module)   the shape `inst` must have, by a rule table keyed by Op
  verify_module(m)                            every instruction checked; returns m or raises ShapeError
  _RULES, _ARITY                              Op -> inference rule, Op -> (min, max) operand count
  _elementwise, _dot, _convolution, ...       the rules (each checks its attributes and operands)

Every failure is a ShapeError naming the instruction (op=name, line=its source line) and what
disagreed.  Layouts never take part in comparisons.  Where XLA lets the declared shape choose
(dot/convolution result element type, convert, bitcast, iota, parameter, constant, custom-call)
the declared element type is taken and the rest is checked.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import HlotuneError, ShapeError
from .hlo import (
    COMPARE_DIRECTIONS,
    ArrayShape,
    Computation,
    DType,
    Instruction,
    Module,
    Op,
    Shape,
    TupleShape,
    Window,
)
from .literal import parse_literal

Rule = Callable[[Instruction, tuple[Shape, ...], "Module | None"], Shape]

_FLOAT_ONLY = frozenset({
    Op.ATAN2, Op.CEIL, Op.COSINE, Op.ERF, Op.EXP, Op.EXPM1, Op.FLOOR, Op.IS_FINITE, Op.LOG, Op.LOG1P,
    Op.LOGISTIC, Op.ROUND_NEAREST_EVEN, Op.RSQRT, Op.SINE, Op.SQRT, Op.TANH,
})
_INT_OR_PRED = frozenset({Op.AND, Op.OR, Op.XOR, Op.NOT})


def _fail(inst: Instruction, msg: str) -> ShapeError:
    return ShapeError(f"{inst.op.value} '{inst.name}': {msg}", line=inst.line, op=inst.name)


def strip_layout(shape: Shape) -> Shape:
    """The shape without layouts (what comparisons use)."""
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(strip_layout(e) for e in shape.elements))
    return shape if shape.layout is None else ArrayShape(shape.dtype, shape.dims)


def same_shape(a: Shape, b: Shape) -> bool:
    """Equal dims and element types (layouts ignored)."""
    return strip_layout(a) == strip_layout(b)


def _show(shape: Shape) -> str:
    return str(strip_layout(shape))


# ---- small helpers ---------------------------------------------------------------------------
def _array(inst: Instruction, shape: Shape, what: str) -> ArrayShape:
    if not isinstance(shape, ArrayShape):
        raise _fail(inst, f"{what} must be an array but is {_show(shape)}")
    return shape


def _arrays(inst: Instruction, shapes: tuple[Shape, ...]) -> list[ArrayShape]:
    return [_array(inst, s, f"operand {k}") for k, s in enumerate(shapes)]


def _declared(inst: Instruction) -> ArrayShape:
    return _array(inst, inst.shape, "the result")


def _attr(inst: Instruction, key: str, kind: type | tuple[type, ...]):
    v = inst.attr(key)
    if v is None:
        raise _fail(inst, f"missing attribute '{key}'")
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise _fail(inst, f"attribute '{key}' has a value of the wrong type: {v!r}")
    return v


def _ints(inst: Instruction, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
    if default is not None and inst.attr(key) is None:
        return default
    v = _attr(inst, key, tuple)
    if not all(isinstance(x, int) for x in v):
        raise _fail(inst, f"attribute '{key}' must hold integers: {v!r}")
    return v


def _dims_in_range(inst: Instruction, dims: tuple[int, ...], rank: int, key: str, distinct: bool = True) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise _fail(inst, f"{key}={{{','.join(map(str, dims))}}} has {d}, out of range for rank {rank}")
    if distinct and len(set(dims)) != len(dims):
        raise _fail(inst, f"{key}={{{','.join(map(str, dims))}}} repeats a dimension")


def _callee(inst: Instruction, module: Module | None, key: str) -> Computation | None:
    name = inst.attr(key)
    if name is None:
        raise _fail(inst, f"missing attribute '{key}'")
    if module is None:
        return None
    if not isinstance(name, str) or name not in module.by_name:
        raise _fail(inst, f"calls computation '{name}', which does not exist")
    return module.by_name[name]


def _check_params(inst: Instruction, comp: Computation, shapes: tuple[Shape, ...]) -> None:
    params = comp.parameters
    if len(params) != len(shapes):
        raise _fail(inst, f"passes {len(shapes)} operands to '{comp.name}', which has {len(params)} parameters")
    for k, (p, s) in enumerate(zip(params, shapes)):
        if not same_shape(p.shape, s):
            raise _fail(inst, f"operand {k} is {_show(s)} but parameter {k} of '{comp.name}' is {_show(p.shape)}")


def _root_shape(inst: Instruction, comp: Computation) -> Shape:
    if comp.root not in comp.by_name:
        raise _fail(inst, f"computation '{comp.name}' has no root '{comp.root}'")
    return comp.by_name[comp.root].shape


# ---- rules -----------------------------------------------------------------------------------
def _elementwise(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    arrs = _arrays(inst, shapes)
    first = arrs[0]
    for k, a in enumerate(arrs[1:], 1):
        if a.dims != first.dims or a.dtype != first.dtype:
            raise _fail(inst, f"operand {k} is {_show(a)} but operand 0 is {_show(first)}")
    if inst.op in _FLOAT_ONLY and not first.dtype.is_float:
        raise _fail(inst, f"needs floating-point operands, got {first.dtype}")
    if inst.op in _INT_OR_PRED and first.dtype.is_float:
        raise _fail(inst, f"needs integer or pred operands, got {first.dtype}")
    dtype = DType.PRED if inst.op is Op.IS_FINITE else first.dtype
    return ArrayShape(dtype, first.dims)


def _compare(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    d = inst.attr("direction")
    if d not in COMPARE_DIRECTIONS:
        raise _fail(inst, f"direction must be one of {', '.join(COMPARE_DIRECTIONS)}, got {d!r}")
    a, b = _arrays(inst, shapes)
    if a.dims != b.dims or a.dtype != b.dtype:
        raise _fail(inst, f"compares {_show(a)} with {_show(b)}")
    return ArrayShape(DType.PRED, a.dims)


def _select(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    p, t, f = _arrays(inst, shapes)
    if p.dtype is not DType.PRED:
        raise _fail(inst, f"predicate must be pred, got {p.dtype}")
    if t.dims != f.dims or t.dtype != f.dtype:
        raise _fail(inst, f"on_true {_show(t)} and on_false {_show(f)} differ")
    if p.dims not in ((), t.dims):
        raise _fail(inst, f"predicate {_show(p)} does not match {_show(t)}")
    return ArrayShape(t.dtype, t.dims)


def _clamp(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    lo, x, hi = _arrays(inst, shapes)
    for name, b in (("min", lo), ("max", hi)):
        if b.dtype != x.dtype or b.dims not in ((), x.dims):
            raise _fail(inst, f"{name} {_show(b)} does not match operand {_show(x)}")
    return ArrayShape(x.dtype, x.dims)


def _convert(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    return ArrayShape(_declared(inst).dtype, a.dims)


def _bitcast(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    out = _declared(inst)
    if a.size * a.dtype.bits != out.size * out.dtype.bits:
        raise _fail(inst, f"bitcast from {_show(a)} to {_show(out)} changes the number of bits")
    return out


def _parameter(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    n = _attr(inst, "parameter_number", int)
    if n < 0:
        raise _fail(inst, f"negative parameter number {n}")
    return inst.shape


def _constant(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    out = _declared(inst)
    text = _attr(inst, "literal", str)
    try:
        parse_literal(text, out)
    except HlotuneError as e:
        raise _fail(inst, e.message) from None
    return out


def _iota(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    out = _declared(inst)
    d = _attr(inst, "iota_dimension", int)
    _dims_in_range(inst, (d,), out.rank, "iota_dimension")
    return out


def _broadcast(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    out = _declared(inst)
    dims = _ints(inst, "dimensions")
    if len(dims) != a.rank:
        raise _fail(inst, f"dimensions has {len(dims)} entries but the operand has rank {a.rank}")
    _dims_in_range(inst, dims, out.rank, "dimensions")
    for k, d in enumerate(dims):
        if out.dims[d] != a.dims[k]:
            raise _fail(inst, f"operand dimension {k} ({a.dims[k]}) maps to result dimension {d} ({out.dims[d]})")
    return ArrayShape(a.dtype, out.dims)


def _reshape(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    out = _declared(inst)
    if a.size != out.size:
        raise _fail(inst, f"reshape of {_show(a)} ({a.size} elements) to {out.dims} ({out.size} elements)")
    return ArrayShape(a.dtype, out.dims)


def _transpose(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    perm = _ints(inst, "dimensions")
    if len(perm) != a.rank:
        raise _fail(inst, f"dimensions has {len(perm)} entries but the operand has rank {a.rank}")
    _dims_in_range(inst, perm, a.rank, "dimensions")
    return ArrayShape(a.dtype, tuple(a.dims[p] for p in perm))


def _same_as_operand(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    return ArrayShape(a.dtype, a.dims)


def _reverse(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    _dims_in_range(inst, _ints(inst, "dimensions"), a.rank, "dimensions")
    return ArrayShape(a.dtype, a.dims)


def _slice(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (a,) = _arrays(inst, shapes)
    sl = _attr(inst, "slice", tuple)
    if len(sl) != a.rank:
        raise _fail(inst, f"slice has {len(sl)} entries but the operand has rank {a.rank}")
    out = []
    for k, (start, limit, stride) in enumerate(sl):
        if not (0 <= start <= limit <= a.dims[k]) or stride < 1:
            raise _fail(inst, f"slice [{start}:{limit}:{stride}] does not fit dimension {k} of size {a.dims[k]}")
        out.append((limit - start + stride - 1) // stride)
    return ArrayShape(a.dtype, tuple(out))


def _scalar_indices(inst: Instruction, shapes: list[ArrayShape], rank: int, first: int) -> None:
    idx = shapes[first:]
    if len(idx) != rank:
        raise _fail(inst, f"needs {rank} start indices, got {len(idx)}")
    for k, s in enumerate(idx):
        if s.rank != 0 or not s.dtype.is_int:
            raise _fail(inst, f"start index {k} must be an integer scalar, got {_show(s)}")


def _dynamic_slice(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    arrs = _arrays(inst, shapes)
    a = arrs[0]
    _scalar_indices(inst, arrs, a.rank, 1)
    sizes = _ints(inst, "dynamic_slice_sizes")
    if len(sizes) != a.rank or any(not 0 <= s <= d for s, d in zip(sizes, a.dims)):
        raise _fail(inst, f"dynamic_slice_sizes {sizes} do not fit operand {_show(a)}")
    return ArrayShape(a.dtype, sizes)


def _dynamic_update_slice(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    arrs = _arrays(inst, shapes)
    a, u = arrs[0], arrs[1]
    _scalar_indices(inst, arrs, a.rank, 2)
    if u.rank != a.rank or u.dtype != a.dtype or any(x > y for x, y in zip(u.dims, a.dims)):
        raise _fail(inst, f"update {_show(u)} does not fit operand {_show(a)}")
    return ArrayShape(a.dtype, a.dims)


def _concatenate(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    arrs = _arrays(inst, shapes)
    dims = _ints(inst, "dimensions")
    first = arrs[0]
    if len(dims) != 1:
        raise _fail(inst, f"dimensions must hold one dimension, got {dims}")
    (d,) = dims
    _dims_in_range(inst, dims, first.rank, "dimensions")
    total = 0
    for k, a in enumerate(arrs):
        other = a.dims[:d] + a.dims[d + 1:]
        if a.rank != first.rank or a.dtype != first.dtype or other != first.dims[:d] + first.dims[d + 1:]:
            raise _fail(inst, f"operand {k} {_show(a)} does not match operand 0 {_show(first)} outside dimension {d}")
        total += a.dims[d]
    return ArrayShape(first.dtype, first.dims[:d] + (total,) + first.dims[d + 1:])


def _pad(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    a, v = _arrays(inst, shapes)
    if v.rank != 0 or v.dtype != a.dtype:
        raise _fail(inst, f"padding value must be a {a.dtype} scalar, got {_show(v)}")
    cfg = _attr(inst, "padding", tuple)
    if len(cfg) != a.rank:
        raise _fail(inst, f"padding has {len(cfg)} dimensions but the operand has rank {a.rank}")
    out = []
    for k, (lo, hi, interior) in enumerate(cfg):
        n = a.dims[k]
        size = lo + hi + n + max(n - 1, 0) * interior
        if interior < 0 or size < 0:
            raise _fail(inst, f"padding {lo}_{hi}_{interior} of dimension {k} (size {n}) is invalid")
        out.append(size)
    return ArrayShape(a.dtype, tuple(out))


def _get_tuple_element(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    (t,) = shapes
    if not isinstance(t, TupleShape):
        raise _fail(inst, f"operand must be a tuple, got {_show(t)}")
    k = _attr(inst, "index", int)
    if not 0 <= k < len(t.elements):
        raise _fail(inst, f"index {k} is out of range for a tuple of {len(t.elements)}")
    return t.elements[k]


def _tuple(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    return TupleShape(tuple(shapes))


def _call(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    key = "calls" if inst.op is Op.FUSION else "to_apply"
    comp = _callee(inst, module, key)
    if comp is None:
        return inst.shape
    _check_params(inst, comp, shapes)
    return _root_shape(inst, comp)


def _custom_call(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    for key in ("to_apply", "calls"):
        if inst.has(key):
            _callee(inst, module, key)
    return inst.shape


def _dot(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    lhs, rhs = _arrays(inst, shapes)
    lb, rb = _ints(inst, "lhs_batch_dims", ()), _ints(inst, "rhs_batch_dims", ())
    lc, rc = _ints(inst, "lhs_contracting_dims", ()), _ints(inst, "rhs_contracting_dims", ())
    _dims_in_range(inst, lb + lc, lhs.rank, "lhs batch+contracting dims")
    _dims_in_range(inst, rb + rc, rhs.rank, "rhs batch+contracting dims")
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise _fail(inst, "lhs and rhs have different numbers of batch or contracting dimensions")
    for kind, ld, rd in (("batch", lb, rb), ("contracting", lc, rc)):
        for x, y in zip(ld, rd):
            if lhs.dims[x] != rhs.dims[y]:
                raise _fail(inst, f"{kind} dimension lhs {x} ({lhs.dims[x]}) != rhs {y} ({rhs.dims[y]})")
    lfree = [lhs.dims[k] for k in range(lhs.rank) if k not in lb and k not in lc]
    rfree = [rhs.dims[k] for k in range(rhs.rank) if k not in rb and k not in rc]
    dims = tuple(lhs.dims[k] for k in lb) + tuple(lfree) + tuple(rfree)
    return ArrayShape(_declared(inst).dtype, dims)


def _window_out(inst: Instruction, size: int, w, k: int) -> int:
    if w.size < 1 or w.stride < 1 or w.lhs_dilate < 1 or w.rhs_dilate < 1:
        raise _fail(inst, f"window dimension {k} has a size, stride or dilation below 1")
    padded = (size - 1) * w.lhs_dilate + 1 + w.pad_lo + w.pad_hi if size > 0 else w.pad_lo + w.pad_hi
    span = (w.size - 1) * w.rhs_dilate + 1
    return 0 if padded < span else (padded - span) // w.stride + 1


def _convolution(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    x, k = _arrays(inst, shapes)
    cd = inst.attr("dim_labels")
    if cd is None or not hasattr(cd, "input_spatial"):
        raise _fail(inst, "missing attribute 'dim_labels'")
    ns = len(cd.input_spatial)
    if x.rank != ns + 2 or k.rank != ns + 2:
        raise _fail(inst, f"dim_labels {cd.text} need rank {ns + 2} operands, got {_show(x)} and {_show(k)}")
    win = inst.attr("window", Window(()))
    if not isinstance(win, Window) or len(win.dims) != ns:
        raise _fail(inst, f"window has {len(getattr(win, 'dims', ()))} dimensions, dim_labels have {ns}")
    g = inst.attr("feature_group_count", 1)
    b = inst.attr("batch_group_count", 1)
    if not isinstance(g, int) or not isinstance(b, int) or g < 1 or b < 1:
        raise _fail(inst, "feature_group_count and batch_group_count must be positive")
    cin, kin, kout = x.dims[cd.input_feature], k.dims[cd.kernel_input_feature], k.dims[cd.kernel_output_feature]
    if cin != kin * g:
        raise _fail(inst, f"input features {cin} != kernel input features {kin} x feature_group_count {g}")
    if kout % g or kout % b or x.dims[cd.input_batch] % b:
        raise _fail(inst, f"kernel output features {kout} / batch {x.dims[cd.input_batch]} not divisible by groups")
    out = [0] * (ns + 2)
    out[cd.output_batch] = x.dims[cd.input_batch] // b
    out[cd.output_feature] = kout
    for s in range(ns):
        wd = win.dims[s]
        if wd.size != k.dims[cd.kernel_spatial[s]]:
            raise _fail(inst, f"window size {wd.size} != kernel spatial dimension {s} ({k.dims[cd.kernel_spatial[s]]})")
        out[cd.output_spatial[s]] = _window_out(inst, x.dims[cd.input_spatial[s]], wd, s)
    return ArrayShape(_declared(inst).dtype, tuple(out))


def _reducer(inst: Instruction, module: Module | None, inits: list[ArrayShape]) -> None:
    comp = _callee(inst, module, "to_apply")
    if comp is None:
        return
    n = len(inits)
    if len(comp.parameters) != 2 * n:
        raise _fail(inst, f"reducer '{comp.name}' has {len(comp.parameters)} parameters, needs {2 * n}")
    root = _root_shape(inst, comp)
    want: Shape = inits[0] if n == 1 else TupleShape(tuple(inits))
    if not same_shape(root, want):
        raise _fail(inst, f"reducer '{comp.name}' returns {_show(root)}, needs {_show(want)}")


def _split_inputs(inst: Instruction, shapes: tuple[Shape, ...]) -> tuple[list[ArrayShape], list[ArrayShape]]:
    arrs = _arrays(inst, shapes)
    if len(arrs) % 2:
        raise _fail(inst, f"needs as many init values as inputs, got {len(arrs)} operands")
    n = len(arrs) // 2
    ins, inits = arrs[:n], arrs[n:]
    for k, (a, v) in enumerate(zip(ins, inits)):
        if v.rank != 0 or v.dtype != a.dtype:
            raise _fail(inst, f"init value {k} must be a {a.dtype} scalar, got {_show(v)}")
        if a.dims != ins[0].dims:
            raise _fail(inst, f"input {k} {_show(a)} differs in dimensions from input 0 {_show(ins[0])}")
    return ins, [ArrayShape(v.dtype, ()) for v in inits]


def _pack(outs: list[ArrayShape]) -> Shape:
    return outs[0] if len(outs) == 1 else TupleShape(tuple(outs))


def _reduce(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    ins, inits = _split_inputs(inst, shapes)
    dims = _ints(inst, "dimensions")
    _dims_in_range(inst, dims, ins[0].rank, "dimensions")
    _reducer(inst, module, inits)
    kept = tuple(d for k, d in enumerate(ins[0].dims) if k not in dims)
    return _pack([ArrayShape(a.dtype, kept) for a in ins])


def _reduce_window(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    ins, inits = _split_inputs(inst, shapes)
    win = _attr(inst, "window", Window)
    rank = ins[0].rank
    if len(win.dims) != rank:
        raise _fail(inst, f"window has {len(win.dims)} dimensions but the input has rank {rank}")
    _reducer(inst, module, inits)
    dims = tuple(_window_out(inst, ins[0].dims[k], win.dims[k], k) for k in range(rank))
    return _pack([ArrayShape(a.dtype, dims) for a in ins])


def _gather(inst: Instruction, shapes: tuple[Shape, ...], module: Module | None) -> Shape:
    a, idx = _arrays(inst, shapes)
    if not idx.dtype.is_int:
        raise _fail(inst, f"start indices must be integers, got {idx.dtype}")
    offset_dims = _ints(inst, "offset_dims")
    collapsed = _ints(inst, "collapsed_slice_dims", ())
    start_map = _ints(inst, "start_index_map")
    sizes = _ints(inst, "slice_sizes")
    obatch = _ints(inst, "operand_batching_dims", ())
    ivd = _attr(inst, "index_vector_dim", int)
    if not 0 <= ivd <= idx.rank:
        raise _fail(inst, f"index_vector_dim {ivd} is out of range for indices of rank {idx.rank}")
    if len(sizes) != a.rank or any(not 0 <= s <= d for s, d in zip(sizes, a.dims)):
        raise _fail(inst, f"slice_sizes {sizes} do not fit operand {_show(a)}")
    _dims_in_range(inst, collapsed + obatch, a.rank, "collapsed_slice_dims+operand_batching_dims")
    _dims_in_range(inst, start_map, a.rank, "start_index_map")
    if any(sizes[d] > 1 for d in collapsed + obatch):
        raise _fail(inst, "collapsed or batching dimensions must have slice size 1")
    nvec = idx.dims[ivd] if ivd < idx.rank else 1
    if len(start_map) != nvec:
        raise _fail(inst, f"start_index_map has {len(start_map)} entries, index vectors have {nvec}")
    batch = [d for k, d in enumerate(idx.dims) if k != ivd]
    offsets = [s for k, s in enumerate(sizes) if k not in collapsed and k not in obatch]
    rank = len(batch) + len(offsets)
    if len(offset_dims) != len(offsets):
        raise _fail(inst, f"offset_dims has {len(offset_dims)} entries, the slice keeps {len(offsets)} dimensions")
    _dims_in_range(inst, offset_dims, rank, "offset_dims")
    out, bi, oi = [], iter(batch), iter(offsets)
    for k in range(rank):
        out.append(next(oi) if k in offset_dims else next(bi))
    return ArrayShape(a.dtype, tuple(out))


_RULES: dict[Op, Rule] = {
    **{op: _elementwise for op in (
        Op.ABS, Op.CEIL, Op.COSINE, Op.ERF, Op.EXP, Op.EXPM1, Op.FLOOR, Op.IS_FINITE, Op.LOG, Op.LOG1P,
        Op.LOGISTIC, Op.NEGATE, Op.NOT, Op.ROUND_NEAREST_EVEN, Op.RSQRT, Op.SIGN, Op.SINE, Op.SQRT, Op.TANH,
        Op.ADD, Op.AND, Op.ATAN2, Op.DIVIDE, Op.MAXIMUM, Op.MINIMUM, Op.MULTIPLY, Op.OR, Op.POWER,
        Op.REMAINDER, Op.SUBTRACT, Op.XOR)},
    Op.COMPARE: _compare,
    Op.SELECT: _select,
    Op.CLAMP: _clamp,
    Op.CONVERT: _convert,
    Op.BITCAST: _bitcast,
    Op.COPY: _same_as_operand,
    Op.PARAMETER: _parameter,
    Op.CONSTANT: _constant,
    Op.IOTA: _iota,
    Op.BROADCAST: _broadcast,
    Op.RESHAPE: _reshape,
    Op.TRANSPOSE: _transpose,
    Op.REVERSE: _reverse,
    Op.SLICE: _slice,
    Op.DYNAMIC_SLICE: _dynamic_slice,
    Op.DYNAMIC_UPDATE_SLICE: _dynamic_update_slice,
    Op.CONCATENATE: _concatenate,
    Op.PAD: _pad,
    Op.GET_TUPLE_ELEMENT: _get_tuple_element,
    Op.TUPLE: _tuple,
    Op.CALL: _call,
    Op.FUSION: _call,
    Op.CUSTOM_CALL: _custom_call,
    Op.DOT: _dot,
    Op.CONVOLUTION: _convolution,
    Op.REDUCE: _reduce,
    Op.REDUCE_WINDOW: _reduce_window,
    Op.GATHER: _gather,
}

_UNARY = (1, 1)
_ARITY: dict[Op, tuple[int, int | None]] = {
    **{op: _UNARY for op in (
        Op.ABS, Op.CEIL, Op.COSINE, Op.ERF, Op.EXP, Op.EXPM1, Op.FLOOR, Op.IS_FINITE, Op.LOG, Op.LOG1P,
        Op.LOGISTIC, Op.NEGATE, Op.NOT, Op.ROUND_NEAREST_EVEN, Op.RSQRT, Op.SIGN, Op.SINE, Op.SQRT, Op.TANH,
        Op.CONVERT, Op.BITCAST, Op.COPY, Op.BROADCAST, Op.RESHAPE, Op.TRANSPOSE, Op.REVERSE, Op.SLICE,
        Op.GET_TUPLE_ELEMENT)},
    **{op: (2, 2) for op in (
        Op.ADD, Op.AND, Op.ATAN2, Op.DIVIDE, Op.MAXIMUM, Op.MINIMUM, Op.MULTIPLY, Op.OR, Op.POWER,
        Op.REMAINDER, Op.SUBTRACT, Op.XOR, Op.COMPARE, Op.DOT, Op.CONVOLUTION, Op.PAD, Op.GATHER)},
    Op.SELECT: (3, 3),
    Op.CLAMP: (3, 3),
    Op.PARAMETER: (0, 0),
    Op.CONSTANT: (0, 0),
    Op.IOTA: (0, 0),
    Op.DYNAMIC_SLICE: (1, None),
    Op.DYNAMIC_UPDATE_SLICE: (2, None),
    Op.CONCATENATE: (1, None),
    Op.TUPLE: (0, None),
    Op.CALL: (0, None),
    Op.FUSION: (0, None),
    Op.CUSTOM_CALL: (0, None),
    Op.REDUCE: (2, None),
    Op.REDUCE_WINDOW: (2, None),
}


def infer_shape(inst: Instruction, operand_shapes: tuple[Shape, ...], module: Module | None = None) -> Shape:
    """The shape `inst` must have given its operands' shapes (layouts absent).

    `module` resolves called computations (fusion, call, reduce's reducer); without it those
    rules trust the declared shape.  Raises ShapeError naming the instruction.
    """
    operand_shapes = tuple(operand_shapes)
    lo, hi = _ARITY[inst.op]
    n = len(operand_shapes)
    if n < lo or (hi is not None and n > hi):
        want = str(lo) if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
        raise _fail(inst, f"takes {want} operands, got {n}")
    return strip_layout(_RULES[inst.op](inst, operand_shapes, module))


def verify_module(m: Module) -> Module:
    """Check every instruction of every computation; return `m` or raise ShapeError.

    Checks: the entry exists; names are unique; each operand is defined earlier in its
    computation; called computations exist and the call graph has no cycle; parameters are
    numbered 0..n-1; operand counts; declared shape == inferred shape (dims, element type).
    """
    if len(m.by_name) != len(m.computations):
        raise ShapeError(f"module '{m.name}' has two computations with the same name")
    if m.entry not in m.by_name:
        raise ShapeError(f"module '{m.name}' has no entry computation '{m.entry}'")
    for comp in m.computations:
        _verify_computation(comp, m)
    _check_acyclic(m)
    return m


def _verify_computation(comp: Computation, m: Module) -> None:
    shapes: dict[str, Shape] = {}
    numbers: list[int] = []
    for inst in comp.instructions:
        if inst.name in shapes:
            raise _fail(inst, f"second instruction named '{inst.name}' in computation '{comp.name}'")
        for o in inst.operands:
            if o not in shapes:
                where = "later" if o in comp.by_name else "nowhere"
                raise _fail(inst, f"operand '{o}' is not defined before use (defined {where} in '{comp.name}')")
        for callee in inst.called:
            if callee not in m.by_name:
                raise _fail(inst, f"calls computation '{callee}', which does not exist")
        inferred = infer_shape(inst, tuple(shapes[o] for o in inst.operands), m)
        if not same_shape(inferred, inst.shape):
            raise _fail(inst, f"declared shape {_show(inst.shape)} but inferred {_show(inferred)}")
        if inst.op is Op.PARAMETER:
            numbers.append(inst.attr("parameter_number"))
        shapes[inst.name] = inst.shape
    if sorted(numbers) != list(range(len(numbers))):
        raise ShapeError(f"computation '{comp.name}' has parameter numbers {sorted(numbers)}, "
                         f"not 0..{len(numbers) - 1}", line=comp.line)
    if comp.root not in shapes:
        raise ShapeError(f"computation '{comp.name}' has no root instruction '{comp.root}'", line=comp.line)


def _check_acyclic(m: Module) -> None:
    callees = {c.name: {n for i in c.instructions for n in i.called} for c in m.computations}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for start in callees:
        if start in state:
            continue
        stack = [(start, iter(callees[start]))]
        state[start] = 1
        while stack:
            name, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[name] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise ShapeError(f"computation '{nxt}' calls itself (through '{name}')", line=m.by_name[nxt].line)
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(callees[nxt])))
