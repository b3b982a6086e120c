"""Tuning on a Ray cluster, and tuning several targets from one command.

Map:
  tune_targets(model, tuning_log, targets, ray=None, ...) -> TuneReport | MultiTuneReport
      one `tuner.tune_model` per target fingerprint, all at once (one thread each), measuring on
      - a RayPool (`ray` = an address, "auto" or "local"): "cpu" / "cuda" mean every fingerprint of that kind
        that the cluster's nodes announce, each measured only on nodes announcing it; or
      - local measurers (no `ray`): one ProgramMeasurer per target, with the runner of its kind.
  MultiTuneReport    the reports of several targets (text, to_json, trials, interrupted)

Records: the driver (this process) writes every record it receives, one transaction per batch, into the
database given by path or URL (a PostgreSQL URL lets several drivers on several machines share it; SQLite works
for one driver).  Each record carries the fingerprint of the target measured, and the actor that measured it
checked that its machine has exactly that fingerprint.  All machines' results flow through the driver, so the
task scheduler and the cost model of each target see the measurements of every machine; a later run (or another
driver) starts from everything in the database.  Writing only in the driver keeps "a record is written exactly
once" simple: a candidate whose runner was lost is measured again by the pool and only its one final result is
recorded (see measure/ray_runner.py).

Ctrl-C: the main thread tells the pool (or the local measurers' loops) to stop; each target's run ends like an
interrupted single run (at most the batch in flight is lost) and its report says so.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..database import open_database
from ..errors import InputError
from ..target import Target
from .tuner import TuneReport, tune_model


@dataclass
class MultiTuneReport:
    """What tuning several targets did: one TuneReport per target fingerprint."""

    reports: list[TuneReport] = field(default_factory=list)
    pool_stats: dict = field(default_factory=dict)

    @property
    def trials(self) -> int:
        return sum(r.trials for r in self.reports)

    @property
    def interrupted(self) -> bool:
        return any(r.interrupted for r in self.reports)

    def to_json(self) -> dict:
        return {"targets": [r.to_json() for r in self.reports], "trials": self.trials,
                "pool": self.pool_stats}

    def text(self) -> str:
        return "\n\n".join(r.text() for r in self.reports)


class _PrefixStream:
    """Progress lines of one target's run, prefixed with the target, written whole under a lock."""

    def __init__(self, stream: TextIO, prefix: str, lock: threading.Lock):
        self.stream, self.prefix, self.lock = stream, prefix, lock
        self._buf = ""

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self._buf += text.replace("\r", "\n")
        *lines, self._buf = self._buf.split("\n")
        with self.lock:
            for ln in lines:
                if ln.strip():
                    self.stream.write(f"[{self.prefix}] {ln}\n")
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        pass


def _local_measurer(target: Target, workers: int | None, timing, seed: int):
    from ..measure.builder import LocalBuilder
    from ..measure.measurer import ProgramMeasurer, make_runner

    return ProgramMeasurer(LocalBuilder(n_workers=workers), make_runner(target, timing), seed=seed)


def _resolve_local(specs: Sequence[str | Target]) -> list[Target]:
    out: dict[str, Target] = {}
    for s in specs:
        t = s if isinstance(s, Target) else Target.from_string(s)
        out.setdefault(t.fingerprint, t)
    return list(out.values())


def tune_targets(model, tuning_log: Any, targets: Sequence[str | Target], ray: str | None = None, *,
                 trials: int | None = None, time_budget: float | None = None, seed: int = 0,
                 workers: int | None = None, timing=None, timeout: float = 10.0, build_timeout: float = 15.0,
                 progress: bool = True, stream: TextIO | None = None, pool=None, pool_options: dict | None = None,
                 **options: Any) -> TuneReport | MultiTuneReport:
    """Tune `model` (a loaded api.Model) for every target at once (see the module docstring).

    `tuning_log`: a path or URL (each target's run opens its own connection) or a Database (shared).  `trials`
    and `time_budget` apply to each target.  `pool`: an existing RayPool (its owner closes it); else one is made
    from `ray` with `pool_options` (see RayPool) and closed at the end.  Other options go to `tune_model`.
    Returns a TuneReport for one target fingerprint, a MultiTuneReport for several."""
    import sys

    if not targets:
        raise InputError("no target to tune for")
    own_pool = pool is None and ray is not None
    if own_pool:
        from ..measure.ray_runner import RayPool
        pool = RayPool(targets, ray, timing=timing, timeout=timeout, build_timeout=build_timeout, seed=seed,
                       **(pool_options or {}))
    try:
        resolved = pool.targets if pool is not None else _resolve_local(targets)
        _ = model.frontend   # computed once, before the threads
        if len(resolved) == 1:
            t = resolved[0]
            m = pool.measurer(t) if pool is not None else None
            db = open_database(tuning_log)
            try:
                return tune_model(model, db, t, trials=trials, time_budget=time_budget, seed=seed, workers=workers,
                                  timing=timing, measurer=m, progress=progress, stream=stream,
                                  db_location=_location(tuning_log, db), **options)
            finally:
                if db is not tuning_log:
                    db.close()
        return _tune_threads(model, tuning_log, resolved, pool, trials=trials, time_budget=time_budget, seed=seed,
                             workers=workers, timing=timing, progress=progress,
                             stream=stream if stream is not None else sys.stderr, **options)
    finally:
        if own_pool:
            pool.close()


def _location(spec: Any, db) -> str:
    import os
    if isinstance(spec, str | os.PathLike):
        text = os.fspath(spec)
        return text if "://" in text or not os.path.exists(text) else os.path.abspath(text)
    return getattr(db, "location", "")


class _StopFlag:
    """Local measurers have no pool to interrupt: a wrapper that raises KeyboardInterrupt between batches."""

    def __init__(self, measurer, stop: threading.Event):
        self.inner, self.stop = measurer, stop
        self.runner = getattr(measurer, "runner", None)

    def measure_batch(self, inputs):
        if self.stop.is_set():
            raise KeyboardInterrupt
        return self.inner.measure_batch(inputs)

    def close(self) -> None:
        self.inner.close()


def _tune_threads(model, tuning_log, targets: list[Target], pool, *, trials, time_budget, seed, workers, timing,
                  progress: bool, stream: TextIO, **options) -> MultiTuneReport:
    lock = threading.Lock()
    stop = threading.Event()
    reports: dict[str, TuneReport] = {}
    errors: list[BaseException] = []

    def one(t: Target) -> None:
        db = open_database(tuning_log)
        m = pool.measurer(t) if pool is not None else _StopFlag(_local_measurer(t, workers, timing, seed), stop)
        try:
            reports[t.fingerprint] = tune_model(
                model, db, t, trials=trials, time_budget=time_budget, seed=seed, workers=workers, timing=timing,
                measurer=m, progress=progress, stream=_PrefixStream(stream, t.fingerprint, lock),
                db_location=_location(tuning_log, db), **options)
        except BaseException as e:  # surfaces in the main thread
            errors.append(e)
            stop.set()
            if pool is not None:
                pool.interrupt()
        finally:
            m.close()
            if db is not tuning_log:
                db.close()

    threads = [threading.Thread(target=one, args=(t,), name=f"hlotune-tune-{t.fingerprint}", daemon=True)
               for t in targets]
    for th in threads:
        th.start()
    try:
        for th in threads:
            while th.is_alive():
                th.join(0.5)
    except KeyboardInterrupt:
        stop.set()
        if pool is not None:
            pool.interrupt()
        for th in threads:
            th.join()
    if errors:
        raise errors[0]
    return MultiTuneReport([reports[t.fingerprint] for t in targets if t.fingerprint in reports],
                           pool.stats if pool is not None else {})


__all__ = ["tune_targets", "MultiTuneReport"]
