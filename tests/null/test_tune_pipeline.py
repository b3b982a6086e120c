"""The tuner's pipelining (batch k+1 searched while batch k is measured) and its early cutoff of hopeless candidates,
on the synthetic measurer of test_search (costs a known function of the schedule; no code generation)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

import hlotune
from hlotune.database import open_database
from hlotune.errors import InputError
from hlotune.measure.records import MeasureResult
from hlotune.search.evolutionary import EvolutionarySearch
from hlotune.search.tuner import _pipelined
from tests.conftest import model_path
from tests.null.test_search import SyntheticMeasurer, _learned, _tune, synthetic_cost


@pytest.fixture(scope="module")
def model():
    return hlotune.load_model(str(model_path("dense_bias_relu")))


def _keys(path: str) -> list[str]:
    return [r.schedule_key for r in open_database(path).records()]


@pytest.fixture
def proposals(monkeypatch):
    """Counts the evolutionary search's proposals (each counted as it starts)."""
    count = {"n": 0}
    original = EvolutionarySearch.propose

    def propose(self, n, measured, rng):
        count["n"] += 1
        return original(self, n, measured, rng)

    monkeypatch.setattr(EvolutionarySearch, "propose", propose)
    return count


class OverlapMeasurer(SyntheticMeasurer):
    """Synthetic costs; each batch of the search waits (at most WAIT s) until the tuner has started searching the
    next batch, and notes whether it did (it can only while this batch is being measured: pipelining)."""

    WAIT = 1.0

    def __init__(self, proposals: dict):
        super().__init__()
        self.proposals = proposals
        self.threads: list[str] = []
        self.overlapped: list[bool] = []

    def measure_batch(self, inputs):
        self.threads.append(threading.current_thread().name)
        out = super().measure_batch(inputs)
        k = len(self.threads)   # the defaults (k = 1) overlap the first round's search, batch j its round j + 1's
        t_end = time.monotonic() + self.WAIT
        while self.proposals["n"] < k and time.monotonic() < t_end:
            time.sleep(0.005)
        self.overlapped.append(self.proposals["n"] >= k)
        return out


def test_pipelined_run_searches_while_measuring(model, tmp_path, proposals):
    path = str(tmp_path / "p.db")
    meas = OverlapMeasurer(proposals)
    rep = _tune(model, open_database(path), meas, trials=49, confirm=0, pipeline="on")
    # 1 default + 3 batches of 16; the default (one task) overlapped the first round's search, batches 1 and 2 the
    # search of the next; after batch 3 the budget is spent, so nothing more is searched (nor measured)
    assert rep.pipelined and rep.total_trials == rep.trials == 49
    assert meas.overlapped == [True, True, True, False] and proposals["n"] == 3
    assert meas.threads == ["hlotune-measure"] * 4
    assert len(meas.seen) == len(set(meas.seen)) == 49 and sorted(_keys(path)) == sorted(meas.seen)


@pytest.mark.parametrize("confirm", [0, 2])
def test_pipelined_and_sequential_measure_the_same_number_of_distinct_schedules(model, tmp_path, confirm):
    ratios = []
    for seed in ((0, 1, 2) if confirm else (0,)):
        got = {}
        for mode in ("off", "on"):
            path = str(tmp_path / f"{mode}-{seed}.db")
            meas = SyntheticMeasurer()
            cm = _learned() if confirm else None   # (the learnt model is slow: one of the two cases)
            rep = _tune(model, open_database(path), meas, trials=60, confirm=confirm, pipeline=mode, seed=seed,
                        **({"cost_model": cm} if cm else {}))
            assert rep.pipelined == (mode == "on") and rep.total_trials == 60 and rep.stop_reason.startswith("trial")
            keys = _keys(path)
            assert len(set(meas.seen)) == len(set(keys)) == sum(s.trials for s in rep.subgraphs) == 60
            if not confirm:   # no confirmation timings: every measurement is a new schedule
                assert len(meas.seen) == len(keys) == 60
            got[mode] = rep.subgraphs[0].best_s
        ratios.append(got["on"] / got["off"])
    # the pipelined search learns one batch later, but finds schedules of the same quality: within 1.5x on the median
    # seed, within 3x on every one (one seed alone swings past 2x: 2.04x and 2.38x were seen, feature versions 4, 5)
    assert 1 / 1.5 <= sorted(ratios)[len(ratios) // 2] <= 1.5 and all(1 / 3 <= r <= 3 for r in ratios), ratios


def test_seeded_pipelined_runs_propose_the_same_candidates(model, tmp_path):
    runs = []
    for k in range(2):
        meas = SyntheticMeasurer()
        _tune(model, open_database(str(tmp_path / f"r{k}.db")), meas, trials=49, seed=7, cost_model=_learned(),
              pipeline="on")
        runs.append(meas.seen)
    assert runs[0] == runs[1] and len(set(runs[0])) == 49
    seq = SyntheticMeasurer()
    _tune(model, open_database(str(tmp_path / "seq.db")), seq, trials=33, seed=7, cost_model=_learned(), pipeline="off")
    # the default schedule is the first trial either way; pipelined (one task), the first round is searched while
    # the default is measured, so it cannot seed that round's population, and later rounds learn one batch later
    assert seq.seen[0] == runs[0][0] and len(set(seq.seen)) == 33


class SlowMeasurer(SyntheticMeasurer):
    """Synthetic costs, `delay` s per batch; `abort()` (ProgramMeasurer's) stops the batch in progress."""

    def __init__(self, delay: float, fail_at: int | None = None):
        super().__init__()
        self.delay, self.fail_at = delay, fail_at
        self.calls = 0
        self.aborted = threading.Event()

    def abort(self):
        self.aborted.set()

    def measure_batch(self, inputs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt   # as a measurer told to stop does (distributed._StopFlag)
        t_end = time.monotonic() + self.delay
        while time.monotonic() < t_end:
            if self.aborted.is_set():
                raise KeyboardInterrupt
            time.sleep(0.002)
        return super().measure_batch(inputs)


def test_time_budget_drops_the_last_proposal_unmeasured(model, tmp_path):
    path = str(tmp_path / "t.db")
    meas = SlowMeasurer(0.15)
    rep = _tune(model, open_database(path), meas, trials=None, time_budget=0.6, confirm=0, pipeline="on")
    assert "time budget" in rep.stop_reason and rep.pipelined
    # what was measured was committed: a batch proposed after the budget ran out was not measured
    assert len(meas.seen) == len(set(meas.seen)) == rep.total_trials == len(_keys(path)) > 1


@pytest.mark.parametrize("where", ["main", "thread"])
def test_interrupt_loses_only_the_batch_in_flight(model, tmp_path, monkeypatch, where):
    """Ctrl-C in the main thread while batch 2 is measured (the measurer is told to abort), or a measurer that
    raises KeyboardInterrupt in the measuring thread: batch 1 is in the database, batch 2 is not."""
    path = str(tmp_path / f"i{where}.db")
    meas = SlowMeasurer(0.3, fail_at=3 if where == "thread" else None)
    original = EvolutionarySearch.propose
    count = {"n": 0}

    def propose(self, n, measured, rng):
        count["n"] += 1
        if where == "main" and count["n"] == 3:
            raise KeyboardInterrupt
        return original(self, n, measured, rng)

    monkeypatch.setattr(EvolutionarySearch, "propose", propose)
    rep = _tune(model, open_database(path), meas, trials=64, confirm=0, pipeline="on")
    assert rep.interrupted and rep.stop_reason == "interrupted"
    assert rep.total_trials == len(set(_keys(path))) == 1 + 16
    assert meas.aborted.is_set() == (where == "main")


class CutoffRunner:
    """The part of LocalRunner's interface the tuner uses for the cutoff."""

    def __init__(self):
        self.best: dict[str, float] = {}

    def set_best(self, best):
        self.best = dict(best)


class CutoffMeasurer(SyntheticMeasurer):
    """Synthetic costs; a candidate more than 3x slower than its task's best (as the tuner told the runner) gets
    one repeat, like the LocalRunner's early cutoff.  Notes the best it was given against the true one."""

    def __init__(self):
        super().__init__()
        self.runner = CutoffRunner()
        self.given: list[tuple[float | None, float | None]] = []
        self.costs: dict[str, float] = {}
        self.cut = 0

    def measure_batch(self, inputs):
        known = min(self.costs.values(), default=None)   # the best of everything measured before this batch
        out = []
        for inp in inputs:
            best = self.runner.best.get(inp.task.key)
            self.given.append((best, known))
            c = synthetic_cost(inp.schedule)
            self.seen.append(inp.schedule.key)
            self.costs[inp.schedule.key] = c
            if best is not None and c > 3 * best:
                self.cut += 1
                out.append(MeasureResult((c,)))
            else:
                out.append(MeasureResult((c, c * 1.01, c * 0.99)))
        return out


@pytest.mark.parametrize("mode", ["off", "on"])
def test_tuner_gives_the_runner_each_tasks_best_for_the_cutoff(model, tmp_path, mode):
    path = str(tmp_path / f"c{mode}.db")
    meas = CutoffMeasurer()
    rep = _tune(model, open_database(path), meas, trials=49, confirm=0, pipeline=mode)
    assert rep.total_trials == 49
    # every batch after the first (the default) was measured knowing the best of everything committed before it
    assert meas.given[0] == (None, None)
    assert all(b == pytest.approx(k) for b, k in meas.given[1:])
    # a cut-off candidate is a valid record with the one repeat it has
    recs = list(open_database(path).records())
    one = [r for r in recs if len(r.costs) == 1]
    assert meas.cut > 0 and len(one) == meas.cut and all(r.valid for r in one)
    assert rep.subgraphs[0].valid == 49


def test_pipeline_setting():
    class Runner:
        def __init__(self, rt):
            self.rt = rt

        def realtime(self):
            return self.rt

    cpu, cuda = SimpleNamespace(kind="cpu"), SimpleNamespace(kind="cuda")
    assert _pipelined("auto", SimpleNamespace(runner=Runner(True)), cpu)
    assert not _pipelined("auto", SimpleNamespace(runner=Runner(False)), cpu)
    assert not _pipelined("auto", SyntheticMeasurer(), cpu)          # no runner to ask: off
    assert _pipelined("auto", SyntheticMeasurer(), cuda)
    assert _pipelined("on", SyntheticMeasurer(), cpu) and not _pipelined("off", SimpleNamespace(runner=Runner(True)),
                                                                          cuda)


def test_bad_pipeline_value_is_an_input_error(model, tmp_path):
    with pytest.raises(InputError, match="pipeline"):
        _tune(model, open_database(str(tmp_path / "b.db")), SyntheticMeasurer(), pipeline="sometimes")


def test_real_time_tuner_leaves_real_time_priority_and_restores_it():
    """A tuner started under chrt, with a measurer that has no runner priority to set: for the run it goes to
    normal priority (only a timing may be real-time: RT throttling), and gets its priority back at the end; a
    tuner at normal priority changes nothing."""
    import os
    import sys

    from hlotune.search.tuner import (
        PIPELINE_SWITCH_INTERVAL,
        _realtime_timing_only,
        _restore_search,
        _search_beside_measurement,
    )

    seen = {}

    def body():
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        except (AttributeError, OSError):
            seen["skip"] = True
            return
        old, how = _realtime_timing_only(SyntheticMeasurer())
        seen["during"], seen["how"] = os.sched_getscheduler(0), how
        _restore_search(old, None)
        seen["after"] = os.sched_getscheduler(0)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    th = threading.Thread(target=body)   # only this thread is ever real-time, for a moment
    th.start()
    th.join()
    if seen.get("skip"):
        pytest.skip("this user may not use SCHED_RR")
    assert seen == {"during": os.SCHED_OTHER, "after": os.SCHED_RR, "how": "search at normal priority"}
    assert _realtime_timing_only(SyntheticMeasurer()) == (None, "")
    interval = sys.getswitchinterval()   # the switch interval changes in the main thread only
    old = _search_beside_measurement()
    assert sys.getswitchinterval() == min(interval, PIPELINE_SWITCH_INTERVAL)
    _restore_search(None, old)
    assert sys.getswitchinterval() == interval


# ----------------------------------------------------------------------------- first round in parts (tune_warmup)

class SizesMeasurer(SyntheticMeasurer):
    """Synthetic costs; notes the size of every batch."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def measure_batch(self, inputs):
        self.sizes.append(len(inputs))
        return super().measure_batch(inputs)


def _pretrained(model):
    """A trained (ranking) model, as a loaded pretrained one is."""
    import random

    from hlotune.schedule_space.task import tasks_from_subgraphs
    from hlotune.search.space import TaskSpace, sample_random
    from tests.null.test_search import TARGET, synthetic_cost

    space = TaskSpace(tasks_from_subgraphs(model.frontend.subgraphs, TARGET)[0])
    cm = _learned()
    scheds = sample_random(space, random.Random(5), 64)
    cm.fit([(space.task, s, (synthetic_cost(s),) * 3) for s in scheds])
    cm.pretrained = True
    assert cm.trained
    return cm


@pytest.mark.parametrize("pipeline", ["off", "on"])
def test_first_round_is_measured_in_parts_and_reranked(model, tmp_path, monkeypatch, pipeline, proposals):
    learnt = []
    original = EvolutionarySearch.rerank

    def rerank(self, n, measured, rng):
        learnt.append(("rerank", len(self.model.samples)))
        out = original(self, n, measured, rng)
        # the model as it is now ranks what comes back (the eps-greedy random tail aside)
        from hlotune.search.evolutionary import score
        head = out[: n - int(round(self.eps_greedy * n))]
        sc = score(self.space, self.model, head, self.cache)
        assert all(a >= b for a, b in zip(sc, sc[1:]))
        return out

    monkeypatch.setattr(EvolutionarySearch, "rerank", rerank)
    first = []
    original_first = EvolutionarySearch.sketch_bests_first

    def sketch_bests_first(self, cands):
        first.append([s.key for s in original_first(self, cands)])
        return original_first(self, cands)

    monkeypatch.setattr(EvolutionarySearch, "sketch_bests_first", sketch_bests_first)
    twins, rooms = [], []
    original_twins = EvolutionarySearch.twins

    def record_twins(self, measured, rng, room=None):
        out = original_twins(self, measured, rng, room)
        twins.append([s.key for s in out])
        rooms.append(room)
        return out

    monkeypatch.setattr(EvolutionarySearch, "twins", record_twins)
    monkeypatch.setenv("HLOTUNE_TUNE_WARMUP", "8,8,16,16")
    meas = SizesMeasurer()
    cm = _pretrained(model)
    n0 = len(cm.samples)
    rep = _tune(model, open_database(str(tmp_path / "w.db")), meas, trials=65, batch_size=64, confirm=0,
                cost_model=cm, pipeline=pipeline)
    assert meas.sizes == [1, 8, 8, 16, 16, 16] and rep.total_trials == 65
    assert len(meas.seen) == len(set(meas.seen)) == 65
    # each part after the first was chosen by the model after it had learnt the default and the parts before it:
    # ranked again, except once 16 trials were known (a second evolution: the second proposal of the run)
    assert learnt == [("rerank", n0 + 9), ("rerank", n0 + 33), ("rerank", n0 + 49)]
    assert proposals["n"] == 2
    # the first part (after the default) is the batch with every sketch's best up front (WARM_SKETCH_PARTS = 1)
    assert len(first) == 1 and meas.seen[1:9] == first[0][:8]
    # every later part (and the round's rest) starts with the bests' twins (packing toggled) as they were then
    assert len(twins) == 4 and any(twins) and rooms == [8, 16, 16, 16]     # each with the size of its part
    for tw, start in zip(twins, (9, 17, 33, 49)):
        assert meas.seen[start: start + len(tw)] == tw


def test_twins_toggle_the_packing_of_the_measured_bests(model, monkeypatch):
    """`twins`: the TWIN_BESTS fastest measured schedules with their B packing toggled, same sketch and tiling,
    none measured before, none twice; unmeasured or unpackable bests give none, and the default schedule leading
    takes no slot (the outward, unroll and ladder moves, tested below, left out)."""
    import random

    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_MOVES", 0)
    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_UNROLL", 0)
    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_LADDER_BEST", 0)

    from hlotune.schedule_space.mutate import mutate_pack
    from hlotune.schedule_space.steps import Pack, Split
    from hlotune.schedule_space.task import tasks_from_subgraphs
    from hlotune.search.evolutionary import TWIN_BESTS, structure
    from hlotune.search.space import TaskSpace, sample_random
    from tests.null.test_search import TARGET

    space = TaskSpace(tasks_from_subgraphs(model.frontend.subgraphs, TARGET)[0])
    ev = EvolutionarySearch(space, _learned(), population=64, generations=1, workers=1)
    assert ev.twins(set(), random.Random(0)) == []                       # nothing measured yet
    packable = {sk.id for sk in space.sketches if any(site.pack for site in sk.sites)}
    scheds = [s for s in sample_random(space, random.Random(1), 200) if s.sketch in packable]
    packed = [s for s in scheds if any(isinstance(st, Pack) for st in s.steps)]
    assert len(packed) >= 2                                              # else the test shows nothing
    # an unpacked best whose tiling allows packing: packed[1] unpacked (tiles whose innermost j tile does not
    # divide the axis, or is 1, cannot be packed: those give no twin)
    plain = mutate_pack(space.sketch_of(packed[1]), packed[1], random.Random(0))
    assert plain is not None and not any(isinstance(st, Pack) for st in plain.steps)
    bests = [packed[0], plain]
    rest = [s for s in scheds if s.key not in {packed[0].key, packed[1].key, plain.key}][:20]
    ev.observe(bests + rest, [1.0, 2.0] + [5.0] * len(rest))
    measured = {s.key for s in bests + rest}
    tw = ev.twins(measured, random.Random(2))
    assert tw and len({t.key for t in tw}) == len(tw) and not any(t.key in measured for t in tw)

    def tiles(s):
        return [st.factors for st in s.steps if isinstance(st, Split) and not st.stage.endswith(".pack")]

    for t in tw:
        parent = next(b for b in bests[:TWIN_BESTS] if b.sketch == t.sketch and tiles(b) == tiles(t))
        assert structure(t)[2] != structure(parent)[2]                  # packed buffers differ
    assert any(structure(t)[2] == () for t in tw) and any(structure(t)[2] for t in tw)   # both ways
    # the default schedule (no holes, nothing to pack) leading takes no slot: the same two bests are toggled
    assert space.default is not None and not space.sketch_of(space.default).has_holes
    ev.observe([space.default], [0.5])
    assert ev.best[0][2].key == space.default.key
    led = ev.twins(measured | {space.default.key}, random.Random(2))
    assert [t.key for t in led] == [t.key for t in tw]


def _twin_search(model, seed: int, site_flag: str):
    """The fixture's first task: 120 random schedules of sketches with `site_flag` sites, a model fitted on the first
    60 of them (synthetic costs) and an evolutionary search with that model."""
    import random

    from hlotune.schedule_space.task import tasks_from_subgraphs
    from hlotune.search.space import TaskSpace, sample_random
    from tests.null.test_search import TARGET

    space = TaskSpace(tasks_from_subgraphs(model.frontend.subgraphs, TARGET)[0])
    scheds = [s for s in sample_random(space, random.Random(seed), 120)
              if any(getattr(site, site_flag) for site in space.sketch_of(s).sites)]
    learned = _learned().fit([(space.task, s, (synthetic_cost(s),)) for s in scheds[:60]])
    return space, scheds, learned, EvolutionarySearch(space, learned, population=64, generations=1, workers=1)


def test_twins_end_with_the_models_best_outward_moves_of_the_fastest(model, monkeypatch):
    """After the packing twins, `twins` adds the TWIN_MOVES outward moves of the fastest measured schedule that
    the model scores highest, none measured; a measured move is skipped for the next one (the unroll and ladder
    moves, tested below, left out)."""
    import random

    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_UNROLL", 0)
    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_LADDER_BEST", 0)

    from hlotune.schedule_space.mutate import outward_moves
    from hlotune.search.evolutionary import TWIN_MOVES, score

    space, scheds, learned, ev = _twin_search(model, 4, "parallel")
    best = next(s for s in scheds[60:] if len(outward_moves(space.sketch_of(s), s)) > TWIN_MOVES + 1)
    rest = [s for s in scheds[60:] if s.key != best.key][:10]
    ev.observe([best] + rest, [1.0] + [5.0] * len(rest))
    moves = outward_moves(space.sketch_of(best), best)
    sc = score(space, learned, moves, None)
    want = [moves[j] for j in sorted(range(len(moves)), key=lambda j: (-sc[j], moves[j].key))]
    measured = {s.key for s in [best] + rest}
    tw = ev.twins(measured, random.Random(0))
    got = [t for t in tw if t.key in {m.key for m in moves}]
    assert [t.key for t in got] == [m.key for m in want[:TWIN_MOVES]] and tw[-len(got):] == got
    assert len(set(sc[:])) >= 2                                          # the model tells the moves apart
    tw2 = ev.twins(measured | {want[0].key}, random.Random(0))
    assert [t.key for t in tw2 if t.key in {m.key for m in moves}] == [m.key for m in want[1:TWIN_MOVES + 1]]


def test_twins_put_the_unroll_moves_of_the_fastest_before_its_ladder(model, monkeypatch):
    """`twins`: after the packing twins, the fastest measured schedule's `unroll_moves` not yet measured (all of
    them when they are at most TWIN_UNROLL, else the model's TWIN_UNROLL best; the second fastest's are not among
    them), then its ladder moves.  In a part too small for all of them the unroll moves come whole or not at all,
    and the ladder takes what is left of half the part."""
    import random

    from hlotune.schedule_space.mutate import ladder_moves, unroll_moves
    from hlotune.search.evolutionary import TWIN_UNROLL, score

    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_MOVES", 0)
    space, scheds, learned, ev = _twin_search(model, 5, "unroll")
    best, second = scheds[60], scheds[61]
    rest = scheds[62:72]
    ev.observe([best, second] + rest, [1.0, 1.5] + [5.0] * len(rest))
    measured = {s.key for s in [best, second] + rest}
    moves = unroll_moves(space.sketch_of(best), best)
    assert 2 <= len(moves) <= TWIN_UNROLL                                 # one unroll site: all its other values
    ladder = {m.key for m in ladder_moves(space.sketch_of(best), best)}
    tw = ev.twins(measured, random.Random(0))
    keys = [t.key for t in tw]
    at = keys.index(moves[0].key)
    assert keys[at: at + len(moves)] == [m.key for m in moves]
    head, tail = keys[:at], keys[at + len(moves):]
    assert tail and set(tail) <= ladder and not set(head) & ladder      # the ladder after them, nothing between
    others = {m.key for m in unroll_moves(space.sketch_of(second), second)}
    assert not others & set(keys)
    # a measured move is skipped
    tw2 = ev.twins(measured | {moves[0].key}, random.Random(0))
    assert [t.key for t in tw2 if t.key in {m.key for m in moves}] == [m.key for m in moves[1:]]
    # at most half of the part they start: the unroll moves whole, the ladder cut
    assert ev.twins(measured, random.Random(0), room=2 * len(tw)) == tw
    fit = len(head) + len(moves)
    assert [t.key for t in ev.twins(measured, random.Random(0), room=2 * fit + 2)] == keys[: fit + 1]
    assert [t.key for t in ev.twins(measured, random.Random(0), room=2 * fit)] == keys[:fit]
    short = [t.key for t in ev.twins(measured, random.Random(0), room=2 * fit - 2)]
    assert short[: len(head)] == head and not set(short) & {m.key for m in moves}   # the unroll moves left out
    assert len(short) == fit - 1 and set(short[len(head):]) <= ladder                # the ladder in their place
    # more moves than TWIN_UNROLL: the model's best
    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_UNROLL", 1)
    sc = score(space, learned, moves, None)
    assert len(set(sc)) >= 2                                              # the model tells the moves apart
    top = min(range(len(moves)), key=lambda j: (-sc[j], moves[j].key))
    assert [t.key for t in ev.twins(measured, random.Random(0)) if t.key in {m.key for m in moves}] == \
        [moves[top].key]


def test_twins_move_from_the_fastest_sketch_point_while_the_default_leads(model):
    """While the default schedule (a sketch without holes: no moves of its own) is the fastest measured, the
    unroll and ladder twins are those of the fastest schedule of a sketch with holes, as if the default were not
    there; the default gives none of its own."""
    import random

    from hlotune.schedule_space.mutate import ladder_moves, unroll_moves

    space, scheds, learned, ev = _twin_search(model, 5, "unroll")
    default = space.default
    assert default is not None and not space.sketch_of(default).has_holes
    best, rest = scheds[60], scheds[62:72]
    measured = {s.key for s in [default, best] + rest}
    ev.observe([best] + rest, [1.0] + [5.0] * len(rest))
    alone = ev.twins(measured, random.Random(0))
    ev.observe([default], [0.5])                                          # the default leads now
    assert ev.best[0][2].key == default.key
    led = ev.twins(measured, random.Random(0))
    assert [t.key for t in led] == [t.key for t in alone]
    moves = {m.key for m in unroll_moves(space.sketch_of(best), best) + ladder_moves(space.sketch_of(best), best)}
    assert moves & {t.key for t in led}


def test_first_part_tries_each_sketch_best(model):
    """The first part of a fresh task's first round: the default-like seeds, then the model's best candidate of
    every sketch (best first), then the best of every annotation structure not yet among them (best first), then
    the batch as proposed; nothing lost or repeated.  A group's representative is its best candidate with tile
    factors that divide their extents where it has one (`ragged`)."""
    import math
    import random

    from hlotune.schedule_space.task import tasks_from_subgraphs
    from hlotune.search.evolutionary import ragged, structure
    from hlotune.search.space import TaskSpace
    from tests.null.test_search import TARGET

    space = TaskSpace(tasks_from_subgraphs(model.frontend.subgraphs, TARGET)[0])
    ev = EvolutionarySearch(space, _pretrained(model), population=256, generations=1, workers=1)
    cands = ev.propose(48, set(), random.Random(3))
    out = ev.sketch_bests_first(cands)
    assert len(out) == len(cands) and len({s.key for s in out}) == len(out)
    pool = {s.key for s in ev.pool} | {s.key for s in cands}
    assert all(s.key in pool for s in out)
    seed_keys = {x.key for x in space.seeds}
    seeds = [s for s in cands if s.key in seed_keys]
    assert out[: len(seeds)] == seeds

    def uneven(s):   # independent of `ragged` (which decodes the decisions): the holes' Split steps themselves
        sk = space.sketch_of(s)
        return any(h.extent % math.prod(s.steps[h.step].factors) for h in sk.tiles)

    assert all(ragged(space.sketch_of(s), s) == uneven(s) for s in ev.pool)

    def bests(group_of, even_first=True):
        best = {}
        for s in ev.pool:
            if s.key not in seed_keys:
                v, g = ev.pool_score[s.key], group_of(s)
                t = (even_first and uneven(s), -v, s.key)
                if g not in best or t < best[g][2]:
                    best[g] = (v, s.key, t)
        return {g: (v, k) for g, (v, k, _) in best.items()}

    by_sketch, by_structure = bests(lambda s: s.sketch), bests(structure)
    assert len(by_sketch) >= 2 and len(by_structure) > len(by_sketch)   # else the test shows nothing
    top = bests(structure, even_first=False)   # some structure's best-scored is ragged: else the rule shows nothing
    assert any(top[g] != by_structure[g] for g in top)
    head = out[len(seeds): len(seeds) + len(by_sketch)]
    assert {s.key for s in head} == {k for _, k in by_sketch.values()}
    assert [ev.pool_score[s.key] for s in head] == sorted((v for v, _ in by_sketch.values()), reverse=True)
    more = [(v, k) for v, k in by_structure.values() if k not in {s.key for s in head}]
    n_ahead = len(seeds) + len(head) + len(more)
    assert n_ahead < len(out)
    mid = out[len(seeds) + len(head): n_ahead]
    assert [s.key for s in mid] == [k for _, k in sorted(more, key=lambda t: (-t[0], t[1]))]
    assert {structure(s) for s in out[:n_ahead]} >= set(by_structure)   # every structure is tried
    # the rest keeps the proposed order
    rest = [s.key for s in out[n_ahead:]]
    assert rest == [s.key for s in cands if s.key not in {x.key for x in out[:n_ahead]}][: len(rest)]


def test_first_round_in_one_piece_when_off_or_cold(model, tmp_path, monkeypatch):
    meas = SizesMeasurer()
    _tune(model, open_database(str(tmp_path / "cold.db")), meas, trials=65, batch_size=64, confirm=0)
    assert meas.sizes == [1, 64]   # a cold (random) model does not rank: nothing to re-rank with
    monkeypatch.setenv("HLOTUNE_TUNE_WARMUP", "0")
    meas = SizesMeasurer()
    _tune(model, open_database(str(tmp_path / "off.db")), meas, trials=65, batch_size=64, confirm=0,
          cost_model=_pretrained(model))
    assert meas.sizes == [1, 64]


def test_twins_walk_the_tile_ladder_of_a_small_sketch_without_annotation_sites(monkeypatch):
    """The fastest measured schedule of the packed-GEMM sketch (`gemm_panel`: a row block and a k block, no
    annotation site, so no packing, outward or unroll twins): `twins` are all its `ladder_moves` not yet measured
    (each hole has one level), a measured one skipped, at most half of the part they start; a fastest of a sketch
    with deeper tiles adds the model's TWIN_LADDER_BEST best of its ladder moves (none when that is 0)."""
    import random

    from hlotune.schedule_space.annotate import sample_schedules
    from hlotune.schedule_space.mutate import ladder_moves
    from hlotune.schedule_space.task import Task
    from hlotune.search.evolutionary import TWIN_LADDER_BEST, TWIN_LADDER_LEVELS, score
    from hlotune.search.space import TaskSpace, sample_random
    from tests.cpu.test_gemm_panel import CASES, WIDTHS

    (sg,) = [s for s in hlotune.load_model(CASES["dense_bias_relu"]).frontend.subgraphs if s.workload.flops > 1e6]
    space = TaskSpace(Task(sg.workload.key, sg.workload.compute, WIDTHS["avx512"]))
    (panel,) = [sk for sk in space.sketches if sk.rules == ("gemm_panel",)]
    assert panel.tiles and not panel.sites and all(h.n <= TWIN_LADDER_LEVELS for h in panel.tiles)
    learned = _learned()
    others = [s for s in sample_random(space, random.Random(2), 60) if s.sketch != panel.id]
    learned.fit([(space.task, s, (synthetic_cost(s),)) for s in others[:40]])
    ev = EvolutionarySearch(space, learned, population=64, generations=1, workers=1)
    best = sample_schedules(panel, None, 3, 1)[0]
    ev.observe([best] + others[40:50], [1.0] + [5.0] * 10)
    measured = {s.key for s in [best] + others[40:50]}
    moves = ladder_moves(panel, best)
    assert len(moves) >= 2
    assert [t.key for t in ev.twins(measured, random.Random(0))] == [m.key for m in moves]
    assert [t.key for t in ev.twins(measured | {moves[0].key}, random.Random(0))] == [m.key for m in moves[1:]]
    assert [t.key for t in ev.twins(measured, random.Random(0), room=5)] == [m.key for m in moves[:2]]  # half a part

    big = max(others[:40], key=lambda s: len(ladder_moves(space.sketch_of(s), s)))
    big_moves = ladder_moves(space.sketch_of(big), big)
    assert len(big_moves) > 2 and any(h.n > TWIN_LADDER_LEVELS for h in space.sketch_of(big).tiles)
    ev.observe([big], [0.5])                                             # now the fastest
    keys = {m.key for m in big_moves}
    sc = score(space, learned, big_moves, None)
    ranked = [big_moves[j].key for j in sorted(range(len(big_moves)), key=lambda j: (-sc[j], big_moves[j].key))]
    n = min(TWIN_LADDER_BEST, len(big_moves))
    assert n >= 2 and [t.key for t in ev.twins(measured | {big.key}, random.Random(0)) if t.key in keys] == ranked[:n]
    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_LADDER_BEST", 2)
    assert [t.key for t in ev.twins(measured | {big.key}, random.Random(0)) if t.key in keys] == ranked[:2]
    monkeypatch.setattr("hlotune.search.evolutionary.TWIN_LADDER_BEST", 0)
    assert not keys & {t.key for t in ev.twins(measured | {big.key}, random.Random(0))}
