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

Rules (see DESIGN.md and the fusion tests):
  - loop fusion: elementwise ops with their data-movement/constant producers;
  - input fusion: reduce / reduce-window with their elementwise producers;
  - output fusion: dot / convolution with their elementwise consumers (bias, activation, residual);
  - a cluster holds at most one reduction-bearing op (reduce, reduce-window, dot, convolution);
    so a reduction is never fused into another one's inputs and no fusion has two dots;
  - only cheap producers (no reduction, no transcendental, few ops) are duplicated into several
    consumers; others either move whole or become an extra output of the consumer (multi-output);
  - dot / convolution take producers that are pure data movement or converts only;
  - merges never create a cycle between clusters (checked by reachability).
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
    if ops_p & REDUCTION and ops_k & REDUCTION:
        return None
    if ops_k & CONTRACTION and not ops_p <= CONTRACTION_PRODUCER_OPS:
        return None
    if ops_p & REDUCTION and not _epilogue_ok(g, p, k):
        return None
    others = {r for v in g.exports(p) for r in g.readers.get(v, ())} - {k.id}
    glue = any(v in g.glue_reads for v in g.exports(p))
    if not others and not glue:
        return "move"
    if _cheap(g, p):
        return "dup"
    return None if g.reaches(others, k.id) else "multi"


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


def fuse(module: Module) -> FusedProgram:
    """Fuse the entry computation of an (optimized) module into subgraphs; see the module docstring."""
    m = _prepare(module)
    entry = topo_sort(m.entry_computation)
    g = _build_graph(entry, bool(config.get("no_fuse")))
    prog = _emit(m, g)
    config.debug(1, "fusion: %d subgraphs (%s)", len(prog.subgraphs),
                 ", ".join(f"{s.name}:{s.kind}" for s in prog.subgraphs))
    return prog
