"""GpuRunner: measure CUDA candidates in one process that owns the GPU; build support for the builder pool.

Map:
  compile_cuda_object(func, target) -> BuildResult   in a builder process: generate CUDA C, nvcc -> cubin;
                                                     BuildResult.obj = cubin bytes, .symbol = the launches
                                                     and temporaries as JSON (`cuda_runtime.source_artifact`)
  measure_gpu_kernel(kernel, data, dev_inputs, timing, fault) -> (kind, message, costs)   in-process
  GpuRunner(timing, timeout)   the parent side, the same interface as runner.LocalRunner (run_one, run,
                               start, close, restarts); chosen for target kind "cuda" by measurer.RUNNERS
  _GpuRunHandler               the runner process: the primary CUDA context, task inputs kept in device
                               memory (uploaded once per task), one candidate per message

Per candidate, in the runner: load the cubin (pycuda `module_from_buffer`, resource checks: compile error
if the kernel cannot launch as planned); outputs are device buffers filled with `reference.poison`; one
launch, synchronize, outputs copied back and compared with the reference (`reference.compare`); the
inputs are copied back and compared with the pristine ones (a kernel that writes its inputs is a wrong
answer, and the inputs are uploaded again); then the candidate's launches, GRAPH_LAUNCHES times over, are
captured into one CUDA graph (a `LaunchProgram`), as a whole model replays its kernels: warm-up replays for
`warmup_ms`, and `repeats` repeats of `number` replays each (number chosen from the warm-up so that a repeat lasts
`min_repeat_ms`), each repeat timed with CUDA events: cost = seconds per call, the device's time without pycuda's
per-launch host cost (5-10 us, which hid the differences between small kernels and favoured schedules of fewer
kernels: a 240 s tune of mlp_train_step chose schedules 27 % slower in the model than its defaults, session 11).
Where the capture fails, and for candidates slower than GRAPH_MAX_CALL_S, the launches are timed one by one.

A CUDA error (illegal address, trap, launch failure) leaves the context unusable: the runner answers with
the candidate's runtime error and `fatal`, and the parent kills it; a hang is a run_timeout (the parent
kills the runner after `timeout` s); a crash of the process (signal) is a runtime error naming the
signal.  In every case the next candidate gets a fresh runner.  The runner's address space is not capped
(the CUDA driver reserves far more virtual memory than it uses).
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..errors import HlotuneError
from ..schedule_space.loop_ir import LoopFunc, Seq
from ..target import Target
from .records import BuildResult, ErrorKind
from .reference import TaskData, compare, poison
from .runner import LocalRunner, TimingConfig, _inject_run_fault

#: task inputs kept on the device in a runner (least recently used tasks are dropped beyond this)
DEVICE_TASKS = 8
#: launches of a candidate per CUDA graph when timing it (0: launched one by one, the timing before session 11), for
#: candidates whose first call took less than GRAPH_MAX_CALL_S (beyond it the host's launch cost is under 1 %)
GRAPH_LAUNCHES = 10
GRAPH_MAX_CALL_S = 1e-3


# ----------------------------------------------------------------------------- builder side

def compile_cuda_object(func: LoopFunc, target: Target) -> BuildResult:
    """CUDA C of `func` compiled by nvcc for the target's arch (raises CompileError)."""
    from ..codegen.cuda import generate_cuda
    from ..codegen.cuda_runtime import compile_cubin, source_artifact

    src = generate_cuda(func, target.arch)
    cubin = compile_cubin(src.text, target.arch or "sm_90", context=func.name)
    stub = LoopFunc(func.name, func.inputs, func.outputs, Seq(()))
    return BuildResult(obj=cubin, symbol=source_artifact(src), func=stub, parallel=False)


# ----------------------------------------------------------------------------- in the runner process

def _events_per_call(run, n: int) -> float:
    import pycuda.driver as drv
    start, stop = drv.Event(), drv.Event()
    start.record()
    for _ in range(n):
        run()
    stop.record()
    stop.synchronize()
    return stop.time_since(start) / 1e3 / n


def _graph_program(kernel, ptrs: list[int], n: int):
    """A LaunchProgram of `n` launches of the kernel's launches on `ptrs`, captured into a CUDA graph (run twice),
    or None where capture failed."""
    from ..codegen.cuda_runtime import LaunchProgram

    prog = LaunchProgram()
    slots = [prog.slot(p) for p in ptrs]
    for _ in range(n):
        prog.kernel(kernel, slots)
    prog.finish()
    for _ in range(2):   # the second run of a key captures the graph and replays it
        prog.run(("measure",))
    return prog if prog.graph_launches else None


def measure_gpu_kernel(kernel, data: TaskData, dev_inputs: list, timing: TimingConfig,
                       fault: str | None = None) -> tuple[ErrorKind, str, tuple[float, ...]]:
    """Check and time a loaded CudaKernel on device-resident inputs: (error kind, message, costs).
    CUDA errors propagate (the caller decides that the process must go)."""
    from ..codegen.cuda_runtime import synchronize, to_device

    func = kernel.func
    for b, ref in zip(func.outputs, data.expected):
        if tuple(b.shape) != ref.shape or b.dtype.np != ref.dtype:
            return (ErrorKind.WRONG_ANSWER, f"output {b.name}: {b.dtype.value}{list(b.shape)}, reference has "
                    f"{ref.dtype}{list(ref.shape)}", ())
    if len(func.outputs) != len(data.expected) or len(func.inputs) != len(data.inputs):
        return ErrorKind.WRONG_ANSWER, "the kernel's buffers do not match the task's", ()
    outs = [to_device(poison(ref)) for ref in data.expected]
    ptrs = [d.ptr for d in dev_inputs] + [o.ptr for o in outs]

    def run() -> None:
        kernel.call_unchecked(ptrs)

    _inject_run_fault(fault, "run")
    t0 = time.perf_counter()
    run()
    synchronize()
    first = time.perf_counter() - t0
    got = [o.get() for o in outs]
    if fault == "wrong":
        got[0].flat[0] = got[0].flat[0] + 1 if got[0].dtype.kind != "b" else not got[0].flat[0]
    for b, out, ref, (rtol, atol) in zip(func.outputs, got, data.expected, data.tolerances):
        msg = compare(out, ref, rtol, atol, b.name)
        if msg is not None:
            return ErrorKind.WRONG_ANSWER, msg, ()
    for b, d, orig in zip(func.inputs, dev_inputs, data.inputs):
        if not np.array_equal(d.get(), orig, equal_nan=orig.dtype.kind == "f"):
            raise _InputsWritten(b.name)
    prog = _graph_program(kernel, ptrs, GRAPH_LAUNCHES) if 0 < GRAPH_LAUNCHES and first < GRAPH_MAX_CALL_S else None
    unit = GRAPH_LAUNCHES if prog is not None else 1
    timed = run if prog is None else (lambda: prog.run(("measure",)))   # one call, or one replay of the graph
    # warm-up by wall time, then the number of replays per repeat from the warm-up's rate
    calls, t0 = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - t0 < timing.warmup_ms * 1e-3:
        timed()
        calls += 1
        if calls % 16 == 0:
            synchronize()
    synchronize()
    per_call = max((time.perf_counter() - t0) / calls, 1e-7) if calls > 1 else max(first, 1e-7)
    per_call = min(per_call, _events_per_call(timed, 1))
    number = max(1, min(100000, math.ceil(timing.min_repeat_ms * 1e-3 / per_call)))
    costs = tuple(_events_per_call(timed, number) / unit for _ in range(max(1, timing.repeats)))
    if prog is not None:
        prog.close()
    return ErrorKind.NONE, "", costs


class _InputsWritten(Exception):
    pass


class _GpuRunHandler:
    """("task", TaskData) stores a task; ("run", key, build, timing, fault) measures one candidate and
    answers (kind, message, costs, run seconds, fatal)."""

    def __init__(self, target_json: str):
        from ..codegen.cuda_runtime import context

        self.target = Target.from_json(target_json)
        context()
        self.tasks: dict[str, TaskData] = {}
        self.dev: dict[str, list] = {}

    def _inputs(self, key: str) -> list:
        from ..codegen.cuda_runtime import to_device

        if key not in self.dev:
            while len(self.dev) >= DEVICE_TASKS:
                self.dev.pop(next(iter(self.dev)))
            self.dev[key] = [to_device(a) for a in self.tasks[key].inputs]
        else:
            self.dev[key] = self.dev.pop(key)   # most recently used last
        return self.dev[key]

    def __call__(self, msg):
        if msg[0] == "task":
            self.tasks[msg[1].key] = msg[1]
            self.dev.pop(msg[1].key, None)
            return None
        import pycuda.driver as drv

        from ..codegen.cuda_runtime import kernel_from_artifact

        _, key, build, timing, fault = msg
        t0 = time.perf_counter()
        try:
            kernel = kernel_from_artifact(build.func, build.obj, build.symbol, self.target, build.build_s)
        except HlotuneError as e:
            return ErrorKind.COMPILE, f"cannot load the cubin: {e}", (), time.perf_counter() - t0, False
        except drv.Error as e:
            return ErrorKind.COMPILE, f"cannot load the cubin: {type(e).__name__}: {e}", (), \
                time.perf_counter() - t0, True
        fatal = False
        try:
            kind, text, costs = measure_gpu_kernel(kernel, self.tasks[key], self._inputs(key), timing, fault)
        except _InputsWritten as e:
            self.dev.pop(key, None)
            kind, text, costs = ErrorKind.WRONG_ANSWER, f"the kernel wrote to its input {e.args[0]}", ()
        except drv.Error as e:   # the context is lost after a device fault: the parent restarts us
            kind, text, costs, fatal = ErrorKind.RUNTIME, f"CUDA error: {type(e).__name__}: {e}", (), True
        except MemoryError:
            kind, text, costs = ErrorKind.RUNTIME, "MemoryError while running the candidate", ()
        except Exception as e:
            kind, text, costs = ErrorKind.RUNTIME, f"{type(e).__name__}: {e}", ()
        finally:
            del kernel
        return kind, text, costs, time.perf_counter() - t0, fatal


def make_handler(target_json: str) -> _GpuRunHandler:
    return _GpuRunHandler(target_json)


# ----------------------------------------------------------------------------- the parent side

class GpuRunner(LocalRunner):
    """Runs built CUDA candidates in one process that owns GPU 0 (see the module docstring).
    `timeout`: seconds per candidate (load + check + timing), the first one also pays the context start.
    The process is not memory-capped (a CUDA context maps far more address space than it uses)."""

    HANDLER = "hlotune.measure.gpu_runner:make_handler"
    PROCESS_NAME = "hlotune-gpu-runner"
    WHAT = "the GPU runner process"

    def __init__(self, timing: TimingConfig | None = None, timeout: float = 20.0, memory_bytes: int | None = None,
                 target: Target | None = None):
        super().__init__(timing, timeout, target=target)
        self.memory_bytes = None
        del memory_bytes

    def _target(self) -> Target:
        if self.target is None:
            self.target = Target.from_string("cuda")
        return self.target


__all__ = ["GpuRunner", "compile_cuda_object", "measure_gpu_kernel"]
