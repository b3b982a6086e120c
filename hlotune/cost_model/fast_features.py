"""Fast features: many schedules of one structure at once, without lowering each one.

Map:
  structure_key(schedule)        the steps with Split factors blanked: schedules with equal keys differ only
                                 in tile sizes (what the sketch sampler and tile-size mutation produce); the
                                 splits before an RFactor keep their factors (rfactor bakes them into the
                                 new stage's expressions), so those are one template per factor choice
  Template.build(cd, steps)      from one representative: replay with tagged factors (so every split relation
                                 knows which step factors it came from), lower it once (for the statement
                                 list and arithmetic counts), and record the loop structure of every store
  Template.nests(factors)        StoreNests for N candidates: extents, bound-inferred regions of attached
                                 stages and index coefficients, all numpy over an (N, n_factors) matrix;
                                 `bad` marks candidates it cannot reproduce (a clamped region minimum under
                                 a packed index, a fractional region): those are lowered instead
  Template.instantiate(factors)  (nests, bad) under the template's lock: templates are shared by threads; a
                                 forked child forgets those whose lock was held (_forget_busy_templates)
  batch_features(cd, schedules)  list of (S_i, NUM_FEATURES) arrays, one per schedule (groups by structure;
                                 a structure the template cannot express -- non-affine indices, a stage read
                                 by consumers of different rank (a row sketch's rfactor) --
                                 falls back to the exact path: lower + features_of_func)

The template mirrors `schedule_space.lower`: a stage's nest is its attach chain plus its own iterators;
a reduction has an init statement (space iterators after the first reduce one) then its update; an attached
stage's region per dimension is the span of its consumers' accesses over the loops inside the attach point
(the whole dimension when that reaches the extent or goes through a fused loop with a fractional coefficient);
a packed index `x // k` / `x % k` (Pack) is bounded as the lowering's simplifier has it (`_divmod_dim`: the terms
of x that are multiples of k, the others when they stay within one period of k).  Loops of extent 1 are kept
with extent 1 (features ignore them).  Tests check that it equals the exact path on many schedules.
"""

from __future__ import annotations

import gc
import os
import threading

import numpy as np

from ..errors import HlotuneError, ScheduleError
from ..ir.expr import Binary, ComputeDef, Const, Expr, Load, Var, walk
from ..ir.hlo import Op
from ..schedule_space.loop_ir import Allocate, For, If, LoopFunc, Seq, Store
from ..schedule_space.lower import inlined_bodies, lower
from ..schedule_space.state import SplitRel, State, apply, consumers, init_state
from ..schedule_space.steps import Pragma, RFactor, Split
from .features import (
    NUM_FEATURES,
    Access,
    StoreNest,
    _nbytes,
    add_estimates,
    add_program_features,
    count_ops,
    features_of_func,
    ideal_log2,
    log_scale,
    nest_signature,
    nests_of_func,
    stack_nests,
    store_features,
)


class Unsupported(Exception):
    """The template cannot express this structure (the caller uses the exact path)."""


class _Tag(int):
    """An int that remembers which (step, position) split factors it is the product of."""

    refs: tuple[tuple[int, int], ...] = ()

    def __new__(cls, v: int, refs: tuple[tuple[int, int], ...]):
        o = int.__new__(cls, v)
        o.refs = refs
        return o

    def __mul__(self, o):
        return _Tag(int(self) * int(o), self.refs + getattr(o, "refs", ()))

    __rmul__ = __mul__


UNROLL = "auto_unroll_max_step"


def _blank(s):
    if isinstance(s, Split):
        return ("split", s.stage, s.iter, len(s.factors), s.inner_to_outer)
    if isinstance(s, Pragma) and s.name == UNROLL:
        return ("pragma", s.stage, s.iter, s.name)
    return s


def _fixed_splits(steps) -> int:
    """How many leading steps keep their Split factors in the key: those before the first RFactor (rfactor
    bakes the factors of the split it factors into the new stage's expressions, so a template holds them
    fixed and instantiates only the splits after it); 0 when there is none."""
    for i, s in enumerate(steps):
        if type(s) is RFactor:
            return i
    return 0


def structure_key(steps) -> tuple:
    """Hashable key of a schedule with its Split factors and unroll pragma values blanked (the numbers a
    template instantiates; lengths and directions kept).  Splits before an RFactor keep their factors."""
    steps = tuple(getattr(steps, "steps", steps))
    k = _fixed_splits(steps)
    return tuple(s if i < k else _blank(s) for i, s in enumerate(steps))


_TOKENS: dict = {}                          # blanked step (`_blank`) -> a small int
_BY_ID: dict[int, tuple[object, int]] = {}   # id(step) -> (step, its token): steps shared between schedules
_MAX_TOKENS = 1 << 16


def _token(s) -> int:
    hit = _BY_ID.get(id(s))
    if hit is not None and hit[0] is s:
        return hit[1]
    b = _blank(s)
    t = _TOKENS.get(b)
    if t is None:
        t = _TOKENS[b] = len(_TOKENS)
    if len(_BY_ID) >= _MAX_TOKENS:
        _BY_ID.clear()
    _BY_ID[id(s)] = (s, t)                   # the step is kept alive, so its id is not reused meanwhile
    return t


def key_and_row(steps) -> tuple[tuple, list]:
    """(a key equal for schedules of equal `structure_key`s -- the blanked steps as small ints, cheap to hash --,
    the numbers a template instantiates in its `refs` order: every Split's factors, then an unroll pragma's
    value, in step order) in one pass over the steps (the batch path's grouping)."""
    key = []
    row: list = []
    steps = getattr(steps, "steps", steps)
    fixed = _fixed_splits(steps)
    for i, s in enumerate(steps):
        t = type(s)
        if i < fixed:
            key.append(_fixed_token(s))
            continue
        if t is Split:
            row.extend(s.factors)
        elif t is Pragma and s.name == UNROLL:
            row.append(s.value)
        key.append(_token(s))
    return tuple(key), row


def _fixed_token(s) -> int:
    """The token of a step kept whole (a Split before an RFactor: its factors are part of the structure)."""
    b = ("fixed", s)
    t = _TOKENS.get(b)
    if t is None:
        t = _TOKENS[b] = len(_TOKENS)
    return t


def _affine(e: Expr, axes: set[str]) -> tuple[dict[str, float], float] | None:
    """e as (coefficients over root axis names, constant), or None when not affine."""
    if isinstance(e, Var):
        return ({e.name: 1.0}, 0.0) if e.name in axes else None
    if isinstance(e, Const):
        return {}, float(e.value)
    if isinstance(e, Binary) and e.op in (Op.ADD, Op.SUBTRACT):
        a, b = _affine(e.a, axes), _affine(e.b, axes)
        if a is None or b is None:
            return None
        sg = 1.0 if e.op is Op.ADD else -1.0
        c = dict(a[0])
        for k, v in b[0].items():
            c[k] = c.get(k, 0.0) + sg * v
        return c, a[1] + sg * b[1]
    if isinstance(e, Binary) and e.op is Op.MULTIPLY:
        for x, k in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, Const):
                r = _affine(x, axes)
                if r is None:
                    return None
                return {n: v * float(k.value) for n, v in r[0].items()}, r[1] * float(k.value)
    if isinstance(e, Binary) and e.op in (Op.DIVIDE, Op.REMAINDER) and isinstance(e.b, Const) and e.b.value:
        # linearized as the exact path's `lin_coefs` does: x // k -> x / k, x % k -> x (packed layouts)
        r = _affine(e.a, axes)
        if r is None:
            return None
        if e.op is Op.REMAINDER:
            return r[0], 0.0
        k = float(e.b.value)
        return {n: v / k for n, v in r[0].items()}, r[1] / k
    return None


class _RepStore:
    """What a template takes from its lowered representative per store statement (as `nests_of_func` has it)."""

    __slots__ = ("ops", "is_init", "is_update")

    def __init__(self, st: Store):
        self.ops = count_ops(st.value)
        self.is_init = isinstance(st.value, Const)
        self.is_update = any(isinstance(x, Load) and x.buffer == st.buffer for x in walk(st.value))


def _rep_stores(func: LoopFunc) -> list[_RepStore]:
    """The Store statements of `func` in program order (the order of `nests_of_func`), without their loop nests."""
    out: list[_RepStore] = []

    def visit(s) -> None:
        if isinstance(s, For | Allocate):
            visit(s.body)
        elif isinstance(s, Seq):
            for b in s.body:
                visit(b)
        elif isinstance(s, If):
            visit(s.then)
            if s.otherwise is not None:
                visit(s.otherwise)
        elif isinstance(s, Store):
            out.append(_RepStore(s))

    visit(func.body)
    return out


class Template:
    """The loop structure of one schedule structure, instantiated for many factor choices with numpy."""

    def __init__(self, cd: ComputeDef, state: State, refs: list[tuple[int, int]], rep_nests: list):
        self.cd, self.state, self.refs, self.rep = cd, state, refs, rep_nests
        self.ref_col = {r: k for k, r in enumerate(refs)}
        self.order, self.bodies = inlined_bodies(state)
        self._load_cache: dict[str, list[Load]] = {}
        self._affine_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._plans: dict[int, tuple] = {}
        self._inner_cache: dict[tuple[str, str], set] = {}
        self._consumers: dict[str, list[str]] = {}
        self.stages = {n: state.stage(n) for n in self.order}
        self.inputs = {b.name: b for b in cd.inputs}
        self.stores = self._store_list()
        #: `nests` keeps per-call state on the template, and templates are shared (`_TEMPLATES`) by every thread
        #: of the process (several tuning threads: distributed.tune_targets): one call at a time
        self.lock = threading.Lock()
        self.fixed = 0                    #: leading steps replayed as they are (those before an RFactor)
        if len(self.stores) != len(rep_nests):
            raise Unsupported("statement count differs from the lowered representative")

    # ------------------------------------------------------------------ construction
    @staticmethod
    def build(cd: ComputeDef, steps) -> Template:
        """The template of `steps`' structure.  One with fixed splits (`fixed` > 0: an RFactor) is trusted only
        after `reproduces_representative` (`_template` asks once per structure with every factor blanked)."""
        steps = tuple(getattr(steps, "steps", steps))
        fixed = _fixed_splits(steps)      # steps before an RFactor are replayed as they are (no refs)
        refs: list[tuple[int, int]] = []
        st = init_state(cd)
        for i, s in enumerate(steps):
            if i < fixed:
                pass
            elif isinstance(s, Split):
                fs = []
                for p, f in enumerate(s.factors):
                    refs.append((i, p))
                    fs.append(_Tag(int(f), ((i, p),)))
                s = Split(s.stage, s.iter, tuple(fs), s.inner_to_outer)
            elif isinstance(s, Pragma) and s.name == UNROLL:
                refs.append((i, -1))
                s = Pragma(s.stage, s.iter, s.name, _Tag(int(s.value), ((i, -1),)))
            st = apply(st, s)
        tpl = Template(cd, st, refs, _rep_stores(lower(cd, steps)))
        tpl.fixed = fixed
        return tpl

    def reproduces_representative(self, steps) -> bool:
        """Whether the template gives the exact features of `steps` (its representative).  Asked of rfactor
        templates: the stage rfactor makes indexes the fixed splits' iterators through baked expressions, which
        the template models in most layouts but not all (e.g. an rfactor of a fused reduction's outer part)."""
        F = np.array([key_and_row(steps)[1]], dtype=np.float64) if self.refs else np.zeros((1, 0))
        try:
            nests, bad = self.instantiate(F)
        except Unsupported:
            return False
        if bad.any():
            return False
        rows = [log_scale(store_features(stack_nests([nst]))) for nst in nests]
        ideal = ideal_log2(self.cd)
        got = add_program_features(np.stack(rows, axis=1), ideal)[0] if rows else np.zeros((0, NUM_FEATURES))
        want = features_of_func(lower(self.cd, steps), ideal)
        return got.shape == want.shape and bool(np.allclose(got, want, atol=1e-6))

    def _store_list(self) -> list[tuple[str, str, list[tuple[str, str, bool]]]]:
        """(stage, "plain" | "init" | "update", loop refs (stage, iterator, is_init)) in program order."""
        children: dict[tuple[str, str], list[str]] = {}
        for n in self.order:
            a = self.stages[n].attach
            if a.kind == "at":
                children.setdefault((a.stage, a.iter), []).append(n)
        out: list = []
        self.chain: dict[str, list[tuple[str, str, bool]]] = {}

        def emit(n: str, chain: list) -> None:
            self.chain[n] = chain
            st = self.stages[n]
            loops = list(chain)
            its = st.iters
            r = next((k for k, it in enumerate(its) if it.is_reduce), len(its))
            is_red = st.op.is_reduction
            for k, it in enumerate(its):
                if is_red and k == r:
                    init = loops + [(n, i.name, True) for i in its[r:] if not i.is_reduce]
                    out.append((n, "init", init))
                loops = loops + [(n, it.name, False)]
                for c in children.get((n, it.name), []):
                    emit(c, list(loops))
            if is_red and r == len(its):
                out.append((n, "init", list(loops)))
            out.append((n, "update" if is_red else "plain", loops))

        for n in self.order:
            if self.stages[n].attach.kind == "root":
                emit(n, [])
        return out

    # ------------------------------------------------------------------ numpy instantiation
    def _val(self, f, F: np.ndarray, n: int) -> np.ndarray:
        refs = getattr(f, "refs", ())
        if not refs:
            return np.full(n, float(f))
        v = F[:, self.ref_col[refs[0]]]      # 1 * x is x: the same numbers as a product starting from ones
        for r in refs[1:]:
            v = v * F[:, self.ref_col[r]]
        return v

    def instantiate(self, F: np.ndarray) -> tuple[list[StoreNest], np.ndarray]:
        """`nests(F)` and its `bad` mask, under the template's lock (safe from several threads)."""
        with self.lock:
            return self.nests(F), self.bad.copy()

    def nests(self, F: np.ndarray) -> list[StoreNest]:
        """StoreNests of the N candidates (rows of F); `self.bad` (N,) marks the candidates whose numbers the
        template cannot reproduce (their rows are not to be used: the caller lowers those)."""
        n = F.shape[0]
        self.bad = np.zeros(n, dtype=bool)
        self._lo: dict[str, np.ndarray] = {}      # attached stage -> (N, D) constant of its region minimum
        self._clamp: dict[str, np.ndarray] = {}   # attached stage -> (N, D) region minimum clamped into the domain
        self._tail = np.zeros(n, dtype=bool)      # a split with a partial tile in a stage inferred so far
        ext: dict[str, dict[str, np.ndarray]] = {}
        rc: dict[str, dict[tuple[str, str], np.ndarray]] = {}     # stage -> loop ref -> (N, R) coef in root axes
        fz: dict[str, dict[tuple[str, str], np.ndarray]] = {}     # same, True where reached through a fuse
        mnc: dict[str, dict[tuple[str, str], np.ndarray]] = {}    # attached stage -> outer ref -> (N, D) region min
        shapes: dict[str, np.ndarray] = {}
        self._rca: dict[str, tuple[dict, np.ndarray]] = {}   # stage -> (loop ref -> row, (N, U, R) stacked rc)
        self._coef_cache: dict[tuple, tuple] = {}
        self._fany: dict[str, dict] = {}                   # stage -> loop ref -> any root axis reached via a fuse
        for b in self.cd.inputs:
            shapes[b.name] = np.tile(np.array(b.shape, dtype=np.float64), (n, 1))
        for name in reversed(self.order):
            self._infer(name, F, n, ext, rc, fz, mnc, shapes)
        out = [self._nest(si, rep, n, ext, rc, mnc, shapes, F) for si, rep in enumerate(self.rep)]
        self._rca = self._coef_cache = self._lo = self._clamp = self._fany = None     # per call only
        return out

    def _infer(self, name, F, n, ext, rc, fz, mnc, shapes) -> None:
        st = self.stages[name]
        op = st.op
        axes = [a.name for a in op.axes] + [a.name for a in op.reduce_axes]
        roots = {a.name: np.full(n, float(a.extent)) for a in op.axes + op.reduce_axes}
        outer_coef: dict[tuple[str, str], np.ndarray] = {}
        if st.attach.kind == "at":
            region, outer_coef = self._region(name, n, ext, rc, fz)
            for d, a in enumerate(op.axes):
                roots[a.name] = region[:, d]
        e = dict(roots)
        for r in st.relations:
            if isinstance(r, SplitRel):
                p = e[r.parent]
                if r.factor is not None:
                    f = self._val(r.factor, F, n)
                    e[r.inner], e[r.outer] = np.minimum(p, f), np.ceil(p / f)
                else:
                    f = self._val(r.nparts, F, n)
                    e[r.outer], e[r.inner] = np.minimum(p, f), np.ceil(p / f)
                self._tail |= e[r.outer] * e[r.inner] != p
            else:
                e[r.fused] = np.prod([e[q] for q in r.parents], axis=0)
        ext[name] = e
        # coefficients of the leaves in every node (reverse relations, as root_exprs)
        one = np.ones(n)        # shared: the arrays of `val` are never written in place
        val: dict[str, dict[str, np.ndarray]] = {it.name: {it.name: one} for it in st.iters}
        fus: dict[str, set[str]] = {it.name: set() for it in st.iters}
        for r in reversed(st.relations):
            if isinstance(r, SplitRel):
                d = {k: v * e[r.inner] for k, v in val.get(r.outer, {}).items()}
                for k, v in val.get(r.inner, {}).items():
                    # a fused leaf reaching both halves contiguously ((f // m) * m + f % m): the lowering
                    # simplifies the pair back to f, so its coefficient is the inner one, not the sum
                    o = d.get(k)
                    d[k] = v if o is None else np.where(np.isclose(o, v) & (v != 0), v, o + v)
                val[r.parent] = d
                fus[r.parent] = fus.get(r.outer, set()) | fus.get(r.inner, set())
            else:
                stride = np.ones(n)
                src = val.get(r.fused, {})
                for q in reversed(r.parents):
                    val[q] = {k: np.where(e[q] == 1, 0.0, v / stride) for k, v in src.items()}
                    # q = f // stride: leaves whose steps are not multiples of stride and that together never
                    # reach it (f = a * stride + b, 0 <= b < stride) drop out, as the lowering simplifies them
                    frac = {k: np.mod(v, stride) != 0 for k, v in src.items()}
                    reach = sum((np.where(frac[k], np.abs(v) * (e[k] - 1.0), 0.0) for k, v in src.items()),
                                np.zeros(n))
                    for k, v in src.items():
                        val[q][k] = np.where(frac[k] & (reach < stride), 0.0, val[q][k])
                        if q != r.parents[0]:   # q = (f // stride) % e[q]: steps of whole periods leave q alone
                            val[q][k] = np.where(np.mod(v, stride * e[q]) == 0, 0.0, val[q][k])
                    fus[q] = fus.get(r.fused, set()) | set(val.get(r.fused, {}))
                    stride = stride * e[q]
        R = len(axes)
        nit = len(st.iters)
        keys = [(name, it.name) for it in st.iters] + list(outer_coef)
        RA = np.zeros((n, len(keys), R))
        FA = np.zeros((n, len(keys), R), dtype=bool)
        for j, it in enumerate(st.iters):
            for col, a in enumerate(axes):
                c = val.get(a, {}).get(it.name)
                if c is not None:
                    RA[:, j, col] = c
                    FA[:, j, col] = it.name in fus.get(a, set())
        mn: dict[tuple[str, str], np.ndarray] = {}
        D0 = len(op.axes)
        for j, (u, coef) in enumerate(outer_coef.items(), nit):   # coef: (N, D) over space axes
            RA[:, j, :D0] = coef
            mn[u] = coef
        own = {u: RA[:, j] for j, u in enumerate(keys)}
        ownf = {u: FA[:, j] for j, u in enumerate(keys)}
        self._rca[name] = ({u: j for j, u in enumerate(keys)}, RA)
        self._fany[name] = dict(zip(keys, FA.any(axis=(0, 2)).tolist()))
        rc[name], fz[name], mnc[name] = own, ownf, mn
        is_out = name in self.cd.outputs
        if st.attach.kind == "at":
            shp = np.stack([roots[a.name] for a in op.axes], axis=1) if op.axes else np.zeros((n, 0))
        else:
            shp = np.tile(np.array(op.shape, dtype=np.float64), (n, 1))
        for _axis, factor, offset in st.align:
            if shp.shape[1]:
                shp[:, -1] = shp[:, -1] + np.mod(offset - shp[:, -1], factor)
        shapes[name] = shp
        del is_out

    def _inner_refs(self, target: str, it: str) -> set[tuple[str, str]]:
        got = self._inner_cache.get((target, it))
        if got is None:
            got = self._inner_cache[(target, it)] = self._inner_refs_of(target, it)
        return got

    def _inner_refs_of(self, target: str, it: str) -> set[tuple[str, str]]:
        t = self.stages[target]
        pos = t.iter_pos(it)
        inner = {(target, i.name) for i in t.iters[pos + 1:]}
        for n in self.order:
            ch = self.chain.get(n, [])
            if n != target and any(s == target and s_it == i.name for s, s_it, _ in ch for i in t.iters[pos:]):
                inner |= {(n, i.name) for i in self.stages[n].iters}
        return inner

    def _loads(self, stage: str) -> list[Load]:
        got = self._load_cache.get(stage)
        if got is None:
            got = self._load_cache[stage] = [x for x in walk(self.bodies[stage]) if isinstance(x, Load)]
        return got

    def _access_coefs(self, stage: str, idx: tuple[Expr, ...], rc, n) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (D,) constants and (D, R) matrix of an index of `stage`, and the (N, U, D) coefficients of each
        index dimension per loop ref of the stage (`self._rca[stage][0]` numbers them)."""
        got = self._coef_cache.get((stage, idx))
        if got is not None:
            return got
        key = (stage, idx)
        aff = self._affine_cache.get(key)
        if aff is None:
            aff = self._affine_cache[key] = self._affine_of(stage, idx)
        const, A = aff
        allc = self._rca[stage][1] @ A.T                         # (N, U, D)
        got = self._coef_cache[key] = (const, A, allc)
        return got

    def _affine_of(self, stage: str, idx: tuple[Expr, ...]) -> tuple[np.ndarray, np.ndarray]:
        op = self.stages[stage].op
        axes = [a.name for a in op.axes] + [a.name for a in op.reduce_axes]
        pos = {a: j for j, a in enumerate(axes)}
        A = np.zeros((len(idx), len(axes)))
        const = np.zeros(len(idx))
        for d, e in enumerate(idx):
            r = _affine(e, set(axes))
            if r is None:
                raise Unsupported(f"index {e} of stage {stage} is not affine")
            for a, v in r[0].items():
                A[d, pos[a]] = v
            const[d] = r[1]
        return const, A

    def _divmod_of(self, stage: str, idx: tuple[Expr, ...]) -> list[tuple | None]:
        """Per index dimension: (is_div, k, B (R,), c) for `x // k` / `x % k` of an integer-affine x = B . axes + c
        (what bound inference simplifies term by term, `simplify._div_mod`), else None."""
        key = ("dm", stage, idx)
        got = self._affine_cache.get(key)
        if got is not None:
            return got
        op = self.stages[stage].op
        axes = [a.name for a in op.axes] + [a.name for a in op.reduce_axes]
        pos = {a: j for j, a in enumerate(axes)}
        out: list[tuple | None] = []
        for e in idx:
            info = None
            if isinstance(e, Binary) and e.op in (Op.DIVIDE, Op.REMAINDER) and isinstance(e.b, Const) \
                    and float(e.b.value) >= 1 and float(e.b.value) == int(e.b.value):
                r = _affine(e.a, set(axes))
                if r is not None and all(float(v).is_integer() for v in r[0].values()) and float(r[1]).is_integer():
                    B = np.zeros(len(axes))
                    for a, v in r[0].items():
                        B[pos[a]] = v
                    info = (e.op is Op.DIVIDE, float(e.b.value), B, r[1])
            out.append(info)
        self._affine_cache[key] = out
        return out

    def _divmod_dim(self, c: str, info: tuple, inner: set, ext, rc, n: int, g_outer: dict):
        """Region span of one `x // k` / `x % k` index dimension of consumer `c`, as the exact bound inference
        computes it: x's terms whose coefficients are multiples of k (`qt`) and the rest (`rt`); when rt stays
        within one period of k, x // k is qt / k (+ a constant) and x % k is rt (- a constant); else the whole
        x // k (x % k) is one atom: its bounds when all its loops are inside the attach point, the whole
        dimension when it mixes inner and outer loops, symbolic (span 0) when all are outer.
        Returns (lo, hi, full, bad, outer coefficients) for this dimension, each (N,)."""
        is_div, k, B, const = info
        cst = self.stages[c]
        Dc = len(cst.op.axes)
        K = np.full(n, float(const))
        bad = np.zeros(n, dtype=bool)
        if c in self._lo:
            K = K + self._lo[c] @ B[:Dc]
            bad |= np.any(self._clamp[c][:, B[:Dc] != 0], axis=1)
        terms = []
        for u, m in rc[c].items():
            e = ext[u[0]][u[1]]
            v = np.where(e > 1, m @ B, 0.0)
            bad |= np.abs(v - np.round(v)) > 1e-9
            terms.append((u, np.round(v), e - 1.0, u in inner))
        zero = np.zeros(n)
        rt = {u: np.mod(v, k) != 0 for u, v, _r, _i in terms}
        m = np.mod(K, k)
        rlo = m + sum((np.where(rt[u], np.minimum(0, v * r), 0) for u, v, r, _i in terms), zero)
        rhi = m + sum((np.where(rt[u], np.maximum(0, v * r), 0) for u, v, r, _i in terms), zero)
        one = (rlo >= 0) & (np.floor(rlo / k) == np.floor(rhi / k))
        j = np.floor(rlo / k)
        if is_div:
            keep = {u: ~rt[u] for u, *_ in terms}
            scale, base = 1.0 / k, np.floor(K / k) + j
        else:
            keep = rt
            scale, base = 1.0, m - j * k
        lo1 = base + sum((np.where(keep[u], np.minimum(0, v * scale * r), 0) for u, v, r, i in terms if i), zero)
        hi1 = base + sum((np.where(keep[u], np.maximum(0, v * scale * r), 0) for u, v, r, i in terms if i), zero)
        # the atom case
        xlo = K + sum((np.minimum(0, v * r) for _u, v, r, _i in terms), zero)
        xhi = K + sum((np.maximum(0, v * r) for _u, v, r, _i in terms), zero)
        has_in = np.any([(v != 0) for _u, v, _r, i in terms if i], axis=0) if any(t[3] for t in terms) else zero > 0
        has_out = np.any([(v != 0) for _u, v, _r, i in terms if not i], axis=0) \
            if any(not t[3] for t in terms) else zero > 0
        if is_div:
            alo, ahi = np.floor(xlo / k), np.floor(xhi / k)
        else:
            same = np.floor(xlo / k) == np.floor(xhi / k)
            alo = np.where(same, np.mod(xlo, k), 0.0)
            ahi = np.where(same, np.mod(xhi, k), np.minimum(k - 1, xhi))
        atom_full = ~one & has_in & (has_out | (xlo < 0))
        sym = ~one & ~has_in
        lo = np.where(one, lo1, np.where(sym, 0.0, alo))
        hi = np.where(one, hi1, np.where(sym, 0.0, ahi))
        og = {}
        for u, v, _r, i in terms:
            if not i:
                og[u] = np.where(one, np.where(keep[u], v * scale, 0.0), g_outer[u])
        return lo, hi, atom_full, bad, og

    def _region(self, name: str, n: int, ext, rc, fz):
        st = self.stages[name]
        op = st.op
        target, it = st.attach.stage, st.attach.iter
        inner = self._inner_refs(target, it)
        D = len(op.axes)
        lo = np.full((n, D), np.inf)
        hi = np.full((n, D), -np.inf)
        full = np.zeros((n, D), dtype=bool)
        first_outer: dict | None = None
        first_A = None
        cons = self._consumers.get(name)
        if cons is None:
            cons = self._consumers[name] = consumers(self.state, name)
        for c in cons:
            for ld in self._loads(c):
                if ld.buffer != name:
                    continue
                const, A, allc = self._access_coefs(c, ld.indices, rc, n)
                coefs = {u: allc[:, j] for u, j in self._rca[c][0].items()}
                a = np.tile(const, (n, 1))
                if c in self._lo:    # the consumer's own region minimum (relative index + its constant)
                    Dc = len(self.stages[c].op.axes)
                    a = a + self._lo[c] @ A[:, :Dc].T
                b = a.copy()
                for u, g in coefs.items():
                    if u in inner:
                        e_u = ext[u[0]][u[1]][:, None]
                        span = g * (e_u - 1.0)
                        a = a + np.minimum(0, span)
                        b = b + np.maximum(0, span)
                        if self._fany[c][u]:       # else no axis of u is reached through a fuse: nothing to add
                            via_fuse = (fz[c][u] @ (A.T != 0)) > 0
                            full |= via_fuse & (g != 0) & (e_u > 1) & (np.abs(g - np.round(g)) > 1e-9)
                outer = {u: g.copy() for u, g in coefs.items() if u not in inner}
                for d, info in enumerate(self._divmod_of(c, ld.indices)):
                    if info is None:
                        continue
                    dlo, dhi, dfull, dbad, og = self._divmod_dim(c, info, inner, ext, rc, n,
                                                                 {u: g[:, d] for u, g in outer.items()})
                    a[:, d], b[:, d] = dlo, dhi
                    full[:, d] |= dfull
                    self.bad |= dbad
                    for u, g in og.items():
                        outer[u][:, d] = g
                lo, hi = np.minimum(lo, a), np.maximum(hi, b)
                if first_A is None:
                    first_A = A
                    first_outer = outer
                elif first_A.shape != A.shape:   # consumers of another rank (a stage and its rfactor stage)
                    raise Unsupported(f"consumers of {name} index it over different root axes")
                elif not np.array_equal(first_A, A):
                    full |= np.any(first_A != A, axis=1)[None, :]
        extent = np.array([a.extent for a in op.axes], dtype=np.float64)[None, :]
        if first_A is None:
            self._lo[name] = np.zeros((n, D))
            self._clamp[name] = np.zeros((n, D), dtype=bool)
            return np.tile(extent, (n, 1)), {}
        size = hi - lo + 1
        full |= size >= extent
        # bound inference gives whole sizes: a fractional one is a case the template does not model
        self.bad |= np.any(~full & (np.abs(size - np.round(size)) > 1e-9), axis=1)
        region = np.where(full, extent, size)
        outer = {u: np.where(full, 0.0, g) for u, g in (first_outer or {}).items()}
        # the region minimum (outer terms + lo) is clamped into the domain where its bounds leave it (lower.py):
        # never without partial tiles (every access is in the domain and the region is their hull); with them,
        # the bounds of the linear terms (a fused loop's are not linear: counted as clamped, i.e. not modelled)
        mlo, mhi = lo.copy(), lo.copy()
        fused = np.zeros((n, D), dtype=bool)
        for u, g in outer.items():
            r = ext[u[0]][u[1]][:, None] - 1.0
            mlo, mhi = mlo + np.minimum(0, g * r), mhi + np.maximum(0, g * r)
            if self._fany[u[0]][u]:
                fused |= (g != 0) & (r > 0)
        self._lo[name] = np.where(full, 0.0, lo)
        self._clamp[name] = ~full & self._tail[:, None] & ((mlo < 0) | (mhi + region > extent) | fused)
        return region, outer

    def _plan(self, si: int) -> tuple:
        """What the nest of store `si` takes from the instantiated template (structure only, built once)."""
        got = self._plans.get(si)
        if got is not None:
            return got
        stage, kind, loops = self.stores[si]
        st = self.stages[stage]
        op = st.op
        refs = [(s, it) for s, it, _init in loops]
        kinds = tuple(self.stages[s].iters[self.stages[s].iter_pos(it)].kind for s, it in refs)
        accs = [(stage, 1, tuple(a.var for a in op.axes), stage, _nbytes(op.dtype))]
        if kind != "init":
            if kind == "update":
                accs.append((stage, 0, None, stage, _nbytes(op.dtype)))     # the same coefficients as the write
            accs += [(ld.buffer, 0, ld.indices, ld.buffer, _nbytes(ld.dtype)) for ld in self._loads(stage)]
        unroll = []
        for li, (s, it) in enumerate(refs):
            v = dict(self.stages[s].iters[self.stages[s].iter_pos(it)].pragmas).get(UNROLL)
            if v is not None:
                unroll.append((v, [lj for lj in range(li, len(loops)) if loops[lj][0] == s]))
        alloc = None
        if stage not in self.cd.outputs:
            local = (st.scope in ("global", "local")) if st.attach.kind == "at" else st.scope == "local"
            alloc = (_nbytes(op.dtype), [(s, it) for s, it, _ in self.chain.get(stage, [])], float(local))
        got = self._plans[si] = (stage, refs, kinds, accs, unroll, alloc)
        return got

    def _nest(self, si: int, rep: _RepStore, n, ext, rc, mnc, shapes, F) -> StoreNest:
        stage, refs, kinds, accs_plan, unroll, alloc_plan = self._plan(si)
        L = len(refs)
        E = np.stack([ext[s][it] for s, it in refs], axis=1) if L else np.ones((n, 0))
        accs: list[tuple[str, int, np.ndarray, int]] = []
        for buf, mode, idx, mbuf, eb in accs_plan:
            if idx is None:
                accs.append((buf, mode, accs[0][2], eb))
                continue
            _c, _A, allc = self._access_coefs(stage, idx, rc, n)
            accs.append((buf, mode, self._stack(allc, self._rca[stage][0], refs, n, len(idx), mnc.get(mbuf, {})), eb))
        accesses = self._merge(accs, shapes)
        step = np.zeros(n)
        for v, later in unroll:
            vis = np.any(E[:, later] > 1, axis=1)
            step = np.maximum(step, np.where(vis, self._val(v, F, n), 0.0))
        alloc = np.zeros((n, 4))
        if alloc_plan is not None:
            eb, ch, local = alloc_plan
            size = np.prod(shapes[stage], axis=1) * eb
            outer = np.prod([ext[s][it] for s, it in ch], axis=0) if ch else np.ones(n)
            alloc = np.stack([size, outer, np.prod(E, axis=1) / outer, np.full(n, local)], axis=1)
        return StoreNest(kinds, E, rep.ops, accesses, step, alloc, rep.is_init, rep.is_update)

    @staticmethod
    def _stack(allc: np.ndarray, pos: dict, refs: list, n: int, D: int, minus: dict) -> np.ndarray:
        """(N, L, D) coefficients of the statement's loops (`refs`) from the (N, U, D) ones of the stage's loop
        refs (`pos`: ref -> U index; a loop the stage does not know moves nothing), less the region minimum."""
        li = [k for k, u in enumerate(refs) if u in pos]
        if len(li) == len(refs):            # every loop known: one gather
            out = allc[:, [pos[u] for u in refs]]
        else:
            out = np.zeros((n, len(refs), D))
            if li:
                out[:, li] = allc[:, [pos[refs[k]] for k in li]]
        if minus:
            for k, u in enumerate(refs):
                m = minus.get(u)
                if m is not None:
                    out[:, k] = out[:, k] - m
        return out

    @staticmethod
    def _merge(accs, shapes) -> list[Access]:
        by: dict[str, list] = {}
        for buf, mode, coef, eb in accs:
            if buf not in by:
                by[buf] = [buf, mode, 0, coef, eb]
                by[buf][2] = 1
                continue
            g = by[buf]
            if g[1] != mode:
                g[1] = 2
            g[2] += 1
            g[3] = np.where(np.abs(coef) > np.abs(g[3]), coef, g[3])
        out = sorted(by.values(), key=lambda g: (g[1] == 0, g[0]))
        return [Access(g[0], g[1], g[2], g[4], g[3], shapes[g[0]]) for g in out]


# ----------------------------------------------------------------------------- batch API

_TEMPLATES: dict[tuple, Template | None] = {}
_MAX_TEMPLATES = 4096


def _forget_busy_templates() -> None:
    """In a forked child (the search's `fanout`): a template whose lock another thread of the parent held at the
    fork would stay locked here for ever (that thread is not in the child), its per-call state half made:
    forget it (it is built again when asked for)."""
    for k, tpl in list(_TEMPLATES.items()):
        if tpl is not None and tpl.lock.locked():
            del _TEMPLATES[k]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_busy_templates)


#: an rfactor template (fixed splits) is trusted only once verified against the exact path, about ten
#: lowerings, once per blanked structure (`_rfactor_verdict`).  A blanked structure not yet verified waits until this
#: many of its candidates (any choice of the fixed factors, this batch and earlier ones) were asked for; until then
#: they take the exact path, one lowering each.  Small workloads' populations (a log-softmax of [8, 10]) hold
#: thousands of rfactor structures of one or two candidates each: verifying every one made a search round take a
#: minute.  Plain templates cost about one lowering to build and are built at once (waiting for 3 candidates
#: measured 10-14 % slower on bench dense_bias_relu).
RFACTOR_TEMPLATE_MIN_USES = 12
_RF_USES: dict[tuple, int] = {}    # blanked structure (as `_RF_VERDICT`'s key) -> candidates asked for so far


def _blanked(key_cd: str, steps: tuple) -> tuple:
    """(workload, tokens of the steps with every factor blanked): the key of `_RF_VERDICT` and `_RF_USES`."""
    return key_cd, tuple(_token(s) for s in steps)


def _worth_a_template(key_cd: str, n: int, sched) -> bool:
    """Whether `sched`'s structure, asked for `n` candidates now, should get a template: plain ones at once, rfactor
    ones once verified good (never once verified bad), or when not yet verified after RFACTOR_TEMPLATE_MIN_USES."""
    steps = tuple(getattr(sched, "steps", sched))
    if not _fixed_splits(steps):
        return True
    k = _blanked(key_cd, steps)
    verdict = _RF_VERDICT.get(k)
    if verdict is not None:
        return verdict
    if len(_RF_USES) >= _MAX_TEMPLATES:
        _RF_USES.clear()
    uses = _RF_USES[k] = _RF_USES.get(k, 0) + n
    return uses >= RFACTOR_TEMPLATE_MIN_USES


def _template(cd: ComputeDef, key_cd: str, sched, skey: tuple | None = None, n: int = 0) -> Template | None:
    """The template of `sched`'s structure (None: it has none, or `n` > 0 candidates of it are not yet worth
    one: `_worth_a_template`; the caller takes the exact path)."""
    key = (key_cd, key_and_row(sched)[0] if skey is None else skey)
    tpl = _TEMPLATES.get(key, _TEMPLATES)
    if tpl is _TEMPLATES:
        if n and not _worth_a_template(key_cd, n, sched):
            return None
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.clear()
        try:
            tpl = Template.build(cd, sched)
            if tpl.fixed and not _rfactor_verdict(tpl, key_cd, sched):
                tpl = None
        except (Unsupported, ScheduleError):
            tpl = None
        _TEMPLATES[key] = tpl
    return tpl


#: (workload, tokens of the steps with every factor blanked) -> whether an rfactor template of that structure
#: reproduced its representative: checked once per structure, not once per choice of the fixed split factors
_RF_VERDICT: dict[tuple, bool] = {}


def _rfactor_verdict(tpl: Template, key_cd: str, sched) -> bool:
    steps = tuple(getattr(sched, "steps", sched))
    k = _blanked(key_cd, steps)
    ok = _RF_VERDICT.get(k)
    if ok is None:
        if len(_RF_VERDICT) >= _MAX_TEMPLATES:
            _RF_VERDICT.clear()
        ok = _RF_VERDICT[k] = tpl.reproduces_representative(steps)
    return ok


def batch_features(cd: ComputeDef, schedules, workload_key: str | None = None) -> list[np.ndarray | None]:
    """Log-scaled features (S_i, NUM_FEATURES) of each schedule (None for a schedule that does not lower).
    Schedules sharing a structure are instantiated together from one template; then statements of equal
    shape (`nest_signature`) across all structures are featurized in one numpy call; then the program
    columns of each structure's programs (`add_program_features`, one numpy call per structure).
    The garbage collector is paused meanwhile: the templates and results a batch keeps would otherwise trigger
    a collection every few hundred of them (and a full one, a walk over every object of the process, every
    ~100 collections), though they make no garbage cycles; afterwards they count as one."""
    was = gc.isenabled()
    gc.disable()
    try:
        return _batch_features(cd, schedules, workload_key)
    finally:
        if was:
            gc.enable()


def _batch_features(cd: ComputeDef, schedules, workload_key: str | None) -> list[np.ndarray | None]:
    key_cd = workload_key or cd.name + str(id(cd))
    ideal = ideal_log2(cd)          # once per batch: every schedule of it, template or exact path, uses it
    groups: dict[tuple, tuple[list[int], list[list]]] = {}
    for i, s in enumerate(schedules):
        if len(_TOKENS) >= _MAX_TOKENS:          # tokens are keys of _TEMPLATES: forget both together
            _TOKENS.clear()
            _BY_ID.clear()
            _TEMPLATES.clear()
            _RF_VERDICT.clear()
            _RF_USES.clear()
        k, row = key_and_row(s)
        g = groups.get(k)
        if g is None:
            groups[k] = ([i], [row])
        else:
            g[0].append(i)
            g[1].append(row)
    out: list[np.ndarray | None] = [None] * len(schedules)
    done: list[tuple[list[int], list[StoreNest]]] = []
    for k, (idx, rows) in groups.items():
        tpl = _template(cd, key_cd, schedules[idx[0]], k, len(idx))
        if tpl is not None:
            try:
                F = np.array(rows, dtype=np.float64) if tpl.refs else np.zeros((len(idx), 0))
                nests, bad = tpl.instantiate(F)
                if bad.any():   # candidates the template cannot express: lowered one by one below
                    rest = [i for i, b in zip(idx, bad) if b]
                    idx = [i for i, b in zip(idx, bad) if not b]
                    if idx:
                        nests = tpl.instantiate(F[~bad])[0]
                    for i in rest:
                        _lowered(cd, schedules[i], i, done)
                if idx:
                    done.append((idx, nests))
                continue
            except Unsupported:
                pass
        for i in idx:
            _lowered(cd, schedules[i], i, done)
    buckets: dict[tuple, list[tuple[int, int]]] = {}
    for g, (_idx, nests) in enumerate(done):
        for j, nst in enumerate(nests):
            buckets.setdefault(nest_signature(nst), []).append((g, j))
    rows_of: dict[tuple[int, int], np.ndarray] = {}
    for members in buckets.values():
        nests = [done[g][1][j] for g, j in members]
        X = log_scale(store_features(stack_nests(nests)))
        at = 0
        for (g, j), nst in zip(members, nests):
            k = nst.ext.shape[0]
            rows_of[(g, j)] = X[at:at + k]
            at += k
    by_len: dict[int, list[tuple[list[int], np.ndarray]]] = {}
    for g, (idx, nests) in enumerate(done):
        # prog_* per structure (not all programs of equal length at once): numpy's sums over a program's rows
        # take another order in a larger array, which changes them in the last bit
        X = add_program_features(np.stack([rows_of[(g, j)] for j in range(len(nests))], axis=1), None) if nests else \
            np.zeros((len(idx), 0, NUM_FEATURES))
        by_len.setdefault(X.shape[1], []).append((idx, X))
    for S, parts in by_len.items():
        # the estimates (row by row, and sums over one program's S rows) of all programs of S statements at once:
        # one numpy call per program length instead of one per structure (small batches hold hundreds of them)
        X = np.concatenate([x for _, x in parts]) if len(parts) > 1 else parts[0][1]
        if S:
            add_estimates(X, ideal)
        at = 0
        for idx, _x in parts:
            for i in idx:
                out[i] = X[at]
                at += 1
    return out


def _lowered(cd: ComputeDef, sched, i: int, done: list) -> None:
    """The exact path inside a batch: schedule i lowered one by one, its statements (N = 1 each) added to `done` as a
    group of its own, so that they are featurized together with every other statement of their shape in the batch
    (one numpy call per shape, not one per statement); left None when it does not lower."""
    try:
        nests = nests_of_func(lower(cd, getattr(sched, "steps", sched)))
    except HlotuneError:
        return
    done.append(([i], nests))


def exact_features(cd: ComputeDef, sched) -> np.ndarray | None:
    """Exact path for one schedule: lower, then features_of_func (None when the schedule does not lower); the
    reference the batch path is checked against."""
    try:
        return features_of_func(lower(cd, getattr(sched, "steps", sched)), ideal_log2(cd))
    except HlotuneError:
        return None
