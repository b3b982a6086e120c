"""Lowering: ComputeDef + schedule (steps or State) -> LoopFunc (loop-nest IR).

Map:
  lower(cd, steps_or_state, name)  the entry point (no steps: the default lowering, every stage at root)
  inlined_bodies(state)            the non-inlined stages and their bodies with inlined producers substituted
  _Lowerer.run                     inline -> name loops -> infer bounds (consumers first) -> emit
  _expand_inline                   substitute inlined producers into their consumers' expressions
  _name_loops                      unique loop variable names (iterator name, else `stage.iterator`)
  _infer                           per stage: region of each space root axis (min expr, extent),
                                   tightened leaf extents, root axis expressions, guards
  _region                          bound inference of an attached stage from its consumers' accesses
  _emit_stage / _nest              the loop nest of a stage with its attached producers (Allocate),
                                   guards (If) hoisted to the loop that binds their last variable
  _check                           loop-IR conventions (parallel outermost, vectorized innermost)

Conventions of the result (see loop_ir): every For has min 0 and a constant extent; loops of extent 1
are dropped (their pragmas move to the next loop of the same nest); a stage computed at a loop gets an
`Allocate` of its inferred region (indexed relative to the region's origin, which is clamped into
the domain so the extent stays constant; scope "local" unless the stage has another, e.g. shared
from cache_read); a non-output stage at root gets a full-size `Allocate`
around the whole body; reductions are an init nest (`<loop>.init` variables) then the update nest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ScheduleError
from ..ir.expr import INDEX, Binary, ComputeDef, Const, Expr, Load, Var, rebuild, substitute, walk
from ..ir.hlo import DType, Op
from .loop_ir import Allocate, BufferDecl, For, ForKind, If, LoopFunc, Seq, Stmt, Store, walk_stmts
from .simplify import Ranges, bounds, from_linear, ic, lin_bounds, linear, simplify
from .state import Iterator, StageState, State, check_attach, consumers, propagate, replay, root_exprs

_NOVAR = Var("__reduce__", INDEX)
_THREAD_KINDS = frozenset({ForKind.THREAD_X, ForKind.THREAD_Y, ForKind.THREAD_Z, ForKind.VTHREAD})


@dataclass
class _Info:
    st: StageState
    body: Expr
    pred: Expr | None
    names: dict[str, str]                    # iterator -> loop var (update nest)
    init_names: dict[str, str]               # space iterators inside the first reduce loop -> init var
    region: list[tuple[Expr, int]] = field(default_factory=list)
    ext: dict[str, int] = field(default_factory=dict)
    abs: dict[str, Expr] = field(default_factory=dict)       # root axis -> absolute index (update nest)
    abs_init: dict[str, Expr] = field(default_factory=dict)
    guards: list[Expr] = field(default_factory=list)
    guards_init: list[Expr | None] = field(default_factory=list)
    shape: tuple[int, ...] = ()
    temp: bool = False
    attached: bool = False
    pred_guard: Expr | None = None           # the reduction predicate's guard (update nest only)


def lower(cd: ComputeDef, steps_or_state=(), name: str | None = None) -> LoopFunc:
    """Lower `cd` under a schedule (a sequence of steps, a Schedule or a State) to a LoopFunc."""
    state = steps_or_state if isinstance(steps_or_state, State) else replay(cd, steps_or_state)
    return _Lowerer(state).run(name or cd.name)


def inlined_bodies(state: State) -> tuple[list[str], dict[str, Expr]]:
    """The stages that get a loop nest (not inlined), in stage order, and each one's body expression with
    its inlined producers substituted (what lowering emits per statement; used by the cost model's fast
    feature path)."""
    low = _Lowerer(state)
    low._expand_inline()
    return list(low.order), {n: low.infos[n].body for n in low.order}


def default_lowering(cd: ComputeDef, name: str | None = None) -> LoopFunc:
    """Every stage at root with its natural loop nest; inputs read directly."""
    return lower(cd, (), name)


class _Lowerer:
    def __init__(self, state: State):
        self.state = state
        self.cd = state.cd
        self.infos: dict[str, _Info] = {}
        self.ranges: Ranges = {}
        self.children: dict[tuple[str, str], list[str]] = {}
        self.order: list[str] = []

    # ------------------------------------------------------------------ driver
    def run(self, name: str) -> LoopFunc:
        self._expand_inline()
        for n in self.order:
            check_attach(self.state, n)
        self._name_loops()
        for n in reversed(self.order):
            self._infer(self.infos[n])
        body = self._emit_root()
        self._check(body)
        ins = tuple(BufferDecl(b.name, b.shape, b.dtype) for b in self.cd.inputs)
        outs = tuple(BufferDecl(o, self.cd.stage(o).shape, self.cd.stage(o).dtype) for o in self.cd.outputs)
        return LoopFunc(name, ins, outs, body)

    # ------------------------------------------------------------------ inline
    def _expand_inline(self) -> None:
        inl: dict[str, tuple[list[str], Expr]] = {}

        def expand(e: Expr) -> Expr:
            if not any(isinstance(n, Load) and n.buffer in inl for n in walk(e)):
                return e
            return _map_loads(e, lambda ld: substitute(inl[ld.buffer][1], dict(zip(inl[ld.buffer][0], ld.indices)))
                              if ld.buffer in inl else ld)

        for st in self.state.stages:
            body = expand(st.op.body)
            if st.attach.kind == "inline":
                inl[st.name] = ([a.name for a in st.op.axes], body)
                continue
            self.infos[st.name] = _Info(st, body, st.predicate, {}, {})
            self.order.append(st.name)
            if st.attach.kind == "at":
                self.children.setdefault((st.attach.stage, st.attach.iter), []).append(st.name)
        for o in self.cd.outputs:
            if o not in self.infos:
                raise ScheduleError(f"output {o} is inlined")
        self.reads = {n: {x.buffer for x in walk(self.infos[n].body) if isinstance(x, Load)} for n in self.order}

    def _name_loops(self) -> None:
        used: set[str] = set()

        def claim(stage: str, base: str) -> str:
            nm = base if base not in used else f"{stage}.{base}"
            while nm in used:
                nm += "_"
            used.add(nm)
            return nm

        for n in self.order:
            info = self.infos[n]
            its = info.st.iters
            for it in its:
                info.names[it.name] = claim(n, it.name)
            if info.st.op.is_reduction:
                r = _first_reduce(its)
                for it in its[r:]:
                    if not it.is_reduce:
                        info.init_names[it.name] = claim(n, it.name + ".init")

    # ------------------------------------------------------------------ bound inference
    def _infer(self, info: _Info) -> None:
        st = info.st
        op = st.op
        is_out = st.name in self.cd.outputs
        info.attached = st.attach.kind == "at"
        info.temp = not is_out
        if info.attached:
            info.region = self._region(info)
        else:
            info.region = [(ic(0), a.extent) for a in op.axes]
        roots = {a.name: ext for a, (_, ext) in zip(op.axes, info.region)}
        roots.update({a.name: a.extent for a in op.reduce_axes})
        info.ext = ext = propagate(st.relations, roots)
        leaf: dict[str, Expr] = {}
        for it in st.iters:
            v = info.names[it.name]
            e = ext[it.name]
            if e > 1:
                self.ranges[v] = (0, e - 1)
                leaf[it.name] = Var(v, INDEX)
            else:
                leaf[it.name] = ic(0)
        info.abs, info.guards = self._root(info, leaf)
        keep = [not (isinstance(g, Const) and g.value) for g in info.guards]
        if op.is_reduction:
            r = _first_reduce(st.iters)
            leaf_i = dict(leaf)
            for it in st.iters[r:]:
                if it.is_reduce:
                    leaf_i[it.name] = _NOVAR
                elif ext[it.name] > 1:
                    v = info.init_names[it.name]
                    self.ranges[v] = (0, ext[it.name] - 1)
                    leaf_i[it.name] = Var(v, INDEX)
            info.abs_init, gi = self._root(info, leaf_i)
            if info.pred is not None:  # the reduction predicate guards the update only
                gi[-1] = _NOVAR
            info.guards_init = [None if _NOVAR.name in _vars(g) else g for g, k in zip(gi, keep) if k]
        if info.pred is not None and keep[-1]:
            info.pred_guard = info.guards[-1]
        info.guards = [g for g, k in zip(info.guards, keep) if k]
        shape = [e for _, e in info.region] if info.attached else list(op.shape)
        for _axis, factor, offset in st.align:
            if shape:
                s = shape[-1]
                while s % factor != offset:
                    s += 1
                shape[-1] = s
        info.shape = tuple(shape)

    def _root(self, info: _Info, leaf: dict[str, Expr]) -> tuple[dict[str, Expr], list[Expr]]:
        st = info.st
        vals, guards = root_exprs(st.relations, info.ext, leaf)
        out: dict[str, Expr] = {}
        for a, (mn, _) in zip(st.op.axes, info.region):
            out[a.name] = simplify(Binary(Op.ADD, mn, vals[a.name], INDEX), self.ranges)
        for a in st.op.reduce_axes:
            out[a.name] = simplify(vals[a.name], self.ranges)
        gs = [simplify(g, self.ranges) for g in guards]
        if info.pred is not None:
            gs.append(simplify(substitute(info.pred, out), self.ranges))
        return out, gs

    def _inner_vars(self, target: str, it: str) -> set[str]:
        t = self.infos[target]
        pos = t.st.iter_pos(it)
        inner = {t.names[i.name] for i in t.st.iters[pos + 1:]}
        for n, info in self.infos.items():
            if not info.ext or n == target:
                continue
            chain = _chain(self.state, n)
            if any(s == target and p >= pos for s, p in chain):
                inner |= set(info.names.values())
        return inner

    def _thread_vars_around(self, target: str, it: str) -> set[str]:
        """Loop variables of the threadIdx / vthread loops enclosing loop `it` of `target` (and the
        loops around `target`'s own attach point)."""
        out: set[str] = set()
        while True:
            t = self.infos[target]
            pos = t.st.iter_pos(it)
            out |= {t.names[i.name] for i in t.st.iters[:pos + 1] if i.kind in _THREAD_KINDS}
            if t.st.attach.kind != "at":
                return out
            target, it = t.st.attach.stage, t.st.attach.iter

    def _region(self, info: _Info) -> list[tuple[Expr, int]]:
        st = info.st
        target, it = st.attach.stage, st.attach.iter
        inner = self._inner_vars(target, it)
        if st.scope == "shared":  # filled cooperatively by the whole block: relax the enclosing thread loops
            inner |= self._thread_vars_around(target, it)
        accesses: list[tuple[Expr, ...]] = []
        for c in consumers(self.state, st.name):
            ci = self.infos[c]
            for ld in walk(ci.body):
                if isinstance(ld, Load) and ld.buffer == st.name:
                    accesses.append(tuple(simplify(substitute(i, ci.abs), self.ranges) for i in ld.indices))
        out = []
        for d, ax in enumerate(st.op.axes):
            out.append(self._axis_region([a[d] for a in accesses], ax.extent, inner))
        return out

    def _axis_region(self, idxs: list[Expr], extent: int, inner: set[str]) -> tuple[Expr, int]:
        full = (ic(0), extent)
        key = None
        lo = hi = None
        for e in idxs:
            terms, c = linear(_strip_clamp(e, extent), self.ranges)
            sym: dict = {}
            a, b = c, c
            for k, (atom, coef) in terms.items():
                vs = _vars(atom)
                if any(isinstance(n, Load) for n in walk(atom)):
                    return full
                if isinstance(atom, Var) and atom.name in inner:
                    span = coef * self.ranges.get(atom.name, (0, 0))[1]
                    a += min(0, span)
                    b += max(0, span)
                elif vs & inner:  # e.g. f // 16 of a fused inner (or relaxed thread) loop
                    bb = bounds(atom, self.ranges) if vs <= inner else None
                    if bb is None:
                        return full
                    a += min(coef * bb[0], coef * bb[1])
                    b += max(coef * bb[0], coef * bb[1])
                else:
                    sym[k] = (atom, coef)
            sk = from_linear((sym, 0)).key
            if key is None:
                key, lo, hi, sym0 = sk, a, b, sym
            elif key != sk:
                return full
            else:
                lo, hi = min(lo, a), max(hi, b)
        if key is None:
            return full
        n = hi - lo + 1
        if n >= extent:
            return full
        mn = simplify(from_linear((sym0, lo)), self.ranges)
        b = lin_bounds(linear(mn, self.ranges), self.ranges)
        if b is None or b[0] < 0:
            mn = Binary(Op.MAXIMUM, mn, ic(0), INDEX)
        if b is None or b[1] + n > extent:
            mn = Binary(Op.MINIMUM, mn, ic(extent - n), INDEX)
        return mn, n

    # ------------------------------------------------------------------ emission
    def _emit_root(self) -> Stmt:
        stmts = [self._emit_stage(n) for n in self.order if self.infos[n].st.attach.kind == "root"]
        body: Stmt = stmts[0] if len(stmts) == 1 else Seq(tuple(stmts))
        for n in reversed(self.order):
            info = self.infos[n]
            if info.temp and not info.attached:
                body = Allocate(n, info.st.op.dtype, info.shape, info.st.scope, body)
        return body

    def _fix_loads(self, e: Expr) -> Expr:
        def fix(ld: Load) -> Expr:
            info = self.infos.get(ld.buffer)
            if info is None or not info.attached:
                return ld
            idx = tuple(simplify(Binary(Op.SUBTRACT, i, mn, INDEX), self.ranges)
                        for i, (mn, _) in zip(ld.indices, info.region))
            return Load(ld.buffer, idx, ld.dtype)
        return _map_loads(e, fix)

    def _store_index(self, info: _Info, absx: dict[str, Expr]) -> tuple[Expr, ...]:
        axes = info.st.op.axes
        if not info.attached:
            return tuple(absx[a.name] for a in axes)
        return tuple(simplify(Binary(Op.SUBTRACT, absx[a.name], mn, INDEX), self.ranges)
                     for a, (mn, _) in zip(axes, info.region))

    def _emit_stage(self, n: str) -> Stmt:
        info = self.infos[n]
        st = info.st
        op = st.op
        loops = [(it, info.names[it.name], info.ext[it.name]) for it in st.iters]
        idx = self._store_index(info, info.abs)
        val = self._fix_loads(simplify(substitute(info.body, info.abs), self.ranges))
        if not op.is_reduction:
            return self._nest(n, loops, Store(n, idx, val), info.guards, True, _pragmas(loops))
        r = _first_reduce(st.iters)
        common, rest = loops[:r], loops[r:]
        cvars = {v for _, v, _ in common}
        red_vars = {v for it, v, _ in rest if it.is_reduce}
        g_common, g_upd, g_init = [], [], []
        for g, gi in zip(info.guards, info.guards_init):
            vs = _vars(g)
            if g is info.pred_guard:
                g_upd.append(g)
            elif vs <= cvars:
                g_common.append(g)
            else:
                g_upd.append(g)
                if not (vs & red_vars) and gi is not None:
                    g_init.append(gi)
        init_loops = [(it, info.init_names[it.name], e) for it, _, e in rest if not it.is_reduce]
        init = Store(n, self._store_index(info, info.abs_init), op.reducer.init)
        upd = Store(n, idx, op.reducer.combine(Load(n, idx, op.dtype), val))
        ann = _pragmas(loops)
        ann.update(_pragmas(common + init_loops))
        inner = Seq((self._nest(n, init_loops, init, g_init, False, ann), self._nest(n, rest, upd, g_upd, True, ann)))
        return self._nest(n, common, inner, g_common, True, ann)

    def _nest(self, n: str, loops, leaf: Stmt, guards: list[Expr], attach: bool, ann: dict) -> Stmt:
        pos = {v: k for k, (_, v, _) in enumerate(loops)}
        placed: dict[int, list[Expr]] = {}
        top: list[Expr] = []
        for g in guards:
            ks = [pos[v] for v in _vars(g) if v in pos]
            (placed.setdefault(max(ks), []) if ks else top).append(g)
        stmt = leaf
        for k in range(len(loops) - 1, -1, -1):
            it, v, e = loops[k]
            if attach:
                for p in reversed(self.children.get((n, it.name), [])):
                    pi = self.infos[p]
                    scope = "local" if pi.st.scope == "global" else pi.st.scope  # a temporary inside a loop
                    stmt = Allocate(p, pi.st.op.dtype, pi.shape, scope, Seq((self._emit_stage(p), stmt)))
            stmt = _guard(placed.get(k, []), stmt)
            if e > 1:
                stmt = For(Var(v, INDEX), ic(0), ic(e), it.kind, stmt, ann.get(v, ()))
        return _guard(top, stmt)

    def _check(self, body: Stmt) -> None:
        def visit(s: Stmt, in_loop: bool) -> None:
            if isinstance(s, For):
                if s.kind is ForKind.PARALLEL and in_loop:
                    raise ScheduleError(f"parallel loop {s.var.name} is nested inside another loop")
                if s.kind is ForKind.VECTORIZED and any(isinstance(x, For | Allocate) for x in walk_stmts(s.body)):
                    raise ScheduleError(f"vectorized loop {s.var.name} is not innermost")
                visit(s.body, True)
                return
            for c in _stmt_children(s):
                visit(c, in_loop)
        visit(body, False)


# ----------------------------------------------------------------------------- helpers

def _pragmas(loops) -> dict[str, tuple]:
    """Loop var -> annotations; pragmas of dropped (extent-1) loops move to the next loop inside."""
    out: dict[str, tuple] = {}
    carry: tuple = ()
    for it, v, e in loops:
        if e == 1:
            carry += it.pragmas
        else:
            out[v] = carry + it.pragmas
            carry = ()
    return out


def _first_reduce(iters: tuple[Iterator, ...]) -> int:
    for k, it in enumerate(iters):
        if it.is_reduce:
            return k
    return len(iters)


def _vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def _guard(conds: list[Expr], body: Stmt) -> Stmt:
    if not conds:
        return body
    c = conds[0]
    for x in conds[1:]:
        c = Binary(Op.AND, c, x, DType.PRED)
    return If(c, body)


def _stmt_children(s: Stmt) -> tuple[Stmt, ...]:
    from .loop_ir import stmt_children
    return stmt_children(s)


def _chain(state: State, name: str) -> list[tuple[str, int]]:
    from .state import attach_chain
    return attach_chain(state, name)


def _strip_clamp(e: Expr, extent: int) -> Expr:
    """max(x, 0) and min(x, extent-1) -> x (for regions: the clamped values lie in x's window
    once the window is clamped into the domain)."""
    while isinstance(e, Binary) and isinstance(e.b, Const) and (
            (e.op is Op.MAXIMUM and e.b.value == 0) or (e.op is Op.MINIMUM and e.b.value == extent - 1)):
        e = e.a
    return e


def _map_loads(e: Expr, fn) -> Expr:
    """Rebuild `e` bottom-up, replacing each Load (after its indices) by fn(load)."""
    return rebuild(e, lambda n: fn(n) if isinstance(n, Load) else n)


__all__ = ["lower", "default_lowering"]
