"""Random variants of a schedule that differ only in split factors (a stand-in for the sketch sampler).

Map:
  random_factorization(extent, parts, rng, max_inner)   a random tuple of divisors (innermost capped)
  factor_variants(cd, steps, rng, n, ...)               `n` distinct schedules: `steps` with every Split's
                                                        factors redrawn (legal: each replays)
  split_factor_vector(steps)                            the concatenated Split factors of a schedule (the
                                                        numbers the fast feature path instantiates)

Used by the benchmarks, the tests and the data script until `schedule_space.sketch` / `annotate`
provide the real sampler; schedules made here are of the same kind (one structure, many tile sizes).
"""

from __future__ import annotations

import numpy as np

from ..errors import ScheduleError
from ..ir.expr import ComputeDef
from ..schedule_space.state import apply, init_state
from ..schedule_space.steps import Split, Step


def _divisors(n: int) -> list[int]:
    out = []
    d = 1
    while d * d <= n:
        if n % d == 0:
            out.append(d)
            if d * d != n:
                out.append(n // d)
        d += 1
    return sorted(out)


def random_factorization(extent: int, parts: int, rng: np.random.Generator, max_inner: int = 64) -> tuple[int, ...]:
    """`parts` factors (outer to inner) whose product divides `extent`; the innermost is at most `max_inner`."""
    rest = extent
    out: list[int] = []
    for k in range(parts):
        divs = _divisors(rest)
        if k == 0:
            divs = [d for d in divs if d <= max_inner] or [1]
        f = int(divs[int(rng.integers(len(divs)))])
        out.append(f)
        rest //= f
    return tuple(reversed(out))


def factor_variants(cd: ComputeDef, steps, rng: np.random.Generator, n: int, max_inner: int = 64,
                    max_tries: int = 20) -> list[tuple[Step, ...]]:
    """Up to `n` distinct step lists equal to `steps` except for redrawn Split factors."""
    steps = tuple(getattr(steps, "steps", steps))
    seen: set[tuple] = set()
    out: list[tuple[Step, ...]] = []
    for _ in range(n * max_tries):
        if len(out) >= n:
            break
        try:
            new = _redraw(cd, steps, rng, max_inner)
        except ScheduleError:
            continue
        key = tuple(map(repr, new))
        if key not in seen:
            seen.add(key)
            out.append(new)
    return out


def _redraw(cd: ComputeDef, steps: tuple[Step, ...], rng: np.random.Generator, max_inner: int) -> tuple[Step, ...]:
    st = init_state(cd)
    new: list[Step] = []
    for s in steps:
        if isinstance(s, Split) and all(f is not None for f in s.factors):
            ext = st.stage(s.stage).iters[st.stage(s.stage).iter_pos(s.iter)].extent
            s = Split(s.stage, s.iter, random_factorization(ext, len(s.factors), rng, max_inner), s.inner_to_outer)
        st = apply(st, s)
        new.append(s)
    return tuple(new)


def split_factor_vector(steps) -> tuple[int, ...]:
    """The factors of every Split step, in step order (the tile sizes of a schedule)."""
    out: list[int] = []
    for s in getattr(steps, "steps", steps):
        if isinstance(s, Split):
            out.extend(int(f) for f in s.factors)
    return tuple(out)
