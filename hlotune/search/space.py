"""The search space of one task, as every search policy sees it, and the policy interface.

Map:
  TaskSpace(task, with_default=True)
                             sketches (the default one included), sketch by id, the default schedule (trial 0),
                             default-like seeds of the sketches with holes (where the evolutionary search starts),
                             a tag for "similar subgraphs" (the task scheduler groups tasks by it); without the
                             default: no default sketch, schedule or seeds (the search alone, from scratch)
  sample_random(space, rng, n, exclude)   up to n distinct random schedules spread evenly over the sketches
  SearchPolicy               what the tuner asks of a policy: propose(n, measured, rng), observe(schedules, costs)
  SKETCH_RULES               target kind -> sketch generation (CPU sketches, GPU sketches)
  sample_sketch / mutate / crossover   per sketch kind (a GPU sketch samples and mutates its own knobs)
  derive_rng(seed, *parts)   a random.Random seeded from the run seed and where the run is (reproducible rounds)
  DEFAULT_SKETCH             the id of the default schedule's sketch

The default schedule is the default sketch's only schedule (`Schedule(key, default steps, DEFAULT_SKETCH)`),
so the trial-0 measurement and a random draw of the default sketch have the same structural hash and the
default is never measured twice.
"""

from __future__ import annotations

import random
from functools import cached_property
from typing import Protocol

import numpy as np

from ..schedule_space.annotate import default_like, sample_schedules
from ..schedule_space.mutate import crossover as _crossover_cpu
from ..schedule_space.mutate import mutate as _mutate_cpu
from ..schedule_space.sketch import Sketch, _sketch_id, generate_sketches
from ..schedule_space.sketch_gpu import GpuSketch, generate_gpu_sketches
from ..schedule_space.steps import Schedule
from ..schedule_space.task import Task

DEFAULT_SKETCH = _sketch_id(("default",))

#: target kind -> sketch generation (task, target) -> list[Sketch]
SKETCH_RULES = {"cpu": generate_sketches, "cuda": generate_gpu_sketches}


def sample_sketch(sk: Sketch, task, rng, n: int) -> list[Schedule]:
    """Up to n random schedules of one sketch (a GPU sketch samples its own knobs)."""
    if isinstance(sk, GpuSketch):
        return sk.sample(task, rng, n)
    return sample_schedules(sk, task, rng, n)


def mutate(sk: Sketch, schedule: Schedule, rng=None) -> Schedule | None:
    """One mutation of `schedule` (`schedule_space.mutate.mutate`, or the GPU sketch's own)."""
    return sk.mutate(schedule, rng) if isinstance(sk, GpuSketch) else _mutate_cpu(sk, schedule, rng)


def crossover(sk: Sketch, a: Schedule, b: Schedule, rng=None) -> Schedule | None:
    """A child of two schedules of `sk` (`schedule_space.mutate.crossover`, or the GPU sketch's own)."""
    return sk.crossover(a, b, rng) if isinstance(sk, GpuSketch) else _crossover_cpu(sk, a, b, rng)


def derive_rng(seed: int, *parts: int | str) -> random.Random:
    """A random.Random from the run seed and integers / strings naming the place in the run."""
    ints = [int(seed) & 0xFFFFFFFF]
    for p in parts:
        if isinstance(p, str):
            ints.extend(p.encode()[:32])
        else:
            ints.append(int(p) & 0xFFFFFFFF)
    return random.Random(int(np.random.SeedSequence(ints).generate_state(2, dtype=np.uint64)[0]))


class TaskSpace:
    """The sketches of one task and what the search needs to know about them."""

    def __init__(self, task: Task, with_default: bool = True):
        self.task = task
        self.with_default = with_default
        self.sketches: list[Sketch] = SKETCH_RULES[task.target.kind](task, task.target)
        if not with_default:   # the search alone: nothing of the hand-written default schedule
            self.sketches = [s for s in self.sketches if s.id != DEFAULT_SKETCH]
        self.by_id: dict[str, Sketch] = {s.id: s for s in self.sketches}
        self.holed: list[Sketch] = [s for s in self.sketches if s.has_holes]

    @cached_property
    def default(self) -> Schedule | None:
        """The default schedule (the default sketch's schedule), None when it does not replay."""
        sk = self.by_id.get(DEFAULT_SKETCH)
        if sk is None:
            return None
        got = sample_schedules(sk, self.task, 0, 1)
        return got[0] if got else None

    @cached_property
    def seeds(self) -> list[Schedule]:
        """Schedules of the sketches with holes that match the default's GEMM blocking (`annotate.default_like`):
        the evolutionary search keeps them in its population and measures them early, so mutation starts from
        the default's quality (tile sizes, k-blocking and packing are holes there, fixed in the default)."""
        out: list[Schedule] = []
        for sk in self.holed if self.with_default else ():
            s = sk.default_like() if isinstance(sk, GpuSketch) else default_like(sk)
            if s is not None:
                out.append(Schedule(self.task.key, s.steps, s.sketch))
        return out

    @cached_property
    def tag(self) -> str:
        """Tasks of the same tag are "similar" (same sketch rules up to stage names): the scheduler compares
        their throughput."""
        rules = sorted({r.split(":", 1)[-1] for sk in self.sketches for r in sk.rules})
        return "|".join(rules)

    def sketch_of(self, schedule: Schedule) -> Sketch | None:
        return self.by_id.get(schedule.sketch)


def sample_random(space: TaskSpace, rng: random.Random, n: int, exclude: set[str] | frozenset = frozenset(),
                  tries: int = 3) -> list[Schedule]:
    """Up to `n` distinct random schedules not in `exclude`, drawn evenly from the sketches with holes
    (the default sketch's one schedule included when it is not excluded)."""
    out: list[Schedule] = []
    seen: set[str] = set(exclude)
    d = space.default
    if d is not None and d.key not in seen and n > 0 and (not space.holed or rng.random() < 1.0 / (1 + n)):
        out.append(d)
        seen.add(d.key)
    sketches = space.holed
    for _ in range(tries):
        if len(out) >= n or not sketches:
            break
        need = n - len(out)
        per = -(-need // len(sketches))
        got: list[Schedule] = []
        for sk in sketches:
            got += sample_sketch(sk, space.task, rng, per)
        rng.shuffle(got)
        for s in got:
            if s.key not in seen:
                seen.add(s.key)
                out.append(s)
                if len(out) >= n:
                    break
    return out


class SearchPolicy(Protocol):
    """A per-task search policy (evolutionary, random, optuna)."""

    name: str

    def propose(self, n: int, measured: set[str], rng: random.Random) -> list[Schedule]:
        """Up to `n` new schedules, none of whose keys is in `measured`."""

    def observe(self, schedules: list[Schedule], costs: list[float]) -> None:
        """Measured results (seconds; +inf for a failed candidate)."""


__all__ = ["TaskSpace", "sample_random", "SearchPolicy", "derive_rng", "DEFAULT_SKETCH", "SKETCH_RULES",
           "sample_sketch", "mutate", "crossover"]
