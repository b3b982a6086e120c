"""Schedule state (Ansor's `State`): stages with their loop iterators and compute locations.

Map:
  Iterator        a loop of a stage: name, extent (over the full domain), is_reduce, kind, pragmas
  SplitRel/FuseRel the iterator relations (binary splits by factor or nparts; fuses) from root axes to leaves
  Attach          compute location: root, inline, or at (stage, iterator)
  StageState      one stage: its computation (`op`, an ir Stage), leaves, relations, location, scope
  State           the stages (topological order) + the steps applied so far
  init_state(cd)  every stage at root with its natural loops
  apply(st, step) one step -> new State (pure); illegal steps raise ScheduleError with the reason
  replay(cd, steps)            (states of schedules just built by sampling / mutation are `remember`ed: no second
                               replay when they are lowered)
  propagate(rels, root_extents)   leaf/intermediate extents (split: inner = min(P, f), outer = ceil)
  root_exprs(rels, ext, leaf)     root axis expressions of the leaves, plus guards of inexact splits
  consumers(state, name)          non-inlined stages reading `name` once inlined stages are expanded
  check_attach(state)             every attached stage's consumers sit inside its attach loop

Rules tables: `_APPLY` maps a step class to its function.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cached_property

from ..errors import ScheduleError
from ..ir.expr import (
    INDEX,
    Axis,
    Binary,
    Cast,
    Compare,
    ComputeDef,
    Expr,
    Load,
    Select,
    Stage,
    Unary,
    Var,
    substitute,
    walk,
)
from ..ir.hlo import DType, Op
from .loop_ir import ForKind
from .simplify import bounds, ic
from .steps import (
    Annotate,
    CacheRead,
    CacheWrite,
    ComputeAt,
    ComputeInline,
    ComputeRoot,
    FollowFusedSplit,
    FollowSplit,
    Fuse,
    Pack,
    Pad,
    Pragma,
    Reorder,
    RFactor,
    Split,
    Step,
    StorageAlign,
)

SCOPES = ("global", "local", "shared")
#: loop pragmas (tensor_core: codegen.cuda GEMM template; prefetch_rows: codegen.llvm_emit, ignored elsewhere)
PRAGMAS = ("auto_unroll_max_step", "unroll_explicit", "tensor_core", "prefetch_rows")


@dataclass(frozen=True)
class Iterator:
    name: str
    extent: int
    is_reduce: bool
    kind: ForKind = ForKind.SERIAL
    pragmas: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class SplitRel:
    """parent -> (outer, inner); `factor` fixes the inner extent, else `nparts` the outer one."""

    parent: str
    outer: str
    inner: str
    factor: int | None = None
    nparts: int | None = None


@dataclass(frozen=True)
class FuseRel:
    parents: tuple[str, ...]
    fused: str


@dataclass(frozen=True)
class Attach:
    kind: str  # "root" | "inline" | "at"
    stage: str = ""
    iter: str = ""

    def __str__(self) -> str:
        return f"at {self.stage}.{self.iter}" if self.kind == "at" else self.kind


ROOT = Attach("root")
INLINE = Attach("inline")


@dataclass(frozen=True)
class StageState:
    """A stage of the state.  `op` is its computation over root axes (op.axes space, op.reduce_axes
    reduce); `predicate` (over root axis vars) guards the reduction update (from rfactor of an
    inexact split); `align` holds (axis, factor, offset) storage alignments."""

    name: str
    op: Stage
    iters: tuple[Iterator, ...]
    relations: tuple[SplitRel | FuseRel, ...] = ()
    attach: Attach = ROOT
    scope: str = "global"
    predicate: Expr | None = None
    align: tuple[tuple[int, int, int], ...] = ()

    def iter_pos(self, name: str) -> int:
        for k, it in enumerate(self.iters):
            if it.name == name:
                return k
        raise ScheduleError(f"stage {self.name} has no iterator {name!r} "
                            f"(has {', '.join(i.name for i in self.iters)})")

    @property
    def untransformed(self) -> bool:
        return not self.relations and self.iters == initial_iters(self.op)


@dataclass(frozen=True)
class State:
    cd: ComputeDef
    stages: tuple[StageState, ...]
    steps: tuple[Step, ...] = ()

    @cached_property
    def by_name(self) -> dict[str, int]:
        return {s.name: k for k, s in enumerate(self.stages)}

    def stage(self, name: str) -> StageState:
        k = self.by_name.get(name)
        if k is None:
            raise ScheduleError(f"no stage {name!r} (stages: {', '.join(s.name for s in self.stages)})")
        return self.stages[k]

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.cd.outputs

    def with_stage(self, st: StageState) -> State:
        k = self.by_name[st.name]
        return _renew(self, stages=self.stages[:k] + (st,) + self.stages[k + 1:])

    def __str__(self) -> str:
        lines = []
        for s in self.stages:
            its = " ".join(f"{i.name}:{i.extent}{'r' if i.is_reduce else ''}"
                           f"{'' if i.kind is ForKind.SERIAL else '/' + i.kind.value}" for i in s.iters)
            lines.append(f"{s.name} [{s.attach}, {s.scope}]: {its}")
        return "\n".join(lines)


def _renew(obj, **changes):
    """`dataclasses.replace` for the frozen StageState / State / Iterator, without running __init__ (replay
    makes hundreds of thousands of these; `replace` was its largest cost).  A State keeps its cached
    `by_name` unless its stage names change (callers that insert stages pass `stages` through `_insert`)."""
    new = object.__new__(type(obj))
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    return new


# ----------------------------------------------------------------------------- relations

def _iterator(name: str, extent: int, is_reduce: bool) -> Iterator:
    """Iterator(name, extent, is_reduce) without the frozen dataclass' __init__ (replay makes many)."""
    it = object.__new__(Iterator)
    it.__dict__.update(name=name, extent=extent, is_reduce=is_reduce, kind=ForKind.SERIAL, pragmas=())
    return it


def initial_iters(op: Stage) -> tuple[Iterator, ...]:
    return (tuple(Iterator(a.name, a.extent, False) for a in op.axes)
            + tuple(Iterator(a.name, a.extent, True) for a in op.reduce_axes))


def propagate(rels, root_extents: dict[str, int]) -> dict[str, int]:
    """Extents of every node below the roots (TVM's tightening: inner = min(parent, factor))."""
    ext = dict(root_extents)
    for r in rels:
        if isinstance(r, SplitRel):
            p = ext[r.parent]
            if r.factor is not None:
                ext[r.inner] = min(p, r.factor)
                ext[r.outer] = -(-p // r.factor)
            else:
                ext[r.outer] = min(p, r.nparts)
                ext[r.inner] = -(-p // r.nparts)
        else:
            n = 1
            for q in r.parents:
                n *= ext[q]
            ext[r.fused] = n
    return ext


def root_exprs(rels, ext: dict[str, int], leaf: dict[str, Expr]) -> tuple[dict[str, Expr], list[Expr]]:
    """Expressions of every node in terms of the leaves (`leaf`), and the guards `node < extent`
    needed where a split covers more than its parent."""
    val = dict(leaf)
    guards: list[Expr] = []
    for r in reversed(rels):
        if isinstance(r, SplitRel):
            ie = ext[r.inner]
            e = Binary(Op.ADD, Binary(Op.MULTIPLY, val[r.outer], ic(ie), INDEX), val[r.inner], INDEX)
            val[r.parent] = e
            if ext[r.outer] * ie != ext[r.parent]:
                guards.append(Compare("LT", e, ic(ext[r.parent])))
        else:
            f = val[r.fused]
            stride = 1
            for k in range(len(r.parents) - 1, -1, -1):
                q = r.parents[k]
                e = f if stride == 1 else Binary(Op.DIVIDE, f, ic(stride), INDEX)
                if k > 0:
                    e = Binary(Op.REMAINDER, e, ic(ext[q]), INDEX)
                val[q] = e
                stride *= ext[q]
    return val, guards


def _descendants(rels, roots: set[str]) -> set[str]:
    out = set(roots)
    for r in rels:
        if isinstance(r, SplitRel):
            if r.parent in out:
                out |= {r.outer, r.inner}
        elif any(p in out for p in r.parents):
            out.add(r.fused)
    return out


# ----------------------------------------------------------------------------- queries

_LOADS: dict[int, tuple[Expr, frozenset[str]]] = {}
_LOADS_MAX = 8192


def loads_of(e: Expr) -> frozenset[str]:
    """Buffers loaded by expression `e` (cached per expression object: stage bodies are shared by every
    state of a replay, and `apply` asks for them at almost every step)."""
    hit = _LOADS.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    out = frozenset(n.buffer for n in walk(e) if isinstance(n, Load))
    if len(_LOADS) >= _LOADS_MAX:
        _LOADS.clear()
    _LOADS[id(e)] = (e, out)
    return out


def consumers(state: State, name: str) -> list[str]:
    """Non-inlined stages that read `name`, looking through inlined stages."""
    out: list[str] = []
    todo = [name]
    seen = set()
    while todo:
        b = todo.pop()
        for s in state.stages:
            if s.name in seen or b not in loads_of(s.op.body):
                continue
            seen.add(s.name)
            if s.attach.kind == "inline":
                todo.append(s.name)
            elif s.name not in out:
                out.append(s.name)
    return sorted(out, key=lambda n: state.by_name[n])


def attach_chain(state: State, name: str) -> list[tuple[str, int]]:
    """The loops (stage, iterator position) enclosing stage `name`'s nest, innermost first."""
    out = []
    seen = {name}
    st = state.stage(name)
    while st.attach.kind == "at":
        t = state.stage(st.attach.stage)
        if t.name in seen:
            raise ScheduleError(f"compute_at cycle through stage {t.name}")
        seen.add(t.name)
        out.append((t.name, t.iter_pos(st.attach.iter)))
        st = t
    return out


def inside(state: State, name: str, target: str, pos: int) -> bool:
    """Whether stage `name` is `target` itself or nested inside loop `pos` of `target`."""
    if name == target:
        return True
    return any(t == target and p >= pos for t, p in attach_chain(state, name))


def check_attach(state: State, name: str) -> None:
    """The consumers of an attached stage must run inside its attach loop."""
    st = state.stage(name)
    if st.attach.kind != "at":
        return
    t = state.stage(st.attach.stage)
    if t.attach.kind == "inline":
        raise ScheduleError(f"stage {name} is computed at {t.name}, which is inlined")
    pos = t.iter_pos(st.attach.iter)
    chain = attach_chain(state, name)  # raises on cycles
    del chain
    for c in consumers(state, name):
        if not inside(state, c, t.name, pos):
            raise ScheduleError(f"compute_at {name} at {t.name}.{st.attach.iter}: its consumer {c} "
                                f"is not inside that loop")


def _attached_at(state: State, stage: str, iters: set[str]) -> list[str]:
    return [s.name for s in state.stages if s.attach.kind == "at" and s.attach.stage == stage
            and s.attach.iter in iters]


# ----------------------------------------------------------------------------- steps

def init_state(cd: ComputeDef) -> State:
    """Every stage at root with its natural loop nest (space axes, then reduce axes)."""
    stages = []
    for s in cd.stages:
        its = initial_iters(s)
        if len({i.name for i in its}) != len(its):
            raise ScheduleError(f"stage {s.name} has repeated axis names")
        stages.append(StageState(s.name, s, its))
    names = [s.name for s in cd.stages]
    for o in cd.outputs:
        if o not in names:
            raise ScheduleError(f"output {o} of {cd.name} is not a stage")
    return State(cd, tuple(stages))


def _fresh(existing: set[str], base: str) -> str:
    name = base
    while name in existing:
        name += "_"
    return name


def _check_free(state: State, st: StageState, names: set[str], what: str) -> None:
    for it in st.iters:
        if it.name in names and (it.kind is not ForKind.SERIAL or it.pragmas):
            raise ScheduleError(f"{what} of annotated iterator {st.name}.{it.name}")


def _move_attach(state: State, stage: str, old: set[str], new: str) -> State:
    """Stages computed at one of `old` loops of `stage` move to loop `new` (split: the innermost part;
    fuse: the fused loop), which still encloses their consumers."""
    for s in state.stages:
        if s.attach.kind == "at" and s.attach.stage == stage and s.attach.iter in old:
            state = state.with_stage(_renew(s, attach=Attach("at", stage, new)))
    return state


def _do_split(state: State, stage: str, iter_: str, lengths: tuple, inner_to_outer: bool) -> State:
    st = state.stage(stage)
    pos = st.iter_pos(iter_)
    it = st.iters[pos]
    if not lengths:
        raise ScheduleError(f"split of {stage}.{iter_}: no factors")
    for f in lengths:
        if f is None:
            raise ScheduleError(f"split of {stage}.{iter_}: undetermined factor (None)")
        if not isinstance(f, int) or isinstance(f, bool) or f <= 0:
            raise ScheduleError(f"split of {stage}.{iter_}: factor {f!r} must be a positive integer")
    _check_free(state, st, {iter_}, "split")
    existing = {i.name for i in st.iters}
    n = len(lengths) + 1
    names = []
    for k in range(n):
        nm = _fresh(existing, f"{iter_}.{k}")
        existing.add(nm)
        names.append(nm)
    rels: list[SplitRel] = []
    cur = iter_
    if inner_to_outer:
        for k in range(n - 1, 0, -1):
            outer = names[0] if k == 1 else f"{iter_}#{k}"
            rels.append(SplitRel(cur, outer, names[k], factor=lengths[k - 1]))
            cur = outer
    else:
        for k in range(n - 1):
            inner = names[-1] if k == n - 2 else f"{iter_}#{k}"
            rels.append(SplitRel(cur, names[k], inner, nparts=lengths[k]))
            cur = inner
    ext = propagate(rels, {iter_: it.extent})
    new = tuple([_iterator(nm, ext[nm], it.is_reduce) for nm in names])
    st = _renew(st, iters=st.iters[:pos] + new + st.iters[pos + 1:], relations=st.relations + tuple(rels))
    return _move_attach(state.with_stage(st), stage, {iter_}, names[-1])


def _split(state: State, s: Split) -> State:
    return _do_split(state, s.stage, s.iter, tuple(s.factors), s.inner_to_outer)


def _src_split(state: State, k: int) -> Split:
    if not isinstance(k, int) or not 0 <= k < len(state.steps):
        raise ScheduleError(f"follow split: no step {k} (have {len(state.steps)})")
    src = state.steps[k]
    if isinstance(src, FollowSplit | FollowFusedSplit):
        src = _resolved_split(state, k)
    if not isinstance(src, Split):
        raise ScheduleError(f"follow split: step {k} is not a split")
    return src


def _resolved_split(state: State, k: int) -> Split:
    src = state.steps[k]
    lengths = _follow_lengths(state, src)
    ito = src.factor_or_nparts if isinstance(src, FollowFusedSplit) else _src_split(state, src.src_step).inner_to_outer
    return Split(src.stage, src.iter, lengths, ito)


def _follow_lengths(state: State, s: FollowSplit | FollowFusedSplit) -> tuple[int, ...]:
    if isinstance(s, FollowSplit):
        src = _src_split(state, s.src_step)
        if not 2 <= s.n_split <= len(src.factors) + 1:
            raise ScheduleError(f"follow_split of {s.stage}.{s.iter}: n_split {s.n_split} not in "
                                f"[2, {len(src.factors) + 1}]")
        head = tuple(src.factors[:s.n_split - 2])
        tail = 1
        for f in src.factors[s.n_split - 2:]:
            if f is None:
                raise ScheduleError(f"follow_split of {s.stage}.{s.iter}: source factor undetermined")
            tail *= f
        return head + (tail,)
    prod = 1
    for k in s.src_steps:
        src = _src_split(state, k)
        if not 0 <= s.level < len(src.factors):
            raise ScheduleError(f"follow_fused_split: level {s.level} out of range for step {k}")
        f = src.factors[s.level]
        if f is None:
            raise ScheduleError("follow_fused_split: source factor undetermined")
        prod *= f
    return (prod,)


def _follow_split(state: State, s: FollowSplit) -> State:
    src = _src_split(state, s.src_step)
    return _do_split(state, s.stage, s.iter, _follow_lengths(state, s), src.inner_to_outer)


def _follow_fused_split(state: State, s: FollowFusedSplit) -> State:
    return _do_split(state, s.stage, s.iter, _follow_lengths(state, s), s.factor_or_nparts)


def _reorder(state: State, s: Reorder) -> State:
    st = state.stage(s.stage)
    have = [i.name for i in st.iters]
    if sorted(s.order) != sorted(have) or len(set(s.order)) != len(s.order):
        raise ScheduleError(f"reorder of {s.stage}: {list(s.order)} is not a permutation of {have}")
    by = {i.name: i for i in st.iters}
    if any(by[n].kind is ForKind.VECTORIZED for n in s.order[:-1]):
        raise ScheduleError(f"reorder of {s.stage}: a vectorized iterator must stay innermost")
    return state.with_stage(_renew(st, iters=tuple(by[n] for n in s.order)))


def _fuse(state: State, s: Fuse) -> State:
    st = state.stage(s.stage)
    if len(s.iters) < 2:
        raise ScheduleError(f"fuse of {s.stage}: needs at least two iterators")
    ps = [st.iter_pos(n) for n in s.iters]
    if ps != list(range(ps[0], ps[0] + len(ps))):
        raise ScheduleError(f"fuse of {s.stage}: iterators {list(s.iters)} are not adjacent in loop order "
                            f"{[i.name for i in st.iters]}")
    its = [st.iters[p] for p in ps]
    if len({i.is_reduce for i in its}) != 1:
        raise ScheduleError(f"fuse of {s.stage}: cannot fuse space and reduction iterators {list(s.iters)}")
    _check_free(state, st, set(s.iters), "fuse")
    name = _fresh({i.name for i in st.iters}, "@".join(s.iters))
    ext = 1
    for i in its:
        ext *= i.extent
    new = Iterator(name, ext, its[0].is_reduce)
    st = _renew(st, iters=st.iters[:ps[0]] + (new,) + st.iters[ps[-1] + 1:],
                 relations=st.relations + (FuseRel(tuple(s.iters), name),))
    return _move_attach(state.with_stage(st), s.stage, set(s.iters), name)


def _compute_at(state: State, s: ComputeAt) -> State:
    st = state.stage(s.stage)
    t = state.stage(s.target)
    if s.stage == s.target:
        raise ScheduleError(f"compute_at of {s.stage} into itself")
    if s.stage in state.outputs:
        raise ScheduleError(f"compute_at of output {s.stage}: outputs are computed at root")
    if t.attach.kind == "inline":
        raise ScheduleError(f"compute_at of {s.stage} into inlined stage {t.name}")
    pos = t.iter_pos(s.iter)
    if s.target not in _transitive_consumers(state, s.stage):
        raise ScheduleError(f"compute_at of {s.stage} into {t.name}, which does not consume it")
    if t.iters[pos].kind is ForKind.VECTORIZED:
        raise ScheduleError(f"compute_at of {s.stage} into vectorized loop {t.name}.{s.iter}")
    if any(i.kind is ForKind.PARALLEL for i in st.iters):
        raise ScheduleError(f"compute_at of {s.stage}: it has a parallel loop (parallel loops are outermost)")
    new = state.with_stage(_renew(st, attach=Attach("at", t.name, s.iter)))
    if any(n == s.stage for n, _ in _safe_chain(new, t.name)):
        raise ScheduleError(f"compute_at of {s.stage} at {t.name}.{s.iter} creates a cycle "
                            f"({t.name} is computed inside {s.stage})")
    check_attach(new, s.stage)
    return new


def _transitive_consumers(state: State, name: str) -> set[str]:
    out: set[str] = set()
    todo = [name]
    while todo:
        b = todo.pop()
        for st in state.stages:
            if st.name not in out and b in loads_of(st.op.body):
                out.add(st.name)
                todo.append(st.name)
    return out


def _safe_chain(state: State, name: str) -> list[tuple[str, int]]:
    try:
        return attach_chain(state, name)
    except ScheduleError:
        return [(name, 0)]


def _compute_inline(state: State, s: ComputeInline) -> State:
    st = state.stage(s.stage)
    if s.stage in state.outputs:
        raise ScheduleError(f"compute_inline of output {s.stage}")
    if st.op.is_reduction:
        raise ScheduleError(f"compute_inline of reduction {s.stage}")
    att = _attached_at(state, s.stage, {i.name for i in st.iters})
    if att:
        raise ScheduleError(f"compute_inline of {s.stage}: stage {att[0]} is computed at one of its loops")
    new = state.with_stage(_renew(st, attach=INLINE))
    for other in new.stages:
        if other.attach.kind == "at":
            check_attach(new, other.name)
    return new


def _compute_root(state: State, s: ComputeRoot) -> State:
    st = state.stage(s.stage)
    return state.with_stage(_renew(st, attach=ROOT))


def _rename_loads(e: Expr, old: str, new: str) -> Expr:
    if isinstance(e, Load):
        return Load(new if e.buffer == old else e.buffer, tuple(_rename_loads(i, old, new) for i in e.indices),
                    e.dtype)
    if isinstance(e, Unary):
        return Unary(e.op, _rename_loads(e.a, old, new), e.dtype)
    if isinstance(e, Binary):
        return Binary(e.op, _rename_loads(e.a, old, new), _rename_loads(e.b, old, new), e.dtype)
    if isinstance(e, Compare):
        return Compare(e.direction, _rename_loads(e.a, old, new), _rename_loads(e.b, old, new), e.dtype)
    if isinstance(e, Select):
        return Select(_rename_loads(e.cond, old, new), _rename_loads(e.t, old, new),
                      _rename_loads(e.f, old, new), e.dtype)
    if isinstance(e, Cast):
        return Cast(_rename_loads(e.a, old, new), e.dtype)
    return e


def _buffer_info(state: State, name: str) -> tuple[tuple[int, ...], DType]:
    for b in state.cd.inputs:
        if b.name == name:
            return b.shape, b.dtype
    st = state.stage(name)
    return st.op.shape, st.op.dtype


def _insert(state: State, k: int, st: StageState) -> State:
    return State(state.cd, state.stages[:k] + (st,) + state.stages[k:], state.steps)


def _cache_read(state: State, s: CacheRead) -> State:
    if s.scope not in SCOPES:
        raise ScheduleError(f"cache_read of {s.stage}: unknown scope {s.scope!r}")
    shape, dtype = _buffer_info(state, s.stage)
    if s.stage in state.by_name and state.stage(s.stage).attach.kind == "inline":
        raise ScheduleError(f"cache_read of inlined stage {s.stage}")
    if not s.readers:
        raise ScheduleError(f"cache_read of {s.stage}: no readers")
    for r in s.readers:
        rs = state.stage(r)
        if rs.attach.kind == "inline" or s.stage not in loads_of(rs.op.body):
            raise ScheduleError(f"cache_read of {s.stage}: {r} does not read it (directly)")
    name = _fresh(set(state.by_name) | {b.name for b in state.cd.inputs}, f"{s.stage}.{s.scope}")
    axes = tuple(Axis(f"ax{d}", n) for d, n in enumerate(shape))
    op = Stage(name, axes, Load(s.stage, tuple(a.var for a in axes), dtype), dtype)
    for r in s.readers:
        rs = state.stage(r)
        state = state.with_stage(_renew(rs, op=replace(rs.op, body=_rename_loads(rs.op.body, s.stage, name))))
    first = min(state.by_name[r] for r in s.readers)
    return _insert(state, first, StageState(name, op, initial_iters(op), scope=s.scope))


def _cache_write(state: State, s: CacheWrite) -> State:
    if s.scope not in SCOPES:
        raise ScheduleError(f"cache_write of {s.stage}: unknown scope {s.scope!r}")
    st = state.stage(s.stage)
    if st.attach.kind == "inline":
        raise ScheduleError(f"cache_write of inlined stage {s.stage}")
    if not st.untransformed:
        raise ScheduleError(f"cache_write of {s.stage}: apply it before splitting, fusing, reordering or "
                            f"annotating the stage")
    red = {i.name for i in st.iters if i.is_reduce}
    att = _attached_at(state, s.stage, red)
    if att:
        raise ScheduleError(f"cache_write of {s.stage}: {att[0]} is computed at a reduction loop")
    name = _fresh(set(state.by_name) | {b.name for b in state.cd.inputs}, f"{s.stage}.{s.scope}")
    op = replace(st.op, name=name)
    local = StageState(name, op, initial_iters(op), scope=s.scope, predicate=st.predicate)
    copy_op = Stage(st.name, st.op.axes, Load(name, tuple(a.var for a in st.op.axes), st.op.dtype), st.op.dtype)
    state = state.with_stage(_renew(st, op=copy_op, iters=initial_iters(copy_op), predicate=None))
    return _insert(state, state.by_name[s.stage], local)


def _rfactor(state: State, s: RFactor) -> State:
    st = state.stage(s.stage)
    if not st.op.is_reduction:
        raise ScheduleError(f"rfactor of {s.stage}: not a reduction")
    if st.attach.kind == "inline":
        raise ScheduleError(f"rfactor of inlined stage {s.stage}")
    it = st.iters[st.iter_pos(s.iter)]
    if not it.is_reduce:
        raise ScheduleError(f"rfactor of {s.stage}.{s.iter}: not a reduction iterator")
    space = {a.name for a in st.op.axes}
    touched = _descendants(st.relations, space)
    if touched != space or any(i.kind is not ForKind.SERIAL or i.pragmas for i in st.iters):
        raise ScheduleError(f"rfactor of {s.stage}: apply it before transforming or annotating space iterators")
    red = [i for i in st.iters if i.is_reduce]
    att = _attached_at(state, s.stage, {i.name for i in red})
    if att:
        raise ScheduleError(f"rfactor of {s.stage}: {att[0]} is computed at a reduction loop")
    ext = propagate(st.relations, {a.name: a.extent for a in st.op.reduce_axes})
    vals, guards = root_exprs(st.relations, ext, {i.name: Var(i.name, INDEX) for i in red})
    sub = {a.name: vals[a.name] for a in st.op.reduce_axes}
    names = set(state.by_name) | {b.name for b in state.cd.inputs}
    rf = _fresh(names, f"{s.stage}.rf")
    if it.name in space or any(i.name in space for i in red):
        raise ScheduleError(f"rfactor of {s.stage}: iterator names clash with space axes")
    rf_axes = (Axis(it.name, it.extent),) + st.op.axes
    rf_red = tuple(Axis(i.name, i.extent) for i in red if i.name != it.name)
    preds = list(guards)
    if st.predicate is not None:
        preds.append(substitute(st.predicate, sub))
    pred = None
    for g in preds:
        pred = g if pred is None else Binary(Op.AND, pred, g, DType.PRED)
    rf_op = Stage(rf, rf_axes, substitute(st.op.body, sub), st.op.dtype, rf_red, st.op.reducer)
    rf_st = StageState(rf, rf_op, initial_iters(rf_op), predicate=pred)
    fin_axis = Axis(it.name, it.extent)
    fin_op = Stage(st.name, st.op.axes, Load(rf, (fin_axis.var,) + tuple(a.var for a in st.op.axes), st.op.dtype),
                   st.op.dtype, (fin_axis,), st.op.reducer)
    state = state.with_stage(_renew(st, op=fin_op, iters=initial_iters(fin_op), relations=(), predicate=None))
    return _insert(state, state.by_name[s.stage], rf_st)


def _pack(state: State, s: Pack) -> State:
    """Root stage `<stage>.pack` = buffer `stage` with dimension `axis` split by `factor` (outer part at
    `outer_pos` among the other dimensions, inner part last); `readers` load from it instead."""
    shape, dtype = _buffer_info(state, s.stage)
    nd = len(shape)
    if s.stage in state.by_name and state.stage(s.stage).attach.kind == "inline":
        raise ScheduleError(f"pack of inlined stage {s.stage}")
    for v, what in ((s.axis, "axis"), (s.factor, "factor"), (s.outer_pos, "outer_pos")):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ScheduleError(f"pack of {s.stage}: {what} {v!r} must be an integer")
    if not 0 <= s.axis < nd:
        raise ScheduleError(f"pack of {s.stage}: axis {s.axis} out of range for rank {nd}")
    if s.factor < 1:
        raise ScheduleError(f"pack of {s.stage}: factor {s.factor} must be at least 1")
    if not 0 <= s.outer_pos < nd:
        raise ScheduleError(f"pack of {s.stage}: outer_pos {s.outer_pos} not in [0, {nd - 1}]")
    if not s.readers:
        raise ScheduleError(f"pack of {s.stage}: no readers")
    for r in s.readers:
        rs = state.stage(r)
        if rs.attach.kind == "inline" or s.stage not in loads_of(rs.op.body):
            raise ScheduleError(f"pack of {s.stage}: {r} does not read it (directly)")
    name = _fresh(set(state.by_name) | {b.name for b in state.cd.inputs}, f"{s.stage}.pack")
    rest = [d for d in range(nd) if d != s.axis]
    dims = rest[:s.outer_pos] + [-1] + rest[s.outer_pos:]          # -1: the outer part of `axis`
    ext = {d: shape[d] for d in rest}
    ext[-1] = -(-shape[s.axis] // s.factor)
    axes = tuple(Axis(f"ax{k}", ext[d]) for k, d in enumerate(dims)) + (Axis(f"ax{len(dims)}", s.factor),)
    src = [None] * nd
    for a, d in zip(axes, dims):
        if d >= 0:
            src[d] = a.var
    src[s.axis] = Binary(Op.ADD, Binary(Op.MULTIPLY, axes[dims.index(-1)].var, ic(s.factor), INDEX),
                         axes[-1].var, INDEX)
    if shape[s.axis] % s.factor:      # padded: the last block repeats the last element
        src[s.axis] = Binary(Op.MINIMUM, src[s.axis], ic(shape[s.axis] - 1), INDEX)
    op = Stage(name, axes, Load(s.stage, tuple(src), dtype), dtype)

    def repack(e: Expr) -> Expr:
        if isinstance(e, Load) and e.buffer == s.stage:
            idx = [repack(i) for i in e.indices]
            j = idx[s.axis]
            new = [idx[d] for d in rest]
            new.insert(s.outer_pos, Binary(Op.DIVIDE, j, ic(s.factor), INDEX))
            return Load(name, tuple(new) + (Binary(Op.REMAINDER, j, ic(s.factor), INDEX),), e.dtype)
        return _map_exprs(e, repack)

    for r in s.readers:
        rs = state.stage(r)
        state = state.with_stage(_renew(rs, op=replace(rs.op, body=repack(rs.op.body))))
    first = min(state.by_name[r] for r in s.readers)
    return _insert(state, first, StageState(name, op, initial_iters(op)))


def _pad(state: State, s: Pad) -> State:
    """Stage `s.stage` with space axis `s.iter` extended to `s.extent`; its loads indexed by that axis clamped into
    their buffers where bounds say they could leave them."""
    st = state.stage(s.stage)
    if not isinstance(s.extent, int) or isinstance(s.extent, bool):
        raise ScheduleError(f"pad of {s.stage}: extent {s.extent!r} must be an integer")
    if s.stage in state.outputs:
        raise ScheduleError(f"pad of {s.stage}: an output of the computation (its padding would be written)")
    if st.attach.kind == "inline":
        raise ScheduleError(f"pad of inlined stage {s.stage}")
    axis = next((a for a in st.op.axes if a.name == s.iter), None)
    if axis is None:
        raise ScheduleError(f"pad of {s.stage}: no space axis {s.iter!r} "
                            f"(has {', '.join(a.name for a in st.op.axes)})")
    if any(s.iter in (r.parents if isinstance(r, FuseRel) else (r.parent,)) for r in st.relations):
        raise ScheduleError(f"pad of {s.stage}: axis {s.iter} is already split or fused")
    if s.extent < axis.extent:
        raise ScheduleError(f"pad of {s.stage}: extent {s.extent} is less than axis {s.iter}'s {axis.extent}")
    axes = tuple(Axis(a.name, s.extent) if a.name == s.iter else a for a in st.op.axes)
    ranges = {a.name: (0, a.extent - 1) for a in axes + st.op.reduce_axes}

    def clamp(e: Expr) -> Expr:
        if not isinstance(e, Load):
            return _map_exprs(e, clamp)
        shape, _ = _buffer_info(state, e.buffer)
        idx = []
        for i, n in zip((clamp(x) for x in e.indices), shape):
            if not any(isinstance(v, Var) and v.name == s.iter for v in walk(i)):
                idx.append(i)       # not indexed by the padded axis: it reads what it read before
                continue
            b = bounds(i, ranges)
            if b is None or b[0] < 0:
                i = Binary(Op.MAXIMUM, i, ic(0), INDEX)
            if b is None or b[1] > n - 1:
                i = Binary(Op.MINIMUM, i, ic(n - 1), INDEX)
            idx.append(i)
        return Load(e.buffer, tuple(idx), e.dtype)

    op = replace(st.op, axes=axes, body=clamp(st.op.body))
    iters = tuple(_renew(it, extent=s.extent) if it.name == s.iter else it for it in st.iters)
    return state.with_stage(_renew(st, op=op, iters=iters))


def _map_exprs(e: Expr, fn) -> Expr:
    """`e` with `fn` applied to each direct child expression."""
    if isinstance(e, Load):
        return Load(e.buffer, tuple(fn(i) for i in e.indices), e.dtype)
    if isinstance(e, Unary):
        return Unary(e.op, fn(e.a), e.dtype)
    if isinstance(e, Binary):
        return Binary(e.op, fn(e.a), fn(e.b), e.dtype)
    if isinstance(e, Compare):
        return Compare(e.direction, fn(e.a), fn(e.b), e.dtype)
    if isinstance(e, Select):
        return Select(fn(e.cond), fn(e.t), fn(e.f), e.dtype)
    if isinstance(e, Cast):
        return Cast(fn(e.a), e.dtype)
    return e


def _annotate(state: State, s: Annotate) -> State:
    st = state.stage(s.stage)
    pos = st.iter_pos(s.iter)
    it = st.iters[pos]
    kind = ForKind(s.kind)
    if it.is_reduce and kind is not ForKind.SERIAL and kind is not ForKind.UNROLLED:
        raise ScheduleError(f"annotate {s.stage}.{s.iter} {kind.value}: it is a reduction iterator")
    if kind is ForKind.VECTORIZED:
        if pos != len(st.iters) - 1:
            raise ScheduleError(f"vectorize {s.stage}.{s.iter}: only the innermost iterator can be vectorized")
        if _attached_at(state, s.stage, {s.iter}):
            raise ScheduleError(f"vectorize {s.stage}.{s.iter}: a stage is computed at it")
    if kind is ForKind.PARALLEL and st.attach.kind == "at":
        raise ScheduleError(f"parallel {s.stage}.{s.iter}: the stage is computed inside another loop")
    its = st.iters[:pos] + (_renew(it, kind=kind),) + st.iters[pos + 1:]
    return state.with_stage(_renew(st, iters=its))


def _pragma(state: State, s: Pragma) -> State:
    st = state.stage(s.stage)
    pos = st.iter_pos(s.iter)
    if s.name not in PRAGMAS:
        raise ScheduleError(f"pragma {s.name!r} unknown (known: {', '.join(PRAGMAS)})")
    if not isinstance(s.value, int) or s.value < 0:
        raise ScheduleError(f"pragma {s.name}: value {s.value!r} must be a non-negative integer")
    it = st.iters[pos]
    prs = tuple(p for p in it.pragmas if p[0] != s.name) + ((s.name, s.value),)
    its = st.iters[:pos] + (_renew(it, pragmas=prs),) + st.iters[pos + 1:]
    return state.with_stage(_renew(st, iters=its))


def _storage_align(state: State, s: StorageAlign) -> State:
    st = state.stage(s.stage)
    if s.stage in state.outputs:
        raise ScheduleError(f"storage_align of output {s.stage}: its layout is fixed")
    nd = len(st.op.axes)
    if s.axis != nd - 2:
        raise ScheduleError(f"storage_align of {s.stage}: only axis {nd - 2} (the second-to-last) is supported")
    if s.factor < 1 or not 0 <= s.offset < s.factor:
        raise ScheduleError(f"storage_align of {s.stage}: need factor >= 1 and 0 <= offset < factor")
    return state.with_stage(_renew(st, align=st.align + ((s.axis, s.factor, s.offset),)))


_APPLY = {
    Split: _split, FollowSplit: _follow_split, FollowFusedSplit: _follow_fused_split, Reorder: _reorder,
    Fuse: _fuse, ComputeAt: _compute_at, ComputeInline: _compute_inline, ComputeRoot: _compute_root,
    CacheRead: _cache_read, CacheWrite: _cache_write, RFactor: _rfactor, Annotate: _annotate,
    Pragma: _pragma, StorageAlign: _storage_align, Pack: _pack, Pad: _pad,
}


def apply(state: State, step: Step) -> State:
    """Apply one step; the result records it in `steps`.  Raises ScheduleError when illegal."""
    fn = _APPLY.get(type(step))
    if fn is None:
        raise ScheduleError(f"not a schedule step: {step!r}")
    try:
        new = fn(state, step)
        if isinstance(step, CacheRead | CacheWrite | RFactor | ComputeInline | ComputeRoot | Pack):
            for st in new.stages:
                check_attach(new, st.name)
    except ScheduleError as e:
        raise ScheduleError(f"step {len(state.steps)} ({step.tag}): {e.message}") from None
    return _renew(new, steps=state.steps + (step,))


_REPLAYED: OrderedDict[int, tuple[tuple, ComputeDef, State]] = OrderedDict()
_REPLAYED_MAX = 2048


def remember(state: State) -> None:
    """Keep `state` for a later `replay(state.cd, state.steps)` of the very same steps tuple (e.g. `lower` of a
    schedule that sampling or mutation has just replayed to validate it): a small LRU keyed by the identity of
    the steps tuple, so a lookup costs no hashing of the steps."""
    _REPLAYED[id(state.steps)] = (state.steps, state.cd, state)
    _REPLAYED.move_to_end(id(state.steps))
    if len(_REPLAYED) > _REPLAYED_MAX:
        _REPLAYED.popitem(last=False)


def replay(cd: ComputeDef, steps) -> State:
    """The state after applying `steps` (a sequence of Step, or a Schedule) to `cd`."""
    steps = getattr(steps, "steps", steps)
    hit = _REPLAYED.get(id(steps))
    if hit is not None and hit[0] is steps and hit[1] is cd:
        return hit[2]
    st = init_state(cd)
    for s in steps:
        st = apply(st, s)
    return st
