"""The CPU parallel runtime: a persistent thread pool written in LLVM IR (no C compiler).

Map:
  build_runtime_ir(triple)  the runtime module: globals, `hlotune_rt_worker`, `hlotune_rt_launch`
  Runtime                   compiles it once per process, starts the worker threads (pthread_create
                            through ctypes), re-starts them after fork; `ensure_started()`
  runtime()                 the process-wide Runtime (lazy)
  build_plan_ir(triple, calls) / CallPlan   a whole model's kernel calls as one JIT-compiled function
                            `plan(slots)`: every kernel address and every fixed buffer pointer is a
                            constant; only the pointers that change per call (arguments, fresh outputs)
                            are read from the slot table, so one ctypes call runs the whole model

How a parallel loop runs: the code generator outlines the loop into `task(ctx, chunk, nchunks)`, which
runs chunk [ext*chunk/n, ext*(chunk+1)/n) of the iterations, and calls `hlotune_rt_launch(task, ctx)`
from the kernel.  `launch` cuts the loop into threads * CHUNKS_PER_THREAD chunks, publishes (task, ctx)
and the chunk count (one atomic word, `ticket`), bumps a generation counter, wakes sleeping workers
with a futex, then takes chunks itself (compare-and-swap on `ticket`) until none is left, and spins
until every chunk taken by a worker is done.  Chunks are taken dynamically so that a worker the OS
has not scheduled (a loaded machine) delays nothing: the launching thread does its share.  Workers
spin on the generation counter (with `pause`) for a while after each task, then sleep in
`futex_wait`; so back-to-back kernels (timing loops, a model's subgraphs) pay a few microseconds per
launch, and an idle process burns no CPU.

Why not a Python thread pool calling ctypes: waking Python threads costs tens of microseconds per
call, which would dominate the measured time of small kernels during tuning.  Why not OpenMP
(libgomp): it is not guaranteed to be installed, and this needs only libc (pthread_create, syscall).
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

import llvmlite.binding as llvm
import llvmlite.ir as ir

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()
TASK_TYPE = ir.FunctionType(VOID, [PTR, I64, I64])   # task(ctx, tid, nthreads)
TASK_PTR = TASK_TYPE.as_pointer()
LAUNCH_NAME = "hlotune_rt_launch"
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
DEFAULT_SPIN = 1 << 15    # pause iterations before a worker sleeps (about 0.3 to 1.5 ms)
CHUNKS_PER_THREAD = 4     # a parallel loop is cut into threads * this many chunks, taken dynamically
_N_SHIFT, _N_MASK = 20, (1 << 20) - 1


def is_x86(triple: str) -> bool:
    """Whether an LLVM target triple is an x86 one (32 or 64 bit)."""
    return triple.startswith(("x86_64", "i686", "i386"))


def _pause(b: ir.IRBuilder, triple: str) -> None:
    if is_x86(triple):
        b.asm(ir.FunctionType(VOID, []), "pause", "~{memory}", [], side_effect=True)
    elif triple.startswith(("aarch64", "arm64")):
        b.asm(ir.FunctionType(VOID, []), "yield", "~{memory}", [], side_effect=True)


def _global(m: ir.Module, name: str, ty: ir.Type, init: int | None = 0) -> ir.GlobalVariable:
    g = ir.GlobalVariable(m, ty, name)
    g.initializer = ir.Constant(ty, init) if init is not None else ty(None)
    g.align = 64
    return g


def _grab_chunks(fn: ir.Function, b: ir.IRBuilder, ticket, task, ctx, done, exit_block: ir.Block) -> None:
    """Take chunks of the published task until none is left, then branch to `exit_block`.  A chunk is
    taken by a compare-and-swap that decrements the count in `ticket`; the task and context are read
    only after that succeeds (the launcher keeps them until every chunk is done, so they belong to the
    launch whose chunk was taken)."""
    grab = fn.append_basic_block("grab")
    try_ = fn.append_basic_block("grab.try")
    run = fn.append_basic_block("grab.run")
    b.branch(grab)
    b.position_at_end(grab)
    cur = b.load_atomic(ticket, "acquire", 8, typ=I64)
    left = b.and_(cur, ir.Constant(I64, _N_MASK))
    b.cbranch(b.icmp_signed(">", left, ir.Constant(I64, 0)), try_, exit_block)
    b.position_at_end(try_)
    res = b.cmpxchg(ticket, cur, b.sub(cur, ir.Constant(I64, 1)), "acq_rel", "acquire")
    b.cbranch(b.extract_value(res, 1), run, grab)
    b.position_at_end(run)
    n = b.and_(b.lshr(cur, ir.Constant(I64, _N_SHIFT)), ir.Constant(I64, _N_MASK))
    f = b.load(task, typ=TASK_PTR)   # typed pointer: llvmlite reads an indirect callee's type from it
    b.call(f, [b.load(ctx, typ=PTR), b.sub(left, ir.Constant(I64, 1)), n])
    b.atomic_rmw("add", done, ir.Constant(I64, 1), "release")
    b.branch(grab)


def build_runtime_ir(triple: str) -> str:
    """The runtime module's LLVM IR text."""
    m = ir.Module(name="hlotune_rt")
    m.triple = triple
    gen = _global(m, "hlotune_rt_gen", I32)            # generation counter (futex word)
    _global(m, "hlotune_rt_pending", I64)              # unused (kept for the Python side's table)
    sleepers = _global(m, "hlotune_rt_sleepers", I64)  # workers in futex_wait
    nthreads = _global(m, "hlotune_rt_nthreads", I64, 1)
    spin = _global(m, "hlotune_rt_spin", I64, DEFAULT_SPIN)
    task = _global(m, "hlotune_rt_task", PTR, None)
    ctx = _global(m, "hlotune_rt_ctx", PTR, None)
    ticket = _global(m, "hlotune_rt_ticket", I64)       # (chunks << 20) | chunks not yet taken
    done = _global(m, "hlotune_rt_done", I64)           # chunks finished
    sysno = _SYS_FUTEX.get(platform.machine().lower())
    syscall = ir.Function(m, ir.FunctionType(I64, [I64], var_arg=True), "syscall") if sysno else None
    sched_yield = ir.Function(m, ir.FunctionType(I32, []), "sched_yield")

    # ---- worker(arg = tid) ----
    w = ir.Function(m, ir.FunctionType(PTR, [PTR]), "hlotune_rt_worker")
    w.attributes.add("nounwind")
    b = ir.IRBuilder(w.append_basic_block("entry"))
    seen_p = b.alloca(I32)
    spins_p = b.alloca(I64)
    b.store(ir.Constant(I32, 0), seen_p)
    wait = w.append_basic_block("wait")
    b.branch(wait)
    b.position_at_end(wait)
    b.store(ir.Constant(I64, 0), spins_p)
    poll = w.append_basic_block("poll")
    b.branch(poll)
    b.position_at_end(poll)
    g = b.load_atomic(gen, "acquire", 4, typ=I32)
    run = w.append_basic_block("run")
    idle = w.append_basic_block("idle")
    b.cbranch(b.icmp_unsigned("!=", g, b.load(seen_p, typ=I32)), run, idle)
    b.position_at_end(idle)
    n = b.add(b.load(spins_p, typ=I64), ir.Constant(I64, 1))
    b.store(n, spins_p)
    dospin = w.append_basic_block("spin")
    dosleep = w.append_basic_block("sleep")
    b.cbranch(b.icmp_signed("<", n, b.load(spin, typ=I64)), dospin, dosleep)
    b.position_at_end(dospin)
    _pause(b, triple)
    b.branch(poll)
    b.position_at_end(dosleep)
    b.atomic_rmw("add", sleepers, ir.Constant(I64, 1), "seq_cst")
    if syscall is not None:
        b.call(syscall, [ir.Constant(I64, sysno), gen, ir.Constant(I32, FUTEX_WAIT_PRIVATE), b.load(seen_p, typ=I32),
                         PTR(None), PTR(None), ir.Constant(I32, 0)])
    else:
        b.call(sched_yield, [])
    b.atomic_rmw("sub", sleepers, ir.Constant(I64, 1), "seq_cst")
    b.branch(wait)
    b.position_at_end(run)
    b.store(g, seen_p)
    _grab_chunks(w, b, ticket, task, ctx, done, wait)

    # ---- launch(task, ctx) ----
    f = ir.Function(m, ir.FunctionType(VOID, [TASK_PTR, PTR]), LAUNCH_NAME)
    f.attributes.add("nounwind")
    b = ir.IRBuilder(f.append_basic_block("entry"))
    nt = b.load(nthreads, typ=I64)
    single = f.append_basic_block("single")
    multi = f.append_basic_block("multi")
    b.cbranch(b.icmp_signed("<=", nt, ir.Constant(I64, 1)), single, multi)
    b.position_at_end(single)
    b.call(f.args[0], [f.args[1], ir.Constant(I64, 0), ir.Constant(I64, 1)])
    b.ret_void()
    b.position_at_end(multi)
    nchunks = b.mul(nt, ir.Constant(I64, CHUNKS_PER_THREAD))
    b.store(f.args[0], task)
    b.store(f.args[1], ctx)
    b.store_atomic(ir.Constant(I64, 0), done, "seq_cst", 8)
    b.store_atomic(b.or_(b.shl(nchunks, ir.Constant(I64, _N_SHIFT)), nchunks), ticket, "seq_cst", 8)
    b.atomic_rmw("add", gen, ir.Constant(I32, 1), "seq_cst")
    wake = f.append_basic_block("wake")
    mine = f.append_basic_block("mine")
    slp = b.load_atomic(sleepers, "seq_cst", 8, typ=I64)
    b.cbranch(b.icmp_signed(">", slp, ir.Constant(I64, 0)), wake, mine)
    b.position_at_end(wake)
    if syscall is not None:
        b.call(syscall, [ir.Constant(I64, sysno), gen, ir.Constant(I32, FUTEX_WAKE_PRIVATE),
                         ir.Constant(I32, 0x7FFFFFFF)])
    b.branch(mine)
    b.position_at_end(mine)
    waitb = f.append_basic_block("join")
    _grab_chunks(f, b, ticket, task, ctx, done, waitb)
    b.position_at_end(waitb)
    finished = f.append_basic_block("done")
    left = b.load_atomic(done, "acquire", 8, typ=I64)
    again = f.append_basic_block("join.spin")
    b.cbranch(b.icmp_signed("<", left, nchunks), again, finished)
    b.position_at_end(again)
    _pause(b, triple)
    b.branch(waitb)
    b.position_at_end(finished)
    b.ret_void()
    return str(m)


def _libc_address(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value  # type: ignore[return-value]


class Runtime:
    """The process-wide thread pool (compiled once; workers restarted after fork)."""

    def __init__(self, target_machine: llvm.TargetMachine, triple: str):
        for sym in ("syscall", "sched_yield"):
            llvm.add_symbol(sym, _libc_address(sym))
        mod = llvm.parse_assembly(build_runtime_ir(triple))
        mod.verify()
        self._engine = llvm.create_mcjit_compiler(mod, target_machine)
        self._engine.finalize_object()
        self.launch_address = self._engine.get_function_address(LAUNCH_NAME)
        llvm.add_symbol(LAUNCH_NAME, self.launch_address)
        self._worker = self._engine.get_function_address("hlotune_rt_worker")
        self._g = {n: self._engine.get_global_value_address("hlotune_rt_" + n)
                   for n in ("gen", "pending", "sleepers", "nthreads", "spin")}
        self.lock = threading.RLock()     # one launch at a time from Python threads (re-entrant: a call plan
                                          # holds it around its kernels; `Executable.profile` calls them inside)
        self.threads = 0
        self._started_pid = -1

    def _set(self, name: str, value: int, ctype=ctypes.c_int64) -> None:
        ctype.from_address(self._g[name]).value = value

    def set_spin(self, spins: int) -> None:
        """Pause iterations a worker spins before sleeping."""
        self._set("spin", int(spins))

    def ensure_started(self, threads: int) -> None:
        """Start `threads - 1` workers (the caller's thread is worker 0) once per process."""
        if self._started_pid == os.getpid():
            return
        with self.lock:
            if self._started_pid == os.getpid():
                return
            self._set("gen", 0, ctypes.c_int32)
            self._set("pending", 0)
            self._set("sleepers", 0)
            self._set("nthreads", 1)
            libc = ctypes.CDLL(None)
            libc.pthread_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            libc.pthread_detach.argtypes = [ctypes.c_uint64]
            started = 1
            for tid in range(1, max(1, threads)):
                handle = ctypes.c_uint64(0)
                if libc.pthread_create(ctypes.byref(handle), None, self._worker, tid) != 0:
                    break
                libc.pthread_detach(handle.value)
                started += 1
            self._set("nthreads", started)
            self.threads = started
            self._started_pid = os.getpid()


_RUNTIME: Runtime | None = None
_RUNTIME_LOCK = threading.Lock()


def runtime(target_machine_factory) -> Runtime:
    """The process-wide runtime; `target_machine_factory()` makes a host TargetMachine on first use."""
    global _RUNTIME
    if _RUNTIME is None:
        with _RUNTIME_LOCK:
            if _RUNTIME is None:
                llvm.initialize_native_target()
                llvm.initialize_native_asmprinter()
                _RUNTIME = Runtime(target_machine_factory(), llvm.get_process_triple())
    return _RUNTIME


# ----------------------------------------------------------------------------- call plans

PLAN_NAME = "hlotune_plan"


def build_plan_ir(triple: str, calls: list[tuple[int, tuple[tuple[str, int], ...]]]) -> str:
    """IR of `void hlotune_plan(i64* slots)` calling each `(kernel address, arguments)` in order; an
    argument is `("fixed", pointer)` (a constant) or `("slot", k)` (loaded from `slots[k]` at that call)."""
    m = ir.Module(name="hlotune_plan")
    m.triple = triple
    fn = ir.Function(m, ir.FunctionType(VOID, [PTR]), PLAN_NAME)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    slots = fn.args[0]
    for addr, args in calls:
        fty = ir.FunctionType(VOID, [PTR] * len(args))
        callee = b.inttoptr(ir.Constant(I64, addr), fty.as_pointer())   # typed pointer: the callee's type
        vals = []
        for kind, v in args:
            if kind == "fixed":
                vals.append(b.inttoptr(ir.Constant(I64, v), PTR))
            else:
                vals.append(b.load(b.gep(slots, [ir.Constant(I64, v)], source_etype=PTR), typ=PTR))
        b.call(callee, vals)
    b.ret_void()
    return str(m)


class CallPlan:
    """A JIT-compiled sequence of kernel calls (see `build_plan_ir`): `plan(slots_address)` runs them all.
    The kernels (and the buffers behind fixed pointers) must outlive the plan: the caller keeps them."""

    def __init__(self, calls: list[tuple[int, tuple[tuple[str, int], ...]]]):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        mod = llvm.parse_assembly(build_plan_ir(llvm.get_process_triple(), calls))
        mod.verify()
        tm = llvm.Target.from_default_triple().create_target_machine(opt=1)   # owned by the engine
        self._engine = llvm.create_mcjit_compiler(mod, tm)
        self._engine.finalize_object()
        self.address = self._engine.get_function_address(PLAN_NAME)
        self.n_calls = len(calls)
        self._cfunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.address)

    def __call__(self, slots_address: int) -> None:
        self._cfunc(slots_address)
