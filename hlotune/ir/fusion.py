"""XLA-style fusion: an optimized Module -> fused subgraphs + a glue module that calls them.

Map:
  FusedSubgraph, FusedProgram   the result (frozen)
  fuse(module)                  the driver: prepare, cluster, (sibling-)merge, emit
  _Graph                        mutable clusters of instruction names over the entry computation,
                                with the value -> home cluster map and reader sets
  _producer_rule                may a producer cluster fuse into a consumer cluster, and how
                                (move, duplicate, multi-output merge)
  _sibling_pass                 multi-output fusion of clusters reading the same large input
  _emit                         builds fused computations and the glue entry
  fold_dot_transposes(comp)     transpose(dot(a, b)) -> dot(b, a) when that is the same array (run first)

Rules (see DESIGN.md and the fusion tests):
  - loop fusion: elementwise ops with their data-movement/constant producers;
  - input fusion: reduce / reduce-window with their elementwise producers;
  - output fusion: dot / convolution with their elementwise consumers (bias, activation, residual);
  - a cluster holds at most one reduction-bearing op (reduce, reduce-window, dot, convolution);
    so a reduction is never fused into another one's inputs and no fusion has two dots;
    except:
  - row fusion (normalizations: softmax, layernorm, RMS norm; setting `row_fusion`): reductions over
    the trailing ("row") dims k.. of operands of one shape D fuse with each other and with consumers
    that read their results broadcast along the row, when the merged cluster holds no dot /
    convolution / reduce-window and every member is row-shaped: D itself (elementwise, broadcasts of
    row statistics [D[:k]], row vectors [D[k:]] or scalars), a row statistic (D[:k], size-1 dims
    ignored), or a scalar; one row is at most ROW_FUSION_MAX_BYTES (the default schedule then keeps
    a row in cache between the statistics and the output: one read from memory, one write);
  - only cheap producers (no reduction, no transcendental, few ops) are duplicated into several
    consumers; others either move whole or become an extra output of the consumer (multi-output);
  - dot / convolution take producers that are pure data movement or converts only;
  - merges never create a cycle between clusters (checked by reachability).
Before clustering, a transpose whose operand is a dot read by nothing else, and whose permutation
swaps the dot's two groups of free dims (batch dims kept in place), becomes that dot with its operands
swapped (`fold_dot_transposes`, setting `fold_dot_transpose`; XLA does the same): the dot writes the
transposed layout directly, so the transpose is neither a pass over memory of its own nor a barrier to
output fusion (weight gradients of a dense layer: `transpose(dot(dy, x))` then `w - lr * g`).
Existing `fusion` instructions (XLA's optimized HLO, any kind) are honoured: each stays one
subgraph, unchanged except that fusions nested inside it are inlined.  Other compute instructions
(a lone dot, a legalized custom-call, ...) are clustered by the rules above.

Glue: the entry keeps parameters, constants, tuples, get-tuple-elements, fusion instructions and,
as a documented choice, clusters made only of bitcast/reshape of glue values (free metadata ops
on default layouts): they stay glue instructions rather than becoming subgraphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import config
from ..errors import HlotuneError
from .hlo import (
    DATA_MOVEMENT,
    ELEMENTWISE,
    REDUCTION,
    TRANSCENDENTAL,
    ArrayShape,
    Computation,
    Instruction,
    Module,
    Op,
    TupleShape,
    make_attrs,
)
from .passes import _dce_computation, dce, inline_calls, inline_fusions, topo_sort

CONTRACTION = frozenset({Op.DOT, Op.CONVOLUTION})
REDUCE_OPS = frozenset({Op.REDUCE, Op.REDUCE_WINDOW})
GLUE_OPS = frozenset({Op.PARAMETER, Op.CONSTANT, Op.TUPLE, Op.GET_TUPLE_ELEMENT})
FUSIBLE = ELEMENTWISE | DATA_MOVEMENT | REDUCTION | frozenset({Op.GET_TUPLE_ELEMENT, Op.TUPLE})
#: ops a producer of a dot/convolution may contain
CONTRACTION_PRODUCER_OPS = frozenset({Op.BITCAST, Op.RESHAPE, Op.TRANSPOSE, Op.BROADCAST, Op.COPY, Op.CONVERT})
#: ops allowed between a dot/conv/reduce and the outputs of its epilogue
EPILOGUE_OPS = ELEMENTWISE | frozenset({Op.RESHAPE, Op.BITCAST, Op.COPY})
#: a producer with more ops than this is not duplicated
MAX_DUPLICATED_OPS = 16
#: constants up to this many elements are cloned into fused computations instead of passed in
MAX_CLONED_CONSTANT = 1024
#: an input at least this big makes its readers candidates for sibling (multi-output) fusion
SIBLING_MIN_ELEMENTS = 1024
#: row fusion: the most bytes of one row (the reduced trailing dims) of a row cluster.  Measured (softmax of
#: 4M and 16M floats, 2-core AVX-512 VM, L2 2 MB/core, default schedules): fused vs unfused 1.1x (rows of 16
#: to 64 floats), 1.4-1.7x (128 floats to 256 KB), 1.35x (1 MB), 1.0-1.2x (4 MB: a row no longer stays in
#: L2).  256 KB keeps a row in L2 with room to spare, and bounds the per-row buffers of the fused
#: intermediates (stack allocations of the row loop)
ROW_FUSION_MAX_BYTES = 256 * 1024
#: ops a row cluster may contain
ROW_OPS = ELEMENTWISE | frozenset({Op.REDUCE, Op.BROADCAST, Op.RESHAPE, Op.BITCAST, Op.COPY})
#: a transpose(dot) is folded into a swapped dot only when the new minor (contiguous) output dim is at least
#: this long or no shorter than the old one: the default dot schedules vectorize along the minor output dim
#: (mlp_train_step: dW2 = transpose(dot(dy[256,10], h[256,256])) stays [10,256] then transposed; folded,
#: the [256,10] dot ran 0.69 ms against 0.09 ms for dot + transpose)
FOLD_MIN_MINOR = 16
KIND_ATTR = {"loop": "kLoop", "input": "kInput", "output": "kOutput", "opaque": "kCustom"}


@dataclass(frozen=True)
class FusedSubgraph:
    """One fused computation and the glue instruction that calls it."""

    name: str                 #: the name of the fusion instruction in the glue entry
    computation: Computation  #: parameters -> ROOT (a tuple ROOT for multi-output)
    kind: str                 #: "loop", "input", "output" or "opaque"


@dataclass(frozen=True)
class FusedProgram:
    """Glue module (an ordinary HLO module whose entry calls fusions) and its subgraphs in execution order."""

    module: Module
    subgraphs: tuple[FusedSubgraph, ...]


def classify(insts) -> str:
    """The fusion kind of a group of instructions (see FusedSubgraph.kind)."""
    ops = {i.op for i in insts}
    if ops & CONTRACTION:
        return "output"
    if ops & REDUCE_OPS:
        return "input"
    if ops - (ELEMENTWISE | DATA_MOVEMENT | GLUE_OPS):
        return "opaque"
    return "loop"


# --------------------------------------------------------------------------- the cluster graph

@dataclass
class _Cluster:
    id: int
    members: set[str]
    fixed: bool = False  # an existing fusion instruction: never merged


@dataclass
class _Graph:
    comp: Computation
    order: dict[str, int]
    clusters: dict[int, _Cluster] = field(default_factory=dict)
    home: dict[str, int] = field(default_factory=dict)
    readers: dict[str, set[int]] = field(default_factory=dict)
    glue_reads: set[str] = field(default_factory=set)

    def inst(self, name: str) -> Instruction:
        return self.comp[name]

    def external(self, c: _Cluster) -> list[str]:
        """Values a cluster reads from outside, in a stable order."""
        out = {o: None for m in sorted(c.members, key=self.order.get) for o in self.inst(m).operands
               if o not in c.members}
        return list(out)

    def rebuild(self) -> None:
        self.readers = {}
        for c in self.clusters.values():
            for v in self.external(c):
                self.readers.setdefault(v, set()).add(c.id)

    def exports(self, c: _Cluster) -> list[str]:
        """Members of `c` that some other cluster or the glue reads (c being their home)."""
        out = [m for m in c.members if self.home.get(m) == c.id
               and (self.readers.get(m, set()) - {c.id} or m in self.glue_reads)]
        return sorted(out, key=self.order.get)

    def successors(self, c: _Cluster) -> set[int]:
        return {r for m in c.members if self.home.get(m) == c.id for r in self.readers.get(m, ())} - {c.id}

    def reaches(self, starts: set[int], target: int) -> bool:
        seen, todo = set(), list(starts)
        while todo:
            x = todo.pop()
            if x == target:
                return True
            if x not in seen:
                seen.add(x)
                todo.extend(self.successors(self.clusters[x]))
        return False

    def merge(self, src: _Cluster, dst: _Cluster) -> None:
        """Move every member of `src` into `dst` (src disappears)."""
        dst.members |= src.members
        for m in src.members:
            if self.home.get(m) == src.id:
                self.home[m] = dst.id
        del self.clusters[src.id]
        self.rebuild()

    def needed(self, c: _Cluster, values: set[str]) -> set[str]:
        """Members of `c` that the given values of `c` depend on (inside c)."""
        out, todo = set(), list(values)
        while todo:
            v = todo.pop()
            if v in c.members and v not in out:
                out.add(v)
                todo.extend(self.inst(v).operands)
        return out


def _is_glue(inst: Instruction, comp: Computation) -> bool:
    if inst.op is Op.GET_TUPLE_ELEMENT:
        src = comp[inst.operands[0]]
        return src.op in GLUE_OPS or src.op is Op.FUSION
    return inst.op in GLUE_OPS


def _ops(g: _Graph, c: _Cluster) -> set[Op]:
    return {g.inst(m).op for m in c.members}


def _cheap(g: _Graph, c: _Cluster) -> bool:
    ops = _ops(g, c)
    return (not c.fixed and not ops & REDUCTION and not ops & TRANSCENDENTAL and ops <= FUSIBLE
            and len(c.members) <= MAX_DUPLICATED_OPS)


def _fusible(g: _Graph, c: _Cluster) -> bool:
    return not c.fixed and _ops(g, c) <= FUSIBLE


def _epilogue_ok(g: _Graph, producer: _Cluster, consumer: _Cluster) -> bool:
    """Members of `consumer` that depend on `producer` are elementwise/reshape with the producer's size."""
    heavy = [g.inst(m) for m in producer.members if g.inst(m).op in REDUCTION]
    size = heavy[0].array_shape.size if isinstance(heavy[0].shape, ArrayShape) else -1
    front = {v for v in g.external(consumer) if g.home.get(v) == producer.id}
    dependent = {m for m in consumer.members if set(g.inst(m).operands) & front}
    todo = list(dependent)
    while todo:
        m = todo.pop()
        inst = g.inst(m)
        if inst.op not in EPILOGUE_OPS or not isinstance(inst.shape, ArrayShape) or inst.shape.size != size:
            return False
        for u in g.comp.users[m]:
            if u in consumer.members and u not in dependent:
                dependent.add(u)
                todo.append(u)
    return True


def _producer_rule(g: _Graph, p: _Cluster, k: _Cluster) -> str | None:
    """How producer cluster `p` fuses into consumer `k`: 'move', 'dup', 'multi' or None."""
    if not (_fusible(g, p) and _fusible(g, k)):
        return None
    ops_p, ops_k = _ops(g, p), _ops(g, k)
    if ops_k & CONTRACTION and not ops_p <= CONTRACTION_PRODUCER_OPS:
        return None
    if (ops_p & REDUCTION and (ops_k & REDUCTION or not _epilogue_ok(g, p, k))
            and not _row_ok(g, p.members | k.members)):
        return None
    others = {r for v in g.exports(p) for r in g.readers.get(v, ())} - {k.id}
    glue = any(v in g.glue_reads for v in g.exports(p))
    if not others and not glue:
        return "move"
    if _cheap(g, p):
        return "dup"
    return None if g.reaches(others, k.id) else "multi"


def _row_space(g: _Graph, insts: list[Instruction]) -> tuple[tuple[int, ...], int] | None:
    """(D, k) when every reduce in `insts` reduces the trailing dims k.. (k >= 1) of an operand of dims D."""
    spaces = set()
    for r in insts:
        if r.op is not Op.REDUCE:
            continue
        if len(r.operands) != 2 or not isinstance(r.shape, ArrayShape):
            return None
        dims = g.inst(r.operands[0]).array_shape.dims
        red = tuple(sorted(r.attr("dimensions", ())))
        k = len(dims) - len(red)
        if k < 1 or red != tuple(range(k, len(dims))):
            return None
        spaces.add((dims, k))
    return spaces.pop() if len(spaces) == 1 else None


def _row_kind(dims: tuple[int, ...], full: tuple[int, ...], k: int) -> str | None:
    """'full' (the shape D), 'stat' (D[:k], size-1 dims ignored), 'vec' (D[k:]), 'scalar' or None."""
    if dims == full:
        return "full"
    squeeze = tuple(d for d in dims if d != 1)
    if squeeze == tuple(d for d in full[:k] if d != 1):
        return "stat"
    if not squeeze:
        return "scalar"
    return "vec" if dims == full[k:] else None


def _row_member_ok(g: _Graph, inst: Instruction, full: tuple[int, ...], k: int) -> bool:
    if inst.op not in ROW_OPS or not isinstance(inst.shape, ArrayShape):
        return False
    kind = _row_kind(inst.shape.dims, full, k)
    if kind in (None, "vec"):
        return False
    if inst.op is Op.REDUCE or inst.op in ELEMENTWISE:
        return True
    src = g.inst(inst.operands[0]).shape
    if not isinstance(src, ArrayShape):
        return False
    src_kind = _row_kind(src.dims, full, k)
    if inst.op is not Op.BROADCAST:
        return src_kind == kind                       # reshape / bitcast / copy within a kind
    bdims = tuple(inst.attr("dimensions", ()))
    if src_kind == "scalar" and src.size == 1 and not src.dims:
        return True
    if kind == "stat":
        return src_kind == "stat" and bdims == tuple(range(len(src.dims)))
    return ((src.dims == full[:k] and bdims == tuple(range(k)))                       # a row statistic
            or (src.dims == full[k:] and bdims == tuple(range(k, len(full)))))      # a row vector (scale, bias)


def _row_ok(g: _Graph, members: set[str]) -> bool:
    """Row fusion (see the module docstring): may these members form one row cluster?"""
    if not config.get("row_fusion"):
        return False
    insts = [g.inst(m) for m in members]
    space = _row_space(g, insts)
    if space is None:
        return False
    full, k = space
    row = 1
    for d in full[k:]:
        row *= d
    width = max((i.shape.dtype.bits + 7) // 8 if isinstance(i.shape, ArrayShape) else 8 for i in insts)
    if row * width > ROW_FUSION_MAX_BYTES:
        return False
    return all(_row_member_ok(g, i, full, k) for i in insts)


def _fuse_producers(g: _Graph) -> None:
    """Greedy producer -> consumer fusion, consumers visited from the root back (like XLA)."""
    for name in sorted(g.order, key=g.order.get, reverse=True):
        if name not in g.home:
            continue
        changed = True
        while changed:
            changed = False
            k = g.clusters[g.home[name]]
            for v in g.external(k):
                pid = g.home.get(v)
                if pid is None or pid == k.id:
                    continue
                p = g.clusters[pid]
                how = _producer_rule(g, p, k)
                if how == "dup":
                    k.members |= g.needed(p, {v})
                    g.rebuild()
                elif how in ("move", "multi"):
                    g.merge(p, k)
                if how is not None:
                    changed = True
                    break


def _iteration_dims(g: _Graph, c: _Cluster) -> tuple | None:
    """The iteration space of a loop/input cluster (output dims / reduce operand dims)."""
    insts = [g.inst(m) for m in c.members]
    reduces = [i for i in insts if i.op in REDUCE_OPS]
    if reduces:
        dims = {g.inst(r.operands[0]).array_shape.dims for r in reduces}
        return dims.pop() if len(dims) == 1 else None
    outs = {g.inst(m).shape for m in g.exports(c)}
    dims = {s.dims for s in outs if isinstance(s, ArrayShape)}
    return dims.pop() if len(dims) == 1 else None


def _sibling_pass(g: _Graph) -> None:
    """Merge clusters that read the same large value and do not depend on each other (multi-output)."""
    changed = True
    while changed:
        changed = False
        for v, rs in sorted(g.readers.items(), key=lambda kv: g.order.get(kv[0], -1)):
            shape = g.inst(v).shape
            if not isinstance(shape, ArrayShape) or shape.size < SIBLING_MIN_ELEMENTS:
                continue
            cands = [g.clusters[r] for r in sorted(rs) if _fusible(g, g.clusters[r])
                     and not _ops(g, g.clusters[r]) & CONTRACTION]
            for a in cands:
                for b in cands:
                    if a.id < b.id and _siblings_ok(g, a, b):
                        g.merge(b, a)
                        changed = True
                        break
                if changed:
                    break
            if changed:
                break


def _siblings_ok(g: _Graph, a: _Cluster, b: _Cluster) -> bool:
    da, db = _iteration_dims(g, a), _iteration_dims(g, b)
    if da is None or da != db:
        return False
    return not g.reaches(g.successors(a), b.id) and not g.reaches(g.successors(b), a.id)


def _prune(g: _Graph) -> None:
    """Drop duplicated members no export needs, and clusters nobody reads."""
    for c in list(g.clusters.values()):
        exp = g.exports(c)
        if not exp:
            del g.clusters[c.id]
            for m in c.members:
                if g.home.get(m) == c.id:
                    del g.home[m]
            g.rebuild()
            return _prune(g)
        c.members = g.needed(c, set(exp))
    g.rebuild()


def _build_graph(comp: Computation, no_fuse: bool) -> _Graph:
    order = {i.name: k for k, i in enumerate(comp)}
    g = _Graph(comp, {})
    for inst in comp:
        if _is_glue(inst, comp):
            g.glue_reads.update(inst.operands)
            continue
        g.order[inst.name] = order[inst.name]
        if inst.op is Op.GET_TUPLE_ELEMENT:  # stays with its (non-glue) producer
            cid = g.home[inst.operands[0]]
            g.clusters[cid].members.add(inst.name)
        else:
            cid = order[inst.name]
            g.clusters[cid] = _Cluster(cid, {inst.name}, fixed=inst.op is Op.FUSION)
        g.home[inst.name] = cid
    g.glue_reads.add(comp.root)
    g.rebuild()
    if not no_fuse:
        _fuse_producers(g)
        _sibling_pass(g)
    _prune(g)
    return g


# --------------------------------------------------------------------------- emitting

class _Names:
    def __init__(self, taken):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}.{n}"
        self.taken.add(name)
        return name


def _fused_computation(g: _Graph, c: _Cluster, name: str, exports: list[str]) -> tuple[Computation, list[str]]:
    """The fused computation of cluster `c` and the external values its parameters take."""
    comp = g.comp
    names = _Names(c.members)
    params: list[Instruction] = []
    args: list[str] = []
    local: dict[str, str] = {}
    clones: list[Instruction] = []
    for v in g.external(c):
        src = comp[v]
        if src.op is Op.CONSTANT and isinstance(src.shape, ArrayShape) and src.shape.size <= MAX_CLONED_CONSTANT:
            local[v] = names.fresh(v)
            clones.append(src.replace(name=local[v]))
            continue
        local[v] = names.fresh(f"param_{len(params)}")
        params.append(Instruction(local[v], Op.PARAMETER, src.shape, (),
                                  make_attrs({"parameter_number": len(params)})))
        args.append(v)
    body = [comp[m].replace(operands=tuple(local.get(o, o) for o in comp[m].operands))
            for m in sorted(c.members, key=g.order.get)]
    insts = params + clones + body
    root = exports[0]
    if len(exports) > 1:
        root = names.fresh("tuple")
        insts.append(Instruction(root, Op.TUPLE, TupleShape(tuple(comp[e].shape for e in exports)), tuple(exports)))
    return topo_sort(Computation(name, tuple(insts), root)), args


def _cluster_order(g: _Graph) -> list[_Cluster]:
    deps = {c.id: {g.home[v] for v in g.external(c) if v in g.home} - {c.id} for c in g.clusters.values()}
    out, done = [], set()
    pending = sorted(g.clusters.values(), key=lambda c: min(g.order[m] for m in c.members))
    while pending:
        ready = [c for c in pending if deps[c.id] <= done]
        if not ready:
            raise HlotuneError("fusion produced a cycle between clusters", op=pending[0].members.pop())
        out.append(ready[0])
        done.add(ready[0].id)
        pending.remove(ready[0])
    return out


def _glue_only(g: _Graph, c: _Cluster) -> bool:
    return (_ops(g, c) <= {Op.BITCAST, Op.RESHAPE} and not c.fixed
            and all(v not in g.home for v in g.external(c)))


def _emit(module: Module, g: _Graph) -> FusedProgram:
    comp = g.comp
    comp_names = _Names(module.by_name)
    inst_names = _Names(i.name for i in comp)
    glue = [i for i in comp if _is_glue(i, comp)]
    subgraphs: list[FusedSubgraph] = []
    fused_comps: list[Computation] = []
    for c in _cluster_order(g):
        exports = g.exports(c)
        if _glue_only(g, c):
            glue.extend(comp[m] for m in sorted(c.members, key=g.order.get))
            continue
        if c.fixed:
            (m,) = c.members
            inst = comp[m]
            called = module.computation(inst.attr("calls"))
            kind = classify(called.instructions)
            glue.append(inst.with_attrs(kind=KIND_ATTR[kind]))
            subgraphs.append(FusedSubgraph(inst.name, called, kind))
            continue
        kind = classify(comp[m] for m in c.members)
        fname = exports[0] if len(exports) == 1 else inst_names.fresh(f"{kind}_fusion")
        fcomp, args = _fused_computation(g, c, comp_names.fresh(f"fused_{fname}"), exports)
        fused_comps.append(fcomp)
        glue.append(Instruction(fname, Op.FUSION, fcomp.root_instruction.shape, tuple(args),
                                make_attrs({"kind": KIND_ATTR[kind], "calls": fcomp.name})))
        if len(exports) > 1:
            glue.extend(Instruction(e, Op.GET_TUPLE_ELEMENT, comp[e].shape, (fname,), make_attrs({"index": k}))
                        for k, e in enumerate(exports))
        subgraphs.append(FusedSubgraph(fname, fcomp, kind))
    entry = _dce_computation(topo_sort(Computation(comp.name, tuple(glue), comp.root, True, comp.line)))
    position = {i.name: k for k, i in enumerate(entry)}
    subgraphs.sort(key=lambda sg: position[sg.name])
    others = tuple(x for x in module.computations if not x.is_entry)
    glue_module = module.with_computations(others + tuple(fused_comps) + (entry,))
    return FusedProgram(dce(glue_module), tuple(subgraphs))


def _prepare(module: Module) -> Module:
    """Inline leftover calls, and fusions nested inside fused computations."""
    m = inline_calls(module)
    entry = m.entry_computation
    fused = {i.attr("calls") for i in entry if i.op is Op.FUSION}
    seen, todo = set(), list(fused)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(i.attr("calls") for i in m.computation(n) if i.op is Op.FUSION)
    return inline_fusions(m, seen) if seen else m


def _swapped_dot(dot: Instruction, t: Instruction, lhs_rank: int, rhs_rank: int) -> Instruction | None:
    """`dot(b, a)` computing `t = transpose(dot(a, b))`, or None when the permutation is not that swap."""
    lb, rb = tuple(dot.attr("lhs_batch_dims", ())), tuple(dot.attr("rhs_batch_dims", ()))
    lc, rc = tuple(dot.attr("lhs_contracting_dims", ())), tuple(dot.attr("rhs_contracting_dims", ()))
    nb = len(lb)
    nl, nr = lhs_rank - nb - len(lc), rhs_rank - nb - len(rc)
    want = tuple(range(nb)) + tuple(range(nb + nl, nb + nl + nr)) + tuple(range(nb, nb + nl))
    if tuple(t.attr("dimensions", ())) != want or nl == 0 or nr == 0:
        return None
    old_minor, new_minor = dot.array_shape.dims[-1], t.array_shape.dims[-1]
    if new_minor < min(old_minor, FOLD_MIN_MINOR):
        return None
    attrs = dict(dot.attrs)
    attrs.update(lhs_batch_dims=rb, rhs_batch_dims=lb, lhs_contracting_dims=rc, rhs_contracting_dims=lc)
    attrs = {k: v for k, v in attrs.items() if v != () or k in dict(dot.attrs)}
    prec = attrs.get("operand_precision")
    if isinstance(prec, str) and prec.startswith("{") and prec.count(",") == 1:   # raw text "{lhs,rhs}"
        attrs["operand_precision"] = "{" + ",".join(reversed(prec.strip("{}").split(","))) + "}"
    return Instruction(t.name, Op.DOT, t.shape, tuple(reversed(dot.operands)), make_attrs(attrs), t.line)


def fold_dot_transposes(comp: Computation) -> Computation:
    """Replace each `transpose(dot(a, b))` whose dot has no other reader (and is not the root) and whose
    permutation swaps the dot's lhs-free and rhs-free dims by `dot(b, a)` under the transpose's name
    (unless that makes the minor output dim short: FOLD_MIN_MINOR)."""
    users = comp.users
    new: dict[str, Instruction] = {}
    for t in comp:
        if t.op is not Op.TRANSPOSE or not isinstance(t.shape, ArrayShape):
            continue
        dot = comp[t.operands[0]]
        if dot.op is not Op.DOT or users[dot.name] != (t.name,) or dot.name == comp.root:
            continue
        a, b = (comp[o].shape for o in dot.operands)
        if not (isinstance(a, ArrayShape) and isinstance(b, ArrayShape)):
            continue
        swapped = _swapped_dot(dot, t, a.rank, b.rank)
        if swapped is not None:
            new[t.name] = swapped
    if not new:
        return comp
    body = tuple(new.get(i.name, i) for i in comp)
    return _dce_computation(topo_sort(Computation(comp.name, body, comp.root, comp.is_entry, comp.line)))


def fuse(module: Module) -> FusedProgram:
    """Fuse the entry computation of an (optimized) module into subgraphs; see the module docstring."""
    m = _prepare(module)
    entry = topo_sort(m.entry_computation)
    if config.get("fold_dot_transpose"):
        entry = fold_dot_transposes(entry)
    g = _build_graph(entry, bool(config.get("no_fuse")))
    prog = _emit(m, g)
    config.debug(1, "fusion: %d subgraphs (%s)", len(prog.subgraphs),
                 ", ".join(f"{s.name}:{s.kind}" for s in prog.subgraphs))
    return prog
