"""Workloads: a compute definition with its structural key, weight and cost numbers.

Map:
  workload_key(cd)                 "w1-" + 20 hex digits of sha256 over the canonical form
  canonical(cd)                    cd with buffers b0.., stages s0.., axes i0../r0.. renamed, name ""
  workload_to_json / _from_json    lossless JSON of a ComputeDef (what tuning records store)
  flops(cd), bytes_moved(cd)       cost numbers (the manifest's conventions, see below)
  Workload                         key, compute, weight, flops, bytes, opcodes, shapes
  extract_workloads(program)       FusedProgram -> ((FusedSubgraph, Workload), ...) with weights

Canonical form: buffers are renamed in input order, stages in definition order, each stage's space
axes i0, i1, ... and reduction axes r0, r1, ... positionally; the definition's name is dropped.
The key hashes the canonical JSON (structure, shapes, dtypes, constant values), so structurally
identical subgraphs (repeated layers) share one key whatever their HLO names.

FLOPs (manifest convention): per point of a stage's domain (space x reduction axes), 1 per
distinct arithmetic / compare / select / min / max / transcendental node of its body that depends
on data (a repeated sub-expression counts once, as after CSE; recomputation across stages counts);
index arithmetic, bounds conditions (pad, concatenate, convolution padding selects), converts
and loads are free; a reduction adds 1 per input element (its combiner; a general combiner counts
its own nodes).  A dot or convolution thus counts 2 per multiply-accumulate.
Bytes: every input buffer read once and every output written once, at the dtype's size.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import HlotuneError, UnsupportedError
from .expr import (
    ACC,
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
)
from .hlo import Computation, DType, Op

FORMAT = "w1"


# ----------------------------------------------------------------------------- JSON

def _num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _unnum(v: Any) -> Any:
    return float(v) if isinstance(v, str) else v


def expr_to_obj(e: Expr) -> list:
    """An expression as nested JSON lists (`["b", "add", a, b, "f32"]`, ...)."""
    if isinstance(e, Var):
        return ["v", e.name, e.dtype.value]
    if isinstance(e, Const):
        return ["c", _num(e.value), e.dtype.value]
    if isinstance(e, Load):
        return ["l", e.buffer, [expr_to_obj(i) for i in e.indices], e.dtype.value]
    if isinstance(e, Unary):
        return ["u", e.op.value, expr_to_obj(e.a), e.dtype.value]
    if isinstance(e, Binary):
        return ["b", e.op.value, expr_to_obj(e.a), expr_to_obj(e.b), e.dtype.value]
    if isinstance(e, Compare):
        return ["cmp", e.direction, expr_to_obj(e.a), expr_to_obj(e.b), e.dtype.value]
    if isinstance(e, Select):
        return ["s", expr_to_obj(e.cond), expr_to_obj(e.t), expr_to_obj(e.f), e.dtype.value]
    if isinstance(e, Cast):
        return ["cast", expr_to_obj(e.a), e.dtype.value]
    raise TypeError(f"not an Expr: {e!r}")


def expr_from_obj(o: list) -> Expr:
    """Inverse of `expr_to_obj`."""
    tag = o[0]
    if tag == "v":
        return Var(o[1], DType(o[2]))
    if tag == "c":
        return Const(_unnum(o[1]), DType(o[2]))
    if tag == "l":
        return Load(o[1], tuple(expr_from_obj(i) for i in o[2]), DType(o[3]))
    if tag == "u":
        return Unary(Op(o[1]), expr_from_obj(o[2]), DType(o[3]))
    if tag == "b":
        return Binary(Op(o[1]), expr_from_obj(o[2]), expr_from_obj(o[3]), DType(o[4]))
    if tag == "cmp":
        return Compare(o[1], expr_from_obj(o[2]), expr_from_obj(o[3]), DType(o[4]))
    if tag == "s":
        return Select(expr_from_obj(o[1]), expr_from_obj(o[2]), expr_from_obj(o[3]), DType(o[4]))
    if tag == "cast":
        return Cast(expr_from_obj(o[1]), DType(o[2]))
    raise ValueError(f"unknown expression tag {tag!r}")


def _stage_obj(s: Stage) -> dict:
    r = s.reducer
    return {
        "name": s.name, "dtype": s.dtype.value, "body": expr_to_obj(s.body),
        "axes": [[a.name, a.extent] for a in s.axes],
        "reduce_axes": [[a.name, a.extent] for a in s.reduce_axes],
        "reducer": None if r is None else {
            "init": expr_to_obj(r.init), "op": r.op.value if r.op is not None else None,
            "combiner": expr_to_obj(r.combiner) if r.combiner is not None else None},
    }


def _stage_from(o: dict) -> Stage:
    r = o["reducer"]
    reducer = None if r is None else Reducer(
        expr_from_obj(r["init"]), Op(r["op"]) if r["op"] is not None else None,
        expr_from_obj(r["combiner"]) if r["combiner"] is not None else None)
    return Stage(o["name"], tuple(Axis(n, e) for n, e in o["axes"]), expr_from_obj(o["body"]), DType(o["dtype"]),
                 tuple(Axis(n, e) for n, e in o["reduce_axes"]), reducer)


def compute_to_obj(cd: ComputeDef) -> dict:
    """A ComputeDef as a JSON-ready dict."""
    return {
        "format": FORMAT, "name": cd.name,
        "inputs": [[b.name, list(b.shape), b.dtype.value] for b in cd.inputs],
        "stages": [_stage_obj(s) for s in cd.stages],
        "outputs": list(cd.outputs),
        "constants": [[n, t] for n, t in cd.constants],
    }


def compute_from_obj(o: dict) -> ComputeDef:
    """Inverse of `compute_to_obj` (HlotuneError on another format version)."""
    if o.get("format") != FORMAT:
        raise HlotuneError(f"workload format {o.get('format')!r} is not {FORMAT!r}")
    return ComputeDef(o["name"], tuple(Buffer(n, tuple(s), DType(d)) for n, s, d in o["inputs"]),
                      tuple(_stage_from(s) for s in o["stages"]), tuple(o["outputs"]),
                      tuple((n, t) for n, t in o.get("constants", ())))


def workload_to_json(cd: ComputeDef) -> str:
    """Lossless JSON text of a compute definition."""
    return json.dumps(compute_to_obj(cd), separators=(",", ":"), sort_keys=True, allow_nan=False)


def workload_from_json(text: str) -> ComputeDef:
    """The compute definition `workload_to_json` wrote."""
    try:
        return compute_from_obj(json.loads(text))
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise HlotuneError(f"malformed workload JSON: {err}") from err


# ----------------------------------------------------------------------------- canonical form and key

def _rename(e: Expr, bufs: dict[str, str], vars_: dict[str, str]) -> Expr:
    if isinstance(e, Var):
        return Var(vars_.get(e.name, e.name), e.dtype)
    if isinstance(e, Const):
        return e
    if isinstance(e, Load):
        return Load(bufs.get(e.buffer, e.buffer), tuple(_rename(i, bufs, vars_) for i in e.indices), e.dtype)
    if isinstance(e, Unary):
        return Unary(e.op, _rename(e.a, bufs, vars_), e.dtype)
    if isinstance(e, Binary):
        return Binary(e.op, _rename(e.a, bufs, vars_), _rename(e.b, bufs, vars_), e.dtype)
    if isinstance(e, Compare):
        return Compare(e.direction, _rename(e.a, bufs, vars_), _rename(e.b, bufs, vars_), e.dtype)
    if isinstance(e, Select):
        return Select(_rename(e.cond, bufs, vars_), _rename(e.t, bufs, vars_), _rename(e.f, bufs, vars_), e.dtype)
    if isinstance(e, Cast):
        return Cast(_rename(e.a, bufs, vars_), e.dtype)
    raise TypeError(f"not an Expr: {e!r}")


def canonical(cd: ComputeDef) -> ComputeDef:
    """`cd` with positional names (buffers b0.., stages s0.., axes i0../r0..) and no name."""
    names = {b.name: f"b{k}" for k, b in enumerate(cd.inputs)}
    names.update({s.name: f"s{k}" for k, s in enumerate(cd.stages)})
    stages = []
    for s in cd.stages:
        vs = {a.name: f"i{k}" for k, a in enumerate(s.axes)}
        vs.update({a.name: f"r{k}" for k, a in enumerate(s.reduce_axes)})
        r = s.reducer
        if r is not None and r.combiner is not None:
            r = Reducer(r.init, None, _rename(r.combiner, names, {ACC: ACC, VAL: VAL}))
        stages.append(Stage(names[s.name], tuple(Axis(vs[a.name], a.extent) for a in s.axes),
                            _rename(s.body, names, vs), s.dtype,
                            tuple(Axis(vs[a.name], a.extent) for a in s.reduce_axes), r))
    return ComputeDef("", tuple(Buffer(names[b.name], b.shape, b.dtype) for b in cd.inputs), tuple(stages),
                      tuple(names[o] for o in cd.outputs), tuple((names[n], t) for n, t in cd.constants))


def workload_key(cd: ComputeDef) -> str:
    """A structural hash of `cd` (names of buffers, stages and variables do not matter)."""
    text = workload_to_json(canonical(cd))
    return f"{FORMAT}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


# ----------------------------------------------------------------------------- cost numbers

def _data_ops(e: Expr, seen: dict[Expr, bool]) -> tuple[int, bool]:
    """(counted nodes, depends on data) of an expression; loads' indices are not counted and a
    sub-expression seen before (in `seen`) is counted once, as common-subexpression elimination would."""
    if e in seen:
        return 0, seen[e]
    if isinstance(e, Load):
        n, dep = 0, True
    elif isinstance(e, Var):
        n, dep = 0, e.name in (ACC, VAL)
    elif isinstance(e, Const):
        n, dep = 0, False
    elif isinstance(e, Select):
        cn, cdep = _data_ops(e.cond, seen)
        tn, tdep = _data_ops(e.t, seen)
        fn, fdep = _data_ops(e.f, seen)
        # a data-independent condition is a bounds check (pad, concatenate, padding): free
        n, dep = (cn + tn + fn + 1, True) if cdep else (tn + fn, tdep or fdep)
    else:
        kids = [e.a] if isinstance(e, Unary | Cast) else [e.a, e.b]
        n, dep = 0, False
        for k in kids:
            kn, kd = _data_ops(k, seen)
            n, dep = n + kn, dep or kd
        n += int(dep and not isinstance(e, Cast))
    seen[e] = dep
    return n, dep


def stage_flops(s: Stage) -> float:
    """FLOPs of one stage (see the module docstring)."""
    points = math.prod(s.shape) * math.prod(a.extent for a in s.reduce_axes)
    ops, _ = _data_ops(s.body, {})
    if s.reducer is not None:
        ops += 1 if s.reducer.combiner is None else max(1, _data_ops(s.reducer.combiner, {})[0])
    return float(points * ops)


def flops(cd: ComputeDef) -> float:
    """FLOPs of a compute definition (dot/conv 2 per MAC; elementwise 1; reductions 1 per input)."""
    return sum(stage_flops(s) for s in cd.stages)


def _nbytes(shape: tuple[int, ...], dtype: DType) -> int:
    return math.prod(shape) * max(1, dtype.bits // 8)


def bytes_moved(cd: ComputeDef) -> int:
    """Bytes read and written: every input once, every output once."""
    outs = [cd.stage(o) for o in cd.outputs]
    return sum(_nbytes(b.shape, b.dtype) for b in cd.inputs) + sum(_nbytes(s.shape, s.dtype) for s in outs)


# ----------------------------------------------------------------------------- workloads

def _shape_str(shape: tuple[int, ...], dtype: DType) -> str:
    return f"{dtype.value}[{','.join(map(str, shape))}]"


@dataclass(frozen=True)
class Workload:
    """One tuning task: a compute definition, its key, and how often the program runs it."""

    key: str
    compute: ComputeDef
    weight: int
    flops: float
    bytes: int
    opcodes: tuple[str, ...]
    #: (input shapes, output shapes) as text, e.g. (("f32[16,16]", "f32[16]"), ("f32[16,16]",))
    shapes: tuple[tuple[str, ...], tuple[str, ...]]

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "weight": self.weight, "flops": self.flops, "bytes": self.bytes,
                           "opcodes": list(self.opcodes), "shapes": [list(s) for s in self.shapes],
                           "compute": compute_to_obj(self.compute)}, sort_keys=True)


def opcodes_of(comp: Computation) -> tuple[str, ...]:
    """The distinct opcodes of a computation (parameters and tuples left out), sorted."""
    return tuple(sorted({i.op.value for i in comp if i.op not in (Op.PARAMETER, Op.TUPLE)}))


def make_workload(cd: ComputeDef, opcodes: tuple[str, ...] = (), weight: int = 1) -> Workload:
    """A Workload for one compute definition."""
    ins = tuple(_shape_str(b.shape, b.dtype) for b in cd.inputs)
    outs = tuple(_shape_str(cd.stage(o).shape, cd.stage(o).dtype) for o in cd.outputs)
    return Workload(workload_key(cd), cd, weight, flops(cd), bytes_moved(cd), tuple(opcodes), (ins, outs))


def extract_workloads(program: Any, skip_unsupported: bool = False) -> tuple[tuple[Any, Workload], ...]:
    """((FusedSubgraph, Workload), ...) for every subgraph of a `fusion.FusedProgram`, in order.

    Subgraphs with the same key share one Workload (the first one's compute definition) whose
    weight is the number of such subgraphs.  With `skip_unsupported`, subgraphs that raise
    UnsupportedError are left out instead of raising.
    """
    from .compute import compute_definition
    built: list[tuple[Any, Workload]] = []
    for sg in program.subgraphs:
        try:
            cd = compute_definition(sg.computation, program.module, name=sg.name)
        except UnsupportedError:
            if skip_unsupported:
                continue
            raise
        built.append((sg, make_workload(cd, opcodes_of(sg.computation))))
    counts = Counter(w.key for _, w in built)
    first: dict[str, Workload] = {}
    out = []
    for sg, w in built:
        if w.key not in first:
            first[w.key] = Workload(w.key, w.compute, counts[w.key], w.flops, w.bytes, w.opcodes, w.shapes)
        out.append((sg, first[w.key]))
    return tuple(out)
