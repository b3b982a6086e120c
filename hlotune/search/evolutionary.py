"""Evolutionary search (Ansor's), guided by the cost model: the default policy of `hlotune tune`.

Map:
  EvolutionarySearch(space, model, population, generations, eps_greedy, ...)   one task's search
    .propose(n, measured, rng) -> list[Schedule]      one round: evolve, then pick a batch to measure
    .observe(schedules, costs)                        measured results: the best seed the next population
    .rerank(n, measured, rng) -> list[Schedule]       more of the last round's candidates, ranked by the model as
                                                      it is now (the tuner's first round, measured in parts)
    .sketch_bests_first(cands) -> list[Schedule]      the same batch with each sketch's and each annotation
                                                      structure's best candidate up front (the first part of a
                                                      fresh task's first round)
    .twins(measured, rng, room) -> list[Schedule]     the fastest measured schedules (of sketches with holes)
                                                      with their packing toggled, the model's best outward
                                                      moves of the fastest, its unroll pragma's other values and
                                                      its tile ladder (all of it for a sketch with one level
                                                      per tile hole, else the model's best) (tried first in the
                                                      first round's later parts)
  ragged(sketch, schedule) -> bool                    a tile hole's factors do not divide its extent
  structure(schedule) -> tuple                        sketch, stages with parallel / vectorized loops, packed buffers
  score(space, model, schedules, cache) -> ndarray    predicted scores (higher = faster), features cached
  fanout(fn, jobs, workers, finish=)                  a round's sampling / children chunks (CHUNKS, each its own
                                                      random stream) run in processes forked from this one; each
                                                      process featurizes its chunks' schedules in one batch;
                                                      a worker that fails or hangs (FANOUT_GRACE) is redone here

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

import gc
import heapq
import math
import os
import pickle
import random
import select
import signal
import time
import warnings
from collections import OrderedDict

import numpy as np

from .. import config
from ..schedule_space.loop_ir import ForKind
from ..schedule_space.mutate import _decode, ladder_moves, mutate_pack, outward_moves, unroll_moves
from ..schedule_space.steps import Annotate, Pack, Schedule
from .space import TaskSpace, crossover, mutate, sample_random  # per sketch kind (CPU / GPU)

#: features of this many schedules are kept per task
FEATURE_CACHE = 20000
#: measured schedules kept as seeds per task
KEEP_BEST = 256
#: `twins`: the packing of this many of the fastest measured schedules is toggled (tries per schedule: TWIN_TRIES)
TWIN_BESTS = 2
TWIN_TRIES = 4
#: `twins`: this many of the fastest measured schedule's `outward_moves` (parallel granularity), the model's best
TWIN_MOVES = 2
#: `twins`: this many of the fastest measured schedule's `unroll_moves` (its unroll pragma set to each other value;
#: all of them when one site has them, else the model's best)
TWIN_UNROLL = 3
#: `twins`: all of the fastest measured schedule's `ladder_moves` (one tile level x / 4 or 16) when every tile hole of
#: its sketch has at most this many levels (a tiny tile space: the packed-GEMM `gemm_panel`'s row and k blocks), else
#: the model's TWIN_LADDER_BEST best of them (0: none; 4 since session 39: held out, dense_relu, conv3x3_test and
#: mlp_grad_dot_9 reached 90 % within 15 % in 15 of 18 runs against 10 of 18 with none)
TWIN_LADDER_LEVELS = 1
TWIN_LADDER_BEST = 4
#: `twins`: the unroll moves come only where they fit whole in this share of the part they start, and the ladder
#: moves stop where the twins fill it: twins that fill a part leave the model's own picks out of it (session 29; a
#: ladder filling whole parts cost the normal mode's shipped model its good picks: docs/benchmarks.md, session 38)
TWIN_SHARE = 0.5
#: a round's sampling and each generation's children are cut into this many chunks, each with its own random
#: stream, so that the candidates do not depend on how many processes make them
CHUNKS = 4
#: a forked `fanout` worker still running this many seconds plus this many times the parent's own share after
#: the parent finished it is taken to hang (it forked while another thread of the process, e.g. a second target's
#: tuning thread of `distributed.tune_targets`, held a lock it needs): it is killed and its share redone here
FANOUT_GRACE = (20.0, 4.0)


def search_workers() -> int:
    """Processes for one round (config `search_workers`; 0: one per core, at most CHUNKS)."""
    n = int(config.get("search_workers"))
    return max(1, n if n > 0 else min(CHUNKS, os.cpu_count() or 1))


def fanout(fn, jobs: list[tuple], workers: int, *common, finish=None) -> list:
    """[fn(*job, *common) for job in jobs], the jobs shared round-robin between this process and `workers - 1`
    processes forked from it (each sees this process' state: the task's sketches and caches, so nothing but
    the jobs' results is sent, pickled, through a pipe).  `finish` (optional) maps one process' list of results
    to the list it returns, in that process (work pooled over its share: the features of all its schedules in
    one batch).  A worker that fails, or is not done `FANOUT_GRACE` after this process' own share (a fork of a
    process with threads can deadlock on a lock another thread held), has its jobs done here."""
    def run(share: list[int]) -> list[tuple]:
        res = [fn(*jobs[k], *common) for k in share]
        return list(zip(share, finish(res) if finish is not None and res else res))

    workers = min(workers, len(jobs))
    if workers <= 1 or not hasattr(os, "fork"):
        return [v for _, v in run(list(range(len(jobs))))]
    shares = [list(range(k, len(jobs), workers)) for k in range(workers)]
    kids = []
    for share in shares[1:]:
        r, w = os.pipe()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)   # fork with threads: see FANOUT_GRACE
                pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            shares[0] += share
            continue
        if pid == 0:   # the worker: compute, send, leave without running the parent's exit handlers
            code = 1
            try:
                os.close(r)
                data = pickle.dumps(run(share), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(w, "wb") as fh:
                    fh.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        kids.append((pid, r, share))
    out: list = [None] * len(jobs)
    t0 = time.monotonic()
    for k, v in run(shares[0]):
        out[k] = v
    deadline = time.monotonic() + FANOUT_GRACE[0] + FANOUT_GRACE[1] * (time.monotonic() - t0)
    for pid, r, share in kids:
        got = _collect(pid, r, deadline)
        for k, v in got if got is not None else run(share):
            out[k] = v
    return out


def _collect(pid: int, r: int, deadline: float) -> list | None:
    """A forked worker's results from its pipe `r`, or None (it failed, or is killed: nothing to read by
    `deadline`).  Output waiting in the pipe is read even past the deadline (the parent may have spent it redoing
    another worker's share), and each read extends it by FANOUT_GRACE[0]: only a silent worker is killed."""
    chunks: list[bytes] = []
    try:
        while True:
            if not select.select([r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                config.debug(2, "search worker %d not done in time (a deadlock after fork?): its share redone here",
                             pid)
                return None
            data = os.read(r, 1 << 20)
            if not data:
                break
            chunks.append(data)
            deadline = max(deadline, time.monotonic() + FANOUT_GRACE[0])
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    try:
        return pickle.loads(b"".join(chunks)) if status == 0 and chunks else None
    except Exception:  # noqa: BLE001 - a truncated result: redo the share here
        return None


def ragged(sketch, schedule: Schedule) -> bool:
    """Whether some tile hole of `sketch` (None: none) has factors in `schedule` whose product does not divide the
    hole's extent (a guarded tail); False for a schedule that does not follow the sketch (`_decode`: a database
    record of another version) and for GPU sketches (no tile holes)."""
    d = _decode(sketch, schedule) if sketch is not None and sketch.tiles else None
    return d is not None and any(h.extent % math.prod(f) for h, f in zip(sketch.tiles, d.tiles))


def structure(s: Schedule) -> tuple:
    """A schedule's annotation structure: its sketch, the stages (packed copies aside) with a parallel or a
    vectorized loop, and the packed buffers; tile sizes, unrolling and compute locations aside."""
    loops = sorted({(st.stage, st.kind.value) for st in s.steps if isinstance(st, Annotate)
                    and st.kind in (ForKind.PARALLEL, ForKind.VECTORIZED) and not st.stage.endswith(".pack")})
    return s.sketch, tuple(loops), tuple(sorted(st.stage for st in s.steps if isinstance(st, Pack)))


class FeatureCache:
    """schedule key -> features (an LRU of bounded size)."""

    def __init__(self, size: int = FEATURE_CACHE):
        self.size = size
        self.data: OrderedDict[str, np.ndarray | None] = OrderedDict()

    def put(self, key: str, features: np.ndarray | None) -> None:
        self.data[key] = features

    def get_many(self, space: TaskSpace, schedules: list[Schedule]) -> list[np.ndarray | None]:
        from ..cost_model.fast_features import batch_features

        missing = [s for s in schedules if s.key not in self.data]
        if missing:
            uniq = list({s.key: s for s in missing}.values())
            for s, f in zip(uniq, batch_features(space.task.compute, uniq, space.task.key)):
                self.data[s.key] = f
        out = []
        for s in schedules:
            self.data.move_to_end(s.key)
            out.append(self.data[s.key])
        while len(self.data) > self.size:   # evicted only now: a request larger than the cache still gets all
            self.data.popitem(last=False)
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
                 measured_ratio: float = 0.2, workers: int | None = None):
        self.space = space
        self.model = model
        self.population = max(2, int(population))
        self.generations = max(0, int(generations))
        self.eps_greedy = eps_greedy
        self.mutation_prob = mutation_prob
        self.crossover_prob = crossover_prob
        self.measured_ratio = measured_ratio
        self.cache = FeatureCache()
        self.workers = search_workers() if workers is None else max(1, int(workers))
        self.best: list[tuple[float, str, Schedule]] = []   # measured valid, fastest first
        self.stats: dict[str, float] = {}
        self.pool: list[Schedule] = []          # the last round's scored candidates (for `rerank`)
        self.pool_random: list[Schedule] = []   # and its random samples
        self.pool_score: dict[str, float] = {}  # the pool's predicted scores, by key

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
    def _initial(self, rng: random.Random, featurize: bool = False) -> tuple[list[Schedule], list[Schedule]]:
        seeds = [s for _, _, s in self.best[: int(self.population * self.measured_ratio)]]
        keys = {s.key for s in seeds}
        seeds += [s for s in self.space.seeds if s.key not in keys]
        n = self.population - len(seeds)
        exclude = frozenset(s.key for s in seeds)
        jobs = [(n * k // CHUNKS, n * (k + 1) // CHUNKS, rng.getrandbits(64)) for k in range(CHUNKS)]
        rand = self._merge(fanout(self._sample_chunk, jobs, self.workers, exclude,
                                  finish=self._pooled_features if featurize else None), exclude)
        return seeds + rand, rand

    def _sample_chunk(self, lo: int, hi: int, seed: int, exclude: frozenset):
        return sample_random(self.space, random.Random(seed), hi - lo, exclude=exclude), None

    def _children(self, pop: list[Schedule], scores: np.ndarray, rng: random.Random) -> list[Schedule]:
        w = _weights(scores)
        parents = rng.choices(range(len(pop)), weights=w, k=self.population)
        m = len(parents)
        jobs = [(m * k // CHUNKS, m * (k + 1) // CHUNKS, rng.getrandbits(64)) for k in range(CHUNKS)]
        return self._merge(fanout(self._children_chunk, jobs, self.workers, pop, w, parents,
                                  finish=self._pooled_features), set())

    def _children_chunk(self, lo: int, hi: int, seed: int, pop: list[Schedule], w: list[float],
                        parents: list[int]):
        """Children of parents[lo:hi] (one random stream per chunk: the result does not depend on where the
        chunk runs); their features come from `_pooled_features`, once per process."""
        rng = random.Random(seed)
        groups: dict[str, tuple[list[int], list[float]]] = {}
        for i, s in enumerate(pop):
            g = groups.setdefault(s.sketch, ([], []))
            g[0].append(i)
            g[1].append(w[i])
        out: list[Schedule] = []
        by_id = self.space.by_id
        for i in parents[lo:hi]:
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
            out.append(child or p)
        return out, None

    def _pooled_features(self, results: list[tuple]) -> list[tuple]:
        """`fanout`'s finish for one process' chunks (schedules, None): the features of all their schedules not in
        the cache, in one batch (schedules of one structure across chunks share the template's work), given with the
        first chunk."""
        feats = self._features_of([s for scheds, _ in results for s in scheds])
        return [(scheds, feats if i == 0 else None) for i, (scheds, _) in enumerate(results)]

    def _features_of(self, schedules: list[Schedule]) -> dict[str, np.ndarray | None]:
        """Features of those of `schedules` the cache does not hold (computed where the chunk runs)."""
        from ..cost_model.fast_features import batch_features

        new = list({s.key: s for s in schedules if s.key not in self.cache.data}.values())
        if not new:
            return {}
        return {s.key: f for s, f in zip(new, batch_features(self.space.task.compute, new, self.space.task.key))}

    def _merge(self, parts, exclude) -> list[Schedule]:
        """The chunks' schedules in order without repeats; their features go into the cache."""
        out: list[Schedule] = []
        seen = set(exclude)
        for scheds, feats in parts:
            for k, f in (feats or {}).items():
                self.cache.put(k, f)
            for s in scheds:
                if s.key not in seen:
                    seen.add(s.key)
                    out.append(s)
        return out

    def propose(self, n: int, measured: set[str], rng: random.Random) -> list[Schedule]:
        """Up to `n` schedules to measure next (see the module docstring).  The garbage collector is paused
        meanwhile (and in the forked workers, which inherit that): a round makes millions of short-lived
        objects, so collections ran every few thousand of them, each full one walking the long-lived caches
        (replayed states, features); the round's few cycles are collected afterwards, at once."""
        was = gc.isenabled()
        gc.disable()
        try:
            return self._propose(n, measured, rng)
        finally:
            if was:
                gc.enable()

    def _propose(self, n: int, measured: set[str], rng: random.Random) -> list[Schedule]:
        t0 = time.perf_counter()
        gens = self.generations if _informative(self.model) else 0
        pop, rand = self._initial(rng, featurize=gens > 0)
        t_init = time.perf_counter() - t0
        cands: dict[str, tuple[float, Schedule]] = {}
        t_score = 0.0
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
        self.pool = [s for _, s in cands.values()]
        self.pool_score = {k: v for k, (v, _) in cands.items()}
        self.pool_random = rand
        return out

    def sketch_bests_first(self, cands: list[Schedule]) -> list[Schedule]:
        """`cands` (a batch from `propose` or `rerank`) reordered: the default-like seeds, then the model's best
        candidate of each sketch of the last round's pool, then the best of each annotation structure
        (`structure`) not yet among them, each group best first as scored by that call, then the rest in their
        order, cut to `len(cands)`.  A pretrained model can rank one sketch's schedules, or one structure's
        (a serial GEMM whose only parallel loop packs B), far too high on a new task: the model learns a task
        from normalized throughput, so while everything measured shares that flaw nothing looks slow.
        Measured in parts, the first part then tries every sketch and structure, and the model learns which
        suit this task before the rest is ranked again.  A group's representative is its best candidate whose
        tile factors divide their extents (`ragged`), where it has one: a guarded tail can cost far more than the
        model knows (dense_relu's packed-GEMM sketch with a 133-row block: 1.7x slower than with 128, held out
        the model's first pick; the sketch was then left out until trial ~180, session 43).  Since session 44 the
        code generator splits such tails off (`codegen.partition`: that block now runs as fast as 128 rows), so
        this rule guards against what remains (tails the pass leaves, e.g. cold or too large); it has not been
        measured against its absence with the pass on."""
        seeds = {s.key for s in self.space.seeds}
        by_sketch: dict[str, tuple[bool, float, str, Schedule]] = {}
        by_structure: dict[tuple, tuple[bool, float, str, Schedule]] = {}
        for s in self.pool:
            v = self.pool_score.get(s.key, np.nan)   # scored as of the last call: not measured then
            if s.key in seeds or not np.isfinite(v):
                continue
            t = (ragged(self.space.sketch_of(s), s), -v, s.key, s)
            for group, k in ((by_sketch, s.sketch), (by_structure, structure(s))):
                if k not in group or t[:3] < group[k][:3]:
                    group[k] = t
        ahead = [s for s in cands if s.key in seeds]
        keys = {s.key for s in ahead}
        for group in (by_sketch, by_structure):
            for _, _, k, s in sorted(group.values(), key=lambda t: (t[1], t[2])):
                if k not in keys:
                    ahead.append(s)
                    keys.add(k)
        return (ahead + [s for s in cands if s.key not in keys])[: len(cands)]

    def twins(self, measured: set[str], rng: random.Random, room: int | None = None) -> list[Schedule]:
        """The TWIN_BESTS fastest measured schedules of sketches with holes (`_with_holes`: not the default) with their
        B-operand packing toggled (`mutate_pack`: packed ones unpacked, unpacked ones packed), those not yet
        measured, fastest's first.  The first round's later parts try them first: a structure judged by one poorly
        tiled representative (`sketch_bests_first`) looks slow, and the model then keeps it out; with the best tiling
        found so far it gets a fair trial.  On small GEMMs the pack costs more than it saves (docs/benchmarks.md,
        search, session 26).  Then the model's TWIN_MOVES best `outward_moves` of the fastest (`_moves`), then the
        fastest's `unroll_moves` (`_unrolls`) where all the twins so far fit in TWIN_SHARE (half) of `room` (the size
        of the part they start; None: no limit), then its `ladder_moves` (`_ladder`: all of them for a sketch with
        one level per tile hole, else the model's best) up to that share: twins that fill a small part leave the
        model's own picks out of it (sessions 29, 38, 39).  The unroll moves go before the ladder: behind the model's
        four ladder moves of a deeper sketch they no longer fit, and conv3x3_test's fastest early schedule with its
        pragma at 512 then came at trial 58 instead of ~24 (session 40)."""
        out: list[Schedule] = []
        seen = set(measured)
        bests = self._with_holes(max(TWIN_BESTS, 1))
        fastest = bests[0] if bests else None   # (sketch, schedule): every move below starts from it
        for sk, s in bests[:TWIN_BESTS]:
            if not any(site.pack for site in sk.sites):   # GPU sketches have no annotation sites
                continue
            for _ in range(TWIN_TRIES):
                t = mutate_pack(sk, s, rng)
                if t is not None and t.key not in seen:
                    out.append(t)
                    seen.add(t.key)
        out += self._moves(fastest, seen)
        seen |= {t.key for t in out}
        share = None if room is None else int(room * TWIN_SHARE)
        unrolls = self._unrolls(fastest, seen)
        out += unrolls if share is None or len(out) + len(unrolls) <= share else []
        seen |= {t.key for t in out}
        ladder = self._ladder(fastest, seen)
        return out + (ladder if share is None else ladder[: max(0, share - len(out))])

    def _unrolls(self, fastest: tuple | None, seen: set[str]) -> list[Schedule]:
        """The fastest measured schedule's (`fastest`: its sketch and itself) `unroll_moves` not in `seen`: all of them
        when there are at most TWIN_UNROLL (one unroll site), else the model's TWIN_UNROLL best.  On small kernels the
        unroll pragma alone moves the time by 5-15 %, the model ranks its values poorly, and a random mutation of the
        one knob comes late: conv3x3_test's early bests with their pragma set to 512 were 6-15 % faster in six of
        nine runs of session 35 (docs/benchmarks.md, search, session 36)."""
        moves = self._fastest_moves(fastest, unroll_moves, "unroll", seen) if TWIN_UNROLL > 0 else []
        return moves if len(moves) <= TWIN_UNROLL else self._model_best(moves, TWIN_UNROLL)

    def _ladder(self, fastest: tuple | None, seen: set[str]) -> list[Schedule]:
        """The fastest measured schedule's `ladder_moves` not in `seen`: all of them when each tile hole of its
        sketch has at most TWIN_LADDER_LEVELS levels, else the model's TWIN_LADDER_BEST best.  Where a sketch's tile
        space is that small the model's ranking within it decides everything, and on a workload it never saw it
        can sit 8-64x off in both holes (batch_matmul's row and k blocks); the ladder walks there in a few parts,
        each from the fastest so far (docs/benchmarks.md, search, sessions 37-38).  Deeper sketches have 10-32
        such moves; the model picks a few, each one tile level of the fastest away (session 39)."""
        tiny = fastest is not None and all(h.n <= TWIN_LADDER_LEVELS for h in fastest[0].tiles)
        if not tiny and TWIN_LADDER_BEST <= 0:
            return []
        moves = self._fastest_moves(fastest, ladder_moves, None, seen)
        return moves if tiny or not moves else self._model_best(moves, TWIN_LADDER_BEST)

    def _with_holes(self, k: int) -> list[tuple]:
        """(sketch, schedule) of the `k` fastest measured schedules of sketches with holes, fastest first.  The
        default schedule (a sketch without holes) has no moves and nothing to pack: while it is among the fastest,
        as it often is early in the normal mode, the twins come from the fastest points of sketches (session 40;
        the packing twins since session 41: the default took one of their TWIN_BESTS slots)."""
        out = []
        for _, _, s in self.best:
            sk = self.space.sketch_of(s)
            if sk is not None and sk.has_holes:
                out.append((sk, s))
                if len(out) >= k:
                    break
        return out

    def _fastest_moves(self, fastest: tuple | None, moves_fn, site_flag: str | None,
                       seen: set[str]) -> list[Schedule]:
        """`moves_fn(sketch, schedule)` of `fastest` (the fastest measured schedule of a sketch with holes and its
        sketch, from `_with_holes`), those not in `seen`; none when there is none, its sketch has no `site_flag` site
        (GPU sketches have no annotation sites) or, with `site_flag` None, no CPU tile hole (a CPU sketch may have
        holes and no annotation site: the packed-GEMM `gemm_panel`)."""
        if fastest is None:
            return []
        sk, s = fastest
        if not (any(getattr(site, site_flag) for site in sk.sites) if site_flag else sk.tiles):
            return []
        return [m for m in moves_fn(sk, s) if m.key not in seen]

    def _model_best(self, moves: list[Schedule], k: int) -> list[Schedule]:
        """The model's k best of `moves` (ties by key)."""
        sc = score(self.space, self.model, moves, self.cache)
        order = sorted((j for j in range(len(moves)) if np.isfinite(sc[j])), key=lambda j: (-sc[j], moves[j].key))
        return [moves[j] for j in order[:k]]

    def _moves(self, fastest: tuple | None, seen: set[str]) -> list[Schedule]:
        """The model's TWIN_MOVES best `outward_moves` of the fastest measured schedule (`fastest`) not in `seen`: the
        parallel granularity of a well-tiled schedule, which the evolution's random mutations reach late
        (docs/benchmarks.md, search, session 27)."""
        moves = self._fastest_moves(fastest, outward_moves, "parallel", seen) if TWIN_MOVES > 0 else []
        return self._model_best(moves, TWIN_MOVES) if moves else []

    def rerank(self, n: int, measured: set[str], rng: random.Random) -> list[Schedule]:
        """Up to `n` more schedules from the last round's scored candidates, ranked again by the model as it is
        now (it has learnt what was measured since), `eps_greedy` of them random as in `propose`.  Cheap: the
        candidates' features are cached, so this is one prediction, no evolution."""
        pool = [s for s in self.pool if s.key not in measured]
        if not pool or n <= 0:
            return []
        sc = score(self.space, self.model, pool, self.cache)
        self.pool_score = {s.key: float(v) for s, v in zip(pool, sc)}
        n_rand = min(n, int(round(self.eps_greedy * n)))
        ranked = sorted((j for j in range(len(pool)) if np.isfinite(sc[j])), key=lambda j: (-sc[j], pool[j].key))
        out = [pool[j] for j in ranked[: n - n_rand]]
        picked = {s.key for s in out}
        rest = [s for s in self.pool_random if s.key not in measured and s.key not in picked]
        out += rng.sample(rest, min(len(rest), n - len(out)))
        return out


__all__ = ["EvolutionarySearch", "FeatureCache", "score", "fanout", "search_workers", "structure"]
