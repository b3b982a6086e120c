"""Mutations and crossover of schedules of one sketch (evolutionary search operators).

Map:
  mutate_tile_size(sketch, schedule, rng)         move a factor between two levels of one tile hole
                                                  (Ansor's), sometimes a random non-divisible level
  mutate_unroll(sketch, schedule, rng)            another auto_unroll_max_step value on one stage
  mutate_compute_location(sketch, schedule, rng)  another compute location for one location site
  mutate_parallel(sketch, schedule, rng)          another number of fused outer loops made parallel
  mutate_pack(sketch, schedule, rng)              pack the B operand of a tiled stage, or stop packing it
  outward_moves(sketch, schedule)                 every schedule with one level's smallest prime factor moved
                                                  to its tile's outer loop, parallel loops fused anew (each
                                                  count): more, smaller parallel tasks or outer k blocks
  unroll_moves(sketch, schedule)                  every schedule with one stage's auto-unroll pragma set to
                                                  another value (the other decisions kept)
  ladder_moves(sketch, schedule, steps)           every schedule with one tile level's factor multiplied or
                                                  divided by 4 or 16 (a coarse walk over the tile sizes)
  with_level(decisions, hole, level, factor)      the decisions with one tile level's factor replaced
  crossover(sketch, a, b, rng)                    each tile hole and each annotation site from one parent
  MUTATIONS                                       (name, function, weight): tile size the most

Every operator reads the parents' decisions back from their steps (`annotate.decisions_of`), changes
some, and rebuilds the schedule with `annotate.realize` in repairing mode: decisions that no longer fit
(e.g. vector lanes that no longer divide a mutated tile) are drawn again.  Each returns a new valid
schedule (replays, passes `check_state`, differs from its parent(s)) or None when it found none in a few
tries (e.g. the sketch has no such decision).
"""

from __future__ import annotations

import random
from dataclasses import replace

from ..errors import ScheduleError
from .annotate import NONDIVISIBLE, Decisions, Resample, _log_uniform, as_random, decisions_of, divisors, realize
from .sketch import UNROLL_CHOICES, Sketch, TileHole
from .steps import Schedule

TRIES = 8


def _try(sketch: Sketch, d: Decisions, rng: random.Random, wk: str, parents: tuple[Schedule, ...]) -> Schedule | None:
    try:
        s = realize(sketch, d, rng, wk)
    except ScheduleError:
        return None
    if any(s.steps == p.steps for p in parents):
        return None
    return s


def _decode(sketch: Sketch, s: Schedule) -> Decisions | None:
    try:
        return decisions_of(sketch, s)
    except ScheduleError:
        return None


def _new_factors(hole: TileHole, f: tuple[int, ...], rng: random.Random) -> tuple[int, ...] | None:
    prod = 1
    for x in f:
        prod *= x
    if hole.extent % prod or rng.random() < NONDIVISIBLE:
        # re-draw one level log-uniformly (product kept within the extent)
        k = rng.randrange(hole.n)
        rest = prod // f[k]
        hi = max(1, hole.extent // rest)
        if k == hole.n - 1:
            hi = min(hi, hole.max_innermost)
        new = list(f)
        new[k] = _log_uniform(rng, hi)
        return tuple(new)
    lengths = [hole.extent // prod] + list(f)   # level 0: the outer loop (the rest of the extent)
    src = [k for k, x in enumerate(lengths) if x > 1]
    if not src:
        return None
    a = src[rng.randrange(len(src))]
    ds = [x for x in divisors(lengths[a]) if x > 1]
    d = ds[rng.randrange(len(ds))]
    b = rng.choice([k for k in range(len(lengths)) if k != a])
    lengths[a] //= d
    lengths[b] *= d
    if lengths[-1] > hole.max_innermost:
        return None
    return tuple(lengths[1:])


def mutate_tile_size(sketch: Sketch, schedule: Schedule, rng=None) -> Schedule | None:
    """Change the factors of one tile hole: divide one level by a divisor and multiply another by it
    (the outer loop included), or (sometimes) re-draw one level without divisibility."""
    rng = as_random(rng)
    d = _decode(sketch, schedule)
    holes = [k for k, h in enumerate(sketch.tiles) if h.extent > 1]
    if d is None or not holes:
        return None
    for _ in range(TRIES):
        k = holes[rng.randrange(len(holes))]
        f = _new_factors(sketch.tiles[k], d.tiles[k], rng)
        if f is None or f == d.tiles[k]:
            continue
        s = _try(sketch, replace(d, tiles=d.tiles[:k] + (f,) + d.tiles[k + 1:]), rng, schedule.workload_key,
                 (schedule,))
        if s is not None:
            return s
    return None


def _mutate_site(sketch: Sketch, schedule: Schedule, rng, kind: str, flag: str) -> Schedule | None:
    rng = as_random(rng)
    d = _decode(sketch, schedule)
    sites = [k for k, s in enumerate(sketch.sites) if getattr(s, flag)]
    if d is None or not sites:
        return None
    for _ in range(TRIES):
        k = sites[rng.randrange(len(sites))]
        vals = getattr(d, kind)
        new = replace(d, **{kind: vals[:k] + (Resample(vals[k]),) + vals[k + 1:]})
        s = _try(sketch, new, rng, schedule.workload_key, (schedule,))
        if s is not None:
            return s
    return None


def mutate_unroll(sketch: Sketch, schedule: Schedule, rng=None) -> Schedule | None:
    """Another auto_unroll_max_step value for one stage."""
    return _mutate_site(sketch, schedule, rng, "unroll", "unroll")


def mutate_compute_location(sketch: Sketch, schedule: Schedule, rng=None) -> Schedule | None:
    """Another compute location (root, inline, or a loop of its consumer) for one stage."""
    return _mutate_site(sketch, schedule, rng, "loc", "location")


def mutate_parallel(sketch: Sketch, schedule: Schedule, rng=None) -> Schedule | None:
    """Another parallel granularity: fuse more or fewer outer loops into the parallel loop."""
    return _mutate_site(sketch, schedule, rng, "par", "parallel")


def mutate_pack(sketch: Sketch, schedule: Schedule, rng=None) -> Schedule | None:
    """Pack a tiled stage's B operand or stop packing it."""
    return _mutate_site(sketch, schedule, rng, "pack", "pack")


def outward_moves(sketch: Sketch, schedule: Schedule, max_par: int = 3) -> list[Schedule]:
    """The schedules one outward move away: in one tile hole, one level's factor divided by its smallest prime,
    which multiplies the hole's outer loop (the rest of the extent), with each parallel fuse count 1..max_par
    at each parallel site (the other decisions kept; moves that do not replay are skipped).  Deterministic,
    in hole, level, count order.  Where the tiles leave the outer loops at extent 1 nothing can run in
    parallel; a move gives the threads work, or more of it in smaller pieces."""
    d = _decode(sketch, schedule)
    if d is None:
        return []
    psites = [k for k, site in enumerate(sketch.sites) if site.parallel]
    pars = [d.par] + [d.par[:k] + (j,) + d.par[k + 1:] for k in psites for j in range(1, max_par + 1)]

    def variants():
        for h, f in enumerate(d.tiles):
            for lv, x in enumerate(f):
                if x < 2:
                    continue
                p = divisors(x)[1]   # its smallest prime
                moved = with_level(d, h, lv, x // p)
                for par in pars:
                    yield replace(moved, par=par)

    return _replaying(sketch, schedule, variants())


def ladder_moves(sketch: Sketch, schedule: Schedule, steps: tuple[int, ...] = (4, 16)) -> list[Schedule]:
    """The schedules with one tile level's factor multiplied or divided by each of `steps` (divided only where it
    divides), the hole's outer loop taking up the rest and the other decisions kept (moves that do not replay are
    skipped).  Deterministic, the nearer moves first: for each step, each level divided, then each level
    multiplied (in hole, level order).  A coarse, model-free walk over a tile space: the packed-GEMM sketch's row
    and k blocks sit 8-64x away from where a model that never saw the workload ranks them (docs/benchmarks.md,
    search, sessions 37-38)."""
    d = _decode(sketch, schedule)
    if d is None:
        return []
    levels = [(h, lv, x) for h, f in enumerate(d.tiles) for lv, x in enumerate(f)]

    def variants():
        for m in steps:
            for down in (True, False):
                for h, lv, x in levels:
                    y = (x // m if x % m == 0 else 0) if down else x * m
                    if y >= 1:
                        yield with_level(d, h, lv, y)

    return _replaying(sketch, schedule, variants())


def with_level(d: Decisions, hole: int, level: int, factor: int) -> Decisions:
    """`d` with tile hole `hole`'s level `level` set to `factor` (the other decisions kept; not checked)."""
    f = d.tiles[hole]
    return replace(d, tiles=d.tiles[:hole] + (f[:level] + (factor,) + f[level + 1:],) + d.tiles[hole + 1:])


def unroll_moves(sketch: Sketch, schedule: Schedule) -> list[Schedule]:
    """The schedules with one unroll site's auto_unroll_max_step set to each other value of UNROLL_CHOICES (the
    other decisions kept; values that do not replay are skipped).  Deterministic, in site and value order.
    On small kernels the pragma alone moves the time by 5-15 % (conv3x3_test: 512 against 16 or 64), and the
    search's random mutations reach one value of one site of one schedule late (docs/benchmarks.md, search,
    session 36)."""
    d = _decode(sketch, schedule)
    if d is None:
        return []
    return _replaying(sketch, schedule, (
        replace(d, unroll=d.unroll[:k] + (u,) + d.unroll[k + 1:])
        for k, site in enumerate(sketch.sites) if site.unroll and k < len(d.unroll)
        for u in UNROLL_CHOICES if u != d.unroll[k]))


def _replaying(sketch: Sketch, schedule: Schedule, variants) -> list[Schedule]:
    """The schedules of `variants` (Decisions, each legal as it is) that replay, in order, without repeats or
    `schedule` itself."""
    out: list[Schedule] = []
    seen = {schedule.key}
    for v in variants:
        try:
            s = realize(sketch, v, None, schedule.workload_key)
        except ScheduleError:
            continue
        if s.key not in seen:
            seen.add(s.key)
            out.append(s)
    return out


def crossover(sketch: Sketch, a: Schedule, b: Schedule, rng=None) -> Schedule | None:
    """A child of two schedules of `sketch`: each tile hole and each annotation site (location, parallel,
    vectorize, unroll together) from one parent at random.  None when the parents are of other sketches
    or no child differing from both was found."""
    rng = as_random(rng)
    da, db = _decode(sketch, a), _decode(sketch, b)
    if da is None or db is None or a.steps == b.steps:
        return None
    n_t, n_s = len(sketch.tiles), len(sketch.sites)
    for _ in range(TRIES):
        pt = [rng.random() < 0.5 for _ in range(n_t)]
        ps = [rng.random() < 0.5 for _ in range(n_s)]
        if (all(pt) and all(ps)) or not (any(pt) or any(ps)):
            continue

        def mix(x, y, pick):
            return tuple(u if p else v for u, v, p in zip(x, y, pick))

        child = Decisions(mix(da.tiles, db.tiles, pt), mix(da.loc, db.loc, ps), mix(da.par, db.par, ps),
                          mix(da.vec, db.vec, ps), mix(da.unroll, db.unroll, ps), mix(da.pack, db.pack, ps))
        s = _try(sketch, child, rng, a.workload_key, (a, b))
        if s is not None:
            return s
    return None


#: the mutation operators with Ansor-like weights (tile size the most)
MUTATIONS = (
    ("tile_size", mutate_tile_size, 0.7),
    ("unroll", mutate_unroll, 0.1),
    ("compute_location", mutate_compute_location, 0.1),
    ("parallel", mutate_parallel, 0.1),
    ("pack", mutate_pack, 0.05),
)


def mutate(sketch: Sketch, schedule: Schedule, rng=None) -> Schedule | None:
    """One mutation chosen by MUTATIONS' weights (falls back to the others when it finds nothing)."""
    rng = as_random(rng)
    ops = list(MUTATIONS)
    while ops:
        op = rng.choices(ops, [w for _, _, w in ops])[0]
        s = op[1](sketch, schedule, rng)
        if s is not None:
            return s
        ops.remove(op)
    return None


__all__ = ["mutate_tile_size", "mutate_unroll", "mutate_compute_location", "mutate_parallel", "mutate_pack",
           "outward_moves", "unroll_moves", "ladder_moves", "with_level", "crossover",
           "mutate", "MUTATIONS"]
