"""Optuna's TPE sampler over the same sketches and knobs: the baseline `--policy optuna`.

Map:
  OptunaSearch(space, seed)   .propose(n, measured, rng): ask the study for trials, turn each into a schedule;
                              .observe(schedules, costs): tell the study the measured costs
  build_schedule(space, trial) -> Schedule    the define-by-run space of one trial

The space is define-by-run: a trial first suggests a sketch (categorical), then for each tile hole of that
sketch one number in [0, 1) per level that picks a divisor of what is left of the extent (the innermost at
most the hole's cap), then, as the annotator replays the schedule, one number in [0, 1) per decision (compute
location, parallel fuse count, vector lanes, unroll pragma, packing of a tiled stage's B operand) that picks
one of the options that are legal at that point. Parameter names carry the sketch id, the hole / site index
and the level, so each name always has the same distribution. Trials whose schedule was measured already are
told its cost at once (Optuna learns from them; nothing is measured twice); trials that do not replay are told
FAIL. Measured costs are told as log(seconds); failed measurements as FAIL. The study is seeded
(TPESampler(seed)); it is not warm-started from the database on resume.
"""

from __future__ import annotations

import math
import random

from ..errors import InputError, ScheduleError
from ..schedule_space.annotate import _annotate, _Chooser, _fill, _packed, check_state, divisors
from ..schedule_space.state import replay
from ..schedule_space.steps import Schedule
from .space import TaskSpace


def _optuna():
    try:
        import optuna
    except ImportError:
        raise InputError("--policy optuna needs Optuna: pip install 'hlotune[search]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _pick(trial, name: str, options: list):
    u = trial.suggest_float(name, 0.0, 1.0)
    return options[min(int(u * len(options)), len(options) - 1)]


class _TrialChooser(_Chooser):
    """annotate's decision maker with every decision suggested by the trial."""

    def __init__(self, trial, prefix: str):
        super().__init__(random.Random(0), None)
        self.trial = trial
        self.prefix = prefix

    def pick(self, kind: str, k: int, options: list, sample):
        v = _pick(self.trial, f"{self.prefix}.{kind}{k}", list(options))
        self.made[kind].append(v)
        return v


def build_schedule(space: TaskSpace, trial) -> Schedule:
    """The schedule of one trial (raises ScheduleError when it does not replay)."""
    ids = [s.id for s in space.sketches]
    sk = space.by_id[trial.suggest_categorical("sketch", ids) if len(ids) > 1 else ids[0]]
    if not sk.has_holes:
        replay(sk.compute, sk.steps)
        return Schedule(space.task.key, sk.steps, sk.id)
    tiles = []
    for h, hole in enumerate(sk.tiles):
        rem, fs = max(1, hole.extent), []
        for lv in range(hole.n):
            opts = [d for d in divisors(rem) if lv < hole.n - 1 or d <= hole.max_innermost]
            f = _pick(trial, f"{sk.id}.t{h}.{lv}", opts)
            fs.append(f)
            rem //= f
        tiles.append(tuple(fs))
    state = replay(sk.compute, _fill(sk, tiles))
    ch = _TrialChooser(trial, sk.id)
    state = _annotate(sk, _packed(sk, state, ch, None, tiles), ch, None)
    check_state(state)
    return Schedule(space.task.key, state.steps, sk.id)


class OptunaSearch:
    """TPE (Optuna) over the sketch space of one task, measured through the same runner."""

    name = "optuna"

    def __init__(self, space: TaskSpace, seed: int = 0, n_startup_trials: int = 16):
        optuna = _optuna()
        self.optuna = optuna
        self.space = space
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.pending: dict[str, object] = {}
        self.known: dict[str, float | None] = {}

    def _tell(self, trial, cost: float | None) -> None:
        state = self.optuna.trial.TrialState
        if cost is None or not math.isfinite(cost) or cost <= 0:
            self.study.tell(trial, state=state.FAIL)
        else:
            self.study.tell(trial, math.log(cost))

    def propose(self, n: int, measured: set[str], rng: random.Random) -> list[Schedule]:
        out: list[Schedule] = []
        picked: set[str] = set()
        for _ in range(8 * n + 32):
            if len(out) >= n:
                break
            trial = self.study.ask()
            try:
                s = build_schedule(self.space, trial)
            except ScheduleError:
                self._tell(trial, None)
                continue
            if s.key in measured or s.key in picked or s.key in self.pending:
                self._tell(trial, self.known.get(s.key))
                continue
            self.pending[s.key] = trial
            picked.add(s.key)
            out.append(s)
        return out

    def observe(self, schedules: list[Schedule], costs: list[float]) -> None:
        for s, c in zip(schedules, costs):
            self.known[s.key] = c if math.isfinite(c) else None
            trial = self.pending.pop(s.key, None)
            if trial is not None:
                self._tell(trial, self.known[s.key])


__all__ = ["OptunaSearch", "build_schedule"]
