"""LocalBuilder: compile candidates to relocatable object code in a pool of worker processes.

Map:
  LocalBuilder(n_workers, timeout, memory_bytes)  the pool (default: one worker per core)
    .build(jobs, on_result) -> list[BuildResult]  jobs are BuildJobs; results in job order;
                                                  `on_result(i, result)` is called as each finishes
    .close()
  BuildJob               (compute def, schedule steps, target, kernel name, fault)
  compile_object(func, target) -> BuildResult     LoopFunc -> emit -> O3 -> object code (in-process); a candidate
                                                  whose IR exceeds `build_max_ir_lines` is a compile error, unbuilt
  build_one(job) -> BuildResult                   what a worker does for one job
  _BuildHandler          the worker side (with the build_* faults of the test hook)

The artifact: LLVM JIT code cannot cross processes, so a worker emits an ELF object with the
TargetMachine of the JIT (large code model, so calls to libc / the thread pool are absolute) and the
runner loads it into an execution engine (`add_object_file`), which only relocates: about 1 ms,
against 10 to 100 ms to optimize and generate code.  This keeps the serial runner process free of
compilation work.  The object's undefined symbols are libc's (aligned_alloc, free) and the parallel
runtime's launch function, which the runner defines before loading (see runner.py).

Fault handling: each worker has one job at a time and a deadline (`timeout` seconds after the job
was sent).  A worker past its deadline is killed (SIGKILL) and replaced; its job ends as
build_timeout.  A worker that dies (a crash in LLVM, the memory cap) ends its job as compile with
"builder process died (killed by signal SIGSEGV)"; other jobs are unaffected.  Workers are started
once and reused across batches; replacement workers start in the background (forkserver: tens of ms).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import HlotuneError
from ..ir.expr import ComputeDef
from ..schedule_space.loop_ir import LoopFunc, Seq
from ..target import Target
from .records import BuildResult, ErrorKind
from .workers import Worker, set_policy, wait_any

#: seconds a worker may take to start (import numpy / llvmlite / hlotune) before it counts as failed
START_TIMEOUT = 120.0
#: a worker that dies this many times in a row before saying "ready" means the pool cannot start
MAX_START_FAILURES = 3


@dataclass(frozen=True)
class BuildJob:
    """One candidate for a builder worker."""

    compute: ComputeDef
    steps: tuple
    target: Target
    name: str = "kernel"
    fault: str | None = None


def compile_object(func: LoopFunc, target: Target, opt_level: int | None = None) -> BuildResult:
    """Compile a LoopFunc to object code for `target` in this process (raises CompileError)."""
    import llvmlite.binding as llvm

    from .. import config
    from ..codegen.llvm_cpu import optimize, target_machine
    from ..codegen.llvm_emit import emit_module
    from ..errors import CompileError

    level = int(config.get("opt_level")) if opt_level is None else opt_level
    tm = target_machine(target)   # cached; used for emit_object only, never handed to an engine
    module, symbol, parallel = emit_module(func, target.triple or llvm.get_process_triple())
    text = str(module)
    limit = int(config.get("build_max_ir_lines"))
    lines = text.count("\n")
    if 0 < limit < lines:
        raise CompileError(f"{func.name}: the schedule's code is too large to be worth building ({lines} lines of "
                           f"LLVM IR, limit {limit}: setting build_max_ir_lines); unroll less")
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected the IR of {func.name}: {str(e).strip()}") from None
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    optimize(mod, tm, level)
    obj = tm.emit_object(mod)
    stub = LoopFunc(func.name, func.inputs, func.outputs, Seq(()))
    return BuildResult(obj=bytes(obj), symbol=symbol, func=stub, parallel=parallel)


#: target kind -> "module:function" compiling a LoopFunc to a BuildResult in a builder process
COMPILERS = {"cpu": "hlotune.measure.builder:compile_object",
             "cuda": "hlotune.measure.gpu_runner:compile_cuda_object"}


def _compiler(kind: str):
    import importlib

    from ..errors import UnsupportedError
    if kind not in COMPILERS:
        raise UnsupportedError(f"no builder for target kind {kind!r}")
    mod, _, fn = COMPILERS[kind].partition(":")
    return getattr(importlib.import_module(mod), fn)


def build_one(job: BuildJob) -> BuildResult:
    """Lower `job`'s schedule and compile it; errors become the result's kind and message."""
    from ..schedule_space.lower import lower

    t0 = time.perf_counter()
    try:
        func = lower(job.compute, job.steps, name=job.name)
    except HlotuneError as e:
        return BuildResult(error_kind=ErrorKind.INSTANTIATION, error_msg=str(e), build_s=time.perf_counter() - t0)
    except Exception as e:  # a bug in replay / lowering on this schedule: still the schedule's fault
        return BuildResult(error_kind=ErrorKind.INSTANTIATION, error_msg=f"{type(e).__name__}: {e}",
                           build_s=time.perf_counter() - t0)
    try:
        res = _compiler(job.target.kind)(func, job.target)
    except HlotuneError as e:
        return BuildResult(error_kind=ErrorKind.COMPILE, error_msg=str(e), build_s=time.perf_counter() - t0)
    except Exception as e:
        return BuildResult(error_kind=ErrorKind.COMPILE, error_msg=f"{type(e).__name__}: {e}",
                           build_s=time.perf_counter() - t0)
    return BuildResult(res.obj, res.symbol, res.func, res.parallel, build_s=time.perf_counter() - t0)


def _inject_build_fault(fault: str) -> None:
    if fault == "build_segfault":
        import ctypes
        ctypes.memset(8, 0, 1)
    elif fault == "build_hang":
        while True:
            time.sleep(0.05)
    elif fault == "build_raise":
        raise RuntimeError("injected fault: build_raise")


class _BuildHandler:
    def __init__(self, init) -> None:
        pass

    def __call__(self, msg):
        idx, job = msg
        if job.fault and job.fault.startswith("build_"):
            t0 = time.perf_counter()
            try:
                _inject_build_fault(job.fault)
            except Exception as e:
                return idx, BuildResult(error_kind=ErrorKind.COMPILE, error_msg=f"{type(e).__name__}: {e}",
                                        build_s=time.perf_counter() - t0)
        return idx, build_one(job)


def make_handler(init) -> _BuildHandler:
    return _BuildHandler(init)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


class LocalBuilder:
    """Compiles candidates in `n_workers` processes (default: one per core the process may use) with a
    per-candidate `timeout` (seconds); each worker's address space is capped at its size after start
    plus `memory_bytes` (None: no cap)."""

    def __init__(self, n_workers: int | None = None, timeout: float = 15.0, memory_bytes: int | None = 4 << 30):
        self.n_workers = n_workers or default_workers()
        self.timeout = float(timeout)
        self.memory_bytes = memory_bytes
        self._workers: list[Worker] = []
        self.restarts = 0

    def _spawn(self) -> Worker:
        """A worker at normal priority even when this process is real-time (`chrt`): building never needs it, and
        a real-time builder would spend the cores' real-time budget that the runner's timings live in
        (runner.RtPacer)."""
        w = Worker("hlotune.measure.builder:make_handler", None, self.memory_bytes, "hlotune-builder").start()
        if hasattr(os, "SCHED_OTHER"):
            set_policy(w.proc.pid, os.SCHED_OTHER)
        return w

    def _ensure_pool(self) -> None:
        self._workers = [w for w in self._workers if w.proc is not None]
        while len(self._workers) < self.n_workers:
            self._workers.append(self._spawn())

    def _replace(self, w: Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = self._spawn()
        self.restarts += 1

    def build(self, jobs: Sequence[BuildJob],
              on_result: Callable[[int, BuildResult], None] | None = None) -> list[BuildResult]:
        """Build every job; never raises for a job's failure (it is in the job's result)."""
        results: list[BuildResult | None] = [None] * len(jobs)
        todo = deque(range(len(jobs)))
        left = len(jobs)
        start_failures = 0

        def finish(i: int, r: BuildResult) -> None:
            nonlocal left
            results[i] = r
            left -= 1
            if on_result is not None:
                on_result(i, r)

        self._ensure_pool()
        while left:
            for w in self._workers:    # hand out work
                if w.ready and w.job is None and todo:
                    i = todo.popleft()
                    try:
                        w.send((i, jobs[i]))
                    except Exception as e:  # cannot pickle the job, or the pipe broke
                        finish(i, BuildResult(error_kind=ErrorKind.UNKNOWN, error_msg=f"cannot send job: {e}"))
                        self._replace(w)
                        continue
                    w.job, w.deadline = i, time.monotonic() + self.timeout
            now = time.monotonic()
            deadlines = [w.deadline for w in self._workers if w.job is not None]
            deadlines += [w.started_at + START_TIMEOUT for w in self._workers if not w.ready]
            wait = max(0.0, min(deadlines) - now) if deadlines else 0.1
            for w in wait_any(self._workers, wait):
                try:
                    msg = w.recv()
                except (EOFError, OSError):
                    if w.job is not None:
                        finish(w.job, BuildResult(error_kind=ErrorKind.COMPILE,
                                                  error_msg=f"builder process died ({w.describe_exit()})",
                                                  build_s=self.timeout - max(0.0, w.deadline - time.monotonic())))
                    elif not w.ready:
                        start_failures += 1
                    self._replace(w)
                    continue
                if isinstance(msg, tuple) and msg[:1] == ("ready",):
                    w.ready = True
                    start_failures = 0
                    continue
                i, res = msg
                w.job, w.deadline = None, float("inf")
                finish(i, res)
            now = time.monotonic()
            for w in list(self._workers):
                if w.job is not None and now >= w.deadline:
                    i = w.job
                    self._replace(w)
                    finish(i, BuildResult(error_kind=ErrorKind.BUILD_TIMEOUT,
                                          error_msg=f"build took longer than {self.timeout:g} s (worker killed)",
                                          build_s=self.timeout))
                elif not w.ready and now >= w.started_at + START_TIMEOUT:
                    start_failures += 1
                    self._replace(w)
            if start_failures >= MAX_START_FAILURES * self.n_workers:
                while todo:
                    finish(todo.popleft(), BuildResult(error_kind=ErrorKind.UNKNOWN,
                                                       error_msg="builder processes fail to start"))
                if all(w.job is None for w in self._workers):
                    break
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop every worker."""
        for w in self._workers:
            w.stop()
        self._workers = []

    def __enter__(self) -> LocalBuilder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; daemonic children die with the parent anyway
        try:
            self.close()
        except Exception:
            pass
