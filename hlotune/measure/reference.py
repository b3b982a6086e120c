"""Reference data of a task: random inputs drawn once, the reference outputs, and the output check.

Map:
  TaskData                  kernel inputs (parameters then array constants), expected outputs,
                            (rtol, atol) per output, how long the reference took
  task_data(task, seed)     the TaskData of a task, cached per (workload key, seed) (LRU)
  draw_inputs(cd, seed)     seeded random parameters of a compute definition
  compare(out, ref, ...)    None when `out` matches `ref`, else a one-line description of the mismatch
  poison(ref)               an output buffer that differs from `ref` in every element (fills outputs
                            before the checked run, so an element the kernel never writes is caught)

Inputs: one numpy Generator seeded with (seed, crc32 of the workload key), so the same task always
gets the same inputs.  Floats are uniform in [-1, 1), or in [0.5, 2) when the compute definition
applies log / log1p / sqrt / rsqrt / power / divide anywhere (those give NaN or huge values on
negatives / near zero, which would make most of the output a weak check); bf16 inputs are rounded
to bf16 (the kernel and the reference see the same values); integers are in [0, 8) (small, so index
arithmetic and integer products stay in range); predicates are fair coin flips.

Reference outputs come from the numpy evaluation of the compute definition (`ir.compute_eval`,
float64 inside, rounded per op like XLA), which is independent of schedules and code generation.
It costs about 5 ns per point of the iteration domain (a 1024^3 matmul: about 5 s), once per task.

The check (`compare`): integer and predicate outputs must be equal.  Float outputs: NaN positions must
match; infinities must match exactly (position and sign); elsewhere |out - ref| <= atol + rtol*|ref|
with rtol by dtype (f64 1e-7, f32 1e-4, f16 2e-3, bf16 1.6e-2) and
atol = rtol/10 * sqrt(R) * max(1, rms(ref)), R = the largest reduction size (product of reduction
extents) of any stage: a candidate may sum in a different order (tiles, vector lanes, rfactor), and
float32 rounding error of a sum of R terms grows like sqrt(R) times the magnitude of the terms.  A
wrong schedule (wrong index, missing tile, uninitialized accumulator) misses by O(1) of the values.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..ir.compute import constant_values
from ..ir.compute_eval import evaluate_compute
from ..ir.expr import Binary, ComputeDef, Unary, walk
from ..ir.hlo import DType, Op
from ..schedule_space.task import Task

#: ops whose inputs should be positive (and away from zero) for a strong check
_POSITIVE_OPS = frozenset({Op.LOG, Op.LOG1P, Op.SQRT, Op.RSQRT, Op.POWER, Op.DIVIDE})
_RTOL = {DType.F64: 1e-7, DType.F32: 1e-4, DType.F16: 2e-3, DType.BF16: 1.6e-2}
CACHE_SIZE = 64


@dataclass(frozen=True)
class TaskData:
    """What the runner needs to check a task's candidates (see the module docstring)."""

    key: str
    inputs: tuple[np.ndarray, ...]                 # kernel inputs: parameters then array constants
    expected: tuple[np.ndarray, ...]               # reference outputs, in the kernel's output order
    tolerances: tuple[tuple[float, float], ...]    # (rtol, atol) per output; (0, 0) = exact
    reference_s: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.inputs) + sum(a.nbytes for a in self.expected)


def _needs_positive(cd: ComputeDef) -> bool:
    for s in cd.stages:
        for n in walk(s.body):
            if isinstance(n, (Unary, Binary)) and n.op in _POSITIVE_OPS:
                return True
    return False


def draw_inputs(cd: ComputeDef, seed: int = 0, key: str = "") -> list[np.ndarray]:
    """Random values for the parameters of `cd` (not its array constants); see the module docstring."""
    rng = np.random.default_rng([seed, zlib.crc32((key or cd.name).encode())])
    consts = {n for n, _ in cd.constants}
    lo, hi = (0.5, 2.0) if _needs_positive(cd) else (-1.0, 1.0)
    out = []
    for b in cd.inputs:
        if b.name in consts:
            continue
        dt = b.dtype
        if dt.is_float:
            x = rng.uniform(lo, hi, b.shape).astype(dt.np)
            if dt is DType.BF16:
                x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        elif dt is DType.PRED:
            x = rng.random(b.shape) < 0.5
        else:
            x = rng.integers(0, 8, b.shape).astype(dt.np)
        out.append(np.asarray(x, order="C"))   # (ascontiguousarray makes 0-d arrays 1-d)
    return out


def _max_reduction(cd: ComputeDef) -> int:
    return max([math.prod(a.extent for a in s.reduce_axes) for s in cd.stages if s.reduce_axes] or [1])


def _tolerance(dtype: DType, ref: np.ndarray, red: int) -> tuple[float, float]:
    if not dtype.is_float:
        return 0.0, 0.0
    rtol = _RTOL.get(dtype, 1e-4)
    finite = ref[np.isfinite(ref)].astype(np.float64)
    rms = float(np.sqrt(np.mean(finite * finite))) if finite.size else 0.0
    return rtol, rtol / 10 * math.sqrt(red) * max(1.0, rms)


def make_task_data(task: Task, seed: int = 0) -> TaskData:
    """Draw the inputs of `task` and compute its reference outputs (uncached; see `task_data`)."""
    cd = task.compute
    t0 = time.perf_counter()
    params = draw_inputs(cd, seed, task.key)
    expected = evaluate_compute(cd, params)
    consts = constant_values(cd)
    kernel_inputs = list(params) + [np.ascontiguousarray(consts[b.name], dtype=b.dtype.np)
                                    for b in cd.inputs[len(params):]]
    dtypes = [cd.stage(o).dtype if o in cd.stage_by_name else _input_dtype(cd, o) for o in cd.outputs]
    expected = tuple(np.ascontiguousarray(e, dtype=dt.np).reshape(e.shape) for e, dt in zip(expected, dtypes))
    red = _max_reduction(cd)
    tols = tuple(_tolerance(dt, e, red) for dt, e in zip(dtypes, expected))
    return TaskData(task.key, tuple(kernel_inputs), expected, tols, time.perf_counter() - t0)


def _input_dtype(cd: ComputeDef, name: str) -> DType:
    return next(b.dtype for b in cd.inputs if b.name == name)


_CACHE: OrderedDict[tuple[str, int], TaskData] = OrderedDict()
_LOCK = threading.Lock()


def task_data(task: Task, seed: int = 0) -> TaskData:
    """The TaskData of `task` (inputs drawn once per (workload key, seed); an LRU of CACHE_SIZE tasks)."""
    k = (task.key, seed)
    with _LOCK:
        hit = _CACHE.get(k)
        if hit is not None:
            _CACHE.move_to_end(k)
            return hit
    data = make_task_data(task, seed)
    with _LOCK:
        _CACHE[k] = data
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return data


def poison(ref: np.ndarray) -> np.ndarray:
    """A C-contiguous array of ref's shape and dtype that differs from `ref` in every element."""
    if ref.dtype.kind == "f":
        return np.where(np.isnan(ref), np.asarray(1.0, ref.dtype), np.asarray(np.nan, ref.dtype)).astype(ref.dtype)
    if ref.dtype.kind == "b":
        return np.asarray(~ref, order="C")
    return np.asarray(ref ^ np.asarray(1, ref.dtype), order="C")


def compare(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float, name: str = "output") -> str | None:
    """None when `out` matches `ref` (see the module docstring), else what differs, in one line."""
    if out.shape != ref.shape:
        return f"{name}: shape {out.shape}, expected {ref.shape}"
    if ref.dtype.kind != "f":
        bad = out != ref
        if not bad.any():
            return None
        i = int(np.flatnonzero(bad)[0])
        return (f"{name}: {int(bad.sum())} of {ref.size} elements differ, first at flat index {i}: "
                f"{out.flat[i].item()!r}, expected {ref.flat[i].item()!r}")
    o, r = out.astype(np.float64), ref.astype(np.float64)
    nan_o, nan_r = np.isnan(o), np.isnan(r)
    inf_r = np.isinf(r)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(o - r) <= atol + rtol * np.abs(r)
    ok = np.where(nan_r, nan_o, np.where(inf_r, o == r, close & ~nan_o))
    if ok.all():
        return None
    bad = ~ok
    i = int(np.flatnonzero(bad)[0])
    with np.errstate(invalid="ignore"):
        err = np.abs(o - r)[bad & np.isfinite(r) & np.isfinite(o)]
    worst = f", max abs error {err.max():.3g}" if err.size else ""
    return (f"{name}: {int(bad.sum())} of {ref.size} elements differ (rtol {rtol:g}, atol {atol:.3g}){worst}; "
            f"first at flat index {i}: {float(o.flat[i])!r}, expected {float(r.flat[i])!r}")
