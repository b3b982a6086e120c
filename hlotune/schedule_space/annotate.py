"""Random annotation: fill a sketch's holes and decide its annotations -> valid schedules.

Map:
  factor_schemes(extent, n, max_innermost)  every n-tuple of tile factors whose product divides extent
                                            (cached per extent; the innermost capped)
  sample_tile(hole, rng, nondivisible)      one random factorization (sometimes a non-divisible one)
  Decisions                                 everything a schedule of a sketch chose: tile factors per hole;
                                            per site compute location, parallel fuse count, vector lanes,
                                            unroll pragma
  sample_schedules(sketch, task, rng, n)    up to n distinct valid schedules, reproducible from the seed
  realize(sketch, decisions, ...)           decisions -> Schedule (strict, or repairing what no longer fits)
  decisions_of(sketch, schedule)            the inverse: read the decisions back from the steps
  default_like(sketch)                      the schedule of a tile_fuse@1 / cache_write@1 sketch that matches
                                            the default's GEMM blocking (where the search starts)
  check_state(state)                        the filter beyond replay: vector lanes <= 16 and dividing,
                                            parallel loops of extent >= 2

A schedule of a sketch is the sketch's template with its Split holes filled (same positions), then the
annotation steps, in this order: for each site with a PackChoice that packs, the Pack step (factor = the
innermost tile of the stage's last space axis) and the packed copy's own (fixed) schedule; the compute
location of each location site (ComputeRoot / ComputeInline / ComputeAt, always explicit), then per site:
Fuse of its outer space loops + Annotate parallel, Split of its innermost loop by the lanes + Annotate
vectorized (or Annotate of the innermost loop as is), and a Pragma auto_unroll_max_step on its outermost
loop. Candidates for each decision are read off the replayed state (iterator extents and attach points), so
every choice is legal by construction; replay itself is the validation (an illegal step raises ScheduleError
and the candidate is dropped).

Decision encodings (per site): loc () when not a location site, ("root",), ("inline",) or
("at", stage, iterator); par = number of outer loops fused and made parallel (0: none); vec = 0 none,
1 the innermost loop as is, v >= 2 split off v lanes and vectorize them; unroll = pragma value; pack = 1 when
the site's B operand is packed (0 otherwise and at sites without a PackChoice).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cache, lru_cache

import numpy as np

from ..errors import ScheduleError
from .default import PARALLEL_MIN_WORK, transposed_pack
from .loop_ir import ForKind
from .sketch import MAX_LANES, UNROLL_CHOICES, PackChoice, Sketch, TileHole
from .state import SplitRel, StageState, State, _buffer_info, apply, consumers, propagate, remember, replay
from .steps import (
    Annotate,
    ComputeAt,
    ComputeInline,
    ComputeRoot,
    Fuse,
    Pack,
    Pragma,
    Schedule,
    Split,
    step_to_json,
)

#: probability that a tile hole gets a random non-divisible factorization (guarded tails)
NONDIVISIBLE = 0.1
#: probability of choosing no parallel loop / no vectorization where one is possible
P_NO_PARALLEL = 0.05
P_NO_VECTOR = 0.1
#: probability of packing a tiled stage's B operand where its site allows it
P_PACK = 0.7


# ----------------------------------------------------------------------------- tile factors

@cache
def divisors(n: int) -> tuple[int, ...]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return tuple(small + large[::-1])


@lru_cache(maxsize=4096)
def factor_schemes(extent: int, n: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """All (f1, ..., fn) (outer level first) with f1*...*fn dividing `extent` and fn <= max_innermost."""
    out: list[tuple[int, ...]] = []

    def rec(prefix: tuple[int, ...], rem: int) -> None:
        if len(prefix) == n - 1:
            for d in divisors(rem):
                if d > max_innermost:
                    break
                out.append(prefix + (d,))
            return
        for d in divisors(rem):
            rec(prefix + (d,), rem // d)

    rec((), max(1, extent))
    return tuple(out)


def _log_uniform(rng: random.Random, hi: int) -> int:
    if hi <= 1:
        return 1
    return max(1, min(hi, int(round(2.0 ** rng.uniform(0.0, math.log2(hi))))))


def sample_tile(hole: TileHole, rng: random.Random, nondivisible: float = NONDIVISIBLE) -> tuple[int, ...]:
    """Random factors for `hole`: uniform over `factor_schemes`, or (with probability `nondivisible`) a
    log-uniform draw per level whose product need not divide the extent (the tail is guarded)."""
    if nondivisible and hole.extent > 2 and rng.random() < nondivisible:
        fs: list[int] = []
        rem = hole.extent
        for k in range(hole.n):
            v = _log_uniform(rng, min(rem, hole.max_innermost) if k == 0 else rem)
            fs.append(v)
            rem = max(1, rem // v)
        return tuple(reversed(fs))
    schemes = factor_schemes(hole.extent, hole.n, hole.max_innermost)
    return schemes[rng.randrange(len(schemes))]


# ----------------------------------------------------------------------------- decisions

@dataclass(frozen=True)
class Decisions:
    """What a schedule of a sketch chose (see the module docstring for the encodings)."""

    tiles: tuple[tuple[int, ...], ...]
    loc: tuple[tuple, ...]
    par: tuple[int, ...]
    vec: tuple[int, ...]
    unroll: tuple[int, ...]
    pack: tuple[int, ...] = ()    # per site: 1 = its PackChoice is taken (absent: 0)


class Resample:
    """A decision value meaning "choose again at random, differently from `old` if possible"."""

    __slots__ = ("old",)

    def __init__(self, old):
        self.old = old


class _Chooser:
    """Makes each decision: the fixed value when given and legal; else (with an rng) a random one."""

    def __init__(self, rng: random.Random | None, fixed: Decisions | None):
        self.rng = rng
        self.fixed = fixed
        self.made: dict[str, list] = {"loc": [], "par": [], "vec": [], "unroll": [], "pack": []}

    def pick(self, kind: str, k: int, options: list, sample):
        vals = getattr(self.fixed, kind) if self.fixed is not None else ()
        want = vals[k] if k < len(vals) else None
        if want is None and kind == "pack" and self.rng is None and 0 in options:
            want = 0   # decisions written before packing existed: no pack
        if isinstance(want, Resample):
            others = [o for o in options if o != want.old] or options
            v = others[self.rng.randrange(len(others))]
        elif want is not None and (want in options or self.rng is None):
            if want not in options:
                raise ScheduleError(f"{kind} decision {want!r} of site {k} is not one of {options}")
            v = want
        elif self.rng is None:
            raise ScheduleError(f"no {kind} decision for site {k}")
        else:
            v = sample(options)
        self.made[kind].append(v)
        return v

    def skip(self, kind: str, value) -> None:
        self.made[kind].append(value)


def _attached_at(state: State, stage: str, it: str) -> bool:
    for s in state.stages:
        a = s.attach
        if a.iter == it and a.stage == stage and a.kind == "at":
            return True
    return False


def _loc_options(state: State, site) -> list[tuple]:
    opts: list[tuple] = [("root",)]
    if site.inlinable:
        opts.append(("inline",))
    cons = consumers(state, site.stage)
    if len(cons) == 1:
        t = state.stage(cons[0])
        for it in t.iters:
            if it.is_reduce or it.kind is ForKind.VECTORIZED:
                break
            opts.append(("at", t.name, it.name))
    return opts


def _loc_step(stage: str, loc: tuple):
    if loc[0] == "root":
        return ComputeRoot(stage)
    if loc[0] == "inline":
        return ComputeInline(stage)
    return ComputeAt(stage, loc[1], loc[2])


def _par_candidates(state: State, st: StageState) -> list:
    cands = []
    its = st.iters[:-1] if len(st.iters) > 1 else st.iters
    for it in its:
        if it.is_reduce or it.kind is not ForKind.SERIAL or it.pragmas:
            break
        cands.append(it)
        if _attached_at(state, st.name, it.name):
            break
    return cands


def _parent_extent(st: StageState, name: str) -> int:
    roots = {a.name: a.extent for a in st.op.axes + st.op.reduce_axes}
    for r in st.relations:
        if isinstance(r, SplitRel) and name in (r.outer, r.inner):
            return propagate(st.relations, roots)[r.parent]
    for it in st.iters:
        if it.name == name:
            return it.extent
    return roots.get(name, 1)


def _vec_options(state: State, st: StageState) -> list[int]:
    if not st.iters:
        return [0]
    it = st.iters[-1]
    if it.is_reduce or it.kind is not ForKind.SERIAL or _attached_at(state, st.name, it.name):
        return [0]
    e = it.extent
    opts = [0]
    if 2 <= e <= MAX_LANES and _parent_extent(st, it.name) % e == 0:
        opts.append(1)
    opts += [v for v in divisors(e) if 2 <= v <= MAX_LANES and v < e]
    return opts


class _Sampler:
    """The random default choice of each kind of decision."""

    def __init__(self, rng: random.Random, cores: int):
        self.rng = rng
        self.cores = max(1, cores)

    def loc(self, options):
        return options[self.rng.randrange(len(options))]

    def par(self, cum: list[int]):
        def choose(options):
            live = [k for k in options if k > 0]
            if not live or self.rng.random() < P_NO_PARALLEL:
                return 0
            want = 16 * self.cores
            k0 = next((k for k in live if cum[k - 1] >= want), live[-1])
            near = [k for k in live if abs(k - k0) <= 1]
            return near[self.rng.randrange(len(near))]
        return choose

    def vec(self, options):
        live = [v for v in options if v != 0]
        if not live or self.rng.random() < P_NO_VECTOR:
            return 0
        weights = [3 if (v == 1 or v & (v - 1) == 0) else 1 for v in live]
        return self.rng.choices(live, weights)[0]

    def unroll(self, options):
        return options[self.rng.randrange(len(options))]

    def pack(self, options):
        return 1 if 1 in options and self.rng.random() < P_PACK else 0


def _pack_options(sketch: Sketch, state: State, pc: PackChoice) -> tuple[list[int], int]:
    f = state.steps[sketch.tiles[pc.tile].step].factors[pc.level]
    shape, _ = _buffer_info(state, pc.buffer)
    return ([0, 1] if f >= 2 and shape[pc.axis] % f == 0 else [0]), f


def _pack_steps(state: State, pc: PackChoice, f: int) -> list:
    """The Pack step and the schedule of the packed copy (like the default's): when the packed axis is the
    source's contiguous one, vector copies along it (lanes: the widest power of two up to MAX_LANES
    dividing f); otherwise (B transposed) the copy runs along the reduction axis, which is contiguous in
    the source.  Parallel over the outer loops when the buffer is large."""
    shape, _ = _buffer_info(state, pc.buffer)
    nd = len(shape) + 1
    axes = [f"ax{d}" for d in range(nd)]
    inner = axes[-1]
    steps: list = [Pack(pc.buffer, (pc.reader,), pc.axis, f, pc.outer_pos)]
    if pc.axis == len(shape) - 1:
        lanes = next((v for v in (16, 8, 4, 2) if v <= MAX_LANES and f % v == 0), 0)
        if lanes and lanes < f:
            steps += [Split(pc.name, inner, (lanes,)), Annotate(pc.name, f"{inner}.1", ForKind.VECTORIZED)]
        elif lanes:
            steps.append(Annotate(pc.name, inner, ForKind.VECTORIZED))
        outer = axes[:-1]
    else:
        kax = f"ax{pc.outer_pos + 1}"
        k_dim = [d for d in range(len(shape)) if d != pc.axis][pc.outer_pos]
        more, outer = transposed_pack(pc.name, axes, kax, shape[k_dim])
        steps += more
    if outer and math.prod(shape) >= PARALLEL_MIN_WORK:
        if len(outer) > 1:
            steps.append(Fuse(pc.name, tuple(outer)))
        steps.append(Annotate(pc.name, "@".join(outer), ForKind.PARALLEL))
    return steps


def _packed(sketch: Sketch, state: State, ch: _Chooser, smp: _Sampler | None, tiles) -> State:
    """The pack decisions of every site, applied to the template's state (from the state LRU when the same
    tiles and packs were replayed before: the Pack steps rewrite expressions and re-check every attach)."""
    chosen = []
    for k, site in enumerate(sketch.sites):
        pc = site.pack
        if pc is None:
            ch.skip("pack", 0)
            continue
        opts, f = _pack_options(sketch, state, pc)
        if ch.pick("pack", k, opts, smp.pack if smp else None):
            chosen.append((pc, f))
    if not chosen:
        return state

    def build() -> State:
        st = state
        for pc, f in chosen:
            for step in _pack_steps(st, pc, f):
                st = apply(st, step)
            if pc.name not in st.by_name:
                raise ScheduleError(f"pack of {pc.buffer}: the packed copy is not named {pc.name}")
        return st

    return _cached_state(sketch, (tuple(map(tuple, tiles)), tuple((pc.name, f) for pc, f in chosen)), build)


def _annotate(sketch: Sketch, state: State, ch: _Chooser, smp: _Sampler | None) -> State:
    sites = sketch.sites
    inlined: set[str] = set()
    for k, site in enumerate(sites):
        if not site.location:
            ch.skip("loc", ())
            continue
        loc = ch.pick("loc", k, _loc_options(state, site), smp.loc if smp else None)
        state = apply(state, _loc_step(site.stage, loc))
        if loc[0] == "inline":
            inlined.add(site.stage)
    for k, site in enumerate(sites):
        name = site.stage
        st = state.stage(name)
        if name in inlined:
            for kind in ("par", "vec", "unroll"):
                ch.skip(kind, 0)
            continue
        if site.parallel and st.attach.kind == "root":
            cands = _par_candidates(state, st)
            cum, p = [], 1
            for it in cands:
                p *= it.extent
                cum.append(p)
            opts = [0] + [j + 1 for j in range(len(cands)) if cum[j] >= 2]
            n = ch.pick("par", k, opts, smp.par(cum) if smp else None)
            if n >= 2:
                state = apply(state, Fuse(name, tuple(it.name for it in cands[:n])))
            if n >= 1:
                state = apply(state, Annotate(name, state.stage(name).iters[0].name, ForKind.PARALLEL))
        else:
            ch.skip("par", 0)
        if site.vector:
            st = state.stage(name)
            v = ch.pick("vec", k, _vec_options(state, st), smp.vec if smp else None)
            if v >= 2:
                state = apply(state, Split(name, st.iters[-1].name, (v,)))
            if v >= 1:
                state = apply(state, Annotate(name, state.stage(name).iters[-1].name, ForKind.VECTORIZED))
        else:
            ch.skip("vec", 0)
        st = state.stage(name)
        if site.unroll and st.iters:
            u = ch.pick("unroll", k, list(UNROLL_CHOICES), smp.unroll if smp else None)
            state = apply(state, Pragma(name, st.iters[0].name, "auto_unroll_max_step", u))
        else:
            ch.skip("unroll", 0)
    return state


def check_state(state: State) -> None:
    """The filter beyond replay: vectorized loops have at most MAX_LANES lanes that divide the loop they
    were split from; parallel loops have extent >= 2.  Raises ScheduleError."""
    for st in state.stages:
        for it in st.iters:
            if it.kind is ForKind.VECTORIZED:
                if it.extent > MAX_LANES or _parent_extent(st, it.name) % it.extent:
                    raise ScheduleError(f"vectorized {st.name}.{it.name}: {it.extent} lanes")
            elif it.kind is ForKind.PARALLEL and it.extent < 2:
                raise ScheduleError(f"parallel {st.name}.{it.name} of extent {it.extent}")


def _fill(sketch: Sketch, tiles) -> list:
    steps = list(sketch.steps)
    for h, f in zip(sketch.tiles, tiles):
        if len(f) != h.n or any(not isinstance(x, int) or x < 1 for x in f):
            raise ScheduleError(f"tile factors {f!r} for {h.stage}.{h.iter}: need {h.n} positive integers")
        if f[-1] > h.max_innermost:
            raise ScheduleError(f"tile factors {f!r} for {h.stage}.{h.iter}: innermost above {h.max_innermost}")
        steps[h.step] = replace(steps[h.step], factors=tuple(f))
    return steps


_TEMPLATES: OrderedDict = OrderedDict()
_TEMPLATES_MAX = 4096


def _cached_state(sketch: Sketch, key, build) -> State:
    """An LRU of partial states keyed by (sketch id, key); `build()` makes a missing one."""
    key = (sketch.id, key)
    hit = _TEMPLATES.get(key)
    if hit is not None and hit[0] is sketch.compute:
        _TEMPLATES.move_to_end(key)
        return hit[1]
    state = build()
    _TEMPLATES[key] = (sketch.compute, state)
    if len(_TEMPLATES) > _TEMPLATES_MAX:
        _TEMPLATES.popitem(last=False)
    return state


def _template_state(sketch: Sketch, tiles) -> State:
    """The state after the sketch's template with `tiles` filled in, from the LRU: mutations of unroll,
    parallel, location or packing and crossovers keep a parent's tiles, so they skip the template's replay."""
    return _cached_state(sketch, tuple(map(tuple, tiles)), lambda: replay(sketch.compute, _fill(sketch, tiles)))


def _build(sketch: Sketch, tiles, rng: random.Random | None, fixed: Decisions | None) -> tuple[State, Decisions]:
    state = _template_state(sketch, tiles)
    ch = _Chooser(rng, fixed)
    smp = _Sampler(rng, sketch.target.cores) if rng is not None else None
    state = _packed(sketch, state, ch, smp, tiles)
    state = _annotate(sketch, state, ch, smp)
    check_state(state)
    remember(state)
    m = ch.made
    return state, Decisions(tuple(tuple(t) for t in tiles), tuple(m["loc"]), tuple(m["par"]), tuple(m["vec"]),
                            tuple(m["unroll"]), tuple(m["pack"]))


_STEP_JSON: dict = {}
_STEP_JSON_MAX = 65536


def _step_text(step) -> str:
    """The canonical JSON text of one step (as `Schedule.key` writes it), cached per step: the template steps
    of a sketch are shared by thousands of its schedules."""
    t = _STEP_JSON.get(step)
    if t is None:
        if len(_STEP_JSON) >= _STEP_JSON_MAX:
            _STEP_JSON.clear()
        t = _STEP_JSON[step] = json.dumps(step_to_json(step), sort_keys=True, separators=(",", ":"))
    return t


def make_schedule(workload_key: str, steps: tuple, sketch_id: str) -> Schedule:
    """Schedule(workload_key, steps, sketch_id) with its structural `key` computed from cached per-step JSON
    (the same text and hash as `Schedule.key`, which otherwise re-serializes every step of every candidate)."""
    s = Schedule(workload_key, tuple(steps), sketch_id)
    head = '{"sketch":' + json.dumps(sketch_id) + "," if sketch_id else "{"
    text = (head + '"steps":[' + ",".join(_step_text(x) for x in s.steps) + '],"workload_key":'
            + json.dumps(workload_key) + "}")
    s.__dict__["key"] = hashlib.sha256(text.encode()).hexdigest()   # primes the cached_property
    return s


def as_random(rng) -> random.Random:
    """A `random.Random` from a seed, a random.Random (used as is) or a numpy Generator (seeds one)."""
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, np.random.Generator):
        return random.Random(int(rng.integers(0, 2**63 - 1)))
    return random.Random(rng)


def sample_schedules(sketch: Sketch, task=None, rng=0, n: int = 1, nondivisible: float = NONDIVISIBLE,
                     max_tries: int | None = None) -> list[Schedule]:
    """Up to `n` distinct valid schedules of `sketch` (each replays, passes `check_state`); the same rng
    seed gives the same schedules.  `task` (optional) supplies the workload key; `rng` is a seed, a
    random.Random or a numpy Generator.  A sketch without holes gives its one schedule."""
    rnd = as_random(rng)
    wk = getattr(task, "key", None) or sketch.workload_key
    if not sketch.has_holes:  # the default schedule: replay only (it is the lead's own heuristic)
        try:
            replay(sketch.compute, sketch.steps)
        except ScheduleError:
            return []
        return [make_schedule(wk, sketch.steps, sketch.id)][:n]
    out: list[Schedule] = []
    seen: set = set()
    tries = max_tries if max_tries is not None else 4 * n + 16
    for _ in range(tries):
        if len(out) >= n:
            break
        tiles = tuple(sample_tile(h, rnd, nondivisible) for h in sketch.tiles)
        try:
            state, made = _build(sketch, tiles, rnd, None)
        except ScheduleError:
            continue
        if state.steps in seen:
            continue
        seen.add(state.steps)
        out.append(_noted(make_schedule(wk, state.steps, sketch.id), made))
    return out


def _noted(schedule: Schedule, decisions: Decisions) -> Schedule:
    """`schedule` with the decisions that made it kept beside it, so that `decisions_of` (every mutation and
    crossover of it) need not read them back from the steps; they equal what `decisions_of` would read."""
    schedule.__dict__["_decisions"] = decisions
    return schedule


def realize(sketch: Sketch, decisions: Decisions, rng=None, workload_key: str | None = None) -> Schedule:
    """The schedule of `decisions`.  With `rng` None every decision must be legal (else ScheduleError);
    with an rng, decisions that no longer fit (or are `Resample` markers) are drawn again at random."""
    rnd = None if rng is None else as_random(rng)
    state, made = _build(sketch, decisions.tiles, rnd, decisions)
    return _noted(make_schedule(workload_key or sketch.workload_key, state.steps, sketch.id), made)


def default_like(sketch: Sketch, rng=0) -> Schedule | None:
    """The schedule of `sketch` closest to the default schedule's GEMM blocking (`default._gemm_plan`), for a
    tile_fuse@1 / cache_write@1 sketch of a dot-like stage: row tiles (1, tm/mr, mr), column tiles (1, tn/nr,
    nr) (nr halved while above the sketch's innermost limit: the register panel's 2 x 128 tile), batch tiles 1,
    the longest reduce axis blocked by kc (others outside), B packed into nr-wide panels (unless the plan reads it
    unpacked), the consumer's tile loops fused and parallel, vector lanes vl on both stages and auto-unroll 64
    (which unrolls the mr x nr/vl micro-tile but not the k loop around it). Other decisions are drawn from `rng`.
    The search starts from it, so tuning explores the neighbourhood of the default (tile sizes, k-blocking, packing)
    instead of having to find that point at random. None for other sketches or when the default is no GEMM."""
    from .default import _gemm_plan, _inner_reduce

    if not sketch.tiles or not any(r.endswith(("tile_fuse@1", "cache_write@1")) for r in sketch.rules):
        return None
    cd, target = sketch.compute, sketch.target
    name = sketch.tiles[0].stage
    op = cd.stage_by_name.get(name) or cd.stage_by_name.get(name.removesuffix(".local"))
    if op is None or len(op.axes) < 2:
        return None
    plan = _gemm_plan(op, target, max(1, target.vector_bits // 32))
    if plan is None:
        return None
    *batch, ax_i, ax_j = op.axes
    inner = _inner_reduce(op)
    hole_j = next((h for h in sketch.tiles if h.iter == ax_j.name), None)
    nr = plan.nr
    while hole_j is not None and nr > hole_j.max_innermost and nr % (2 * plan.vl) == 0:
        nr //= 2   # the register panel's 128-wide tile: two 64-wide ones (a sketch's innermost is at most 64)
    want = {ax_i.name: (1, plan.tm // plan.mr, plan.mr), ax_j.name: (1, max(1, plan.tn // nr), nr),
            inner.name: (plan.kc or inner.extent,)}
    tiles = []
    for h in sketch.tiles:
        if h.stage != name:
            return None
        tiles.append(want.get(h.iter, (1,) * h.n))
    n = len(sketch.sites)
    loc, par, vec, unroll, pack = [None] * n, [None] * n, [None] * n, [None] * n, [None] * n
    work = math.prod(a.extent for a in op.axes + op.reduce_axes)
    for k, site in enumerate(sketch.sites):
        if site.stage == name:
            vec[k] = plan.vl if plan.nr > plan.vl else 1
            unroll[k] = 64 if plan.mr * plan.nvec <= 64 else 512   # the micro-tile, not the k loop
            pack[k] = int(site.pack is not None and not plan.unpacked)
        elif site.parallel and site.vector and not site.location:   # the consumer hosting the tile
            par[k] = len(batch) + 2 if work >= PARALLEL_MIN_WORK else 0
            vec[k] = plan.vl if plan.tn > plan.vl else 1
    d = Decisions(tuple(tiles), tuple(loc), tuple(par), tuple(vec), tuple(unroll), tuple(pack))
    try:
        return realize(sketch, d, as_random(rng))
    except ScheduleError:
        return None


def decisions_of(sketch: Sketch, schedule: Schedule) -> Decisions:
    """Read the decisions of a schedule of `sketch` back from its steps (inverse of `realize`)."""
    made = schedule.__dict__.get("_decisions")
    if made is not None and schedule.sketch == sketch.id and len(made.tiles) == len(sketch.tiles):
        return made
    steps = schedule.steps
    T = len(sketch.steps)
    holes = {h.step for h in sketch.tiles}
    if len(steps) < T or any(steps[k] != s for k, s in enumerate(sketch.steps) if k not in holes):
        raise ScheduleError(f"schedule does not follow sketch {sketch.id}")
    tiles = []
    for h in sketch.tiles:
        s = steps[h.step]
        if not isinstance(s, Split) or (s.stage, s.iter) != (h.stage, h.iter):
            raise ScheduleError(f"schedule does not follow sketch {sketch.id} at step {h.step}")
        tiles.append(tuple(s.factors))
    loc: dict[str, tuple] = {}
    par: dict[str, int] = {}
    vec: dict[str, int] = {}
    unroll: dict[str, int] = {}
    fuse: dict[str, int] = {}
    split: dict[str, int] = {}
    packed: set[str] = set()
    for s in steps[T:]:
        if isinstance(s, Pack):
            packed.add(s.readers[0])
        elif isinstance(s, ComputeRoot):
            loc[s.stage] = ("root",)
        elif isinstance(s, ComputeInline):
            loc[s.stage] = ("inline",)
        elif isinstance(s, ComputeAt):
            loc[s.stage] = ("at", s.target, s.iter)
        elif isinstance(s, Fuse):
            fuse[s.stage] = len(s.iters)
        elif isinstance(s, Split):
            split[s.stage] = s.factors[0]
        elif isinstance(s, Annotate) and s.kind is ForKind.PARALLEL:
            par[s.stage] = fuse.pop(s.stage, 1)
        elif isinstance(s, Annotate) and s.kind is ForKind.VECTORIZED:
            vec[s.stage] = split.pop(s.stage, 1)
        elif isinstance(s, Pragma):
            unroll[s.stage] = s.value
    ss = sketch.sites
    return Decisions(tuple(tiles), tuple(loc.get(s.stage, ()) if s.location else () for s in ss),
                     tuple(par.get(s.stage, 0) for s in ss), tuple(vec.get(s.stage, 0) for s in ss),
                     tuple(unroll.get(s.stage, 0) for s in ss),
                     tuple(int(s.pack is not None and s.pack.reader in packed) for s in ss))


__all__ = ["factor_schemes", "sample_tile", "Decisions", "Resample", "sample_schedules", "realize", "default_like",
           "decisions_of", "check_state", "as_random", "divisors", "NONDIVISIBLE"]
