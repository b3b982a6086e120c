"""Evolutionary search (Ansor's), guided by the cost model: the default policy of `hlotune tune`.

Map:
  EvolutionarySearch(space, model, population, generations, eps_greedy, ...)   one task's search
    .propose(n, measured, rng) -> list[Schedule]      one round: evolve, then pick a batch to measure
    .observe(schedules, costs)                        measured results: the best seed the next population
  score(space, model, schedules, cache) -> ndarray    predicted scores (higher = faster), features cached

One round (`propose`):
  1. initial population: the best measured schedules (up to `measured_ratio` of it), the task's default-like
     seeds (`TaskSpace.seeds`: the default's GEMM blocking as a point of a sketch with holes) plus random
     schedules drawn evenly from the sketches, `population` in all;
  2. `generations` times: score the population with the cost model, choose parents in proportion to their
     score, and make each child by crossover of two parents of the same sketch (`crossover_prob`), by one
     mutation (tile size most often, then unroll, compute location, parallel granularity:
     `schedule_space.mutate.MUTATIONS`; `mutation_prob`) or as a copy;
  3. every scored schedule not yet measured competes for the batch: the best `n - n_random` by predicted
     score, plus `n_random = round(eps_greedy * n)` random schedules of step 1 (epsilon-greedy); a seed not
     yet measured goes first (so the first round measures the default-like points).
While the cost model is untrained (or random) step 2 is skipped: evolving on random scores finds nothing.
No schedule whose structural hash is in `measured` (or already picked) is proposed, so nothing is measured
twice.  Features are cached per schedule key (they do not depend on the model), so survivors of a generation
and of earlier rounds are not featurized again; while the model is untrained (random scores) no features are
computed at all.  Everything random comes from the `rng` argument: the same rng state, measured set and model
give the same batch.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict

import numpy as np

from ..schedule_space.steps import Schedule
from .space import TaskSpace, crossover, mutate, sample_random  # per sketch kind (CPU / GPU)

#: features of this many schedules are kept per task
FEATURE_CACHE = 20000
#: measured schedules kept as seeds per task
KEEP_BEST = 256


class FeatureCache:
    """schedule key -> features (an LRU of bounded size)."""

    def __init__(self, size: int = FEATURE_CACHE):
        self.size = size
        self.data: OrderedDict[str, np.ndarray | None] = OrderedDict()

    def get_many(self, space: TaskSpace, schedules: list[Schedule]) -> list[np.ndarray | None]:
        from ..cost_model.fast_features import batch_features

        missing = [s for s in schedules if s.key not in self.data]
        if missing:
            uniq = list({s.key: s for s in missing}.values())
            for s, f in zip(uniq, batch_features(space.task.compute, uniq, space.task.key)):
                self.data[s.key] = f
            while len(self.data) > self.size:
                self.data.popitem(last=False)
        out = []
        for s in schedules:
            self.data.move_to_end(s.key)
            out.append(self.data[s.key])
        return out


def score(space: TaskSpace, model, schedules: list[Schedule], cache: FeatureCache | None = None) -> np.ndarray:
    """Predicted scores of `schedules` (higher = faster; -inf: does not lower)."""
    if not schedules:
        return np.zeros(0)
    if cache is not None and getattr(model, "trained", False) and hasattr(model, "predict_features"):
        return np.asarray(model.predict_features(cache.get_many(space, schedules)), dtype=float)
    return np.asarray(model.predict(space.task, schedules), dtype=float)


def _weights(scores: np.ndarray) -> list[float]:
    """Selection weights in proportion to the score, shifted so that the worst finite score gets a little."""
    s = np.where(np.isfinite(scores), scores, np.nan)
    if np.all(np.isnan(s)):
        return [1.0] * len(scores)
    lo, hi = np.nanmin(s), np.nanmax(s)
    span = hi - lo if hi > lo else 1.0
    w = np.nan_to_num((s - lo) / span + 0.01, nan=0.0)
    return w.tolist()


def _informative(model) -> bool:
    """Whether the model's scores mean anything: an XGBoost model before its first training (or the random
    model) scores at random, and evolving a population on random scores costs seconds per round for nothing,
    so such rounds measure the seeds and random samples instead."""
    from ..cost_model.model import RandomModel

    if isinstance(model, RandomModel):
        return False
    return getattr(model, "trained", True) or not hasattr(model, "predict_features")


class EvolutionarySearch:
    """Cost-model-guided evolutionary search over the sketches of one task."""

    name = "evolutionary"

    def __init__(self, space: TaskSpace, model, population: int = 2048, generations: int = 4,
                 eps_greedy: float = 0.05, mutation_prob: float = 0.85, crossover_prob: float = 0.1,
                 measured_ratio: float = 0.2):
        self.space = space
        self.model = model
        self.population = max(2, int(population))
        self.generations = max(0, int(generations))
        self.eps_greedy = eps_greedy
        self.mutation_prob = mutation_prob
        self.crossover_prob = crossover_prob
        self.measured_ratio = measured_ratio
        self.cache = FeatureCache()
        self.best: list[tuple[float, str, Schedule]] = []   # measured valid, fastest first
        self.stats: dict[str, float] = {}

    # ------------------------------------------------------------------ measured results
    def observe(self, schedules: list[Schedule], costs: list[float]) -> None:
        keys = {k for _, k, _ in self.best}
        for s, c in zip(schedules, costs):
            if np.isfinite(c) and s.key not in keys and s.sketch in self.space.by_id:
                self.best.append((float(c), s.key, s))
                keys.add(s.key)
        self.best.sort(key=lambda t: (t[0], t[1]))
        del self.best[KEEP_BEST:]

    # ------------------------------------------------------------------ one round
    def _initial(self, rng: random.Random) -> tuple[list[Schedule], list[Schedule]]:
        seeds = [s for _, _, s in self.best[: int(self.population * self.measured_ratio)]]
        keys = {s.key for s in seeds}
        seeds += [s for s in self.space.seeds if s.key not in keys]
        rand = sample_random(self.space, rng, self.population - len(seeds), exclude={s.key for s in seeds})
        return seeds + rand, rand

    def _children(self, pop: list[Schedule], scores: np.ndarray, rng: random.Random) -> list[Schedule]:
        w = _weights(scores)
        groups: dict[str, tuple[list[int], list[float]]] = {}
        for i, s in enumerate(pop):
            g = groups.setdefault(s.sketch, ([], []))
            g[0].append(i)
            g[1].append(w[i])
        parents = rng.choices(range(len(pop)), weights=w, k=self.population)
        out: list[Schedule] = []
        seen: set[str] = set()
        by_id = self.space.by_id
        for i in parents:
            p = pop[i]
            sk = by_id.get(p.sketch)
            child = None
            if sk is not None and sk.has_holes:
                r = rng.random()
                if r < self.crossover_prob:
                    idx, ws = groups[p.sketch]
                    if len(idx) > 1:
                        mate = pop[rng.choices(idx, weights=ws, k=1)[0]]
                        child = crossover(sk, p, mate, rng) if mate.key != p.key else None
                elif r < self.crossover_prob + self.mutation_prob:
                    child = mutate(sk, p, rng)
            c = child or p
            if c.key not in seen:
                seen.add(c.key)
                out.append(c)
        return out

    def propose(self, n: int, measured: set[str], rng: random.Random) -> list[Schedule]:
        """Up to `n` schedules to measure next (see the module docstring)."""
        import time

        t0 = time.perf_counter()
        pop, rand = self._initial(rng)
        t_init = time.perf_counter() - t0
        cands: dict[str, tuple[float, Schedule]] = {}
        t_score = 0.0
        gens = self.generations if _informative(self.model) else 0
        for g in range(gens + 1):
            t1 = time.perf_counter()
            sc = score(self.space, self.model, pop, self.cache)
            t_score += time.perf_counter() - t1
            for s, v in zip(pop, sc):
                if s.key not in measured and np.isfinite(v):
                    cands[s.key] = (float(v), s)
            if g == gens or not pop:
                break
            pop = self._children(pop, sc, rng)
        # the default-like seeds are measured first (once): mutation of measured schedules starts from them
        out = [s for s in self.space.seeds if s.key not in measured][:n]
        picked = {s.key for s in out}
        n_rand = min(n - len(out), int(round(self.eps_greedy * n)))
        top = heapq.nsmallest(n - n_rand - len(out), [kv for kv in cands.items() if kv[0] not in picked],
                              key=lambda kv: (-kv[1][0], kv[0]))
        out += [s for _, (_, s) in top]
        picked |= {s.key for _, (_, s) in top}
        pool = [s for s in rand if s.key not in measured and s.key not in picked]
        for s in rng.sample(pool, min(len(pool), n - len(out))):
            out.append(s)
            picked.add(s.key)
        if len(out) < n:   # the space is small: whatever unmeasured candidates are left
            for k, (_, s) in sorted(cands.items(), key=lambda kv: (-kv[1][0], kv[0])):
                if len(out) >= n:
                    break
                if k not in picked:
                    out.append(s)
                    picked.add(k)
        self.stats = {"init_s": t_init, "score_s": t_score, "total_s": time.perf_counter() - t0,
                      "candidates": len(cands)}
        return out


__all__ = ["EvolutionarySearch", "FeatureCache", "score"]
