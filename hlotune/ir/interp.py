"""The reference interpreter: evaluates an HLO module with numpy, following XLA's semantics.

Map:
  evaluate(module, args)              entry computation -> flat tuple of arrays (InputError on bad args)
  evaluate_computation(module, c, a)  one computation -> value (ndarray or nested tuple)
  _Interp                             per-call state: constant cache, plans (order + frees) per computation
  RULES                               Op -> rule(ctx, inst, operands) -> value; one small function per op
  helpers                             rounding (bf16/f16), pad, dot, convolution, gather, combiners

Precision: float ops compute in float64 when the input is float32 or narrower (float16/bfloat16 are
computed in float32 at least) and are rounded to the instruction's type after every op; bf16 values
live in float32 arrays rounded to bfloat16 (nearest even on the upper 16 bits).  Dots, convolutions
and add-reductions accumulate in float64.  Integer division follows XLA: x / 0 = -1 (all ones),
INT_MIN / -1 = INT_MIN, x % 0 = x, INT_MIN % -1 = 0; float -> int converts truncate toward zero,
saturate, and map NaN to 0.

Evaluation is a loop over each computation's instructions (no recursion per instruction; only
calls nest) and frees each value after its last use.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import HlotuneError, InputError, ShapeError, UnsupportedError
from . import custom_calls
from .hlo import (
    ArrayShape,
    Computation,
    ConvDims,
    DType,
    Instruction,
    Module,
    Op,
    Shape,
    TupleShape,
    Window,
    literal_array,
)

Value = Any  # np.ndarray | tuple[Value, ...]


# ----------------------------------------------------------------------------- public API

def evaluate(module: Module, args: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Run the entry computation on `args`; the outputs flattened (tuple leaves in order)."""
    entry = module.entry_computation
    args = _check_args(entry, args)
    out = evaluate_computation(module, entry, args)
    return tuple(_own(a) for a in _leaves(out))


def _own(a: np.ndarray) -> np.ndarray:
    """A writable C-contiguous array (copies views, broadcasts and cached constants)."""
    if a.flags.c_contiguous and a.flags.writeable and a.base is None:
        return a
    return np.array(a, order="C", copy=True)


def evaluate_computation(module: Module, comp: Computation, args: Sequence[Value]) -> Value:
    """Evaluate one computation of `module` on `args` (arrays or nested tuples)."""
    with np.errstate(all="ignore"):
        return _Interp(module).run(comp, list(args))


# ----------------------------------------------------------------------------- argument checks

def _check_args(comp: Computation, args: Sequence[Any]) -> list[Value]:
    params = comp.parameters
    if len(args) != len(params):
        raise InputError(f"{comp.name} takes {len(params)} arguments, got {len(args)}")
    return [_check_arg(p, p.shape, a) for p, a in zip(params, args)]


def _check_arg(param: Instruction, shape: Shape, arg: Any) -> Value:
    what = f"parameter {param.attr('parameter_number')} ({param.name})"
    if isinstance(shape, TupleShape):
        if not isinstance(arg, (tuple, list)) or len(arg) != len(shape.elements):
            raise InputError(f"{what} expects a tuple of {len(shape.elements)} arrays")
        return tuple(_check_arg(param, s, a) for s, a in zip(shape.elements, arg))
    arr = np.asarray(arg)
    if arr.shape != tuple(shape.dims):
        raise InputError(f"{what} expects shape {list(shape.dims)}, got {list(arr.shape)}")
    if arr.dtype != shape.dtype.np:
        raise InputError(f"{what} expects {shape.dtype} ({shape.dtype.np}), got {arr.dtype}")
    if shape.dtype is DType.BF16:
        arr = round_bf16(arr)
    return arr


def _leaves(v: Value) -> list[np.ndarray]:
    if isinstance(v, tuple):
        return [x for e in v for x in _leaves(e)]
    return [v]


# ----------------------------------------------------------------------------- the interpreter

@dataclass(frozen=True)
class _Plan:
    order: tuple[Instruction, ...]
    frees: tuple[tuple[str, ...], ...]  # names whose last use is order[i]


class _Interp:
    """State of one evaluation: the module, cached plans and constants."""

    def __init__(self, module: Module):
        self.module = module
        self._plans: dict[str, _Plan] = {}
        self._consts: dict[tuple[str, str], np.ndarray] = {}
        self._combiners: dict[str, Any] = {}
        self.vectorized = 0  # > 0 while evaluating a reduce combiner on whole arrays
        self._stack: list[Computation] = []

    def operand_shape(self, inst: Instruction, i: int) -> Shape:
        """The declared shape (with layout) of operand `i` of `inst` in the running computation."""
        return self._stack[-1][inst.operands[i]].shape

    def computation(self, name: str, inst: Instruction) -> Computation:
        try:
            return self.module.computation(name)
        except KeyError:
            raise ShapeError(f"called computation {name!r} does not exist", line=inst.line, op=inst.name) from None

    def plan(self, comp: Computation) -> _Plan:
        p = self._plans.get(comp.name)
        if p is None:
            p = self._plans[comp.name] = _make_plan(comp)
        return p

    def constant(self, comp: Computation, inst: Instruction) -> np.ndarray:
        key = (comp.name, inst.name)
        v = self._consts.get(key)
        if v is None:
            v = self._consts[key] = _finish_array(literal_array(inst), inst.array_shape)
            v.setflags(write=False)
        return v

    def run(self, comp: Computation, args: list[Value]) -> Value:
        params = comp.parameters
        if len(args) != len(params):
            raise ShapeError(f"computation {comp.name} takes {len(params)} arguments, got {len(args)}")
        plan = self.plan(comp)
        env: dict[str, Value] = {}
        self._stack.append(comp)
        try:
            for inst, dead in zip(plan.order, plan.frees):
                if inst.op is Op.PARAMETER:
                    env[inst.name] = args[inst.attr("parameter_number")]
                elif inst.op is Op.CONSTANT:
                    env[inst.name] = self.constant(comp, inst)
                else:
                    env[inst.name] = self.apply(inst, [env[o] for o in inst.operands])
                for name in dead:
                    del env[name]
        finally:
            self._stack.pop()
        return env[comp.root]

    def apply(self, inst: Instruction, ops: list[Value]) -> Value:
        rule = RULES.get(inst.op)
        if rule is None:
            raise UnsupportedError(f"no interpreter rule for {inst.op}", line=inst.line, op=inst.name)
        try:
            out = rule(self, inst, ops)
        except HlotuneError as e:
            if e.op is None:
                e.op, e.line = inst.name, inst.line
                e.args = (e._format(),)
            raise
        except (ValueError, IndexError, TypeError, KeyError) as e:
            raise ShapeError(f"{inst.op} failed: {e}", line=inst.line, op=inst.name) from e
        return _finish(out, inst.shape, inst, check_dims=not self.vectorized)


def _make_plan(comp: Computation) -> _Plan:
    order = _topo_order(comp)
    last: dict[str, int] = {}
    for i, inst in enumerate(order):
        for o in inst.operands:
            last[o] = i
    frees: list[list[str]] = [[] for _ in order]
    for i, inst in enumerate(order):
        if inst.name == comp.root:
            continue
        frees[last.get(inst.name, i)].append(inst.name)
    return _Plan(tuple(order), tuple(tuple(f) for f in frees))


def _topo_order(comp: Computation) -> list[Instruction]:
    """Definition order when it is topological, else a topological order (iterative DFS)."""
    by_name = comp.by_name
    for inst in comp.instructions:
        for o in inst.operands:
            if o not in by_name:
                raise ShapeError(f"operand {o!r} is not defined in {comp.name}", line=inst.line, op=inst.name)
    seen: set[str] = set()
    ok = True
    for inst in comp.instructions:
        if any(o not in seen for o in inst.operands):
            ok = False
            break
        seen.add(inst.name)
    if ok:
        return list(comp.instructions)
    done: set[str] = set()
    open_: set[str] = set()
    out: list[Instruction] = []
    for start in comp.instructions:
        stack = [(start.name, False)]
        while stack:
            name, expanded = stack.pop()
            if name in done:
                continue
            if expanded:
                done.add(name)
                open_.discard(name)
                out.append(by_name[name])
                continue
            if name in open_:
                raise ShapeError(f"cycle through {name!r} in {comp.name}", op=name)
            open_.add(name)
            stack.append((name, True))
            stack.extend((o, False) for o in reversed(by_name[name].operands) if o not in done)
    return out


# ----------------------------------------------------------------------------- rounding and types

def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), held as float32."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, r).astype(np.float32)


def _finish(v: Value, shape: Shape, inst: Instruction, check_dims: bool = True) -> Value:
    if isinstance(shape, TupleShape):
        if not isinstance(v, tuple) or len(v) != len(shape.elements):
            raise ShapeError(f"{inst.op} produced no tuple of {len(shape.elements)}", line=inst.line, op=inst.name)
        return tuple(_finish(e, s, inst, check_dims) for e, s in zip(v, shape.elements))
    arr = _finish_array(v, shape)
    if check_dims and arr.shape != tuple(shape.dims):
        raise ShapeError(f"{inst.op} produced shape {list(arr.shape)}, declared {shape}",
                         line=inst.line, op=inst.name)
    return arr


def _finish_array(v: Any, shape: ArrayShape) -> np.ndarray:
    arr = np.asarray(v)
    want = shape.dtype.np
    if arr.dtype != want:
        arr = _convert(arr, shape.dtype)
    elif shape.dtype is DType.BF16:
        arr = round_bf16(arr)
    return arr


def _work(x: np.ndarray) -> np.ndarray:
    """The array in the float type used for computing (float64 for <= 32-bit floats)."""
    if x.dtype.kind == "f" and x.dtype != np.float64:
        return x.astype(np.float64)
    return x


def _dtype_of(inst: Instruction) -> DType:
    s = inst.shape
    return s.dtype if isinstance(s, ArrayShape) else s.flat()[0].dtype


def _convert(x: np.ndarray, to: DType) -> np.ndarray:
    """XLA's convert: float->int truncates toward zero, saturates, NaN -> 0; ->pred is != 0."""
    x = np.asarray(x)
    if to is DType.PRED:
        return x != 0
    if to.is_float:
        y = x.astype(np.float32 if to is DType.BF16 else to.np)
        return round_bf16(y) if to is DType.BF16 else y
    if x.dtype.kind == "f":
        info = np.iinfo(to.np)
        t = np.trunc(x.astype(np.float64))
        hi, lo = t >= float(info.max) + 1.0, t < float(info.min)
        bad = hi | lo | np.isnan(t)
        out = np.where(bad, 0.0, t).astype(to.np)
        out[hi] = info.max
        out[lo] = info.min
        return out
    return x.astype(to.np)


# ----------------------------------------------------------------------------- elementwise rules

def _float_unary(fn: Callable[[np.ndarray], np.ndarray]) -> Callable:
    def rule(ctx: _Interp, inst: Instruction, ops: list[np.ndarray]) -> np.ndarray:
        x = ops[0]
        if x.dtype.kind != "f":
            raise UnsupportedError(f"{inst.op} of {x.dtype} is not supported")
        return fn(_work(x))
    return rule


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=np.float64) if x.size else x


def _sign(ctx, inst, ops):
    x = ops[0]
    if x.dtype.kind == "f":
        return np.where(np.isnan(x), x, np.sign(x))
    return np.sign(x).astype(x.dtype)


def _abs(ctx, inst, ops):
    return np.abs(ops[0])


def _negate(ctx, inst, ops):
    return np.negative(ops[0])


def _not(ctx, inst, ops):
    x = ops[0]
    return np.logical_not(x) if x.dtype == bool else np.invert(x)


def _is_finite(ctx, inst, ops):
    return np.isfinite(ops[0])


def _binary(fn: Callable) -> Callable:
    def rule(ctx, inst, ops):
        a, b = ops
        if a.dtype.kind == "f":
            a, b = _work(a), _work(b)
        return fn(a, b)
    return rule


def _divide(ctx, inst, ops):
    a, b = ops
    if a.dtype.kind == "f":
        return _work(a) / _work(b)
    if a.dtype == bool:
        raise UnsupportedError("divide of pred is not supported")
    a, b = np.broadcast_arrays(a, b)
    zero = b == 0
    safe = np.where(zero, 1, b).astype(a.dtype)
    if a.dtype.kind == "i":
        info = np.iinfo(a.dtype)
        ovf = (a == info.min) & (safe == -1)
        safe = np.where(ovf, 1, safe).astype(a.dtype)
        q = np.abs(a.astype(np.int64) if a.dtype.itemsize < 8 else a) // np.abs(safe)
        q = np.where((a < 0) != (safe < 0), -q, q).astype(a.dtype)
        q = np.where(ovf, a, q)
    else:
        q = a // safe
    return np.where(zero, np.array(-1).astype(a.dtype), q).astype(a.dtype)


def _remainder(ctx, inst, ops):
    a, b = ops
    if a.dtype.kind == "f":
        return np.fmod(_work(a), _work(b))
    a, b = np.broadcast_arrays(a, b)
    zero = b == 0
    safe = np.where(zero, 1, b).astype(a.dtype)
    if a.dtype.kind == "i":
        safe = np.where(safe == -1, 1, safe).astype(a.dtype)  # x % -1 == 0, also for INT_MIN
    r = np.fmod(a, safe)
    return np.where(zero, a, r).astype(a.dtype)


def _power(ctx, inst, ops):
    a, b = ops
    if a.dtype.kind == "f":
        return np.power(_work(a), _work(b))
    if a.dtype == bool:
        return a | ~b
    a, b = np.broadcast_arrays(a, b)
    neg = b < 0 if b.dtype.kind == "i" else np.zeros(b.shape, bool)
    r = np.power(a, np.where(neg, 0, b).astype(b.dtype))
    # negative exponents: 1 for base 1, +-1 for base -1, 0 otherwise (XLA's integer pow)
    neg_val = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)).astype(a.dtype)
    return np.where(neg, neg_val, r).astype(a.dtype)


def _total_order_key(x: np.ndarray) -> np.ndarray:
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[x.dtype.itemsize]
    i = x.view(bits).astype(np.int64)
    mask = np.int64((1 << (8 * x.dtype.itemsize - 1)) - 1)
    return np.where(i < 0, i ^ mask, i)


_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
            "GT": np.greater, "GE": np.greater_equal}


def _compare(ctx, inst, ops):
    a, b = ops
    direction = inst.attr("direction")
    fn = _COMPARE.get(direction)
    if fn is None:
        raise UnsupportedError(f"compare direction {direction!r}")
    if inst.attr("type") == "TOTALORDER" and a.dtype.kind == "f":
        a, b = _total_order_key(a), _total_order_key(b)
    return fn(a, b)


def _select(ctx, inst, ops):
    p, a, b = ops
    return np.where(p, a, b)


def _clamp(ctx, inst, ops):
    lo, x, hi = ops
    return np.minimum(np.maximum(x, lo), hi)


def _convert_rule(ctx, inst, ops):
    return _convert(ops[0], _dtype_of(inst))


# ----------------------------------------------------------------------------- structural rules

def _tuple(ctx, inst, ops):
    return tuple(ops)


def _gte(ctx, inst, ops):
    t = ops[0]
    if not isinstance(t, tuple):
        raise ShapeError("get-tuple-element of a non-tuple")
    return t[inst.attr("index")]


def _call(ctx, inst, ops):
    name = inst.attr("to_apply") or inst.attr("calls")
    if isinstance(name, tuple):
        name = name[0]
    return ctx.run(ctx.computation(name, inst), ops)


def _parameter(ctx, inst, ops):  # handled by the loop; present so every Op has a rule
    raise ShapeError("parameter evaluated outside a computation")


def _constant(ctx, inst, ops):
    return literal_array(inst)


def _custom_call(ctx, inst, ops):
    spec = custom_calls.describe_custom_call(inst)
    out_shape = custom_calls.result_shape(inst)
    result = _gemm(spec, ops, out_shape) if spec.kind == "gemm" else _cudnn_conv(spec, ops, out_shape)
    result = _finish_array(result, out_shape)
    if not isinstance(inst.shape, TupleShape):
        return result
    rest = tuple(np.zeros(s.dims, s.dtype.np) if isinstance(s, ArrayShape) else () for s in inst.shape.elements[1:])
    return (result,) + rest


# ----------------------------------------------------------------------------- data movement

def _layout(s: ArrayShape) -> tuple[int, ...]:
    return s.layout if s.layout is not None else tuple(range(s.rank - 1, -1, -1))


def _bitcast(ctx, inst, ops):
    """Reinterpret the physical buffer: layouts decide which logical order the bytes have."""
    x, out = ops[0], inst.array_shape
    if x.size != out.size:
        raise ShapeError(f"bitcast of {x.size} elements to {out} ({out.size})")
    src = ctx.operand_shape(inst, 0)
    if out.dtype.np != x.dtype:
        if x.dtype.itemsize != out.dtype.np.itemsize:
            raise UnsupportedError(f"bitcast from {x.dtype} to {out.dtype} changes the element size")
    s_major = tuple(reversed(_layout(src)))
    phys = np.transpose(x, s_major).reshape(-1) if src.rank else x.reshape(-1)
    if out.dtype.np != x.dtype:
        phys = np.ascontiguousarray(phys).view(out.dtype.np)
    o_major = tuple(reversed(_layout(out)))
    y = phys.reshape(tuple(out.dims[d] for d in o_major))
    return np.transpose(y, np.argsort(o_major)) if out.rank else y.reshape(())


def _broadcast(ctx, inst, ops):
    x, out = ops[0], inst.array_shape
    dims = tuple(inst.attr("dimensions", ()))
    if len(dims) != x.ndim:
        raise ShapeError(f"broadcast dimensions {list(dims)} do not match operand rank {x.ndim}")
    order = np.argsort(dims)
    x = np.transpose(x, order) if x.ndim else x
    shape = [1] * out.rank
    for i, d in enumerate(sorted(dims)):
        shape[d] = x.shape[i]
    return np.broadcast_to(x.reshape(shape), out.dims)


def _reshape(ctx, inst, ops):
    return np.reshape(ops[0], inst.array_shape.dims)


def _copy(ctx, inst, ops):
    return ops[0]


def _transpose(ctx, inst, ops):
    return np.transpose(ops[0], inst.attr("dimensions"))


def _reverse(ctx, inst, ops):
    dims = tuple(inst.attr("dimensions", ()))
    return np.flip(ops[0], axis=dims) if dims else ops[0]


def _concatenate(ctx, inst, ops):
    return np.concatenate(ops, axis=inst.attr("dimensions")[0])


def _slice(ctx, inst, ops):
    return ops[0][tuple(slice(s, l, st) for s, l, st in inst.attr("slice"))]


def pad_array(x: np.ndarray, value: Any, config: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """HLO pad: per dim (low, high, interior); negative low/high remove elements."""
    shape, place, cut = [], [], []
    for n, (lo, hi, interior) in zip(x.shape, config):
        inner = n + max(n - 1, 0) * interior
        full = inner + max(lo, 0) + max(hi, 0)
        shape.append(full)
        place.append(slice(max(lo, 0), max(lo, 0) + inner, interior + 1))
        cut.append(slice(-min(lo, 0), full + min(hi, 0)))
        if full + min(hi, 0) + min(lo, 0) < 0:
            raise ShapeError(f"pad {lo}_{hi}_{interior} leaves a negative size")
    out = np.full(shape, value, dtype=x.dtype)
    out[tuple(place)] = x
    return out[tuple(cut)]


def _pad(ctx, inst, ops):
    x, v = ops
    return pad_array(x, v[()], inst.attr("padding"))


def _iota(ctx, inst, ops):
    out = inst.array_shape
    d = inst.attr("iota_dimension")
    shape = [1] * out.rank
    shape[d] = out.dims[d]
    r = np.arange(out.dims[d]).reshape(shape)
    return np.broadcast_to(r, out.dims).astype(out.dtype.np if out.dtype is not DType.PRED else bool)


def _start_indices(ops: list[np.ndarray], rank: int) -> list[int]:
    if len(ops) == 1 and ops[0].ndim == 1:  # old form: one index vector
        return [int(v) for v in ops[0]]
    return [int(np.asarray(o).reshape(())) for o in ops]


def _dynamic_slice(ctx, inst, ops):
    x = ops[0]
    sizes = inst.attr("dynamic_slice_sizes")
    starts = _start_indices(ops[1:], x.ndim)
    idx = []
    for n, s, st in zip(x.shape, sizes, starts):
        st = min(max(st, 0), n - s)
        idx.append(slice(st, st + s))
    return x[tuple(idx)]


def _dynamic_update_slice(ctx, inst, ops):
    x, upd = ops[0], ops[1]
    starts = _start_indices(ops[2:], x.ndim)
    idx = []
    for n, s, st in zip(x.shape, upd.shape, starts):
        st = min(max(st, 0), n - s)
        idx.append(slice(st, st + s))
    out = np.array(x, copy=True)
    out[tuple(idx)] = upd
    return out


def _gather(ctx, inst, ops):
    x, idx = ops
    offset_dims = tuple(inst.attr("offset_dims", ()))
    collapsed = tuple(inst.attr("collapsed_slice_dims", ()))
    index_map = tuple(inst.attr("start_index_map", ()))
    op_batch = tuple(inst.attr("operand_batching_dims", ()))
    idx_batch = tuple(inst.attr("start_indices_batching_dims", ()))
    ivd = inst.attr("index_vector_dim", idx.ndim)
    sizes = tuple(inst.attr("slice_sizes"))
    if ivd == idx.ndim:
        idx = idx[..., None]
    idx = np.moveaxis(idx, ivd, -1).astype(np.int64)
    batch_shape = idx.shape[:-1]
    n = int(np.prod(batch_shape, dtype=np.int64))
    flat = idx.reshape(n, idx.shape[-1])
    starts = np.zeros((n, x.ndim), np.int64)
    for k, d in enumerate(index_map):
        starts[:, d] = flat[:, k]
    # batching dims: start = position along the matching indices batch dim
    batch_dims_of_idx = [d for d in range(len(batch_shape) + 1) if d != ivd]  # original dims of idx
    grid = np.indices(batch_shape).reshape(len(batch_shape), n) if batch_shape else np.zeros((0, n), np.int64)
    for od, bd in zip(op_batch, idx_batch):
        starts[:, od] = grid[batch_dims_of_idx.index(bd)]
    starts = np.clip(starts, 0, np.array(x.shape) - np.array(sizes))
    index = []
    for d in range(x.ndim):
        along = np.arange(sizes[d]).reshape((1,) + tuple(sizes[d] if e == d else 1 for e in range(x.ndim)))
        index.append(starts[:, d].reshape((n,) + (1,) * x.ndim) + along)
    g = x[tuple(index)]
    keep = [d for d in range(x.ndim) if d not in collapsed and d not in op_batch]
    g = g.reshape((n,) + tuple(sizes[d] for d in keep)).reshape(batch_shape + tuple(sizes[d] for d in keep))
    nb = len(batch_shape)
    perm, b = [], 0
    for p in range(nb + len(keep)):
        if p in offset_dims:
            perm.append(nb + offset_dims.index(p))
        else:
            perm.append(b)
            b += 1
    return np.transpose(g, perm)


# ----------------------------------------------------------------------------- reductions

_FAST = {Op.ADD: np.add, Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum, Op.MULTIPLY: np.multiply,
         Op.AND: np.logical_and, Op.OR: np.logical_or}


def combiner_kind(comp: Computation) -> Op | None:
    """The binary op a reduce combiner applies to its two parameters, if that is all it does."""
    if len(comp.parameters) != 2:
        return None
    root = comp.root_instruction
    names = {p.name for p in comp.parameters}
    if root.op in _FAST and len(root.operands) == 2 and set(root.operands) == names:
        return root.op
    return None


def _fast_ufunc(kind: Op, dtype: np.dtype) -> np.ufunc:
    if kind in (Op.AND, Op.OR) and dtype.kind != "b":
        return np.bitwise_and if kind is Op.AND else np.bitwise_or
    return _FAST[kind]


def _combine_fn(ctx: _Interp, inst: Instruction) -> Callable[[list[Value], list[Value]], list[Value]]:
    """acc, x (lists of n arrays) -> new acc, evaluating the combiner on whole arrays."""
    comp = ctx.computation(inst.attr("to_apply"), inst)

    def fn(acc: list[Value], xs: list[Value]) -> list[Value]:
        ctx.vectorized += 1
        try:
            r = ctx.run(comp, list(acc) + list(xs))
        finally:
            ctx.vectorized -= 1
        return list(r) if isinstance(r, tuple) else [r]
    return fn


def _reduce(ctx, inst, ops):
    n = len(ops) // 2
    xs, inits = ops[:n], ops[n:]
    dims = tuple(sorted(inst.attr("dimensions", ())))
    comp = ctx.computation(inst.attr("to_apply"), inst)
    kind = combiner_kind(comp)
    if n == 1 and kind is not None:
        x, init = _work(xs[0]), _work(inits[0])
        uf = _fast_ufunc(kind, x.dtype)
        r = uf(init, uf.reduce(x, axis=dims) if dims else x)
        return (r,) if isinstance(inst.shape, TupleShape) else r
    keep = [d for d in range(xs[0].ndim) if d not in dims]
    out_shape = tuple(xs[0].shape[d] for d in keep)
    k = int(np.prod([xs[0].shape[d] for d in dims], dtype=np.int64))
    flat = [np.transpose(x, keep + list(dims)).reshape(out_shape + (k,)) for x in xs]
    acc = [np.broadcast_to(i, out_shape).copy() for i in inits]
    fn = _combine_fn(ctx, inst)
    for j in range(k):
        acc = [np.broadcast_to(a, out_shape) for a in fn(acc, [f[..., j] for f in flat])]
    return acc[0] if n == 1 and not isinstance(inst.shape, TupleShape) else tuple(acc)


def _reduce_window(ctx, inst, ops):
    n = len(ops) // 2
    xs, inits = ops[:n], ops[n:]
    window: Window = inst.attr("window")
    rank = xs[0].ndim
    wdims = window.dims if window is not None else ()
    if len(wdims) != rank:
        raise ShapeError(f"reduce-window window has {len(wdims)} dims, operand rank {rank}")
    cfg = [(w.pad_lo, w.pad_hi, w.lhs_dilate - 1) for w in wdims]
    padded = [pad_array(x, i[()], cfg) for x, i in zip(xs, inits)]
    out_shape = tuple((p - (w.size - 1) * w.rhs_dilate - 1) // w.stride + 1 if p >= (w.size - 1) * w.rhs_dilate + 1
                      else 0 for p, w in zip(padded[0].shape, wdims))

    def window_slice(arr, offs):
        return arr[tuple(slice(o * w.rhs_dilate, o * w.rhs_dilate + (m - 1) * w.stride + 1, w.stride)
                         for o, w, m in zip(offs, wdims, out_shape))]

    comp = ctx.computation(inst.attr("to_apply"), inst)
    kind = combiner_kind(comp)
    positions = itertools.product(*(range(w.size) for w in wdims))
    if n == 1 and kind is not None:
        x = _work(padded[0])
        uf = _fast_ufunc(kind, x.dtype)
        acc = np.broadcast_to(_work(inits[0]), out_shape).copy()
        for offs in positions:
            acc = uf(acc, window_slice(x, offs))
        return (acc,) if isinstance(inst.shape, TupleShape) else acc
    acc = [np.broadcast_to(i, out_shape).copy() for i in inits]
    fn = _combine_fn(ctx, inst)
    for offs in positions:
        acc = [np.broadcast_to(a, out_shape) for a in fn(acc, [window_slice(p, offs) for p in padded])]
    return acc[0] if n == 1 and not isinstance(inst.shape, TupleShape) else tuple(acc)


# ----------------------------------------------------------------------------- dot and convolution

def dot_general(a: np.ndarray, b: np.ndarray, lb: Sequence[int], lc: Sequence[int], rb: Sequence[int],
                rc: Sequence[int]) -> np.ndarray:
    """XLA dot: result dims = batch, lhs free, rhs free; accumulates in float64 (int64 for ints)."""
    lf = [d for d in range(a.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(b.ndim) if d not in rb and d not in rc]
    bs = [a.shape[d] for d in lb]
    m = [a.shape[d] for d in lf]
    nn = [b.shape[d] for d in rf]
    k = int(np.prod([a.shape[d] for d in lc], dtype=np.int64))
    acc = np.float64 if a.dtype.kind in "fb" or b.dtype.kind in "f" else np.int64
    if a.dtype == bool and b.dtype == bool:
        acc = np.int64
    am = np.transpose(a, list(lb) + lf + list(lc)).astype(acc).reshape(
        int(np.prod(bs, dtype=np.int64)), int(np.prod(m, dtype=np.int64)), k)
    bm = np.transpose(b, list(rb) + list(rc) + rf).astype(acc).reshape(
        int(np.prod(bs, dtype=np.int64)), k, int(np.prod(nn, dtype=np.int64)))
    return np.matmul(am, bm).reshape(bs + m + nn)


def _dot(ctx, inst, ops):
    a, b = ops
    r = dot_general(a, b, inst.attr("lhs_batch_dims", ()), inst.attr("lhs_contracting_dims", ()),
                    inst.attr("rhs_batch_dims", ()), inst.attr("rhs_contracting_dims", ()))
    return r != 0 if _dtype_of(inst) is DType.PRED else r


def convolution(x: np.ndarray, w: np.ndarray, window: Window | None, labels: ConvDims,
                feature_groups: int = 1, batch_groups: int = 1) -> np.ndarray:
    """XLA convolution for any dim_labels, padding, strides, dilations, reversal and groups.

    Works in a canonical layout (batch, spatial..., feature) with one matmul per kernel position;
    accumulates in float64 (int64 for integers).
    """
    ns = len(labels.input_spatial)
    wdims = window.dims if window is not None else ()
    if len(wdims) != ns:
        raise ShapeError(f"convolution window has {len(wdims)} dims, dim_labels {ns} spatial dims")
    if feature_groups > 1 and batch_groups > 1:
        raise UnsupportedError("convolution with both feature_group_count and batch_group_count > 1")
    acc = np.float64 if x.dtype.kind == "f" or w.dtype.kind == "f" else np.int64
    xc = np.transpose(x, (labels.input_batch,) + tuple(labels.input_spatial) + (labels.input_feature,)).astype(acc)
    wc = np.transpose(w, tuple(labels.kernel_spatial) + (labels.kernel_input_feature,
                                                        labels.kernel_output_feature)).astype(acc)
    flips = tuple(i for i, d in enumerate(wdims) if d.reversal)
    if flips:
        wc = np.flip(wc, axis=flips)
    cfg = [(0, 0, 0)] + [(d.pad_lo, d.pad_hi, d.lhs_dilate - 1) for d in wdims] + [(0, 0, 0)]
    xc = pad_array(xc, 0, cfg)
    nb, c = xc.shape[0], xc.shape[-1]
    ksp, ci, co = wc.shape[:ns], wc.shape[ns], wc.shape[ns + 1]
    out_sp = []
    for p, k, d in zip(xc.shape[1:-1], ksp, wdims):
        span = (k - 1) * d.rhs_dilate + 1
        out_sp.append((p - span) // d.stride + 1 if p >= span else 0)
    g, bg = feature_groups, batch_groups
    if c != ci * g or co % (g * bg) or nb % bg:
        raise ShapeError(f"convolution features: input {c}, kernel in {ci} x groups {g}, out {co}, batch {nb} / {bg}")
    ob = nb // bg
    # x: (bg, ob, *sp, g, ci); kernel per position: (ci, groups, co / groups)
    groups = g * bg
    xg = xc.reshape((bg, ob) + xc.shape[1:-1] + (g, ci))
    out = np.zeros((groups, ob * int(np.prod(out_sp, dtype=np.int64)), co // groups), acc)
    for pos in itertools.product(*(range(k) for k in ksp)):
        sl = tuple(slice(o * d.rhs_dilate, o * d.rhs_dilate + (m - 1) * d.stride + 1, d.stride)
                   for o, d, m in zip(pos, wdims, out_sp))
        xs = xg[(slice(None), slice(None)) + sl]  # (bg, ob, *out, g, ci)
        if bg > 1:
            lhs = xs.reshape(bg, -1, ci)  # g == 1
        else:
            lhs = np.moveaxis(xs[0], -2, 0).reshape(g, -1, ci)
        rhs = np.moveaxis(wc[pos].reshape(ci, groups, co // groups), 1, 0)  # (groups, ci, co/groups)
        out += np.matmul(lhs, rhs)
    out = np.moveaxis(out, 0, 1).reshape((ob,) + tuple(out_sp) + (co,))
    canon = (labels.output_batch,) + tuple(labels.output_spatial) + (labels.output_feature,)
    return np.transpose(out, np.argsort(canon))


def _convolution(ctx, inst, ops):
    x, w = ops
    labels = inst.attr("dim_labels")
    if not isinstance(labels, ConvDims):
        raise ShapeError("convolution without dim_labels")
    return convolution(x, w, inst.attr("window"), labels, inst.attr("feature_group_count", 1),
                       inst.attr("batch_group_count", 1))


def _activation(name: str | None, y: np.ndarray, alpha: float = 0.0) -> np.ndarray:
    if name is None:
        return y
    if name == "relu":
        return np.maximum(y, 0)
    if name == "relu6":
        return np.clip(y, 0, 6)
    if name == "elu":
        return np.where(y > 0, y, np.expm1(y))
    if name == "leaky_relu":
        return np.where(y > 0, y, alpha * y)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-y))
    if name == "tanh":
        return np.tanh(y)
    if name == "gelu":  # cuBLAS/cuDNN GELU is the tanh approximation
        return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y ** 3)))
    raise UnsupportedError(f"activation {name!r}")


def _gemm(spec: custom_calls.GemmSpec, ops: list[np.ndarray], out: ArrayShape) -> np.ndarray:
    y = dot_general(ops[0], ops[1], spec.lhs_batch_dims, spec.lhs_contracting_dims, spec.rhs_batch_dims,
                    spec.rhs_contracting_dims)
    y = y * spec.alpha if spec.alpha != 1.0 else y
    if spec.c_operand is not None:
        y = y + spec.beta * _work(ops[spec.c_operand])
    if spec.bias_operand is not None:
        y = y + _work(ops[spec.bias_operand])  # a vector along the last output dimension
    return _activation(spec.activation, y)


def _cudnn_conv(spec: custom_calls.ConvSpec, ops: list[np.ndarray], out: ArrayShape) -> np.ndarray:
    y = convolution(ops[0], ops[1], spec.window, spec.dim_labels, spec.feature_group_count, spec.batch_group_count)
    if spec.conv_result_scale != 1.0:
        y = y * spec.conv_result_scale
    if spec.side_input_operand is not None and spec.side_input_scale != 0.0:
        y = y + spec.side_input_scale * _work(ops[spec.side_input_operand])
    if spec.bias_operand is not None:
        bias = _work(ops[spec.bias_operand])
        shape = [1] * y.ndim
        shape[spec.dim_labels.output_feature] = bias.size
        y = y + bias.reshape(shape)
    return _activation(spec.activation, y, spec.leakyrelu_alpha)


# ----------------------------------------------------------------------------- the rule table

RULES: dict[Op, Callable[[_Interp, Instruction, list[Value]], Value]] = {
    Op.ABS: _abs,
    Op.ADD: _binary(np.add),
    Op.AND: _binary(lambda a, b: a & b),
    Op.ATAN2: _binary(np.arctan2),
    Op.BITCAST: _bitcast,
    Op.BROADCAST: _broadcast,
    Op.CALL: _call,
    Op.CEIL: _float_unary(np.ceil),
    Op.CLAMP: _clamp,
    Op.COMPARE: _compare,
    Op.CONCATENATE: _concatenate,
    Op.CONSTANT: _constant,
    Op.CONVERT: _convert_rule,
    Op.CONVOLUTION: _convolution,
    Op.COPY: _copy,
    Op.COSINE: _float_unary(np.cos),
    Op.CUSTOM_CALL: _custom_call,
    Op.DIVIDE: _divide,
    Op.DOT: _dot,
    Op.DYNAMIC_SLICE: _dynamic_slice,
    Op.DYNAMIC_UPDATE_SLICE: _dynamic_update_slice,
    Op.ERF: _float_unary(_erf),
    Op.EXP: _float_unary(np.exp),
    Op.EXPM1: _float_unary(np.expm1),
    Op.FLOOR: _float_unary(np.floor),
    Op.FUSION: _call,
    Op.GATHER: _gather,
    Op.GET_TUPLE_ELEMENT: _gte,
    Op.IOTA: _iota,
    Op.IS_FINITE: _is_finite,
    Op.LOG: _float_unary(np.log),
    Op.LOG1P: _float_unary(np.log1p),
    Op.LOGISTIC: _float_unary(lambda x: 1.0 / (1.0 + np.exp(-x))),
    Op.MAXIMUM: _binary(np.maximum),
    Op.MINIMUM: _binary(np.minimum),
    Op.MULTIPLY: _binary(np.multiply),
    Op.NEGATE: _negate,
    Op.NOT: _not,
    Op.OR: _binary(lambda a, b: a | b),
    Op.PAD: _pad,
    Op.PARAMETER: _parameter,
    Op.POWER: _power,
    Op.REDUCE: _reduce,
    Op.REDUCE_WINDOW: _reduce_window,
    Op.REMAINDER: _remainder,
    Op.RESHAPE: _reshape,
    Op.REVERSE: _reverse,
    Op.ROUND_NEAREST_EVEN: _float_unary(np.rint),
    Op.RSQRT: _float_unary(lambda x: 1.0 / np.sqrt(x)),
    Op.SELECT: _select,
    Op.SIGN: _sign,
    Op.SINE: _float_unary(np.sin),
    Op.SLICE: _slice,
    Op.SQRT: _float_unary(np.sqrt),
    Op.SUBTRACT: _binary(np.subtract),
    Op.TANH: _float_unary(np.tanh),
    Op.TRANSPOSE: _transpose,
    Op.TUPLE: _tuple,
    Op.XOR: _binary(lambda a, b: a ^ b),
}
