"""`hlotune tune`: tune every subgraph of a model, writing each measured batch to the tuning database.

Map:
  tune_model(model, db, target, ...) -> TuneReport   the loop (api.tune opens the model and calls it)
  TuneReport / SubgraphReport                        what a run did: per subgraph best / default latency,
                                                     trials, error kinds; estimated whole-model latency
  parse_duration("8h") -> seconds                    30s, 15m, 8h, 1h30m, 2d or a number of seconds
  make_cost_model(path, seed)                        a pretrained model (--cost-model) or a fresh XGBoost one
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
     batch in flight), then the cost model, the policy and the scheduler learn the results.
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
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import config
from ..errors import InputError
from ..measure.records import MeasureInput
from ..schedule_space.steps import Schedule, schedule_from_json
from ..schedule_space.task import Task, tasks_from_subgraphs
from ..target import Target
from .progress import Progress, fmt_latency, fmt_time
from .records import to_record
from .scheduler import TaskScheduler
from .space import TaskSpace, derive_rng

POLICIES = ("evolutionary", "random", "optuna")
DEFAULT_TRIALS = 1000
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


def make_cost_model(path: str | None = None, seed: int = 0):
    """A pretrained cost model from `path`, else a fresh XGBoost model (random until it has data); the
    random model when xgboost is not installed."""
    from ..cost_model.model import CostModel, RandomModel

    if path:
        return CostModel.load(path)
    try:
        import xgboost  # noqa: F401
    except ImportError:
        warnings.warn("xgboost is not installed: the search uses a random cost model "
                      "(pip install 'hlotune[search]')", stacklevel=2)
        return RandomModel(seed)
    return CostModel(seed=seed)


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
               db_location: str = "") -> TuneReport:
    """Tune `model` (a loaded `api.Model`) into the open database `db` (see the module docstring)."""
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
    runs = [_TaskRun(t, TaskSpace(t)) for t in tasks]
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

    def elapsed() -> float:
        return elapsed0 + time.perf_counter() - t_start

    def total() -> int:
        return total0 + done

    def defaults() -> list[float]:
        return [r.default if r.default is not None else math.inf for r in runs]

    def measure(i_of: list[int], scheds: list[Schedule]) -> list[float]:
        nonlocal done, cmodel, measurer
        if measurer is None:
            measurer = _default_measurer(workers, timing, seed, target)
        t0 = time.perf_counter()
        _limit_run_time(measurer, [runs[i] for i in set(i_of)])
        inputs = [MeasureInput(runs[i].task, s) for i, s in zip(i_of, scheds)]
        results = measurer.measure_batch(inputs)
        again = _confirm(measurer, runs, i_of, inputs, results, confirm) if confirm else []
        records = [to_record(inp, res) for inp, res in zip(inputs, results)]
        db.add_many(records + [to_record(inp, res) for _, inp, res in again])   # one transaction
        report.measure_s += time.perf_counter() - t0
        done += len(records)
        costs = []
        for i, inp, res in zip(i_of, inputs, results):
            c = res.median if res.valid else math.inf
            runs[i].add(inp.schedule.key, c, res.error_kind.value, inp.schedule)
            costs.append(c)
        for i, inp, res in again:
            runs[i].add(inp.schedule.key, res.median, res.error_kind.value, inp.schedule)
        if cmodel is not None:
            t1 = time.perf_counter()
            _model_update(cmodel, [(inp.task, inp.schedule, tuple(res.costs) if res.valid else ())
                                   for inp, res in zip(inputs, results)])
            report.train_s += time.perf_counter() - t1
        log.save_state(elapsed(), total())
        return costs

    if policy == "evolutionary":   # loaded before anything is measured: a bad --cost-model fails at once
        cmodel = cost_model if cost_model is not None and not isinstance(cost_model, str) else \
            make_cost_model(cost_model, seed)
        samples = []
        for i, rec in history:
            s = _schedule_of(rec)
            if s is not None:
                samples.append((runs[i].task, s, tuple(rec.costs) if rec.valid else ()))
        t1 = time.perf_counter()
        _model_update(cmodel, samples, fit=not getattr(cmodel, "pretrained", False))
        report.train_s += time.perf_counter() - t1
    stop = ""
    try:
        # 2. trial 0: default schedules
        todo = [(i, r.space.default) for i, r in enumerate(runs)
                if r.space.default is not None and r.space.default.key not in r.measured]
        if todo and (trials is None or total() < trials):
            todo = todo[: (trials - total()) if trials is not None else None]
            costs = measure([i for i, _ in todo], [s for _, s in todo])
            for i, _ in todo:
                sched.restore(i, runs[i].trials, runs[i].best)
            log.write("defaults", trials_total=total(), elapsed_s=elapsed(),
                      defaults={runs[i].task.name: c for (i, _), c in zip(todo, costs)})
        sched.defaults = defaults()

        # 3. cost model and policies
        for i, r in enumerate(runs):
            r.policy = _make_policy(policy, r.space, cmodel, seed, i, population, generations)
            top = db.top_k(r.task.key, fp, 64)
            seeds = [(s, rec.median) for rec in top if (s := _schedule_of(rec)) is not None]
            if seeds:
                r.policy.observe([s for s, _ in seeds], [c for _, c in seeds])

        # 4. rounds
        rounds = 0
        prog.update(total(), elapsed(), sched.objective(), _sum_default(runs))
        while True:
            if trials is not None and total() >= trials:
                stop = f"trial budget ({trials}) reached"
                break
            if time_budget is not None and elapsed() >= time_budget:
                stop = f"time budget ({fmt_time(time_budget)}) reached"
                break
            i = sched.next_task(derive_rng(seed, "task", total()))
            if i is None:
                stop = "every subgraph stopped"
                break
            r = runs[i]
            n = batch_size if trials is None else min(batch_size, trials - total())
            if time_budget is not None and done and rounds:
                # a smaller last batch rather than overshooting the time budget much
                per = (report.measure_s + report.train_s) / done
                left = time_budget - elapsed() - report.search_s / rounds
                if left < per:
                    stop = f"time budget ({fmt_time(time_budget)}) reached"
                    break
                n = max(1, min(n, int(left / per)))
            rounds += 1
            t0 = time.perf_counter()
            cands = r.policy.propose(n, r.measured, derive_rng(seed, "round", total(), i))
            t_search = time.perf_counter() - t0
            report.search_s += t_search
            if not cands:
                sched.kill(i, "search space exhausted")
                prog.line(f"  {r.task.name}: nothing new to measure (search space exhausted)")
                continue
            best_before = r.best
            costs = measure([i] * len(cands), cands)
            r.policy.observe(cands, costs)
            sched.update(i, len(cands), r.best)
            sched.defaults = defaults()
            log.write("batch", task=r.task.name, key=r.task.key, n=len(cands),
                      valid=sum(math.isfinite(c) for c in costs), best_s=r.best if math.isfinite(r.best) else None,
                      trials_total=total(), elapsed_s=elapsed(), search_s=t_search, train_s_total=report.train_s,
                      model_s=sched.objective(), search_stats=getattr(r.policy, "stats", {}))
            if r.best < best_before:
                sp = f" ({r.default / r.best:.2f}x over default)" if r.default else ""
                prog.line(f"  {r.task.name}: best {fmt_latency(r.best)}{sp}")
            if sched.states[i].dead:
                prog.line(f"  {r.task.name}: stopped ({sched.states[i].dead})")
            prog.update(total(), elapsed(), sched.objective(), _sum_default(runs))
    except KeyboardInterrupt:
        stop = "interrupted"
        report.interrupted = True
    finally:
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
                  fallbacks=report.fallbacks)
        log.close()
    return report


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


__all__ = ["tune_model", "TuneReport", "SubgraphReport", "parse_duration", "make_cost_model", "POLICIES",
           "DEFAULT_TRIALS"]
