"""Fast CPU code for a LoopFunc through llvmlite: build, optimize (O3), JIT, call with numpy arrays.

Map:
  build_cpu(func, target, context)  LoopFunc -> CpuKernel (cached in memory by func.key + target)
  CpuKernel                         `kernel(*arrays)` checks shapes/dtypes and runs the machine code;
                                    `bind(*arrays)` returns a checked zero-argument runner for timing
                                    loops; `call_unchecked(ptrs)` for callers that own their buffers;
                                    `llvm_ir`, `optimized_ir`, `assembly()`, `compile_seconds`
  target_machine(target)            an llvmlite TargetMachine for a cpu Target (host CPU name/features)
  optimize(mod, tm, level)          LLVM's new pass manager, O<level> pipeline
  clear_cache()

Design notes
- Code generation is in `llvm_emit` (statements, expressions, vectorization); this module owns the
  LLVM pipeline and the calling convention.  The kernel is `void NAME(T0* noalias, ..., Tn* noalias)`
  over `func.params` (inputs then outputs); outputs are written in place, so an output may not overlap
  any other argument (checked).
- Parallel loops: outlined into `task(ctx, tid, nthreads)` functions and run by the persistent thread
  pool of `cpu_runtime` (written in LLVM IR: spin-then-futex workers, static chunking).  Chosen over
  a Python thread pool driving ctypes because waking Python threads costs tens of microseconds per
  call, which would swamp the time of small kernels being tuned; chosen over OpenMP because libgomp
  need not be installed.  Measured on the 2-core dev VM: a call of a tiny kernel through `bind()` costs
  about 0.2 us serial and 1.1 us with a parallel loop (launch + join of the second thread, workers
  still spinning); `tests/cpu/test_llvm_cpu.py::test_parallel_overhead_report` prints it.
- Compile time (emit + verify + O3 + MCJIT): 20 to 50 ms for an elementwise kernel, 50 to 130 ms for a
  tiled matmul with unrolled micro-tiles.  Not thread-safe across Python threads (LLVM's global
  context); the measurement layer builds in processes.
- Temporaries of scope "global" are heap allocated (`aligned_alloc`/`free`) inside the kernel around
  their Allocate; "local" ones are stack allocas in the function's entry block (SROA/mem2reg keep
  small accumulator tiles in registers).  No workspace argument: the calling convention stays
  "params only", and glibc reuses freed blocks, so the cost is a few hundred ns per allocation.
- One MCJIT engine per kernel (freed with the kernel), so a tuning worker that builds thousands of
  candidates does not grow without bound beyond the in-memory cache (an LRU of CACHE_SIZE kernels).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import llvmlite.binding as llvm
import numpy as np

from .. import config
from ..buffers import data_address
from ..errors import CompileError, HlotuneError, InputError
from ..schedule_space.loop_ir import LoopFunc
from ..target import Target
from . import cpu_runtime
from .llvm_emit import emit_module

CACHE_SIZE = 512
_CACHE: OrderedDict[tuple[str, str, int, int, bool], CpuKernel] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_TM: dict[str, llvm.TargetMachine] = {}
_INIT = False


def _init_llvm() -> None:
    global _INIT
    if not _INIT:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()
        _INIT = True


def target_machine(target: Target | None = None, opt_level: int = 3) -> llvm.TargetMachine:
    """A TargetMachine for `target` (default: the host), with its CPU name and features."""
    _init_llvm()
    t = target or Target.host_cpu()
    if t.kind != "cpu":
        raise CompileError(f"the LLVM CPU code generator cannot target {t.kind!r}")
    key = f"{t.fingerprint}|{t.llvm_features}|{opt_level}"
    tm = _TM.get(key)
    if tm is None:
        tm = _TM[key] = _new_target_machine(t, opt_level)
    return tm


def _new_target_machine(t: Target, opt_level: int = 3) -> llvm.TargetMachine:
    """A fresh TargetMachine.  An MCJIT engine takes ownership of the machine it is given (llvmlite marks
    it owned and LLVM deletes it with the engine), so every engine gets its own: handing it the cached
    one would leave the cache pointing at freed memory once the engine's kernel is dropped."""
    _init_llvm()
    tgt = llvm.Target.from_triple(t.triple or llvm.get_process_triple())
    return tgt.create_target_machine(cpu=t.name, features=t.llvm_features, opt=min(max(opt_level, 0), 3),
                                     reloc="default", codemodel="jitdefault", jit=True)


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, level: int = 3) -> None:
    """Run LLVM's default O<level> module pipeline (new pass manager) on `mod` in place."""
    if level <= 0:
        return
    pto = llvm.create_pipeline_tuning_options(speed_level=min(level, 3))
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pm = pb.getModulePassManager()
    pm.run(mod, pb)


class CpuKernel:
    """A compiled LoopFunc.  `kernel(*arrays)`: inputs then outputs (numpy arrays of the declared
    shapes and dtypes; bf16 buffers are float32 arrays); outputs are written in place."""

    def __init__(self, func: LoopFunc, target: Target, name: str, llvm_ir: str, optimized_ir: str,
                 engine: llvm.ExecutionEngine, address: int, parallel: bool, compile_seconds: float):
        self.func = func
        self.target = target
        self.name = name
        self.llvm_ir = llvm_ir
        self.optimized_ir = optimized_ir
        self.compile_seconds = compile_seconds
        self.parallel = parallel
        self._engine = engine
        self._address = address
        n = len(func.params)
        self._cfunc = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n))(address)
        self._n_in = len(func.inputs)
        self._np = [(p.name, p.dtype.np, tuple(p.shape), i >= self._n_in) for i, p in enumerate(func.params)]

    def __repr__(self) -> str:
        return f"<CpuKernel {self.func.name} ({len(self.func.params)} buffers, {self.target.fingerprint})>"

    def _check(self, arrays: tuple) -> tuple[list[int], list[np.ndarray]]:
        if len(arrays) != len(self._np):
            ins = ", ".join(p.name for p in self.func.inputs)
            outs = ", ".join(p.name for p in self.func.outputs)
            raise InputError(f"kernel {self.func.name} takes {len(self._np)} arrays (inputs {ins}; outputs {outs}),"
                             f" got {len(arrays)}")
        keep, ptrs, spans = [], [], []
        for (name, dtype, shape, is_out), a in zip(self._np, arrays):
            if not isinstance(a, np.ndarray):
                if is_out:
                    raise InputError(f"output {name!r} of kernel {self.func.name} must be a numpy array")
                a = np.asarray(a)
            if a.dtype != dtype:
                raise InputError(f"buffer {name!r} of kernel {self.func.name}: dtype {a.dtype}, expected {dtype}")
            if a.shape != shape:
                raise InputError(f"buffer {name!r} of kernel {self.func.name}: shape {a.shape}, expected {shape}")
            if not a.flags.c_contiguous:
                if is_out:
                    raise InputError(f"output {name!r} of kernel {self.func.name} must be C-contiguous")
                a = np.ascontiguousarray(a)
            if is_out and not a.flags.writeable:
                raise InputError(f"output {name!r} of kernel {self.func.name} is read-only")
            p = data_address(a)
            keep.append(a)
            ptrs.append(p)
            spans.append((p, p + a.nbytes, name, is_out))
        self._check_overlap(spans)
        return ptrs, keep

    def _check_overlap(self, spans: list[tuple[int, int, str, bool]]) -> None:
        outs = [s for s in spans if s[3] and s[1] > s[0]]
        for lo, hi, name, _ in outs:
            for lo2, hi2, name2, _o in spans:
                if name2 != name and hi2 > lo2 and lo < hi2 and lo2 < hi:
                    raise InputError(f"output {name!r} of kernel {self.func.name} overlaps buffer {name2!r}"
                                     " (kernels do not work in place)")

    def _start_runtime(self) -> cpu_runtime.Runtime:
        rt = cpu_runtime.runtime(lambda: _new_target_machine(self.target))
        rt.ensure_started(num_threads(self.target))
        return rt

    def __call__(self, *arrays: np.ndarray) -> None:
        ptrs, _keep = self._check(arrays)
        if self.parallel:
            rt = self._start_runtime()
            with rt.lock:
                self._cfunc(*ptrs)
        else:
            self._cfunc(*ptrs)

    def call_unchecked(self, ptrs: list[int] | tuple[int, ...]) -> None:
        """Run on raw data pointers (inputs then outputs), with no checks: the caller guarantees the
        shapes, dtypes, C-contiguity and that no output overlaps another buffer (the whole-model
        executable's own buffers), and keeps the arrays alive during the call."""
        if self.parallel:
            rt = self._start_runtime()   # (re)starts the workers after a fork
            with rt.lock:
                self._cfunc(*ptrs)
        else:
            self._cfunc(*ptrs)

    def bind(self, *arrays: np.ndarray) -> Callable[[], None]:
        """Check `arrays` once; return a zero-argument function that runs the kernel on them (timing loops).
        The arrays must stay alive and unchanged in shape while the runner is used."""
        ptrs, keep = self._check(arrays)
        cf = self._cfunc
        if self.parallel:
            rt = self._start_runtime()
            lock = rt.lock

            def run_parallel(_keep=keep) -> None:
                with lock:
                    cf(*ptrs)
            return run_parallel

        def run(_keep=keep) -> None:
            cf(*ptrs)
        return run

    def assembly(self) -> str:
        """The machine code of the optimized module, as assembly text."""
        tm = target_machine(self.target)
        return tm.emit_assembly(llvm.parse_assembly(self.optimized_ir))


def num_threads(target: Target) -> int:
    """Threads for parallel loops: HLOTUNE_NUM_THREADS, else the target's cores."""
    n = int(config.get("num_threads") or 0)
    return n if n > 0 else max(1, target.cores)


def _compile(func: LoopFunc, target: Target, opt_level: int, context: str | None) -> CpuKernel:
    t0 = time.perf_counter()
    tm = target_machine(target)
    where = f" ({context})" if context else ""
    try:
        module, name, parallel = emit_module(func, target.triple or llvm.get_process_triple())
    except HlotuneError as e:
        raise CompileError(f"code generation for {func.name}{where}: {e.message}") from e
    text = str(module)
    config.debug(4, "LLVM IR of %s%s:\n%s", func.name, where, text)
    if parallel:  # the kernel calls hlotune_rt_launch: make sure the runtime's symbol exists
        cpu_runtime.runtime(lambda: _new_target_machine(target))
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected the IR of {func.name}{where}: {str(e).strip()}") from None
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    optimize(mod, tm, opt_level)
    optimized = str(mod)
    config.debug(5, "optimized LLVM IR of %s:\n%s", func.name, optimized)
    engine = llvm.create_mcjit_compiler(mod, _new_target_machine(target))   # the engine owns its machine
    engine.finalize_object()
    addr = engine.get_function_address(name)
    if not addr:
        raise CompileError(f"JIT produced no code for {func.name}{where}")
    dt = time.perf_counter() - t0
    config.debug(2, "compiled %s in %.3f s", func.name, dt)
    return CpuKernel(func, target, name, text, optimized, engine, addr, parallel, dt)


def build_cpu(func: LoopFunc, target: Target | None = None, *, context: str | None = None,
              opt_level: int | None = None) -> CpuKernel:
    """Compile `func` to machine code for `target` (default: the host).  Raises CompileError (naming the
    function and `context`, e.g. the stage/step being built) when code generation or LLVM fails."""
    t = target or Target.host_cpu()
    level = int(config.get("opt_level")) if opt_level is None else opt_level
    key = (func.key, t.fingerprint + "|" + t.llvm_features, level, int(config.get("nontemporal_store_bytes")),
           bool(config.get("loop_partition")))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    kern = _compile(func, t, level, context)
    with _CACHE_LOCK:
        _CACHE[key] = kern
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return kern


def clear_cache() -> None:
    """Forget every compiled kernel (tests, memory)."""
    with _CACHE_LOCK:
        _CACHE.clear()
