"""LocalRunner: load compiled candidates in one isolated process, check their output, time them.

Map:
  TimingConfig     warm-up, repeats, minimum time per repeat, cache flush, early cutoff
  LocalRunner(timing, timeout, memory_bytes, target, cutoff)
    .run(task_data, builds, faults) -> list[MeasureResult]   one candidate at a time
    .set_best({task key: seconds})   the tuner's per-task best, for the early cutoff of hopeless candidates
    .realtime() -> bool              whether the runner process really times at SCHED_RR
    .set_priority(p) -> bool         time at SCHED_RR priority p (a tuner started under chrt: only its runner)
    .close()
  load_kernel(build, target) -> CpuKernel      object code -> execution engine -> CpuKernel (in-process)
  measure_kernel(kernel, data, timing, fault, flusher, pace)  check + timing of one loaded kernel (in-process)
  RtPacer          keeps a real-time runner under the kernel's RT throttling (rests between timings)
  _RunHandler      the runner process: task data cache, the faults of the test hook

One long-lived runner process per device (spawned through the forkserver, so its LLVM state is clean);
the parent sends each task's inputs and reference outputs once per runner process, then one message
per candidate.  The parent waits for each reply with a timeout: past it the runner is killed and the
candidate is a run_timeout; if the runner dies (a segfault in a kernel, an abort) the candidate is a
runtime error naming the signal.  Either way a fresh runner is started for the next candidate.  The
runner's address space is capped (RLIMIT_AS: its size after start + `memory_bytes`), so a candidate
that allocates without bound gets a MemoryError (runtime) instead of exhausting the machine.

Per candidate, in the runner:
  1. load: a new execution engine with its own TargetMachine (an MCJIT engine owns and frees the
     TargetMachine it is given, so a shared one would dangle after the first engine is freed),
     `add_object_file`, finalize; the parallel runtime's symbol is defined first.
  2. check: outputs are filled with `reference.poison` (differs from the reference everywhere), the
     kernel runs once, each output is compared with the reference (`reference.compare`); inputs are
     compared with a pristine copy afterwards (a kernel that writes its inputs is a wrong answer, and
     the inputs are restored for the next candidate).
  3. warm-up: calls until `warmup_ms` have passed (the checked call counts; at least that call).
  4. timing: `number` calls per repeat so that a repeat lasts at least `min_repeat_ms`, estimated from
     the warm-up; `repeats` repeats, each timed with `time.perf_counter_ns` around the calls of
     `kernel.bind(...)`; cost = seconds per call.  With `flush_cache`, a buffer of twice the last-level
     cache (at most FLUSH_MAX_BYTES) is written before each repeat and `number` is 1 (each cost is one cold call).
  5. early cutoff: when the first repeat is slower than `cutoff_s` per call, and so was the checked call (one slow
     observation on a busy machine is not enough: a cold call faster than the cutoff means the repeat was
     disturbed), the candidate stops there and is valid with that one repeat (the LocalRunner sets `cutoff_s` =
     `cutoff` x the task's best given by `set_best`, setting `measure_cutoff`, default 1.5): a schedule clearly
     slower than the best is not worth timing in full, and one repeat of it is still a real, checked measurement
     the cost model learns from.
     When the checked call itself (a cold call: it can only be slower than a warm one) took more than
     CHECK_CUTOFF x `cutoff_s`, the candidate stops before the warm-up, valid with that one call as its cost
     (when it took less than COLD_SLACK_S more than that, more calls are timed first, for up to COLD_SLACK_S, and
     the fastest decides and is the cost: a cold parallel call pays for waking the runtime's threads);
     and when both of its first two repeats are over `cutoff2_s` (SECOND_CUTOFF x the best: it cannot be a new
     best) it stops after those two.  On workload A's 256 trials the first two save about 15 of 105 s of tuning.
  6. real-time pacing: a runner at real-time priority (SCHED_RR/FIFO) sleeps RtPacer's rest before a timing that
     would take its busy time since the last rest past the kernel's real-time budget (see RtPacer).
Defaults: 3 repeats of at least 34 ms, so a candidate near the best is timed for about 100 ms (plus 10 ms
of warm-up).  The timed calls include the ~0.2 us of a Python call through
ctypes (the same as an executable's), which matters only for kernels of a few microseconds.
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .. import config
from ..buffers import aligned_copy, empty_outputs
from ..target import Target
from .records import BuildResult, ErrorKind, MeasureResult
from .reference import TaskData, compare, poison
from .workers import REALTIME, Worker, set_policy

START_TIMEOUT = 120.0
RUN_FAULTS = ("segfault", "hang", "oom", "raise", "wrong")
#: a candidate whose checked (first, cold) call exceeds this many times its `cutoff_s` is not timed further
CHECK_CUTOFF = 2.0
#: ... unless it exceeds it by less than this: then more (warm) calls, for up to this long, decide (the fastest one
#: counts).  A cold call of a parallel kernel includes waking the runtime's sleeping worker threads, which took up to
#: ~1.1 ms on a 2-core VM (session 24: a 10 us kernel's cold call measured 30 us to 1.1 ms, and the next calls stay
#: slow until the worker runs), so without this nearly every parallel candidate of a task whose best is under ~0.4 ms
#: was recorded at its cold call's time, 3x to 100x its real one
COLD_SLACK_S = 2e-3
#: a candidate whose first two repeats are both more than this many times its task's best stops after them
SECOND_CUTOFF = 1.1
#: the cache-flush buffer is twice the last-level cache, at most this (some VMs report a host-wide L3)
FLUSH_MAX_BYTES = 128 << 20
#: RtPacer: kept unused of the kernel's real-time budget per period, and added to the rest it must leave (seconds)
RT_MARGIN_S = 0.1
RT_REST_MARGIN_S = 0.02
#: where Linux keeps the real-time throttling budget (microseconds; runtime -1: no throttling)
RT_SYSCTL = "/proc/sys/kernel/sched_rt_{}_us"


@dataclass(frozen=True)
class TimingConfig:
    """How candidates are timed (see the module docstring)."""

    warmup_ms: float = 10.0
    repeats: int = 3
    min_repeat_ms: float = 34.0
    flush_cache: bool = False
    #: stop after the first repeat when it took more than this many seconds per call (0: never)
    cutoff_s: float = 0.0
    #: stop after the second repeat when both took more than this many seconds per call (0: never)
    cutoff2_s: float = 0.0


# ----------------------------------------------------------------------------- in-process pieces

def _fresh_target_machine(target: Target):
    import llvmlite.binding as llvm
    tgt = llvm.Target.from_triple(target.triple or llvm.get_process_triple())
    return tgt.create_target_machine(cpu=target.name, features=target.llvm_features, opt=3,
                                     reloc="default", codemodel="jitdefault", jit=True)


def _init_llvm(target: Target) -> None:
    import llvmlite.binding as llvm

    from ..codegen import cpu_runtime
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    cpu_runtime.runtime(lambda: _fresh_target_machine(target))


def load_kernel(build: BuildResult, target: Target):
    """A CpuKernel running the object code of `build` (in this process)."""
    import llvmlite.binding as llvm

    from ..codegen.llvm_cpu import CpuKernel
    from ..errors import CompileError

    _init_llvm(target)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _fresh_target_machine(target))
    engine.add_object_file(llvm.ObjectFileRef.from_data(build.obj))
    engine.finalize_object()
    addr = engine.get_function_address(build.symbol)
    if not addr:
        raise CompileError(f"object code of {build.func.name} has no symbol {build.symbol!r}")
    return CpuKernel(build.func, target, build.symbol, "", "", engine, addr, build.parallel, build.build_s)


def _inject_run_fault(fault: str | None, stage: str) -> None:
    if fault == "segfault" and stage == "run":
        ctypes.memset(8, 0, 1)          # write to (nearly) address 0
    elif fault == "hang" and stage == "run":
        while True:
            pass
    elif fault == "oom" and stage == "run":
        hog = []
        while True:
            hog.append(np.ones(1 << 21))  # 16 MiB at a time, touched
    elif fault == "raise" and stage == "run":
        raise RuntimeError("injected fault: raise")


class _Flusher:
    def __init__(self, target: Target):
        llc = max(target.l3_bytes or 0, target.l2_bytes or 0)
        size = min(2 * max(llc, 8 << 20), FLUSH_MAX_BYTES)
        self.buf = np.zeros(size // 8, dtype=np.int64)
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        self.buf.fill(self.n)


def rt_budget(sysctl: str = RT_SYSCTL) -> tuple[float, float] | None:
    """(period, runtime) of Linux's real-time throttling in seconds: real-time threads may use `runtime` of each
    `period` of a core; None when it is off (runtime -1) or cannot be read."""
    try:
        period, runtime = (int(Path(sysctl.format(k)).read_text()) * 1e-6 for k in ("period", "runtime"))
    except (OSError, ValueError):
        return None
    return (period, runtime) if 0 < runtime < period else None


class RtPacer:
    """Keeps a real-time runner under the kernel's RT throttling.  Linux lets real-time threads use `runtime` of
    each `period` of a core (950 ms of 1 s by default), then stops every real-time thread of the core until the
    period ends: a runner busy for a whole batch at SCHED_RR stalls ~50 ms each second, and the repeat it is
    timing then takes 2.5x as long (a 34 ms repeat: 84 ms; benchmarks/rt_stalls.py measures it).  Call the pacer
    before each timing with the time it will take: when that would bring the time busy since the last rest past
    `busy_s` (the budget less RT_MARGIN_S), it sleeps `rest_s` (what the period leaves, plus RT_REST_MARGIN_S)
    first.  An idle gap of at least `rest_s` between calls (the runner waiting for the next batch) is a rest too;
    the first call rests (what the process used before it is not known).  `done()` marks the end of a candidate
    (the runner may idle from there).  The rest is only a rest when nothing else on the cores is real-time: the
    tuner puts its search at normal priority (tuner._realtime_timing_only), and builders always build at normal
    priority."""

    def __init__(self, busy_s: float, rest_s: float, clock=time.perf_counter, sleep=time.sleep):
        self.busy_s, self.rest_s = busy_s, rest_s
        self.clock, self.sleep = clock, sleep
        self.since: float | None = None    # start of the busy stretch
        self.idle_at: float | None = None  # end of the last candidate
        self.rests = 0

    @staticmethod
    def for_budget(budget: tuple[float, float] | None) -> RtPacer | None:
        if budget is None:
            return None
        period, runtime = budget
        return RtPacer(max(runtime - RT_MARGIN_S, 0.5 * runtime), period - runtime + RT_REST_MARGIN_S)

    def __call__(self, next_s: float = 0.0) -> None:
        now = self.clock()
        if self.since is not None and self.idle_at is not None and now - self.idle_at >= self.rest_s:
            self.since = now
        self.idle_at = None
        if self.since is None or (now - self.since + next_s > self.busy_s and now > self.since):
            self.sleep(self.rest_s)
            self.rests += 1
            self.since = self.clock()

    def done(self) -> None:
        self.idle_at = self.clock()


def _no_pace(next_s: float = 0.0) -> None:
    return None


def _outputs_apart(expected: list[np.ndarray], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Poisoned output buffers, ALIGN-aligned (the same timing on every allocation) and the big ones placed off the
    big inputs' page offsets (`buffers.empty_outputs`: a candidate's timing does not depend on whether its output
    happened to start just after an input, modulo 4 KiB)."""
    outs = empty_outputs([(tuple(r.shape), r.dtype, r.nbytes) for r in expected], inputs)
    for out, ref in zip(outs, expected):
        np.copyto(out, poison(ref), casting="no")
    return outs


def measure_kernel(kernel, data: TaskData, timing: TimingConfig, fault: str | None = None,
                   flusher: _Flusher | None = None, pace=None) -> tuple[ErrorKind, str, tuple[float, ...]]:
    """Check and time a loaded kernel on the task's inputs: (error kind, message, costs).  `pace(seconds)` is
    called before each timed stretch with its expected length (an RtPacer, for a real-time runner)."""
    pace = pace or _no_pace
    func = kernel.func
    for b, ref in zip(func.outputs, data.expected):
        if tuple(b.shape) != ref.shape or b.dtype.np != ref.dtype:
            return (ErrorKind.WRONG_ANSWER, f"output {b.name}: {b.dtype.value}{list(b.shape)}, reference has "
                    f"{ref.dtype}{list(ref.shape)}", ())
    if len(func.outputs) != len(data.expected) or len(func.inputs) != len(data.inputs):
        return ErrorKind.WRONG_ANSWER, "the kernel's buffers do not match the task's", ()
    inputs = [aligned_copy(a) for a in data.inputs]
    outs = _outputs_apart(data.expected, inputs)
    run = kernel.bind(*inputs, *outs)
    _inject_run_fault(fault, "run")
    pace(0.0)
    t0 = time.perf_counter_ns()
    run()
    first = time.perf_counter_ns() - t0
    if fault == "wrong":
        outs[0].flat[0] = outs[0].flat[0] + 1 if outs[0].dtype.kind != "b" else not outs[0].flat[0]
    for b, out, ref, (rtol, atol) in zip(func.outputs, outs, data.expected, data.tolerances):
        msg = compare(out, ref, rtol, atol, b.name)
        if msg is not None:
            return ErrorKind.WRONG_ANSWER, msg, ()
    for b, a, orig in zip(func.inputs, inputs, data.inputs):
        if not np.array_equal(a, orig, equal_nan=a.dtype.kind == "f"):
            return ErrorKind.WRONG_ANSWER, f"the kernel wrote to its input {b.name}", ()
    calls, spent, check = 1, first, first   # check: the fastest single call so far
    limit = timing.cutoff_s * CHECK_CUTOFF
    if 0 < limit < first * 1e-9 < limit + COLD_SLACK_S:   # maybe only cold: warm calls for up to COLD_SLACK_S
        while check * 1e-9 > limit and (spent - first) * 1e-9 < COLD_SLACK_S:
            t0 = time.perf_counter_ns()
            run()
            t = time.perf_counter_ns() - t0
            calls, spent, check = calls + 1, spent + t, min(check, t)
    if 0 < limit < check * 1e-9:   # hopeless already in its checked call(s)
        return ErrorKind.NONE, "", (check * 1e-9,)
    # warm-up (the checked calls count)
    warm = int(timing.warmup_ms * 1e6)
    pace(max(warm - spent, 0) * 1e-9)
    t0 = time.perf_counter_ns() - spent
    while spent < warm:
        run()
        calls += 1
        spent = time.perf_counter_ns() - t0
    per_call = max(1, (spent - first) // (calls - 1) if calls > 1 else first)
    number = 1 if timing.flush_cache else max(1, math.ceil(timing.min_repeat_ms * 1e6 / per_call))
    costs: list[float] = []
    for _ in range(max(1, timing.repeats)):
        if flusher is not None:
            flusher()
        pace(number * per_call * 1e-9)
        t0 = time.perf_counter_ns()
        for _ in range(number):
            run()
        costs.append((time.perf_counter_ns() - t0) / number * 1e-9)
        if len(costs) == 1 and 0 < timing.cutoff_s < min(costs[0], check * 1e-9):   # hopeless: one repeat is enough
            break
        if len(costs) == 2 and 0 < timing.cutoff2_s < min(costs):   # not a new best: two repeats are enough
            break
    return ErrorKind.NONE, "", tuple(costs)


class _RunHandler:
    """The runner process: ("task", TaskData) stores a task; ("run", key, build, timing, fault) measures."""

    def __init__(self, target_json: str):
        self.target = Target.from_json(target_json)
        self.realtime = raise_priority() if config.get("measure_realtime") else False
        _init_llvm(self.target)
        self.tasks: dict[str, TaskData] = {}
        self.flusher: _Flusher | None = None
        # used while this process is real-time (its parent may make it so later)
        self.pacer = RtPacer.for_budget(rt_budget()) if config.get("measure_rt_pace") else None

    def __call__(self, msg):
        if msg[0] == "task":
            self.tasks[msg[1].key] = msg[1]
            return None
        _, key, build, timing, fault = msg
        t0 = time.perf_counter()
        try:
            kernel = load_kernel(build, self.target)
        except Exception as e:
            return ErrorKind.COMPILE, f"cannot load the object code: {type(e).__name__}: {e}", (), \
                time.perf_counter() - t0
        try:
            if timing.flush_cache and self.flusher is None:
                self.flusher = _Flusher(self.target)
            kind, text, costs = measure_kernel(kernel, self.tasks[key], timing, fault,
                                               self.flusher if timing.flush_cache else None, self._pace())
        except MemoryError:
            kind, text, costs = ErrorKind.RUNTIME, "MemoryError: the candidate exceeded the runner's memory cap", ()
        except Exception as e:
            kind, text, costs = ErrorKind.RUNTIME, f"{type(e).__name__}: {e}", ()
        finally:
            del kernel
            if self.pacer is not None:
                self.pacer.done()
        return kind, text, costs, time.perf_counter() - t0

    def _pace(self):
        """The pacer while this process runs at real-time priority (its parent may raise it at any time)."""
        try:
            rt = os.sched_getscheduler(0) in REALTIME
        except (AttributeError, OSError):
            rt = False
        return self.pacer if rt else None


def raise_priority() -> bool:
    """Put this process (and the threads it starts later: the parallel runtime's) at the lowest real-time
    priority, SCHED_RR 1, when the user may (root, CAP_SYS_NICE or an rtprio limit).  Other jobs' threads, even at
    nice 19, can then not hold a core a parallel kernel is timed on (a static split waits for its slowest thread,
    so one preempted thread stretches the whole call); the kernel's own candidates still time-slice with each
    other, and the kernel's RT throttling keeps 5% of each core for everything else.  False when not allowed."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        return True
    except (AttributeError, OSError):
        return False


def set_rr(pid: int, priority: int) -> bool:
    """SCHED_RR `priority` for every thread of process `pid` (threads it starts later inherit it); False when not
    allowed for one of them."""
    return set_policy(pid, os.SCHED_RR, priority)


def make_handler(target_json: str) -> _RunHandler:
    return _RunHandler(target_json)


# ----------------------------------------------------------------------------- the parent side

class LocalRunner:
    """Runs built candidates of a task in an isolated process (see the module docstring).
    `timeout`: seconds per candidate (load + check + timing); `memory_bytes`: the runner's address
    space beyond its size at start (None: no cap); `cutoff`: a candidate whose first timed repeat is more than
    this many times slower than its task's best (`set_best`) stops there (None: setting `measure_cutoff`;
    0: off)."""

    #: the runner process: its message handler, process name, and how errors name it
    HANDLER = "hlotune.measure.runner:make_handler"
    PROCESS_NAME = "hlotune-runner"
    WHAT = "the runner process"

    def __init__(self, timing: TimingConfig | None = None, timeout: float = 10.0,
                 memory_bytes: int | None = None, target: Target | None = None, cutoff: float | None = None):
        self.timing = timing or TimingConfig()
        self.timeout = float(timeout)
        self.cutoff = float(config.get("measure_cutoff") if cutoff is None else cutoff)
        self.best: dict[str, float] = {}
        self.priority: int | None = None
        self.memory_bytes = memory_bytes if memory_bytes is not None else _default_memory()
        self.target = target
        self._worker: Worker | None = None
        self._sent: set[str] = set()
        self.restarts = 0

    def _target(self) -> Target:
        """The target measured (detected on first use when not given)."""
        if self.target is None:
            self.target = Target.host_cpu()
        return self.target

    def _ensure(self) -> Worker | None:
        w = self._worker
        if w is not None and w.alive and w.ready:
            return w
        if w is not None:
            w.kill()
            self.restarts += 1
        self._sent = set()
        for _ in range(2):
            w = Worker(self.HANDLER, self._target().to_json(), self.memory_bytes, self.PROCESS_NAME).start()
            if w.wait_ready(START_TIMEOUT):
                self._worker = w
                if self.priority is not None:
                    set_rr(w.proc.pid, self.priority)
                return w
            w.kill()
        self._worker = None
        return None

    def start(self) -> None:
        """Start the runner process now (else it starts with the first candidate)."""
        self._ensure()

    def set_best(self, best: dict[str, float]) -> None:
        """The best latency measured so far per task key (the tuner sets it before each batch): a candidate of
        such a task whose first timed repeat is more than `cutoff` times slower stops after that repeat."""
        self.best = {k: float(v) for k, v in best.items() if math.isfinite(v) and v > 0}

    def _timing(self, key: str) -> TimingConfig:
        best = self.best.get(key)
        if not best or self.cutoff <= 0:
            return self.timing
        return replace(self.timing, cutoff_s=self.cutoff * best, cutoff2_s=SECOND_CUTOFF * best)

    def realtime(self) -> bool:
        """Whether the runner process times at real-time priority (SCHED_RR; setting `measure_realtime`, where
        this user may): asked of the running process itself, which is started if need be."""
        w = self._ensure()
        try:
            return w is not None and os.sched_getscheduler(w.proc.pid) == os.SCHED_RR
        except (AttributeError, OSError):
            return False

    def set_priority(self, priority: int) -> bool:
        """Time at SCHED_RR `priority` (every thread of the runner process, and of any runner started after it):
        a tuner started under `chrt` keeps only its runner real-time (tuner._realtime_timing_only), so its search
        can run while a candidate is timed without disturbing it.  False when not allowed."""
        self.priority = int(priority)
        w = self._ensure()
        return w is not None and set_rr(w.proc.pid, self.priority)

    def run_one(self, data: TaskData, build: BuildResult, fault: str | None = None) -> MeasureResult:
        """Measure one built candidate of the task whose TaskData is `data`."""
        if not build.ok:
            return MeasureResult((), build.error_kind, build.error_msg, build.build_s, 0.0)
        w = self._ensure()
        if w is None:
            return MeasureResult((), ErrorKind.UNKNOWN, f"{self.WHAT} cannot start", build.build_s, 0.0)
        t0 = time.monotonic()
        try:
            if data.key not in self._sent:
                w.send(("task", data))
                self._sent.add(data.key)
            w.send(("run", data.key, build, self._timing(data.key), fault))
        except Exception as e:
            self._kill()
            return MeasureResult((), ErrorKind.UNKNOWN, f"cannot send the candidate to the runner: {e}",
                                 build.build_s, 0.0)
        if not w.conn.poll(self.timeout):
            self._kill()
            return MeasureResult((), ErrorKind.RUN_TIMEOUT, f"run took longer than {self.timeout:g} s (runner killed)",
                                 build.build_s, time.monotonic() - t0)
        try:
            kind, text, costs, run_s, *fatal = w.recv()
        except (EOFError, OSError):
            how = w.describe_exit()
            self._kill()
            return MeasureResult((), ErrorKind.RUNTIME, f"runner process died ({how})", build.build_s,
                                 time.monotonic() - t0)
        if fatal and fatal[0]:  # the runner says its state is broken (e.g. a CUDA context error)
            self._kill()
        return MeasureResult(tuple(costs), kind, text, build.build_s, run_s)

    def run(self, data: TaskData, builds: Sequence[BuildResult],
            faults: Sequence[str | None] | None = None) -> list[MeasureResult]:
        """Measure built candidates of one task, one after the other."""
        faults = faults or [None] * len(builds)
        return [self.run_one(data, b, f) for b, f in zip(builds, faults)]

    def _kill(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
            self.restarts += 1
        self._sent = set()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._sent = set()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _default_memory() -> int:
    """Half the machine's memory, at most 16 GiB (beyond the runner's own size)."""
    try:
        import os
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        total = 8 << 30
    return int(min(total // 2, 16 << 30))
