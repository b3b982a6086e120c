"""`hlotune tune`: tune every subgraph of a model, writing each measured batch to the tuning database.

Map:
  tune_model(model, db, target, ...) -> TuneReport   the loop (api.tune opens the model and calls it)
  TuneReport / SubgraphReport                        what a run did: per subgraph best / default latency,
                                                     trials, error kinds; estimated whole-model latency
  parse_duration("8h") -> seconds                    30s, 15m, 8h, 1h30m, 2d or a number of seconds
  make_cost_model(path, seed, target)                a pretrained model (--cost-model; by default the one shipped
                                                     for the CPU, BUILTIN_MODEL) or a fresh XGBoost one
  POLICIES                                           evolutionary | random | optuna

One run:
  1. tasks = the distinct workloads of the model; what the database already holds for them on this target
     (measured schedule keys, best, trial counts) is read first: a second run continues the first.
  2. trial 0: the default schedule of every task not yet measured (one batch), so "speedup over the default"
     is a measurement and a subgraph whose search finds nothing valid still has its (measured) default.
  3. the cost model is warm-started from the database's records of these tasks (and `--cost-model` loads a
     pretrained one); the policies are seeded with the best measured schedules.
  4. rounds until the trial budget (counting the trials already in the database), the time budget (counting
     earlier runs' time, kept in a state file under the log dir) or every task has stopped: the task
     scheduler picks a task, its policy proposes a batch (never a measured schedule), the batch is
     measured, its records are committed to the database in one transaction (so a kill loses at most the
     batch in flight), then the cost model, the policy and the scheduler learn the results.  The runner is
     given each task's best (`set_best`): a candidate whose first timed repeat is already `measure_cutoff`
     times slower stops there.
  5. pipelined (`tune_pipeline`: on cuda, or when the CPU runner times at real-time priority): batch k is
     measured by a background thread while the main thread searches batch k+1 (knowing batches up to k-1,
     excluding batch k's candidates); batch k is then committed, batch k+1 submitted, and the cost model
     learns batch k while batch k+1 is measured.  The trials in flight count for the budget and for the
     random streams (seeded runs stay reproducible); a batch proposed when the budget has run out is dropped.
     The search must not share the cores with a timing as an equal: a tuner itself at real-time priority
     (`chrt`) gives the runner its priority and puts itself (search, cost model) at normal priority for the
     run (`_realtime_timing_only`; builders always build at normal priority): the kernel's RT throttling
     would otherwise stall the timing when real-time work fills the cores.  Ctrl-C loses the batch in flight
     (the measurer is told to abort) and is never lost itself (`_CtrlC`: the search forks).
  6. a fresh task's first round, when the cost model already ranks (the pretrained one), is measured in parts
     (`tune_warmup`, default 8, 8, 16, 16): after each part the model learns it and the rest of the round's
     candidates are ranked again (`rerank`), except once, when WARM_EVOLVE_AFTER trials are known, where a new
     evolution from the measured bests proposes them; so the run's own measurements steer the round at once.
     Pipelined with one task, the default schedule is measured while the first round is searched.
Each run writes a JSON-lines log `tune-<model>-<time>.jsonl` under the log dir (one line per batch).
Randomness: every round draws from `derive_rng(seed, trials so far, task)`, so a seeded run proposes the same
candidates when the measurements are the same.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import config
from ..errors import HlotuneError, InputError
from ..measure.records import MeasureInput
from ..measure.workers import REALTIME, thread_ids
from ..schedule_space.steps import Schedule, schedule_from_json
from ..schedule_space.task import Task, tasks_from_subgraphs
from ..target import Target
from .progress import Progress, fmt_latency, fmt_time
from .records import to_record
from .scheduler import TaskScheduler
from .space import TaskSpace, derive_rng

POLICIES = ("evolutionary", "random", "optuna")
DEFAULT_TRIALS = 1000
#: a fresh task's first round in parts (setting tune_warmup): once this many of its trials are measured, the rest
#: of the round comes from a new evolution (seeded with the measured bests, scored by the model that learnt them)
#: instead of the first evolution's candidates ranked again
WARM_EVOLVE_AFTER = 16
#: ... and each of its first this many parts holds every sketch's and every annotation structure's best candidate
#: as the model ranks it then (a pretrained model can rank one sketch, or one structure such as a serial GEMM, far
#: too high on a new task).  2 was tried (logs/search_s5b): no better
WARM_SKETCH_PARTS = 1
#: per-subgraph early stopping: trials without improvement
DEFAULT_EARLY_STOPPING = 256


# ----------------------------------------------------------------------------- reports

@dataclass
class SubgraphReport:
    """One tuned subgraph (distinct workload)."""

    name: str
    key: str
    weight: int
    flops: float
    trials: int = 0
    valid: int = 0
    best_s: float | None = None
    default_s: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    stopped: str = ""

    @property
    def fallback(self) -> bool:
        """No valid tuned schedule: the subgraph uses its default schedule."""
        return self.best_s is None

    @property
    def latency_s(self) -> float | None:
        return self.best_s if self.best_s is not None else self.default_s

    @property
    def speedup(self) -> float | None:
        if self.best_s and self.default_s:
            return self.default_s / self.best_s
        return None


@dataclass
class TuneReport:
    """What `tune` did: per subgraph and for the whole model (estimated as sum of weight x latency)."""

    model: str
    target: str
    tuning_log: str
    policy: str
    seed: int
    trials: int = 0                 # measured in this run
    total_trials: int = 0           # in the database for this model and target, this run included
    elapsed_s: float = 0.0          # this run
    total_elapsed_s: float = 0.0    # all runs on this database (the time budget counts it)
    search_s: float = 0.0
    measure_s: float = 0.0
    train_s: float = 0.0            # cost model training
    stop_reason: str = ""
    interrupted: bool = False
    pipelined: bool = False         # the next batch was searched while one was measured (setting tune_pipeline)
    log_file: str = ""
    subgraphs: list[SubgraphReport] = field(default_factory=list)

    @property
    def model_latency_s(self) -> float | None:
        """Estimated whole-model latency: sum of weight x (best, else default) latency; None if unknown."""
        vals = [(s.weight, s.latency_s) for s in self.subgraphs]
        if not vals or any(v is None for _, v in vals):
            return None
        return sum(w * v for w, v in vals)

    @property
    def default_latency_s(self) -> float | None:
        vals = [(s.weight, s.default_s) for s in self.subgraphs]
        if not vals or any(v is None for _, v in vals):
            return None
        return sum(w * v for w, v in vals)

    @property
    def speedup(self) -> float | None:
        m, d = self.model_latency_s, self.default_latency_s
        return d / m if m and d else None

    @property
    def fallbacks(self) -> list[str]:
        """Subgraphs without any valid tuned schedule (they use their default)."""
        return [s.name for s in self.subgraphs if s.fallback]

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(model_latency_s=self.model_latency_s, default_latency_s=self.default_latency_s,
                 speedup=self.speedup, fallbacks=self.fallbacks)
        return d

    def text(self) -> str:
        lines = [f"tuned {self.model} on {self.target} ({self.policy}, seed {self.seed}): {self.trials} trials in "
                 f"{fmt_time(self.elapsed_s)} (database total {self.total_trials} trials, "
                 f"{fmt_time(self.total_elapsed_s)}); stopped: {self.stop_reason}"]
        lines.append(f"  {'subgraph':28s} {'weight':>6s} {'trials':>6s} {'valid':>5s} {'default':>12s} "
                     f"{'best':>12s} {'speedup':>8s}  errors")
        for s in self.subgraphs:
            sp = f"{s.speedup:.2f}x" if s.speedup else "-"
            errs = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "-"
            note = "  (no valid schedule: uses the default)" if s.fallback else ""
            note += f"  [stopped: {s.stopped}]" if s.stopped else ""
            lines.append(f"  {s.name[:28]:28s} {s.weight:6d} {s.trials:6d} {s.valid:5d} "
                         f"{fmt_latency(s.default_s):>12s} {fmt_latency(s.best_s):>12s} {sp:>8s}  {errs}{note}")
        sp = f"{self.speedup:.2f}x" if self.speedup else "-"
        lines.append(f"  estimated model latency: {fmt_latency(self.model_latency_s)} "
                     f"(default schedules {fmt_latency(self.default_latency_s)}, speedup {sp})")
        lines.append(f"  time: search {fmt_time(self.search_s)}, measurement {fmt_time(self.measure_s)} "
                     f"(cost model training {fmt_time(self.train_s)})")
        if self.log_file:
            lines.append(f"  log: {self.log_file}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- helpers

_DURATION = re.compile(r"(\d+(?:\.\d*)?)\s*([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: Any) -> float | None:
    """Seconds from 30s / 15m / 8h / 1h30m / 2d / a number of seconds (None stays None)."""
    if text is None:
        return None
    if isinstance(text, int | float):
        v = float(text)
    else:
        t = str(text).strip().lower()
        try:
            v = float(t)
        except ValueError:
            parts = _DURATION.findall(t)
            if not parts or _DURATION.sub("", t).strip():
                raise InputError(f"cannot read the duration {text!r} (use e.g. 90s, 15m, 8h, 1h30m)") from None
            v = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"the time budget must be positive, got {text!r}")
    return v


#: the CPU cost model shipped with hlotune: trained on random schedules of the fixture subgraphs measured on a
#: 2-core AVX-512 machine (benchmarks/make_cost_model_data.py, then `hlotune cost-model train`; docs/cost_model.md)
BUILTIN_MODEL = Path(__file__).resolve().parent.parent / "data" / "cost_model_cpu.json"


def make_cost_model(path: str | None = None, seed: int = 0, target: Target | None = None):
    """The cost model a search starts from.  `path`: a pretrained model file; "none": a fresh XGBoost model
    (random until it has data); None or "auto": the setting `cost_model` (default "auto": the model shipped with
    hlotune on a CPU target, a fresh one elsewhere or when the shipped file does not fit this hlotune, with a
    warning).  The random model when xgboost is not installed."""
    from ..cost_model.model import CostModel, RandomModel

    path = config.get("cost_model") if path in (None, "") else path
    try:
        import xgboost  # noqa: F401
    except ImportError:
        warnings.warn("xgboost is not installed: the search uses a random cost model "
                      "(pip install 'hlotune[search]')", stacklevel=2)
        return RandomModel(seed)
    if str(path).lower() == "auto":
        return _builtin_model(seed, target)
    if str(path).lower() == "none":
        return CostModel(seed=seed)
    return CostModel.load(path)


def _builtin_model(seed: int, target: Target | None):
    from ..cost_model.model import CostModel

    if (target is not None and target.kind != "cpu") or not BUILTIN_MODEL.is_file():
        return CostModel(seed=seed)
    try:
        return CostModel.load(BUILTIN_MODEL)
    except HlotuneError as e:   # a feature version this file predates: start cold rather than fail
        warnings.warn(f"the shipped cost model cannot be used ({e}); starting from a fresh model", stacklevel=3)
        return CostModel(seed=seed)


def _ranks(model) -> bool:
    """Whether `model` ranks candidates before this run measured anything (a pretrained or trained model)."""
    from .evolutionary import _informative
    return model is not None and _informative(model)


def _model_update(model, samples, fit: bool = False) -> None:
    if not samples or not hasattr(model, "update"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (model.fit if fit else model.update)(samples)


def _make_policy(name: str, space: TaskSpace, model, seed: int, i: int, population: int, generations: int):
    if name == "evolutionary":
        from .evolutionary import EvolutionarySearch
        return EvolutionarySearch(space, model, population=population, generations=generations)
    if name == "random":
        from .random_search import RandomSearch
        return RandomSearch(space)
    if name == "optuna":
        from .optuna_search import OptunaSearch
        return OptunaSearch(space, seed=int(derive_rng(seed, "optuna", i).getrandbits(31)))
    raise InputError(f"unknown search policy {name!r} (one of {', '.join(POLICIES)})")


def _schedule_of(rec) -> Schedule | None:
    try:
        d = json.loads(rec.steps)
        s = schedule_from_json(d if isinstance(d, dict) else {"workload_key": rec.workload_key, "steps": d})
        return Schedule(rec.workload_key, s.steps, s.sketch)
    except Exception:  # a record of another schedule format: not usable as a seed
        return None


class _RunLog:
    """The JSON-lines log of one run, and the state file that carries the time used across runs."""

    def __init__(self, log_dir: str, model_name: str, ident: str, enabled: bool = True):
        self.enabled = enabled
        self.path = ""
        self.state_path = ""
        self._fh = None
        if not enabled:
            return
        os.makedirs(log_dir, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_name)[:60] or "model"
        self.path = os.path.join(log_dir, f"tune-{safe}-{stamp}-{os.getpid()}.jsonl")
        self.state_path = os.path.join(log_dir, f".tune-state-{ident}.json")
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def elapsed_before(self) -> float:
        if not self.state_path or not os.path.exists(self.state_path):
            return 0.0
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                return float(json.load(fh).get("elapsed_s", 0.0))
        except (OSError, ValueError, TypeError, AttributeError):
            return 0.0

    def save_state(self, elapsed: float, trials: int) -> None:
        if not self.state_path:
            return
        tmp = self.state_path + f".{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"elapsed_s": elapsed, "trials": trials, "time": time.time()}, fh)
        os.replace(tmp, self.state_path)

    def write(self, event: str, **kw) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps({"event": event, "time": time.time(), **kw}, default=str) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class _TaskRun:
    task: Task
    space: TaskSpace
    measured: set[str] = field(default_factory=set)
    trials: int = 0
    valid: int = 0
    best: float = math.inf
    default: float | None = None
    errors: Counter = field(default_factory=Counter)
    policy: Any = None
    best_schedule: Schedule | None = None

    def add(self, sched_key: str, cost: float, error_kind: str, schedule: Schedule | None = None) -> None:
        """One record of this task; a schedule measured again (a confirmation) is not a new trial, and the
        best is the lowest median over all records (the database's rule)."""
        if sched_key in self.measured:
            if error_kind == "none" and math.isfinite(cost) and cost < self.best:
                self.best, self.best_schedule = cost, schedule or self.best_schedule
            return
        self.measured.add(sched_key)
        self.trials += 1
        if error_kind == "none" and math.isfinite(cost):
            self.valid += 1
            if cost < self.best:
                self.best, self.best_schedule = cost, schedule
            if self.space.default is not None and sched_key == self.space.default.key:
                self.default = cost
        else:
            self.errors[error_kind] += 1


# ----------------------------------------------------------------------------- the loop

def tune_model(model, db, target: Target, *, trials: int | None = None, time_budget: float | None = None,
               seed: int = 0, workers: int | None = None, cost_model: Any = None, policy: str = "evolutionary",
               batch_size: int = 64, population: int = 2048, generations: int = 4,
               early_stopping: int | None = DEFAULT_EARLY_STOPPING, timing=None, measurer=None, confirm: int = 2,
               progress: bool = True, stream=None, log_dir: str | None = None, write_log: bool = True,
               db_location: str = "", pipeline: str | bool | None = None, with_default: bool = True) -> TuneReport:
    """Tune `model` (a loaded `api.Model`) into the open database `db` (see the module docstring).  `pipeline`:
    search the next batch while one is measured, "auto" | "on" | "off" or a bool (None: setting `tune_pipeline`;
    auto: on cuda, or on the CPU when the runner times at real-time priority).  `with_default=False` searches
    from scratch: no trial 0, and no policy sees the default schedule or its default-like seeds (to compare
    search policies alone; the report then has no default latency)."""
    pipeline = _pipeline_mode(pipeline)
    if policy not in POLICIES:
        raise InputError(f"unknown search policy {policy!r} (one of {', '.join(POLICIES)})")
    if trials is not None and trials < 0:
        raise InputError(f"--trials must be at least 0, got {trials}")
    if batch_size < 1:
        raise InputError(f"the batch size must be at least 1, got {batch_size}")
    if trials is None and time_budget is None:
        trials = DEFAULT_TRIALS
    t_start = time.perf_counter()
    tasks = tasks_from_subgraphs(model.frontend.subgraphs, target)
    fp = target.fingerprint
    runs = [_TaskRun(t, TaskSpace(t, with_default)) for t in tasks]
    ident = hashlib.sha256("|".join([db_location or repr(db), fp, *sorted(t.key for t in tasks)]).encode()
                           ).hexdigest()[:16]
    log = _RunLog(log_dir or str(config.get("log_dir")), model.name, ident, enabled=write_log)
    report = TuneReport(model.name, fp, db_location or getattr(db, "location", ""), policy, seed,
                        log_file=log.path)

    # 1. what the database holds
    history: list[tuple[int, Any]] = []
    for i, r in enumerate(runs):
        for rec in db.records(r.task.key, target=fp):
            cost = rec.median if rec.valid else math.inf
            r.add(rec.schedule_key, cost, rec.error_kind, _schedule_of(rec) if cost < r.best else None)
            history.append((i, rec))
    total0 = sum(r.trials for r in runs)
    elapsed0 = log.elapsed_before() if total0 else 0.0   # a state file of a database since deleted counts nothing
    if not write_log and history:   # no state file: estimate the earlier time from the records
        elapsed0 = sum(rec.build_s + rec.run_s for _, rec in history)
    sched = TaskScheduler([t.weight for t in tasks], [t.flops for t in tasks], [r.space.tag for r in runs],
                          early_stopping=early_stopping)
    for i, r in enumerate(runs):
        sched.restore(i, r.trials, r.best)
    prog = Progress(trials, time_budget, stream=stream, enabled=progress)
    prog.start(total0, elapsed0)
    log.write("start", model=model.name, target=fp, policy=policy, seed=seed, trials=trials,
              time_budget=time_budget, tasks=[t.key for t in tasks], trials_before=total0, elapsed_before=elapsed0)

    own_measurer = measurer is None
    cmodel = None
    done = 0
    pipelined: bool | None = None   # decided at the first round's batch (the runner must be started to know)
    pending: _Batch | None = None    # the batch being measured while the next one is searched
    trial0: tuple | None = None      # (todo, job): the default schedules measured while the first round is searched
    warm_sizes: tuple[int, ...] = tuple(config.get("tune_warmup"))
    restore: list[tuple] = []        # what _realtime_timing_only and _search_beside_measurement changed
    rt_how: str | None = None        # what _realtime_timing_only did (None: not yet asked)

    def elapsed() -> float:
        return elapsed0 + time.perf_counter() - t_start

    def total() -> int:
        return total0 + done

    def defaults() -> list[float]:
        return [r.default if r.default is not None else math.inf for r in runs]

    def get_measurer():
        nonlocal measurer, rt_how
        if measurer is None:
            measurer = _default_measurer(workers, timing, seed, target)
        if rt_how is None:   # once, before anything is measured
            old, rt_how = _realtime_timing_only(measurer)
            restore.append((old, None))
        return measurer

    def run_batch(m, i_of: list[int], scheds: list[Schedule]):
        """Measure a batch and confirm its new bests (the measuring thread's work when pipelined: it reads the
        tasks' state, which only the main thread changes, in commit, and never while a batch is in flight)."""
        t0 = time.perf_counter()
        _limit_run_time(m, [runs[i] for i in set(i_of)])
        _set_best(m, [runs[i] for i in set(i_of)])
        inputs = [MeasureInput(runs[i].task, s) for i, s in zip(i_of, scheds)]
        results = m.measure_batch(inputs)
        again = _confirm(m, runs, i_of, inputs, results, confirm) if confirm else []
        return inputs, results, again, time.perf_counter() - t0

    def commit(i_of: list[int], measured) -> list[float]:
        """A measured batch into the database (one transaction: a kill loses at most what is in flight), then
        into the tasks' state."""
        nonlocal done
        inputs, results, again, t_meas = measured
        t0 = time.perf_counter()
        records = [to_record(inp, res) for inp, res in zip(inputs, results)]
        db.add_many(records + [to_record(inp, res) for _, inp, res in again])   # one transaction
        report.measure_s += t_meas + time.perf_counter() - t0
        done += len(records)
        costs = []
        for i, inp, res in zip(i_of, inputs, results):
            c = res.median if res.valid else math.inf
            runs[i].add(inp.schedule.key, c, res.error_kind.value, inp.schedule)
            costs.append(c)
        for i, inp, res in again:
            runs[i].add(inp.schedule.key, res.median, res.error_kind.value, inp.schedule)
        log.save_state(elapsed(), total())
        return costs

    def learn(measured) -> None:
        inputs, results = measured[:2]
        if cmodel is not None:
            t1 = time.perf_counter()
            _model_update(cmodel, [(inp.task, inp.schedule, tuple(res.costs) if res.valid else ())
                                   for inp, res in zip(inputs, results)])
            report.train_s += time.perf_counter() - t1

    def measure(i_of: list[int], scheds: list[Schedule]) -> list[float]:
        measured = run_batch(get_measurer(), i_of, scheds)
        costs = commit(i_of, measured)
        learn(measured)
        return costs

    def decide_pipeline(m) -> bool:
        nonlocal pipelined
        if pipelined is None:
            pipelined = report.pipelined = _pipelined(pipeline, m, target)
            if pipelined:
                restore.append((None, _search_beside_measurement()))
            log.write("pipeline", on=pipelined, priority=rt_how or "")
        return pipelined

    def submit(b: _Batch) -> _Batch:
        m = get_measurer()
        b.job = _Job(run_batch, (m, [b.i] * len(b.cands), b.cands), background=decide_pipeline(m))
        b.best_before = runs[b.i].best
        return b

    def defaults_done(todo: list[tuple[int, Schedule]], costs: list[float]) -> None:
        for i, _ in todo:
            sched.restore(i, runs[i].trials, runs[i].best)
        log.write("defaults", trials_total=total(), elapsed_s=elapsed(),
                  defaults={runs[i].task.name: c for (i, _), c in zip(todo, costs)})
        sched.defaults = defaults()

    def settle_defaults() -> None:
        """The default schedules measured beside the first round's search: commit, learn, tell the policies."""
        nonlocal trial0
        todo, job = trial0
        trial0 = None
        measured = job.result(ctrl_c.check)
        costs = commit([i for i, _ in todo], measured)
        learn(measured)
        defaults_done(todo, costs)
        for (i, s), c in zip(todo, costs):
            if runs[i].policy is not None:
                runs[i].policy.observe([s], [c])

    def settle(b: _Batch):
        """Wait for a batch, commit it, tell its policy and the scheduler: (costs, the measured batch)."""
        measured = b.job.result(ctrl_c.check)
        costs = commit([b.i] * len(b.cands), measured)
        r = runs[b.i]
        r.policy.observe(b.cands, costs)
        sched.update(b.i, len(b.cands), r.best)
        sched.defaults = defaults()
        return costs, measured

    def wrap_up(b: _Batch, costs: list[float], measured) -> None:
        """After a batch: the cost model learns it (while the next batch is measured, when pipelined), the log
        line, the progress bar."""
        learn(measured)
        r = runs[b.i]
        log.write("batch", task=r.task.name, key=r.task.key, n=len(b.cands),
                  valid=sum(math.isfinite(c) for c in costs), best_s=r.best if math.isfinite(r.best) else None,
                  trials_total=total(), elapsed_s=elapsed(), search_s=b.t_search, train_s_total=report.train_s,
                  model_s=sched.objective(), search_stats=b.stats)
        if r.best < b.best_before:
            sp = f" ({r.default / r.best:.2f}x over default)" if r.default else ""
            prog.line(f"  {r.task.name}: best {fmt_latency(r.best)}{sp}")
        if sched.states[b.i].dead:
            prog.line(f"  {r.task.name}: stopped ({sched.states[b.i].dead})")
        prog.update(total(), elapsed(), sched.objective(), _sum_default(runs))

    def flush() -> None:
        nonlocal pending
        b, pending = pending, None
        if b is not None:
            wrap_up(b, *settle(b))

    def drain() -> bool:
        """Settle what is in flight (the defaults first); False when nothing was."""
        if trial0 is not None:
            settle_defaults()
        elif pending is not None:
            flush()
        else:
            return False
        return True

    def warm_up(i: int, cands: list[Schedule], stats: dict) -> list[Schedule]:
        """A fresh task's first round, ranked by a model that already ranks (pretrained), measured in parts
        (setting tune_warmup), each sketch's and each annotation structure's best candidate in each of the first
        WARM_SKETCH_PARTS parts (`sketch_bests_first`): after each part the model learns it and ranks the rest of
        the round's candidates again (`rerank`: no new evolution), except once, past WARM_EVOLVE_AFTER trials,
        where a new evolution proposes them.  Each later part starts with the measured bests' `twins` (their
        packing toggled, the model's best outward moves of the fastest, the fastest's other unroll pragmas and
        its tile ladder, in at most half of the next part).  Returns what is left of the round, for the usual
        path."""
        nonlocal pending
        r = runs[i]
        evolved = False
        for part, size in enumerate(warm_sizes):
            if len(cands) <= size:
                break
            if part < WARM_SKETCH_PARTS:   # every sketch's best (as the model ranks now) in this part
                cands = r.policy.sketch_bests_first(cands)
            ctrl_c.check()
            if trial0 is not None:
                settle_defaults()
            left = len(cands) - size
            pending = submit(_Batch(i, cands[:size], 0.0, stats))
            flush()
            t0 = time.perf_counter()
            if not evolved and r.trials > WARM_EVOLVE_AFTER:   # once: evolve from what was measured
                cands, evolved = r.policy.propose(left, r.measured, derive_rng(seed, "warm", total(), i)), True
            else:
                cands = r.policy.rerank(left, r.measured, derive_rng(seed, "rerank", total(), i))
            room = warm_sizes[part + 1] if part + 1 < len(warm_sizes) else left
            twins = r.policy.twins(r.measured, derive_rng(seed, "twins", total(), i), room)
            if twins:   # the bests' packing twins, outward and unroll moves go first
                keys = {t.key for t in twins}
                cands = (twins + [c for c in cands if c.key not in keys])[: max(left, len(twins))]
            report.search_s += time.perf_counter() - t0
        return cands

    def time_cut(cands: list[Schedule]) -> tuple[list[Schedule], str]:
        """A pipelined batch proposed while the last was measured, cut to the time budget left ("": none left)."""
        if time_budget is None:
            return cands, ""
        per = (report.measure_s + report.train_s) / max(1, done)
        left = time_budget - elapsed()
        if left <= 0 or left < per:
            return [], f"time budget ({fmt_time(time_budget)}) reached"
        return cands[: max(1, int(left / per))], ""

    if policy == "evolutionary":   # loaded before anything is measured: a bad --cost-model fails at once
        cmodel = cost_model if cost_model is not None and not isinstance(cost_model, str) else \
            make_cost_model(cost_model, seed, target)
        samples = []
        for i, rec in history:
            s = _schedule_of(rec)
            if s is not None:
                samples.append((runs[i].task, s, tuple(rec.costs) if rec.valid else ()))
        t1 = time.perf_counter()
        _model_update(cmodel, samples, fit=not getattr(cmodel, "pretrained", False))
        report.train_s += time.perf_counter() - t1
    stop = ""
    ctrl_c = _CtrlC().__enter__()
    try:
        # 2. trial 0: default schedules.  Pipelined with one task, its first round is searched meanwhile (which
        # task goes first depends on the defaults' latencies only when there are several)
        todo = [(i, r.space.default) for i, r in enumerate(runs)
                if r.space.default is not None and r.space.default.key not in r.measured]
        if todo and (trials is None or total() < trials):
            todo = todo[: (trials - total()) if trials is not None else None]
            i_of, scheds = [i for i, _ in todo], [s for _, s in todo]
            if len(runs) == 1 and decide_pipeline(get_measurer()):
                trial0 = (todo, _Job(run_batch, (get_measurer(), i_of, scheds), background=True))
            else:
                defaults_done(todo, measure(i_of, scheds))
        sched.defaults = defaults()

        # 3. cost model and policies
        for i, r in enumerate(runs):
            r.policy = _make_policy(policy, r.space, cmodel, seed, i, population, generations)
            top = db.top_k(r.task.key, fp, 64)
            seeds = [(s, rec.median) for rec in top if (s := _schedule_of(rec)) is not None]
            if seeds:
                r.policy.observe([s for s, _ in seeds], [c for _, c in seeds])

        # 4. rounds.  Pipelined, batch k+1 is searched while batch k is measured (by a background thread), with
        # everything up to batch k-1 learnt and batch k's candidates excluded; then batch k is committed and
        # batch k+1 submitted.  The trials in flight count for the budget and the random streams, so a seeded
        # run proposes the same candidates; a batch proposed when the budget has run out is dropped.
        rounds = 0
        prog.update(total(), elapsed(), sched.objective(), _sum_default(runs))
        while True:
            ctrl_c.check()
            flying = len(pending.cands) if pending is not None else 0
            flying += len(trial0[0]) if trial0 is not None else 0
            if trials is not None and total() + flying >= trials:
                if drain():
                    continue
                stop = f"trial budget ({trials}) reached"
                break
            if time_budget is not None and elapsed() >= time_budget:
                if drain():
                    continue
                stop = f"time budget ({fmt_time(time_budget)}) reached"
                break
            i = sched.next_task(derive_rng(seed, "task", total() + flying))
            if i is None:   # every task stopped, or the scheduler has not seen the batch in flight yet
                if drain():
                    continue
                stop = "every subgraph stopped"
                break
            r = runs[i]
            warm = bool(warm_sizes) and r.trials <= 1 and hasattr(r.policy, "rerank") and _ranks(cmodel)
            if warm and pending is not None:   # the first round in parts learns everything measured before it
                flush()
                continue
            n = batch_size if trials is None else min(batch_size, trials - total() - flying)
            if time_budget is not None and done and rounds and pending is None:
                # a smaller last batch rather than overshooting the time budget much
                per = (report.measure_s + report.train_s) / done
                left = time_budget - elapsed() - report.search_s / rounds
                if left < per:
                    stop = f"time budget ({fmt_time(time_budget)}) reached"
                    break
                n = max(1, min(n, int(left / per)))
            rounds += 1
            busy = r.measured | pending.keys if pending is not None and pending.i == i else r.measured
            if trial0 is not None:
                busy = busy | {sd.key for j, sd in trial0[0] if j == i}
            t0 = time.perf_counter()
            cands = r.policy.propose(n, busy, derive_rng(seed, "round", total() + flying, i))
            t_search = time.perf_counter() - t0
            report.search_s += t_search
            ctrl_c.check()
            if not cands:
                sched.kill(i, "search space exhausted")
                prog.line(f"  {r.task.name}: nothing new to measure (search space exhausted)")
                continue
            stats = dict(getattr(r.policy, "stats", {}) or {})
            if warm:
                cands = warm_up(i, cands, stats)
                if not cands:
                    continue
            nxt = _Batch(i, cands, t_search, stats)
            if pending is not None:
                # batch k: commit it; then batch k+1 goes to the measurer (unless the budget or its task ended
                # meanwhile) before the cost model learns batch k
                b, pending = pending, None
                costs, measured = settle(b)
                nxt.cands, why = time_cut(nxt.cands)
                if not why and not sched.states[i].dead:
                    pending = submit(nxt)
                wrap_up(b, costs, measured)
                if why:
                    stop = why
                    break
                continue
            if trial0 is not None:
                settle_defaults()
            pending = submit(nxt)
            if not pipelined:
                flush()
    except KeyboardInterrupt:
        stop = "interrupted"
        report.interrupted = True
    finally:
        ctrl_c.__exit__()
        if pending is not None and pending.job is not None:   # lost: it was never committed
            pending.job.abandon(measurer)
        if trial0 is not None:
            trial0[1].abandon(measurer)
        for sched_param, interval in restore:
            _restore_search(sched_param, interval)
        prog.close()
        if own_measurer and measurer is not None:
            measurer.close()
        report.trials = done
        report.total_trials = total()
        report.elapsed_s = time.perf_counter() - t_start
        report.total_elapsed_s = elapsed()
        report.stop_reason = stop
        for i, r in enumerate(runs):
            report.subgraphs.append(SubgraphReport(
                r.task.name, r.task.key, r.task.weight, r.task.flops, r.trials, r.valid,
                r.best if math.isfinite(r.best) else None, r.default, dict(r.errors), sched.states[i].dead))
        log.save_state(elapsed(), total())
        log.write("end", stop=stop, trials=done, trials_total=total(), elapsed_s=elapsed(),
                  model_s=report.model_latency_s, default_s=report.default_latency_s,
                  fallbacks=report.fallbacks, pipelined=bool(pipelined))
        log.close()
    return report


@dataclass
class _Batch:
    """A round's candidates (one task) on their way through the measurer."""

    i: int
    cands: list[Schedule]
    t_search: float
    stats: dict
    best_before: float = math.inf
    job: _Job | None = None

    @property
    def keys(self) -> set[str]:
        return {s.key for s in self.cands}


#: after Ctrl-C, how long the tuner waits for its measuring thread to stop (the measurer is told to abort)
ABANDON_WAIT = 15.0


class _Job:
    """fn(*args), in a background thread (`background`) or at once; `result()` waits for it and raises what it
    raised (a KeyboardInterrupt from the measurer included)."""

    def __init__(self, fn, args: tuple, background: bool):
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        if not background:
            self.value = fn(*args)
            return
        self.thread = threading.Thread(target=self._run, args=(fn, args), name="hlotune-measure", daemon=True)
        self.thread.start()

    def _run(self, fn, args: tuple) -> None:
        try:
            self.value = fn(*args)
        except BaseException as e:  # noqa: BLE001 - raised again in the main thread by result()
            self.error = e

    def result(self, check=None) -> Any:
        while self.thread is not None and self.thread.is_alive():
            self.thread.join(0.1)   # short waits: Ctrl-C reaches the main thread at once
            if check is not None:
                check()
        if self.error is not None:
            raise self.error
        return self.value

    def abandon(self, measurer) -> None:
        """The batch will not be committed (Ctrl-C, an error): tell the measurer to stop where it can
        (ProgramMeasurer.abort) and give the thread a while to end before the measurer is closed."""
        if self.thread is None or not self.thread.is_alive():
            return
        abort = getattr(measurer, "abort", None)
        if callable(abort):
            abort()
        self.thread.join(ABANDON_WAIT)


class _CtrlC:
    """Ctrl-C that is not lost.  A KeyboardInterrupt raised inside code whose exceptions Python ignores (an at-fork
    handler: the evolutionary search forks its workers many times a round; a __del__) vanishes, and the run would
    go on.  While tune_model runs in the main thread with Python's default handler, SIGINT also sets a flag, and
    `check()` (between steps of the loop) raises KeyboardInterrupt again when it was set; such an ignored
    KeyboardInterrupt is not printed either (sys.unraisablehook, for the run)."""

    def __init__(self):
        self.hit = False
        self.previous: Any = None
        self.hook: Any = None

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.previous = signal.signal(signal.SIGINT, self._handler)
            self.hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def _handler(self, signum, frame) -> None:
        self.hit = True
        raise KeyboardInterrupt

    def _unraisable(self, info) -> None:
        if not (self.hit and isinstance(info.exc_value, KeyboardInterrupt)):
            (self.hook or sys.__unraisablehook__)(info)

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            sys.unraisablehook = self.hook
            self.previous = self.hook = None


def _pipeline_mode(mode: str | bool | None) -> str:
    if mode is None:
        mode = config.get("tune_pipeline")
    if isinstance(mode, bool):
        return "on" if mode else "off"
    low = str(mode).strip().lower()
    if low not in ("auto", "on", "off"):
        raise InputError(f"pipeline must be auto, on or off, got {mode!r}")
    return low


def _pipelined(mode: str, measurer, target: Target) -> bool:
    """Whether to search while measuring.  The search's processes would stretch the timing of a parallel kernel
    on the cores they share, so "auto" pipelines only on cuda (the GPU is timed) or when the CPU runner
    really times at real-time priority (`runner.realtime()`: SCHED_RR preempts the search)."""
    if mode != "auto":
        return mode == "on"
    if target.kind == "cuda":
        return True
    realtime = getattr(getattr(measurer, "runner", None), "realtime", None)
    return bool(callable(realtime) and realtime())


#: while pipelined, the interpreter's thread switch interval (s): the measuring thread, which needs the GIL for a
#: moment per candidate (to read the runner's reply, send the next), waits at most this long for the search to let go
PIPELINE_SWITCH_INTERVAL = 0.001


def _realtime_timing_only(measurer) -> tuple:
    """Under `chrt` (this thread at SCHED_RR or SCHED_FIFO) only the timing stays real-time: the runner gets this
    thread's priority (`runner.set_priority`, every thread of it), and everything else goes to normal priority
    until the run ends (`_restore_search` puts them back): every real-time thread of this process (the search,
    the processes it forks, the cost model's and BLAS's threads); builder processes always build at normal
    priority (`LocalBuilder._spawn`).  Why: Linux's RT throttling stops every real-time thread of a core for the
    rest of a second once real-time work has used 950 ms of it; with the search and builders real-time too, the
    cores' budget ran out every second of a batch and the repeat being timed stalled ~50 ms (2.5x).  The runner
    alone keeps under the budget (runner.RtPacer).  Two tuners in threads of one process share this: the first
    run to end restores the threads it changed.
    Returns (what to restore: [(thread id, policy, param)], a note for the log); (None, "") for a tuner at normal
    priority."""
    try:
        if os.sched_getscheduler(0) not in REALTIME:
            return None, ""
        prio = os.sched_getparam(0).sched_priority
    except (AttributeError, OSError):
        return None, ""
    how = "search at normal priority"
    set_priority = getattr(getattr(measurer, "runner", None), "set_priority", None)
    if callable(set_priority) and set_priority(prio):
        how = f"runner at real-time priority {prio}, {how}"
    changed = []
    for tid in thread_ids(os.getpid()):
        try:
            policy, param = os.sched_getscheduler(tid), os.sched_getparam(tid)
            if policy in REALTIME:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                changed.append((tid, policy, param))
        except OSError:
            pass   # (a thread that ended meanwhile)
    return changed, how


def _search_beside_measurement() -> float | None:
    """While pipelined: a shorter thread switch interval (PIPELINE_SWITCH_INTERVAL; main thread only), so the
    measuring thread, which needs the GIL for a moment per candidate, waits less between candidates.  Returns
    what `_restore_search` puts back."""
    if threading.current_thread() is not threading.main_thread():   # (several tuning threads would race)
        return None
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, PIPELINE_SWITCH_INTERVAL))
    return interval


def _restore_search(changed: list | None, interval: float | None) -> None:
    """Puts back what `_realtime_timing_only` (threads' policies) and `_search_beside_measurement` changed."""
    if interval is not None:
        sys.setswitchinterval(interval)
    for tid, policy, param in changed or ():
        try:
            os.sched_setscheduler(tid, policy, param)
        except OSError:
            pass   # (a thread that has ended)


def _set_best(measurer, runs: list[_TaskRun]) -> None:
    """Give the runner each task's best latency, for its early cutoff of hopeless candidates (a runner without
    `set_best`, e.g. a Ray pool's, times every candidate in full)."""
    set_best = getattr(getattr(measurer, "runner", None), "set_best", None)
    if callable(set_best):
        set_best({r.task.key: r.best for r in runs if math.isfinite(r.best)})


def _sum_default(runs: list[_TaskRun]) -> float | None:
    if any(r.default is None for r in runs):
        return None
    return sum(r.task.weight * r.default for r in runs)


#: the first confirmation step measures this many candidates of a task again (the fastest first), each later
#: step twice as many as the one before
CONFIRM_TOP = 3


def _confirm(measurer, runs: list[_TaskRun], i_of: list[int], inputs: list[MeasureInput], results: list,
             passes: int) -> list[tuple[int, MeasureInput, Any]]:
    """Guard against the winner's curse: one short timing that happened to be low must not become a task's
    best.  Candidates of the batch that beat their task's best (fastest first, CONFIRM_TOP at a time; the first
    valid one of a task, usually its default schedule, too) are
    measured again `passes` times together with that best, in alternating order and one batch per pass, so
    that both see the same machine; repeated (twice as many at a time) while candidates not yet confirmed beat
    the new best, so no unconfirmed timing can become the best.  A candidate's result becomes its first
    timing plus its confirmations (the record keeps every repeat, the median decides); each incumbent's
    confirmation timings are returned as extra results to record (a schedule's best is the lowest median of
    its records, as in the database).  `results` is updated in place."""
    from dataclasses import replace

    best = {i: (runs[i].best, runs[i].best_schedule) for i in set(i_of)}
    confirmed: set[int] = set()
    extra: list[tuple[int, MeasureInput, Any]] = []
    for step in range(len(results)):
        todo: dict[int, list[int]] = {}
        for j, (i, res) in enumerate(zip(i_of, results)):
            if j not in confirmed and res.valid and res.median < best[i][0]:
                todo.setdefault(i, []).append(j)
        if not todo:
            break
        todo = {i: sorted(js, key=lambda j: results[j].median)[:CONFIRM_TOP << step] for i, js in todo.items()}
        inc: dict[int, list[float]] = {i: [] for i in todo}
        more: dict[int, list[float]] = {j: [] for js in todo.values() for j in js}
        for p in range(passes):
            batch = []   # (task, index into inputs; -1: the task's incumbent)
            for i, js in todo.items():
                group = [(i, -1)] * (best[i][1] is not None) + [(i, j) for j in js]
                batch += group if p % 2 == 0 else group[::-1]
            inps = [MeasureInput(runs[i].task, best[i][1]) if j < 0 else inputs[j] for i, j in batch]
            for (i, j), res in zip(batch, measurer.measure_batch(inps)):
                if res.valid:
                    (inc[i] if j < 0 else more[j]).extend(res.costs)
        for i, js in todo.items():
            b, bs = best[i]
            if inc[i]:
                r0 = results[js[0]]
                extra.append((i, MeasureInput(runs[i].task, bs),
                              replace(r0, costs=tuple(inc[i]), error_msg="", build_s=0.0, run_s=0.0)))
                b = min(b, extra[-1][2].median)
            for j in js:
                confirmed.add(j)
                results[j] = replace(results[j], costs=tuple(results[j].costs) + tuple(more[j]))
                if results[j].median < b:
                    b, bs = results[j].median, inputs[j].schedule
            best[i] = (b, bs)
    return extra


#: a candidate's run (check + warm-up + timing: about RUN_CALLS calls) may take SLOWDOWN times the best latency
RUN_CALLS = 6
SLOWDOWN = 10.0
MIN_RUN_TIMEOUT = 2.0


def _limit_run_time(measurer, runs: list[_TaskRun]) -> None:
    """Cap the runner's per-candidate timeout for this batch: a candidate SLOWDOWN times slower than the best
    (or default) schedule of its task is not worth timing in full, it ends as a run_timeout.  Only for a runner
    with a `timeout` attribute (the LocalRunner); the cap never exceeds the runner's own timeout."""
    runner = getattr(measurer, "runner", None)
    if runner is None or not hasattr(runner, "timeout"):
        return
    if not hasattr(runner, "_hlotune_base_timeout"):
        runner._hlotune_base_timeout = float(runner.timeout)
    base = runner._hlotune_base_timeout
    ref = [r.best for r in runs if math.isfinite(r.best)]
    if len(ref) < len(runs) or not ref:
        runner.timeout = base
        return
    runner.timeout = min(base, max(MIN_RUN_TIMEOUT, 1.0 + RUN_CALLS * SLOWDOWN * max(ref)))


def _default_measurer(workers: int | None, timing, seed: int, target: Target | None = None):
    """A builder pool (its compiler chosen by target kind: `builder.COMPILERS`) and the runner of the target's
    kind (`measurer.make_runner`: a LocalRunner on the CPU, a GpuRunner for cuda)."""
    from ..measure.builder import LocalBuilder
    from ..measure.measurer import ProgramMeasurer, make_runner
    from ..measure.runner import LocalRunner

    runner = make_runner(target, timing) if target is not None else LocalRunner(timing)
    return ProgramMeasurer(LocalBuilder(n_workers=workers), runner, seed=seed)


__all__ = ["tune_model", "TuneReport", "SubgraphReport", "parse_duration", "make_cost_model", "BUILTIN_MODEL",
           "POLICIES", "DEFAULT_TRIALS"]
