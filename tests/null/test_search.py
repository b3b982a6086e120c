"""Search: evolutionary search, baselines, task scheduler, tuner loop, reports -- on a synthetic measurer whose
cost is a known function of the schedule (no code generation)."""

from __future__ import annotations

import math
import os
import random
import threading
import time

import numpy as np
import pytest

import hlotune
from hlotune.cost_model.model import CostModel, RandomModel
from hlotune.database import open_database
from hlotune.errors import InputError
from hlotune.measure.records import ErrorKind, MeasureResult
from hlotune.schedule_space.annotate import sample_schedules
from hlotune.schedule_space.loop_ir import ForKind
from hlotune.schedule_space.steps import Annotate, Pragma, Split
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.search.evolutionary import EvolutionarySearch
from hlotune.search.report import build_report
from hlotune.search.scheduler import TaskScheduler
from hlotune.search.space import DEFAULT_SKETCH, TaskSpace, derive_rng, sample_random
from hlotune.search.tuner import parse_duration, tune_model
from hlotune.target import Target
from tests.conftest import model_path

TARGET = Target.host_cpu()


def synthetic_cost(schedule) -> float:
    """A known function of the schedule: tile factors near 4, unroll 64 and a parallel loop are fast."""
    pen = 0.0
    for st in schedule.steps:
        if isinstance(st, Split) and all(isinstance(f, int) for f in st.factors):
            pen += sum((math.log2(f) - 2.0) ** 2 for f in st.factors)
        elif isinstance(st, Pragma):
            pen += 0.0 if st.value == 64 else 1.0
        elif isinstance(st, Annotate) and st.kind is ForKind.PARALLEL:
            pen -= 2.0
    return 1e-4 * 2.0 ** (pen / 4.0)


class SyntheticMeasurer:
    """measure_batch like ProgramMeasurer's, with synthetic costs; records every candidate it was given."""

    def __init__(self, fail=lambda s: False):
        self.fail = fail
        self.seen: list[str] = []

    def measure_batch(self, inputs):
        out = []
        for inp in inputs:
            self.seen.append(inp.schedule.key)
            if self.fail(inp.schedule):
                out.append(MeasureResult((), ErrorKind.RUNTIME, "synthetic failure"))
            else:
                c = synthetic_cost(inp.schedule)
                out.append(MeasureResult((c, c * 1.01, c * 0.99)))
        return out

    def close(self):
        pass


@pytest.fixture(scope="module")
def model():
    return hlotune.load_model(str(model_path("dense_bias_relu")))


@pytest.fixture(scope="module")
def space(model):
    return TaskSpace(tasks_from_subgraphs(model.frontend.subgraphs, TARGET)[0])


def _learned():
    """The XGBoost cost model, made small so that the tests stay fast.  Without the monotone constraint on the
    estimate columns: the synthetic cost is no time (tile factors near 4 are "fast" at any footprint), so the
    estimate's order, right for real kernels, is no prior for it."""
    return CostModel(seed=0, rounds=15, min_samples=16,
                     params={"nthread": 1, "max_depth": 6, "monotone_constraints": "()"})


def _tune(model, db, measurer, **kw):
    opts = dict(trials=64, seed=0, batch_size=16, population=96, generations=2, progress=False, write_log=False,
                cost_model=RandomModel(0))
    opts.update(kw)
    return tune_model(model, db, TARGET, measurer=measurer, **opts)


def _optimum(space) -> float:
    """The best synthetic cost over a large random sample of the space (the reference the search must reach)."""
    return min(synthetic_cost(s) for s in sample_random(space, random.Random(123), 3000))


# ----------------------------------------------------------------------------- evolutionary search

def test_evolutionary_batch_is_new_distinct_and_eps_greedy(space):
    ev = EvolutionarySearch(space, RandomModel(0), population=64, generations=2)
    measured = {s.key for s in sample_random(space, random.Random(5), 40)}
    batch = ev.propose(20, measured, derive_rng(0, 1))
    keys = [s.key for s in batch]
    assert len(batch) == 20 and len(set(keys)) == 20
    assert not set(keys) & measured
    for s in batch:   # every candidate is a valid schedule of one of the task's sketches
        assert s.sketch in space.by_id and s.workload_key == space.task.key
    # reproducible: same rng state, same batch
    again = EvolutionarySearch(space, RandomModel(0), population=64, generations=2).propose(20, measured,
                                                                                           derive_rng(0, 1))
    assert [s.key for s in again] == keys


def test_evolutionary_follows_the_cost_model(space):
    """With an oracle cost model (the synthetic cost itself) the batch is far better than random samples."""
    class Oracle:
        trained = False

        def predict(self, task, schedules):
            return np.array([-math.log(synthetic_cost(s)) for s in schedules])

    ev = EvolutionarySearch(space, Oracle(), population=128, generations=3, eps_greedy=0.0)
    batch = ev.propose(16, set(), derive_rng(0, 2))
    rand = sample_random(space, random.Random(9), 16)
    assert np.median([synthetic_cost(s) for s in batch]) < 0.5 * np.median([synthetic_cost(s) for s in rand])


def test_measured_best_seed_the_population(space):
    ev = EvolutionarySearch(space, RandomModel(0), population=32, generations=0, measured_ratio=0.5)
    good = sample_random(space, random.Random(3), 8)
    ev.observe(good, [synthetic_cost(s) for s in good])
    init, _ = ev._initial(random.Random(0))
    assert {s.key for s in good} <= {s.key for s in init}


# ----------------------------------------------------------------------------- task scheduler

def test_scheduler_gradient_and_early_stopping():
    s = TaskScheduler(weights=[1, 10], flops=[1e6, 1e6], tags=["a", "b"], early_stopping=3, eps_random=0.0)
    rng = random.Random(0)
    assert s.next_task(rng) == 0       # warm-up: every task once, in order
    s.update(0, 4, 1e-3)
    assert s.next_task(rng) == 1
    s.update(1, 4, 1e-3)
    assert s.next_task(rng) == 1       # same latency, ten times the weight: more to gain
    assert math.isclose(s.objective(), 1e-3 + 10e-3)
    s.update(1, 4, 1e-3)               # no improvement for 4 >= 3 trials: stopped
    assert s.states[1].dead and s.next_task(rng) == 0
    s.kill(0, "done")
    assert s.next_task(rng) is None


def test_scheduler_prefers_subgraph_far_below_similar_throughput():
    # same tag, same flops: task 1 is 10x slower than task 0, so it has most to gain
    s = TaskScheduler(weights=[1, 1], flops=[1e6, 1e6], tags=["t", "t"], eps_random=0.0)
    s.restore(0, 50, 1e-4)
    s.restore(1, 50, 1e-3)
    assert s.next_task(random.Random(0)) == 1
    grads = s.gradients()
    assert grads[1] < grads[0] < 0


def test_unmeasured_task_is_most_urgent():
    s = TaskScheduler(weights=[1, 1], flops=[1, 1], tags=["a", "b"], eps_random=0.0)
    s.restore(0, 10, 1e-4)
    s.restore(1, 10, math.inf)
    assert s.next_task(random.Random(0)) == 1


# ----------------------------------------------------------------------------- the tuner loop

def test_search_converges_on_synthetic_measurer(model, space, tmp_path):
    db = open_database(str(tmp_path / "ev.db"))
    meas = SyntheticMeasurer()
    rep = _tune(model, db, meas, trials=96, cost_model=_learned())
    assert rep.total_trials == 96 and len(set(meas.seen)) == 96      # never measured twice
    opt = _optimum(space)
    assert rep.subgraphs[0].best_s <= 1.25 * opt, (rep.subgraphs[0].best_s, opt)
    # at equal trials, random search over the same space does worse
    rdb = open_database(str(tmp_path / "rand.db"))
    rrep = _tune(model, rdb, SyntheticMeasurer(), trials=96, policy="random")
    assert rep.subgraphs[0].best_s < rrep.subgraphs[0].best_s
    # trial 0 is the default schedule, and the report knows it
    first = next(iter(db.records()))
    assert f'"sketch":"{DEFAULT_SKETCH}"' in first.steps
    sg = rep.subgraphs[0]
    assert sg.default_s == pytest.approx(synthetic_cost(space.default))
    assert sg.speedup == pytest.approx(sg.default_s / sg.best_s)
    assert rep.model_latency_s == pytest.approx(sg.best_s)


def test_feature_cache_serves_requests_larger_than_itself(space):
    from hlotune.cost_model.fast_features import batch_features
    from hlotune.search.evolutionary import FeatureCache

    scheds = sample_random(space, random.Random(5), 9)
    cache = FeatureCache(size=4)
    ref = batch_features(space.task.compute, scheds, space.task.key)
    for part in (scheds[:6], scheds[:2] + scheds[6:], scheds):   # hits that are the oldest entries, then all
        got = cache.get_many(space, part)
        want = [ref[scheds.index(x)] for x in part]
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        assert len(cache.data) <= 4


def test_round_is_the_same_whatever_the_number_of_processes(space):
    from hlotune.search.evolutionary import fanout

    model = _learned().fit([(space.task, s, (synthetic_cost(s),)) for s in sample_random(space, random.Random(3), 40)])
    got = []
    for workers in (1, 3):
        ev = EvolutionarySearch(space, model, population=64, generations=2, workers=workers)
        got.append([s.key for s in ev.propose(16, set(), random.Random(11))])
        assert ev.cache.data   # the features made in the forked workers came back into the cache
    assert got[0] == got[1] and len(got[0]) == 16
    # a worker that fails has its share done here
    assert fanout(_maybe_fail, [(k,) for k in range(5)], 3, os.getpid()) == [k * k for k in range(5)]


def _maybe_fail(k: int, parent: int) -> int:
    if os.getpid() != parent:
        os._exit(3)
    return k * k


def test_seeded_runs_propose_the_same_candidates(model, tmp_path):
    runs = []
    for k in range(2):
        meas = SyntheticMeasurer()
        _tune(model, open_database(str(tmp_path / f"r{k}.db")), meas, trials=48, seed=7, cost_model=_learned())
        runs.append(meas.seen)
    assert runs[0] == runs[1]
    meas = SyntheticMeasurer()
    _tune(model, open_database(str(tmp_path / "other.db")), meas, trials=48, seed=8)
    assert meas.seen != runs[0]


def test_resume_continues_and_counts_what_is_done(model, tmp_path):
    path = str(tmp_path / "resume.db")
    m1, m2 = SyntheticMeasurer(), SyntheticMeasurer()
    r1 = _tune(model, open_database(path), m1, trials=32)
    r2 = _tune(model, open_database(path), m2, trials=64)
    assert (r1.trials, r2.trials, r2.total_trials) == (32, 32, 64)
    assert len(set(m1.seen) | set(m2.seen)) == 64           # measured candidates are skipped (only a best
    #                                                         is measured again, to confirm a faster one)
    db = open_database(path)
    keys = {r.schedule_key for r in db.records()}
    assert len(keys) == 64
    assert r2.subgraphs[0].best_s <= r1.subgraphs[0].best_s
    r3 = _tune(model, open_database(path), SyntheticMeasurer(), trials=64)   # budget already spent
    assert r3.trials == 0 and "budget" in r3.stop_reason


class LuckyMeasurer(SyntheticMeasurer):
    """The first timing of a slow schedule (synthetic cost above `slow`) comes out 100x too fast, as one short
    timing on a busy machine can; every later timing of it is its true cost."""

    def __init__(self, slow: float):
        super().__init__()
        self.slow = slow

    def measure_batch(self, inputs):
        out = []
        for inp in inputs:
            c = synthetic_cost(inp.schedule)
            first = inp.schedule.key not in self.seen
            self.seen.append(inp.schedule.key)
            c = c * 0.01 if first and c > self.slow else c
            out.append(MeasureResult((c, c, c)))
        return out


@pytest.mark.parametrize("confirm", [0, 2])
def test_confirmation_keeps_lucky_timings_from_becoming_the_best(model, space, tmp_path, confirm):
    slow = float(np.median([synthetic_cost(s) for s in sample_random(space, random.Random(9), 200)]))
    db = open_database(str(tmp_path / f"c{confirm}.db"))
    meas = LuckyMeasurer(slow)
    rep = _tune(model, db, meas, trials=48, confirm=confirm)
    best = db.best(rep.subgraphs[0].key, TARGET.fingerprint).record
    true_best = min(synthetic_cost(s) for s in _measured_schedules(db))
    if confirm:   # the best record is the truly fastest schedule, and the report agrees with the database
        assert best.median == pytest.approx(true_best)
        assert rep.subgraphs[0].best_s == pytest.approx(best.median)
        assert rep.total_trials == 48 and len({r.schedule_key for r in db.records()}) == 48
    else:         # without confirmation a lucky slow schedule wins (the measurer does fool the tuner)
        assert best.median < true_best


def _measured_schedules(db):
    from hlotune.search.tuner import _schedule_of

    return [_schedule_of(r) for r in db.records() if r.valid]


def test_subgraph_without_valid_schedule_falls_back_to_default(model, tmp_path):
    rep = _tune(model, open_database(str(tmp_path / "f.db")), SyntheticMeasurer(fail=lambda s: True), trials=20)
    sg = rep.subgraphs[0]
    assert sg.fallback and sg.best_s is None and sg.errors == {"runtime": 20}
    assert rep.fallbacks == [sg.name] and "uses the default" in rep.text()


@pytest.mark.parametrize("policy", ["random", "optuna"])
def test_baseline_policies_measure_new_valid_candidates(model, tmp_path, policy):
    pytest.importorskip("optuna") if policy == "optuna" else None
    meas = SyntheticMeasurer()
    rep = _tune(model, open_database(str(tmp_path / f"{policy}.db")), meas, trials=40, policy=policy)
    assert rep.total_trials == 40 and len(set(meas.seen)) == 40
    assert rep.subgraphs[0].valid == 40 and rep.policy == policy


def test_optuna_schedules_replay_and_cover_sketches(space):
    optuna = pytest.importorskip("optuna")
    from hlotune.schedule_space.state import replay
    from hlotune.search.optuna_search import build_schedule

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    sketches = set()
    for _ in range(30):
        t = study.ask()
        s = build_schedule(space, t)
        replay(space.task.compute, s.steps)
        sketches.add(s.sketch)
        study.tell(t, synthetic_cost(s))
    assert len(sketches) >= 2


def test_time_budget_stops_the_run(model, tmp_path):
    rep = _tune(model, open_database(str(tmp_path / "t.db")), SyntheticMeasurer(), trials=None, time_budget=1e-6)
    assert rep.total_trials == 1 and "time budget" in rep.stop_reason   # only trial 0 (the default)


def test_parse_duration():
    assert parse_duration("8h") == 8 * 3600
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90") == 90 and parse_duration(2.5) == 2.5 and parse_duration(None) is None
    for bad in ("soon", "0", "-3m", "5x"):
        with pytest.raises(InputError):
            parse_duration(bad)


# ----------------------------------------------------------------------------- reports

def test_report_curves_and_plot(model, tmp_path):
    path = str(tmp_path / "rep.db")
    meas = SyntheticMeasurer(fail=lambda s: any(isinstance(st, Pragma) and st.value == 512 for st in s.steps))
    tr = _tune(model, open_database(path), meas, trials=40)
    rep = build_report(open_database(path), model=model)
    c = rep.curves[0]
    firsts = {}   # one trial per schedule: a best measured again to confirm a faster one is no new trial
    for r in open_database(path).records():
        firsts.setdefault(r.schedule_key, r)
    costs = [synthetic_cost_of(r) for r in firsts.values()]
    assert c.n == 40 and c.best == list(np.minimum.accumulate(costs))
    assert c.default_s == tr.subgraphs[0].default_s and c.speedup == pytest.approx(c.default_s / c.best_s)
    assert c.errors == tr.subgraphs[0].errors and sum(c.errors.values()) == 40 - c.valid
    assert rep.model_latency_s == pytest.approx(tr.model_latency_s)
    assert "speedup" in rep.text() and rep.to_json()["workloads"][0]["records"] == 40
    pytest.importorskip("matplotlib")
    rep.plot(str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def synthetic_cost_of(rec) -> float:
    return rec.median if rec.valid else math.inf


def test_cli_tune_and_report_errors(tmp_path, capsys):
    from hlotune.cli import main

    assert main(["tune", str(model_path("dense_bias_relu")), "--tuning-log", str(tmp_path / "x.db"),
                 "--time-budget", "soon"]) == 2
    assert "duration" in capsys.readouterr().err
    assert main(["tune", str(tmp_path / "missing.hlo"), "--tuning-log", str(tmp_path / "x.db")]) == 2
    assert main(["report", str(tmp_path / "empty.db")]) == 2
    assert "no records" in capsys.readouterr().err


def test_default_sketch_schedule_is_the_default(space):
    from hlotune.schedule_space.default import default_schedule

    d = space.default
    assert d.sketch == DEFAULT_SKETCH and d.steps == tuple(default_schedule(space.task.compute, TARGET))
    assert sample_schedules(space.by_id[DEFAULT_SKETCH], space.task, 1, 1)[0].key == d.key


@pytest.mark.parametrize("policy", ["evolutionary", "random", "optuna"])
def test_from_scratch_never_sees_the_default(model, space, tmp_path, policy):
    """with_default=False: no trial 0, and no policy proposes the default schedule or its default-like seeds."""
    pytest.importorskip("optuna") if policy == "optuna" else None
    banned = {space.default.key, *(s.key for s in space.seeds)}
    assert len(banned) > 1   # the dense task has default-like seeds, so the check below can fail
    meas = SyntheticMeasurer()
    rep = _tune(model, open_database(str(tmp_path / "s.db")), meas, trials=48, policy=policy, with_default=False)
    assert rep.total_trials == 48 and not banned & set(meas.seen)
    assert rep.subgraphs[0].default_s is None and rep.subgraphs[0].valid == 48
    assert all(s.sketch != DEFAULT_SKETCH for s in _measured_schedules(open_database(str(tmp_path / "s.db"))))
    with_default = SyntheticMeasurer()
    _tune(model, open_database(str(tmp_path / "d.db")), with_default, trials=48, policy=policy)
    assert with_default.seen[0] == space.default.key
    assert policy != "evolutionary" or banned <= set(with_default.seen)   # evolution measures the seeds early


def test_a_hung_search_worker_is_killed_and_its_share_redone(monkeypatch):
    """A forked worker that deadlocks (forked while another thread held a lock) must not hang the round."""
    from hlotune.search import evolutionary

    monkeypatch.setattr(evolutionary, "FANOUT_GRACE", (0.5, 0.0))
    t0 = time.monotonic()
    assert evolutionary.fanout(_hang_in_child, [(k,) for k in range(6)], 3, os.getpid()) == [k + 1 for k in range(6)]
    assert time.monotonic() - t0 < 20


def _hang_in_child(k: int, parent: int) -> int:
    if os.getpid() != parent:
        time.sleep(60)    # bounded: without the deadline the test fails on its time check instead of hanging
    return k + 1


def test_a_finished_worker_is_read_after_the_deadline(monkeypatch):
    """Workers done while the parent redid a hung one's share are read, not killed: only a silent one is."""
    from hlotune.search import evolutionary

    monkeypatch.setattr(evolutionary, "FANOUT_GRACE", (0.5, 0.0))
    got = evolutionary.fanout(_slow_first_child, [(k,) for k in range(3)], 3, os.getpid())
    assert [v for v, _ in got] == [1, 2, 3]
    assert got[1][1] == os.getpid() and got[2][1] not in (os.getpid(), got[1][1])   # job 1 redone, job 2 kept


def _slow_first_child(k: int, parent: int) -> tuple[int, int]:
    if os.getpid() != parent and k == 1:
        time.sleep(60)
    return k + 1, os.getpid()


def test_fork_while_another_thread_holds_a_feature_template(space, monkeypatch):
    """The second target's tuning thread (distributed.tune_targets) may be inside a shared feature template when
    the first forks its search workers: the child must not wait on that template's lock (seen as a hang)."""
    from hlotune.cost_model import fast_features as ff
    from hlotune.search import evolutionary

    scheds = sample_random(space, random.Random(21), 12)
    want = ff.batch_features(space.task.compute, scheds, space.task.key)
    held = [t for t in ff._TEMPLATES.values() if t is not None]
    assert held
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        for t in held:
            t.lock.acquire()
        locked.set()
        release.wait(60)
        for t in held:
            t.lock.release()

    th = threading.Thread(target=hold)
    th.start()
    try:
        assert locked.wait(10)
        monkeypatch.setattr(evolutionary, "FANOUT_GRACE", (30.0, 0.0))
        got = evolutionary.fanout(_features_where, [(k,) for k in range(2)], 2, space, scheds)
    finally:
        release.set()
        th.join()
    pid, feats = got[1]
    assert pid != os.getpid()   # made in the forked worker, not redone here after a timeout
    assert len(feats) == len(want) and all(np.array_equal(a, b) for a, b in zip(feats, want))


def _features_where(k: int, space, scheds) -> tuple[int, list | None]:
    """(pid, features of `scheds`) for job 1 (the forked worker's); job 0 is the parent's, which would wait for
    the locks the other thread holds: it computes nothing."""
    from hlotune.cost_model.fast_features import batch_features

    if k == 0:
        return os.getpid(), None
    return os.getpid(), batch_features(space.task.compute, scheds, space.task.key)
