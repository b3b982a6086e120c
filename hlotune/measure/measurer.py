"""ProgramMeasurer: build a batch of candidates in parallel, run each in the isolated runner.

Map:
  ProgramMeasurer(builder, runner, seed, overlap, fault_hook)
    .measure_batch(inputs) -> list[MeasureResult]     in input order; never raises for a candidate
    .abort()  (any thread) the batch in progress stops after its current candidate (KeyboardInterrupt), as
              does every later one; for a tuner whose measuring thread must end at Ctrl-C
    .close()  (also a context manager)
  measure_batch(inputs, **kw)        one-shot convenience (starts and stops its own processes)
  FaultHook                          test hook: candidate (batch index or schedule key) -> fault
  FAULTS                             the faults it can inject:
      segfault, hang, oom, raise, wrong          in the runner (while running the candidate)
      build_segfault, build_hang, build_raise    in a builder worker (while building it)

A batch may mix tasks.  Each task's inputs and reference outputs are computed once (the LRU of
`reference.task_data`) in this process and sent once to each runner process.  The order is: build
everything (pool of processes), then run everything (one process), unless `overlap` is on, in which
case building happens in a background thread and each candidate is sent to the runner as soon as it
is built, so building overlaps running.  Overlap is off by default on the CPU: builder processes
compiling on the cores the runner is timing on disturb the measurements (parallel kernels use every
core).  On a 2-core machine it gains little anyway: building costs ~20 ms per candidate over two
workers against ~110 ms of timing (benchmarks/measure_overhead.py measures both).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .builder import BuildJob, LocalBuilder
from .records import BuildResult, ErrorKind, MeasureInput, MeasureResult
from .reference import TaskData, task_data
from .runner import RUN_FAULTS, LocalRunner, TimingConfig

FAULTS = RUN_FAULTS + ("build_segfault", "build_hang", "build_raise")

#: target kind -> "module:Class" of the runner that owns that kind of device
RUNNERS = {"cpu": "hlotune.measure.runner:LocalRunner", "cuda": "hlotune.measure.gpu_runner:GpuRunner"}


def make_runner(target, timing: TimingConfig | None = None, **kw):
    """The runner for `target`'s kind (RUNNERS), e.g. a GpuRunner for "cuda"."""
    import importlib

    mod, _, cls = RUNNERS[target.kind].partition(":")
    return getattr(importlib.import_module(mod), cls)(timing, target=target, **kw)


@dataclass(frozen=True)
class FaultHook:
    """Which candidates misbehave, for fault-injection tests: keys are batch indices (int) or
    schedule keys (str), values are names from FAULTS."""

    faults: tuple[tuple[int | str, str], ...] = field(default_factory=tuple)

    @staticmethod
    def of(mapping: Mapping[int | str, str]) -> FaultHook:
        for k, v in mapping.items():
            if v not in FAULTS:
                raise ValueError(f"unknown fault {v!r} for candidate {k!r} (one of {', '.join(FAULTS)})")
        return FaultHook(tuple(mapping.items()))

    def fault_for(self, index: int, schedule_key: str) -> str | None:
        for k, v in self.faults:
            if k == index or k == schedule_key:
                return v
        return None


def _kernel_name(inp: MeasureInput) -> str:
    base = inp.task.name or inp.task.compute.name or "kernel"
    return "m_" + "".join(c if c.isalnum() else "_" for c in base)


class ProgramMeasurer:
    """Measures batches of candidates; keeps its worker processes between batches."""

    def __init__(self, builder: LocalBuilder | None = None, runner: LocalRunner | None = None, *,
                 seed: int = 0, overlap: bool = False, fault_hook: FaultHook | None = None):
        self.builder = builder or LocalBuilder()
        self.runner = runner or LocalRunner()
        self.seed = seed
        self.overlap = overlap
        self.fault_hook = fault_hook
        self.stats = {"batches": 0, "candidates": 0, "wall_s": 0.0, "build_wall_s": 0.0, "run_wall_s": 0.0}
        self._abort = threading.Event()

    def abort(self) -> None:
        """Stop measuring (from any thread): the batch in progress raises KeyboardInterrupt after its current
        candidate (or build phase), and so does every later call of measure_batch."""
        self._abort.set()

    def _jobs(self, inputs: Sequence[MeasureInput]) -> tuple[list[BuildJob], list[str | None]]:
        jobs, faults = [], []
        for i, inp in enumerate(inputs):
            f = self.fault_hook.fault_for(i, inp.schedule.key) if self.fault_hook else None
            faults.append(f)
            jobs.append(BuildJob(inp.task.compute, tuple(inp.schedule.steps), inp.task.target, _kernel_name(inp), f))
        return jobs, faults

    def _data(self, inputs: Sequence[MeasureInput]) -> dict[str, TaskData | Exception]:
        out: dict[str, TaskData | Exception] = {}
        for inp in inputs:
            if inp.task.key not in out:
                try:
                    out[inp.task.key] = task_data(inp.task, self.seed)
                except Exception as e:   # the reference cannot run: every candidate of the task fails
                    out[inp.task.key] = e
        return out

    def _run(self, inp: MeasureInput, data: TaskData | Exception, build: BuildResult, fault: str | None):
        if self._abort.is_set():
            raise KeyboardInterrupt("measurement aborted")
        if isinstance(data, Exception):
            return MeasureResult((), ErrorKind.UNKNOWN, f"no reference for the task: {type(data).__name__}: {data}",
                                 build.build_s, 0.0)
        if inp.schedule.workload_key != inp.task.key:
            return MeasureResult((), ErrorKind.INSTANTIATION,
                                 f"schedule is for workload {inp.schedule.workload_key}, not {inp.task.key}")
        return self.runner.run_one(data, build, fault)

    def measure_batch(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Build and run every candidate; results in input order (see the module docstring)."""
        t0 = time.perf_counter()
        inputs = list(inputs)
        if self._abort.is_set():
            raise KeyboardInterrupt("measurement aborted")
        if not inputs:
            return []
        jobs, faults = self._jobs(inputs)
        data = self._data(inputs)
        results: list[MeasureResult | None] = [None] * len(inputs)
        if not self.overlap:
            builds = self.builder.build(jobs)
            t1 = time.perf_counter()
            for i, (inp, b) in enumerate(zip(inputs, builds)):
                results[i] = self._run(inp, data[inp.task.key], b, faults[i])
            self.stats["build_wall_s"] += t1 - t0
            self.stats["run_wall_s"] += time.perf_counter() - t1
        else:
            done: queue.Queue = queue.Queue()
            err: list[BaseException] = []

            def build_all() -> None:
                try:
                    self.builder.build(jobs, on_result=lambda i, r: done.put((i, r)))
                except BaseException as e:  # surfaces in the caller's thread
                    err.append(e)
                finally:
                    done.put(None)

            th = threading.Thread(target=build_all, name="hlotune-build", daemon=True)
            th.start()
            while True:
                item = done.get()
                if item is None:
                    break
                i, b = item
                results[i] = self._run(inputs[i], data[inputs[i].task.key], b, faults[i])
            th.join()
            if err:
                raise err[0]
        self.stats["batches"] += 1
        self.stats["candidates"] += len(inputs)
        self.stats["wall_s"] += time.perf_counter() - t0
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the builder and runner processes."""
        self.builder.close()
        self.runner.close()

    def __enter__(self) -> ProgramMeasurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def measure_batch(inputs: Sequence[MeasureInput], *, timing: TimingConfig | None = None,
                  fault_hook: FaultHook | None = None, **runner_kw) -> list[MeasureResult]:
    """Measure one batch with a measurer made for it (processes started and stopped here)."""
    runner = make_runner(inputs[0].task.target, timing, **runner_kw) if inputs else LocalRunner(timing, **runner_kw)
    with ProgramMeasurer(runner=runner, fault_hook=fault_hook) as m:
        return m.measure_batch(inputs)
