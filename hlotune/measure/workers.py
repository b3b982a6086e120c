"""Worker processes for builders and runners: start, talk over a pipe, kill, replace.

Map:
  mp_context()          the multiprocessing context: "forkserver" (numpy, llvmlite and hlotune's
                        codegen preloaded in the server, no LLVM state created there), else "spawn"
  Worker                one child process with a duplex pipe; `start`, `send`, `recv`, `kill`,
                        `describe_exit()` ("killed by signal SIGSEGV"), a job and its deadline
  child_main            the child's loop: cap the address space, make the handler, say "ready",
                        then answer each message with handler(message) until EOF or "stop"
  wait_any(workers, t)  the workers whose pipe is readable (a reply, or EOF when the child died)
  cap_memory(extra)     RLIMIT_AS = current virtual size + extra bytes (MemoryError instead of an
                        exhausted machine)
  set_policy(pid, policy, priority)   the scheduling policy of every thread of a process
  thread_ids(pid), REALTIME             a process's threads; the real-time scheduling policies

Why processes and not threads: LLVM is not thread-safe across Python threads (one global context),
and a candidate that crashes, hangs or allocates without bound must take down only its own process.
Why not `multiprocessing.Pool` / `ProcessPoolExecutor`: a worker that dies breaks the whole pool (or
hangs `map`), and there is no per-task timeout that kills the worker; here a worker is a plain
`Process` that is killed (SIGKILL) and replaced, and its job gets an error kind.
A child whose parent disappears sees EOF on its pipe and exits, so no process outlives the tuner.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import time
from typing import Any

_PRELOAD = ["numpy", "llvmlite.binding", "hlotune.codegen.llvm_cpu", "hlotune.measure.builder",
            "hlotune.measure.runner"]
_CTX = None


def mp_context():
    """The multiprocessing context of every measurement worker (created once per process)."""
    global _CTX
    if _CTX is None:
        try:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(_PRELOAD)
        except ValueError:  # pragma: no cover - platforms without forkserver
            ctx = mp.get_context("spawn")
        _CTX = ctx
    return _CTX


def cap_memory(extra_bytes: int | None) -> None:
    """Limit this process's address space to its current size plus `extra_bytes` (None: no limit)."""
    if not extra_bytes:
        return
    import resource
    try:
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # pragma: no cover - not Linux
        vm = 0
    limit = vm + int(extra_bytes)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


#: the real-time scheduling policies (SCHED_RR, SCHED_FIFO) where the platform has them
REALTIME = tuple(getattr(os, n) for n in ("SCHED_RR", "SCHED_FIFO") if hasattr(os, n))


def thread_ids(pid: int) -> list[int]:
    """The thread ids of process `pid` (just `pid` where /proc cannot say)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return [pid]


def set_policy(pid: int, policy: int, priority: int = 0) -> bool:
    """`os.sched_setscheduler` for every thread of process `pid` (threads it starts later inherit it); False
    when not allowed for one of them."""
    ok = True
    for tid in thread_ids(pid):
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(priority))
        except (AttributeError, OSError):
            ok = False
    return ok


def child_main(conn, factory: str, init: Any, memory_bytes: int | None) -> None:
    """Entry point of a worker process: `factory` ("module:function") makes the handler from `init`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C goes to the tuner, which kills us
    mod, _, fn = factory.partition(":")
    handler = getattr(importlib.import_module(mod), fn)(init)
    cap_memory(memory_bytes)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg == "stop":
            return
        reply = handler(msg)
        if reply is not None:
            conn.send(reply)


class Worker:
    """One worker process (see the module docstring)."""

    def __init__(self, factory: str, init: Any, memory_bytes: int | None = None, name: str = "hlotune-worker"):
        self.factory, self.init, self.memory_bytes, self.name = factory, init, memory_bytes, name
        self.proc = None
        self.conn = None
        self.ready = False
        self.job: Any = None          # what it is working on (owner's bookkeeping)
        self.deadline = float("inf")
        self.started_at = 0.0

    def start(self) -> Worker:
        ctx = mp_context()
        parent, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=child_main, args=(child, self.factory, self.init, self.memory_bytes),
                                name=self.name, daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.ready = False
        self.job = None
        self.deadline = float("inf")
        self.started_at = time.monotonic()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def send(self, msg: Any) -> None:
        self.conn.send(msg)

    def recv(self) -> Any:
        return self.conn.recv()

    def wait_ready(self, timeout: float) -> bool:
        """Block until the child said ready (True) or died / timed out (False)."""
        if self.ready:
            return True
        if self.conn.poll(timeout):
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return False
            self.ready = isinstance(msg, tuple) and msg[:1] == ("ready",)
        return self.ready

    def describe_exit(self) -> str:
        """How the child ended, e.g. "killed by signal SIGSEGV" or "exit code 1"."""
        if self.proc is None:
            return "not started"
        self.proc.join(1.0)
        code = self.proc.exitcode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        """SIGKILL the child (if running) and reap it."""
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5.0)
        if self.conn is not None:
            self.conn.close()
        self.ready = False

    def stop(self, timeout: float = 1.0) -> None:
        """Ask the child to exit; kill it if it does not."""
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send("stop")
            except (OSError, ValueError):
                pass
            self.proc.join(timeout)
        self.kill()


def wait_any(workers: list[Worker], timeout: float | None) -> list[Worker]:
    """The workers whose pipe has a message or EOF, waiting up to `timeout` seconds."""
    by_conn = {w.conn: w for w in workers if w.conn is not None and not w.conn.closed}
    if not by_conn:
        if timeout:
            time.sleep(min(timeout, 0.05))
        return []
    ready = mpc.wait(list(by_conn), timeout=None if timeout is None else max(0.0, timeout))
    return [by_conn[c] for c in ready]
