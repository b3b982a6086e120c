"""Random search over the same sketches and annotations: the baseline `--policy random`.

Map:
  RandomSearch(space)   .propose(n, measured, rng): n distinct unmeasured schedules drawn evenly from the
                        sketches (`space.sample_random`); .observe(...) ignores results
"""

from __future__ import annotations

import random

from ..schedule_space.steps import Schedule
from .space import TaskSpace, sample_random


class RandomSearch:
    """Uniform random sampling of the search space (no cost model)."""

    name = "random"

    def __init__(self, space: TaskSpace):
        self.space = space

    def propose(self, n: int, measured: set[str], rng: random.Random) -> list[Schedule]:
        return sample_random(self.space, rng, n, exclude=measured)

    def observe(self, schedules: list[Schedule], costs: list[float]) -> None:
        return None


__all__ = ["RandomSearch"]
