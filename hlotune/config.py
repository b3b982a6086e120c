"""Typed settings, read from environment variables, and the DEBUG level table.

This is the only module that reads the environment.  Each setting has a name, a type,
a default, a help text and an environment variable.  `settings()` returns the current
values; `HLOTUNE_DEBUG` sets the logging detail:

| level | what is logged |
|-------|----------------|
| 0     | warnings only |
| 1     | tasks (subgraphs found, tuning rounds) |
| 2     | timings (passes, compile, measure) |
| 3     | chosen schedules |
| 4     | generated LLVM IR / CUDA C |
| 5     | the IR after each pass |
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

DEBUG_LEVELS = {
    0: "warnings only",
    1: "tasks",
    2: "timings",
    3: "chosen schedules",
    4: "generated LLVM IR / CUDA C",
    5: "IR after each pass",
}


@dataclass(frozen=True)
class Setting:
    name: str
    type: Callable[[str], Any]
    default: Any
    help: str

    @property
    def env(self) -> str:
        return "HLOTUNE_" + self.name.upper()


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _choice(text: str, values: tuple[str, ...]) -> str:
    low = text.strip().lower()
    if low not in values:
        raise ValueError(f"not one of {', '.join(values)}: {text!r}")
    return low


def _sizes(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    out = tuple(int(p) for p in parts)
    if any(v < 0 for v in out):
        raise ValueError(f"sizes must be >= 0: {text!r}")
    return tuple(v for v in out if v > 0)


SETTINGS: tuple[Setting, ...] = (
    Setting("debug", int, 0, "logging detail 0-5 (see DEBUG_LEVELS); also shows tracebacks in the CLI"),
    Setting("cache_dir", str, os.path.join(os.path.expanduser("~"), ".cache", "hlotune"),
            "directory for caches of compiled modules"),
    Setting("log_dir", str, "logs", "where `hlotune tune` writes run logs by default"),
    Setting("num_threads", int, 0, "threads for parallel loops on the CPU (0: one per core)"),
    Setting("opt_level", int, 3, "LLVM optimization level for generated CPU code"),
    Setting("nontemporal_store_bytes", int, 8 << 20,
            "CPU (x86): in a kernel without local buffers, contiguous vector stores to a kernel argument of at least "
            "this many bytes that the kernel never reads are non-temporal (they bypass the caches: no read for "
            "ownership; 0: off); relu_chain (40 MB in, 40 MB out) ran 1.72 -> 1.24 ms with them"),
    Setting("loop_partition", _bool, True,
            "CPU: split a loop whose body tests a tile's tail guard into a steady part without the guard and a "
            "tail with it (hlotune/codegen/partition.py); a 133-row packed GEMM block of 256 rows ran 1.7x slower "
            "than a 128-row one with the guard in its register tile"),
    Setting("build_max_ir_lines", int, 30000,
            "a tuning candidate whose LLVM IR is longer than this is not built (a compile error; 0: no limit): "
            "such over-unrolled code took 6-13 s to build and was never within 10 % of its task's best"),
    Setting("measure_realtime", _bool, False, "time CPU candidates at real-time priority (SCHED_RR) where this "
                                              "user may: other jobs can then not preempt a parallel kernel's threads"),
    Setting("measure_rt_pace", _bool, True, "a real-time runner rests between timings to stay within the kernel's "
                                            "real-time budget (sched_rt_runtime_us), whose throttling otherwise "
                                            "stalls a timing ~50 ms each busy second"),
    Setting("measure_cutoff", float, 1.5, "a candidate whose first timed repeat is more than this many times slower "
                                          "than its task's best stops there (recorded with that repeat; 0: off); "
                                          "one whose checked first call is twice that slow stops before timing"),
    Setting("tune_pipeline", lambda t: _choice(t, ("auto", "on", "off")), "auto",
            "search the next batch while one is measured: auto (when the CPU runner times at real-time priority, "
            "HLOTUNE_MEASURE_REALTIME, or on cuda), on or off"),
    Setting("tune_warmup", _sizes, (8, 8, 16, 16),
            "a fresh task's first round, when the cost model already ranks (pretrained), is measured in parts of "
            "these sizes; after each part the model learns it and ranks the rest of the round again, or evolves "
            "it anew once 16 trials are known (comma-separated; '0': off)"),
    Setting("search_workers", int, 0, "processes for one evolutionary search round (mutation and features; "
                                      "0: one per core, at most 4; 1: none forked)"),
    Setting("cost_model", str, "auto", "cost model the evolutionary search starts from: 'auto' (the model shipped "
                                       "with hlotune for the CPU, hlotune/data/cost_model_cpu.json; a fresh one on "
                                       "other targets), 'none' (a fresh model, random until it has data) or a path "
                                       "(hlotune cost-model train)"),
    Setting("postgres_url", str, "", "PostgreSQL URL used by the database tests (skipped when empty)"),
    Setting("no_fuse", _bool, False, "disable fusion (one subgraph per instruction); for debugging"),
    Setting("cpu_call_plan", _bool, True, "CPU executables run their kernels from one JIT-compiled call plan with "
                                          "intermediates in one arena (off: the glue program is walked in Python "
                                          "per call, each kernel called through ctypes)"),
    Setting("fold_dot_transpose", _bool, True, "fusion folds transpose(dot(a, b)) into dot(b, a) when that is the "
                                               "same array (weight gradients; see ir/fusion.py)"),
    Setting("row_fusion", _bool, True, "row (normalization) fusion: a reduction over the minor dims fuses with its "
                                       "consumers that read it broadcast along a row (softmax, layernorm: one pass)"),
)
_BY_NAME = {s.name: s for s in SETTINGS}


def get(name: str) -> Any:
    """The current value of setting `name` (environment variable or default)."""
    s = _BY_NAME[name]
    raw = os.environ.get(s.env)
    if raw is None or raw == "":
        return s.default
    try:
        return s.type(raw)
    except ValueError as e:
        raise ConfigError(f"{s.env}={raw!r} is not valid: {e}") from None


def settings() -> dict[str, Any]:
    """All settings with their current values."""
    return {s.name: get(s.name) for s in SETTINGS}


def describe() -> str:
    """A table of every setting: env var, default, help."""
    return "\n".join(f"{s.env:24s} default={s.default!r:12} {s.help}" for s in SETTINGS)


def debug_level() -> int:
    try:
        return int(get("debug"))
    except ConfigError:
        return 0


_LOGGING_DONE = False


def setup_logging() -> logging.Logger:
    """Configure the `hlotune` logger from HLOTUNE_DEBUG once; returns it."""
    global _LOGGING_DONE
    log = logging.getLogger("hlotune")
    if not _LOGGING_DONE:
        level = debug_level()
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[hlotune %(levelname)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.WARNING if level <= 0 else logging.DEBUG)
        log.propagate = False
        _LOGGING_DONE = True
    return log


def debug(level: int, msg: str, *args: Any) -> None:
    """Log `msg` when HLOTUNE_DEBUG >= level (see DEBUG_LEVELS)."""
    if debug_level() >= level:
        setup_logging().debug(msg, *args)


def replace_default(name: str, value: Any) -> None:  # pragma: no cover - used by tests only
    """Change a setting's default for this process (tests)."""
    global SETTINGS, _BY_NAME
    SETTINGS = tuple(dataclasses.replace(s, default=value) if s.name == name else s for s in SETTINGS)
    _BY_NAME = {s.name: s for s in SETTINGS}
