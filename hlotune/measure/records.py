"""Measurement as data: what goes into a measurement and what comes out of it.

Map:
  ErrorKind       how a measurement ended: none (valid), instantiation, compile, runtime, wrong_answer,
                  build_timeout, run_timeout, unknown (values = the database's ERROR_KINDS strings)
  MeasureInput    (task, schedule): one candidate to build and run
  BuildResult     what a builder worker produced: relocatable object code + the kernel's calling
                  convention (a body-less LoopFunc), or an error kind and message
  MeasureResult   costs (seconds per call, one per repeat), error kind and message, build_s, run_s,
                  timestamp; `.median`, `.spread`, `.valid`

Error kinds (which stage of the pipeline failed):
  instantiation   replaying the steps or lowering them failed (the schedule does not apply)
  compile         code generation or LLVM failed, the builder process died (signal) while compiling,
                  or the runner could not load the object code
  build_timeout   the builder took longer than its per-candidate timeout (its worker was killed)
  runtime         the kernel failed while running: a crash (signal) of the runner, an exception,
                  a MemoryError (the runner's address space is capped)
  wrong_answer    the output differs from the reference output on the task's random inputs
  run_timeout     the run (load + check + timing) took longer than the runner's timeout
  unknown         anything else (a worker that cannot start, a message that cannot be sent)
A result is valid only when its kind is `none`; only valid results have costs, so a wrong answer can
never become a best schedule.
"""

from __future__ import annotations

import enum
import statistics
import time
from dataclasses import dataclass, field

from ..schedule_space.loop_ir import LoopFunc
from ..schedule_space.steps import Schedule
from ..schedule_space.task import Task


class ErrorKind(str, enum.Enum):
    """How a measurement ended (the value is what tuning records store)."""

    NONE = "none"
    INSTANTIATION = "instantiation"
    COMPILE = "compile"
    RUNTIME = "runtime"
    WRONG_ANSWER = "wrong_answer"
    BUILD_TIMEOUT = "build_timeout"
    RUN_TIMEOUT = "run_timeout"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class MeasureInput:
    """One candidate: a schedule of a task's workload."""

    task: Task
    schedule: Schedule


@dataclass(frozen=True)
class BuildResult:
    """A compiled candidate.  `obj` is relocatable object code (ELF) for the task's target with the
    kernel `symbol`; `func` is the kernel's LoopFunc without its body (the calling convention: names,
    shapes and dtypes of the inputs then outputs); `parallel` says whether it calls the thread pool.
    On failure `obj` is empty and `error_kind` / `error_msg` say why."""

    obj: bytes = b""
    symbol: str = ""
    func: LoopFunc | None = None
    parallel: bool = False
    error_kind: ErrorKind = ErrorKind.NONE
    error_msg: str = ""
    build_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_kind is ErrorKind.NONE


@dataclass(frozen=True)
class MeasureResult:
    """The outcome of measuring one candidate.  `costs` are seconds per call, one per repeat (empty
    unless valid); `build_s` / `run_s` are the wall seconds spent building and running it."""

    costs: tuple[float, ...] = ()
    error_kind: ErrorKind = ErrorKind.NONE
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = field(default_factory=time.time)

    @property
    def valid(self) -> bool:
        """True when the candidate built, ran, gave the right answer and was timed."""
        return self.error_kind is ErrorKind.NONE and bool(self.costs)

    @property
    def median(self) -> float:
        """Median cost in seconds; +inf when not valid (so invalid results sort last)."""
        return statistics.median(self.costs) if self.valid else float("inf")

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeat costs: the relative noise of the measurement (0 for one
        repeat, +inf when not valid)."""
        if not self.valid:
            return float("inf")
        med = self.median
        return (max(self.costs) - min(self.costs)) / med if med > 0 else 0.0

    def __str__(self) -> str:
        if self.valid:
            return f"{self.median * 1e3:.4f} ms (spread {self.spread:.1%}, {len(self.costs)} repeats)"
        return f"{self.error_kind.value}: {self.error_msg}"
