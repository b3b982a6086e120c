"""Whole-model executables: the glue program running compiled subgraphs in order.

Map:
  choose_schedule(workload, db, target)  best tuned steps for a workload, else the default schedule
  plan_schedules(model, ...)             key -> (printed loop nest, source), for `inspect --schedule`
  CompiledSubgraph                        one fused subgraph: kernel, constant inputs, output buffers
  Executable                              `exe(*arrays) -> tuple[np.ndarray]`, `exe.report()`,
                                          `exe.profile(*arrays)` (cpu: each kernel's time, alone)
  _CpuPlan                                cpu: the glue resolved once into one JIT-compiled call plan
                                          (cpu_runtime.CallPlan): kernel addresses and the pointers of
                                          constants and intermediates (one arena, offsets by liveness) are
                                          constants of the plan; per call only the arguments' and the fresh
                                          outputs' pointers are written to a slot table, then one ctypes call
                                          runs every kernel (setting `cpu_call_plan`; used when every glue op
                                          is a compiled fusion, tuple, get-tuple-element, constant or a view)
  BACKENDS / backend(kind)                target kind -> (kernel builder, default schedule, compiled
                                          subgraph class): "cpu" (LLVM) and "cuda" (nvcc + pycuda)
  GpuSubgraph / _GpuGlue                  the cuda target: constants, intermediates and outputs stay in
                                          device memory; `exe(*device_arrays)` returns DeviceArrays (no host
                                          transfer), `exe(*numpy_arrays)` copies once each way; glue ops
                                          other than reshape/bitcast and subgraphs without a compute
                                          definition run on the host (copied there and back, counted in
                                          `exe.report()`)
  _FastGpuPlan                            cuda: the glue resolved once into one LaunchProgram (pointer table,
                                          driver-API launches, CUDA graph replay); per call only the arguments
                                          and the fresh outputs change (used when nothing runs on the host)

The glue is the entry computation of the fused program: parameters, fusion calls, tuples,
get-tuple-element and a few layout ops (bitcast/reshape of parameters), which are run with the
reference interpreter's rules (they move no data or only reshape).  Output buffers of every
subgraph are allocated once, when the executable is built, and reused by every call; the arrays
returned to the caller are copies, so a later call never changes earlier results.  Compiled
kernels are cached in memory per (workload key, schedule, target) (see `codegen.llvm_cpu`).
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import config
from .buffers import (
    ALIGN,
    APART_MIN_BYTES,
    aligned_copy,
    aligned_empty,
    aligned_empty_of,
    data_address,
    empty_outputs,
)
from .errors import InputError, UnsupportedError
from .ir.hlo import Op, flat_shapes
from .target import Target


@dataclass(frozen=True)
class Choice:
    """The schedule used for one workload and where it came from."""

    steps: tuple
    source: str            # "default" | "default (the log's best)" | "tuned (exact target)" | "tuned (same family)"
    median_s: float | None = None


def _open_db(tuning_log: Any):
    if tuning_log is None:
        return None
    from .database import open_database

    return open_database(tuning_log)


#: target kind -> ("module:function" of the kernel builder, of the default schedule, name of the
#: compiled-subgraph class in this module); imported when first used
BACKENDS = {
    "cpu": ("hlotune.codegen.llvm_cpu:build_cpu", "hlotune.schedule_space.default:default_schedule",
            "CompiledSubgraph"),
    "cuda": ("hlotune.codegen.cuda_runtime:build_cuda", "hlotune.schedule_space.default_gpu:default_gpu_schedule",
             "GpuSubgraph"),
}


def backend(kind: str) -> tuple[Any, Any, Any]:
    """(build(func, target), default_schedule(compute, target), subgraph class) of a target kind."""
    import importlib

    if kind not in BACKENDS:
        raise UnsupportedError(f"target kind {kind!r} has no backend (known: {', '.join(BACKENDS)})")
    out = []
    for ref in BACKENDS[kind][:2]:
        mod, _, fn = ref.partition(":")
        out.append(getattr(importlib.import_module(mod), fn))
    return out[0], out[1], globals()[BACKENDS[kind][2]]


def choose_schedule(workload, db, target: Target) -> Choice:
    """The best valid tuned schedule of `workload` in `db` for `target`, else the default one.  When the best
    record is a default schedule (the search found nothing faster), today's default is used: the one recorded
    is the default of the version that tuned, and later versions' defaults only improve on it."""
    from .schedule_space.steps import schedule_from_json
    from .search.space import DEFAULT_SKETCH

    default_schedule = backend(target.kind)[1]

    if db is not None:
        found = db.best(workload.key, target.fingerprint, family=target.family)
        if found is not None:
            rec, matched = found.record, found.matched
            sched = schedule_from_json(json.loads(rec.steps))
            if sched.sketch == DEFAULT_SKETCH:
                return Choice(tuple(default_schedule(workload.compute, target)), "default (the log's best)",
                              rec.median)
            return Choice(sched.steps, f"tuned ({'exact target' if matched == 'exact' else 'same family'})",
                          rec.median)
    return Choice(tuple(default_schedule(workload.compute, target)), "default")


def plan_schedules(model, tuning_log: Any = None, target: str = "cpu") -> dict[str, tuple[str, str]]:
    """workload key -> (printed loop nest, where its schedule came from)."""
    from .schedule_space.lower import lower

    tgt = Target.from_string(target)
    db = _open_db(tuning_log)
    out: dict[str, tuple[str, str]] = {}
    for sg in model.frontend.subgraphs:
        wl = sg.workload
        if wl.key in out:
            continue
        choice = choose_schedule(wl, db, tgt)
        out[wl.key] = (str(lower(wl.compute, choice.steps, name=_kernel_name(sg.name))), choice.source)
    return out


def _kernel_name(name: str) -> str:
    return "k_" + "".join(c if c.isalnum() else "_" for c in name)


class _Subgraph:
    """One fused subgraph compiled for a target: constants placed once, outputs preallocated.
    Subclasses say where buffers live (`_place`, `_alloc`, `_ptr`) and how `run` passes arguments."""

    KIND = "cpu"

    def __init__(self, sg, choice: Choice, target: Target):
        from .ir.compute import constant_values
        from .schedule_space.lower import lower

        cd = sg.workload.compute
        self.name = sg.name
        self.key = sg.workload.key
        self.choice = choice
        self.n_params = len(sg.computation.parameters)
        t0 = time.perf_counter()
        self.func = lower(cd, choice.steps, name=_kernel_name(sg.name))
        self.kernel = backend(self.KIND)[0](self.func, target)
        self.compile_s = time.perf_counter() - t0
        consts = constant_values(cd)
        self.consts = [self._place(aligned_copy(np.ascontiguousarray(consts[b.name], dtype=b.dtype.np)))
                       for b in cd.inputs[self.n_params:]]
        self.outputs = [self._alloc(tuple(b.shape), b.dtype.np) for b in self.func.outputs]
        self.is_tuple = sg.computation.root_instruction.shape.is_tuple()
        self.in_specs = [(b.dtype.np, tuple(b.shape)) for b in self.func.inputs[: self.n_params]]
        # fast path: pointers of the buffers that never change (constants, preallocated outputs)
        self._const_ptrs = [self._ptr(c) for c in self.consts]
        self._out_ptrs = [self._ptr(o) for o in self.outputs]

    def _outputs(self, fresh: frozenset[int]) -> tuple[list, list[int]]:
        """The output buffers of one call: new ones for the outputs numbered in `fresh` (they leave
        the executable), the preallocated ones for the rest; and their pointers."""
        if not fresh:
            return self.outputs, self._out_ptrs
        outs = [self._alloc(o.shape, o.dtype) if k in fresh else o for k, o in enumerate(self.outputs)]
        return outs, [self._ptr(o) for o in outs]


class CompiledSubgraph(_Subgraph):
    """A subgraph compiled for the CPU: numpy buffers."""

    @staticmethod
    def _place(a: np.ndarray) -> np.ndarray:
        return a

    @staticmethod
    def _alloc(shape, dtype) -> np.ndarray:
        return aligned_empty(shape, dtype)

    @staticmethod
    def _ptr(a: np.ndarray) -> int:
        return data_address(a)

    def run(self, args: Sequence[np.ndarray], fresh: frozenset[int] = frozenset()):
        """Run on `args`; outputs numbered in `fresh` go to new arrays (they leave the executable),
        the others to the buffers allocated once.  Inputs are made C-contiguous arrays of the
        kernel's dtype and shape here, and the outputs are this subgraph's own (or new) arrays, so the
        kernel runs without its per-call argument checks."""
        ins = [a if a.dtype == dt and a.shape == shape and a.flags.c_contiguous
               else np.ascontiguousarray(a, dtype=dt).reshape(shape) for a, (dt, shape) in zip(args, self.in_specs)]
        outs, out_ptrs = self._outputs(fresh)
        self.kernel.call_unchecked([data_address(a) for a in ins] + self._const_ptrs + out_ptrs)
        return tuple(outs) if self.is_tuple else outs[0]


class Executable:
    """A whole model compiled for a target: `exe(*arrays) -> tuple of numpy arrays`."""

    def __init__(self, model, tuning_log: Any = None, target: str = "cpu"):
        if str(target).strip().lower() not in ("cpu", "host", "llvm", "cuda", "gpu"):
            raise UnsupportedError(f"target {target!r} is not available in this build (expected 'cpu' or 'cuda')")
        t0 = time.perf_counter()
        self.model = model
        self.target = Target.from_string(target)
        subgraph_cls = backend(self.target.kind)[2]
        fe = model.frontend
        db = _open_db(tuning_log)
        choices: dict[str, Choice] = {}
        self._subgraphs: dict[str, CompiledSubgraph] = {}
        for sg in fe.subgraphs:
            wl = sg.workload
            if wl.key not in choices:
                choices[wl.key] = choose_schedule(wl, db, self.target)
                config.debug(3, "schedule for %s (%s): %s", wl.key, choices[wl.key].source, choices[wl.key].steps)
            self._subgraphs[sg.name] = subgraph_cls(sg, choices[wl.key], self.target)
        self._choices = choices
        self._interpreted = {sg.name: sg.computation for sg, _ in fe.unsupported}
        self._glue = fe.program.module.entry_computation
        self._params = self._glue.parameters
        self._module = fe.program.module
        self._fresh = _outputs_reaching_root(self._glue)
        self._mini = {i.name: _single_op_computation(self._glue, i) for i in self._glue.instructions
                      if i.op not in (Op.PARAMETER, Op.FUSION, Op.TUPLE, Op.GET_TUPLE_ELEMENT)}
        self._gpu = _GpuGlue(self) if self.target.kind == "cuda" else None
        params = self.model.module.entry_computation.parameters
        self._param_specs = [(p.name, p.array_shape.dims, np.dtype(p.array_shape.dtype.np), p.array_shape.dtype.value)
                             for p in params]
        self._cpu_plan = (_CpuPlan.build(self) if self.target.kind == "cpu" and config.get("cpu_call_plan")
                          else None)
        self.compile_s = time.perf_counter() - t0
        config.debug(2, "compiled %s in %.3f s (%d subgraphs)", model.name, self.compile_s, len(self._subgraphs))

    def _check(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        specs = self._param_specs
        if len(arrays) != len(specs):
            raise InputError(f"{self.model.name} takes {len(specs)} argument(s), got {len(arrays)}")
        out = []
        for i, (a, (name, dims, dtype, dname)) in enumerate(zip(arrays, specs)):
            a = np.asarray(a)
            if a.shape != dims:
                raise InputError(f"argument {i} ({name}): expected shape {list(dims)}, got {list(a.shape)}")
            if a.dtype != dtype:
                raise InputError(f"argument {i} ({name}): expected dtype {dtype} ({dname}), got {a.dtype}")
            out.append(a)
        return out

    def __call__(self, *arrays: Any) -> tuple[np.ndarray, ...]:
        if self._gpu is not None:  # cuda: device arrays in -> device arrays out; numpy in -> numpy out
            return self._gpu(arrays)
        args = self._check(arrays)
        if self._cpu_plan is not None:
            return self._cpu_plan.run(args)
        from .ir.interp import evaluate_computation

        env: dict[str, Any] = {}
        fresh_ids: set[int] = set()
        for inst in self._glue.instructions:
            if inst.op is Op.PARAMETER:
                env[inst.name] = args[inst.attr("parameter_number")]
            elif inst.op is Op.FUSION and inst.name in self._interpreted:
                env[inst.name] = evaluate_computation(self._module, self._interpreted[inst.name],
                                                      [env[o] for o in inst.operands])
            elif inst.op is Op.FUSION:
                fresh = self._fresh.get(inst.name, frozenset())
                val = env[inst.name] = self._subgraphs[inst.name].run([env[o] for o in inst.operands], fresh)
                fresh_ids.update(id(v) for k, v in enumerate(val if isinstance(val, tuple) else (val,))
                                 if k in fresh)
            elif inst.op is Op.TUPLE:
                env[inst.name] = tuple(env[o] for o in inst.operands)
            elif inst.op is Op.GET_TUPLE_ELEMENT:
                env[inst.name] = env[inst.operands[0]][inst.attr("index")]
            else:
                env[inst.name] = evaluate_computation(self._module, self._mini[inst.name],
                                                      [env[o] for o in inst.operands])
        root = env[self._glue.root]
        leaves = _flatten(root)
        shapes = flat_shapes(self._glue.root_instruction.shape)
        out, taken = [], set()
        for x, s in zip(leaves, shapes):  # fresh fusion outputs are handed over; anything else is copied
            if id(x) in fresh_ids and id(x) not in taken:
                taken.add(id(x))
                out.append(x)
            else:
                out.append(np.array(x, dtype=s.dtype.np, copy=True).reshape(s.dims))
        return tuple(out)

    def report(self) -> str:
        """Which schedule each subgraph uses, and the compile time."""
        lines = [f"{self.model.name}: {len(self._subgraphs)} subgraph(s), compiled in {self.compile_s:.2f} s"]
        for name, cs in self._subgraphs.items():
            lines.append(f"  {name:32s} {cs.key}  {cs.choice.source}")
        for name in self._interpreted:
            lines.append(f"  {name:32s} {'-':24s}  reference interpreter (no compute definition)")
        if self._cpu_plan is not None:
            lines.append(self._cpu_plan.describe())
        if self._gpu is not None:
            lines += self._gpu.report_lines()
        return "\n".join(lines)

    def profile(self, *arrays: Any, repeats: int = 20) -> list[tuple[str, str, float]]:
        """cpu: (subgraph name, workload key, median seconds) of each kernel in execution order, each timed
        alone `repeats` times on the intermediates of one run on `arrays` (needs the call plan)."""
        if self._cpu_plan is None:
            raise UnsupportedError("profile needs a cpu executable with the call plan (setting cpu_call_plan)")
        return self._cpu_plan.profile(self._check(arrays), repeats)

    def call_device(self, *arrays: Any) -> tuple:
        """cuda target: run and return the outputs as DeviceArrays (inputs: device or numpy arrays)."""
        if self._gpu is None:
            raise UnsupportedError("call_device needs an executable compiled for target 'cuda'")
        return self._gpu(arrays, host=False)

    def sources(self) -> dict[str, str]:
        """subgraph name -> where its schedule came from."""
        out = {name: cs.choice.source for name, cs in self._subgraphs.items()}
        out.update({name: "interpreter" for name in self._interpreted})
        return out


def _outputs_reaching_root(glue) -> dict[str, frozenset[int]]:
    """fusion name -> indices of its outputs that are (part of) the model's result."""
    out: dict[str, set[int]] = {}

    def visit(name: str, index: int | None) -> None:
        inst = glue[name]
        if inst.op is Op.TUPLE:
            for o in (inst.operands if index is None else (inst.operands[index],)):
                visit(o, None)
        elif inst.op is Op.GET_TUPLE_ELEMENT:
            visit(inst.operands[0], inst.attr("index"))
        elif inst.op is Op.FUSION:
            n = len(flat_shapes(inst.shape))
            out.setdefault(name, set()).update(range(n) if index is None else (index,))

    visit(glue.root, None)
    return {k: frozenset(v) for k, v in out.items()}


def _single_op_computation(glue, inst):
    """A computation `params -> inst` to run one glue instruction with the interpreter."""
    from .ir.hlo import Computation, Instruction, make_attrs

    params = tuple(Instruction(f"__glue_p{k}", Op.PARAMETER, glue[o].shape, (), make_attrs({"parameter_number": k}))
                   for k, o in enumerate(inst.operands))
    body = inst.replace(operands=tuple(p.name for p in params))
    return Computation(f"glue_{inst.name}", params + (body,), body.name)


def _flatten(v: Any) -> list[np.ndarray]:
    if isinstance(v, tuple):
        out: list[np.ndarray] = []
        for e in v:
            out.extend(_flatten(e))
        return out
    return [v]


# ----------------------------------------------------------------------------- the cpu call plan

ARENA_ALIGN = ALIGN   # bytes: every intermediate starts on a cache line


#: glue ops that are views of their operand (no data moved) in the call plans
PLAN_VIEW_OPS = (Op.BITCAST, Op.RESHAPE)


def _walk_glue(exe: Executable, plan) -> dict[str, Any] | None:
    """Resolve the glue program once for a call plan (`_CpuPlan`, `_FastGpuPlan`): each instruction's value, a
    plan leaf or a tuple of them, from the plan's `_param`, `_fusion`, `_constant` and `_view`; None when the plan
    cannot express an instruction (the executable then keeps its general path)."""
    env: dict[str, Any] = {}
    for inst in exe._glue.instructions:
        if inst.op is Op.PARAMETER:
            val = plan._param(exe, inst.attr("parameter_number"))
        elif inst.op is Op.FUSION:
            val = plan._fusion(exe, inst, [env[o] for o in inst.operands])
        elif inst.op is Op.TUPLE:
            val = tuple(env[o] for o in inst.operands)
        elif inst.op is Op.GET_TUPLE_ELEMENT:
            val = env[inst.operands[0]][inst.attr("index")]
        elif inst.op is Op.CONSTANT and not inst.shape.is_tuple():
            val = plan._constant(exe, inst)
        elif inst.op in PLAN_VIEW_OPS:
            val = plan._view(exe, inst, env[inst.operands[0]])
        else:
            val = None
        if val is None:
            return None
        env[inst.name] = val
    return env


@dataclass(frozen=True)
class _Buf:
    """A CPU buffer of the glue program at build time.  `kind`: "arg" (the caller's argument `index`), "fresh"
    (a new array every call, handed to the caller), "fixed" (an array that lives as long as the plan: a
    constant or an intermediate in the arena; `index` into `_CpuPlan.fixed`).  Views share `key`."""

    kind: str
    index: int
    shape: tuple[int, ...]
    dtype: Any

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.index)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _arena_offsets(sizes: list[int], lives: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Byte offsets for buffers of `sizes` live over the step intervals `lives` (inclusive): two buffers
    whose intervals meet never overlap in memory.  First fit, biggest first.  Returns (offsets, total)."""
    placed: list[tuple[int, int, int, int]] = []   # (offset, end, first step, last step)
    offsets = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda j: (-sizes[j], j)):
        n = -(-max(sizes[i], 1) // ARENA_ALIGN) * ARENA_ALIGN
        lo, hi = lives[i]
        busy = sorted((o, e) for o, e, a, b in placed if a <= hi and lo <= b)
        off = 0
        for o, e in busy:
            if off + n <= o:
                break
            off = max(off, e)
        offsets[i] = off
        placed.append((off, off + n, lo, hi))
    return offsets, max((e for _, e, _, _ in placed), default=0)


class _CpuPlan:
    """The glue program of a CPU executable resolved once (see the module map).  Build with `build(exe)`
    (None when some glue op needs the interpreter); `run(checked_args)` returns the outputs."""


    def __init__(self, exe: Executable):
        self.exe = exe
        self.fixed: list[np.ndarray] = []          # constants and arena views, by _Buf.index
        self.fresh: list[_Buf] = []
        self.steps: list[tuple[Any, list[_Buf], list[_Buf]]] = []   # (subgraph, inputs, outputs)
        self.mids: list[tuple[_Buf, int]] = []     # intermediates: buffer, defining step
        self.arena_bytes = 0

    def _fixed(self, arr: np.ndarray) -> _Buf:
        self.fixed.append(arr)
        return _Buf("fixed", len(self.fixed) - 1, tuple(arr.shape), arr.dtype)

    @classmethod
    def build(cls, exe: Executable) -> _CpuPlan | None:
        if exe._interpreted:
            return None
        p = cls(exe)
        env = _walk_glue(exe, p)
        if env is None:
            return None
        p._place_intermediates()
        p._result(env[exe._glue.root])
        p._compile()
        return p

    def _param(self, exe: Executable, k: int) -> _Buf:
        _, dims, dtype, _ = exe._param_specs[k]
        return _Buf("arg", k, tuple(dims), dtype)

    def _constant(self, exe: Executable, inst) -> _Buf:
        from .ir.interp import evaluate_computation

        val = evaluate_computation(exe._module, exe._mini[inst.name], [])
        return self._fixed(aligned_copy(np.ascontiguousarray(val, dtype=inst.array_shape.dtype.np)))

    def _view(self, exe: Executable, inst, x) -> _Buf | None:
        from .ir.passes import _default_layout

        if not (isinstance(x, _Buf) and _default_layout(inst.shape)
                and _default_layout(exe._glue[inst.operands[0]].shape)):
            return None
        return _Buf(x.kind, x.index, tuple(inst.shape.dims), x.dtype)

    def _fusion(self, exe: Executable, inst, operands: list) -> Any:
        sub = exe._subgraphs[inst.name]
        ins = []
        for a, (dt, shape) in zip(operands, sub.in_specs):
            if not isinstance(a, _Buf) or np.dtype(a.dtype) != np.dtype(dt) or \
                    a.size != int(np.prod(shape, dtype=np.int64)):
                return None
            ins.append(a)
        fresh = exe._fresh.get(inst.name, frozenset())
        outs = []
        for k, o in enumerate(sub.outputs):
            if k in fresh:
                b = _Buf("fresh", len(self.fresh), tuple(o.shape), o.dtype)
                self.fresh.append(b)
            else:
                b = self._fixed(o)   # replaced by an arena view in _place_intermediates
                self.mids.append((b, len(self.steps)))
            outs.append(b)
        self.steps.append((sub, ins, outs))
        return tuple(outs) if sub.is_tuple else outs[0]

    def _place_intermediates(self) -> None:
        """Put every intermediate in one arena: buffers live from their step to their last reader."""
        last = {b.key: t for b, t in self.mids}
        for t, (_, ins, _) in enumerate(self.steps):
            for b in ins:
                if b.key in last:
                    last[b.key] = max(last[b.key], t)
        sizes = [b.size * np.dtype(b.dtype).itemsize for b, _ in self.mids]
        offsets, total = _arena_offsets(sizes, [(t, last[b.key]) for b, t in self.mids])
        self.arena_bytes = total
        self._arena = aligned_empty((total,), np.uint8)
        for (b, _), off, n in zip(self.mids, offsets, sizes):
            view = self._arena[off: off + n].view(b.dtype).reshape(b.shape)
            self.fixed[b.index] = view

    def _result(self, root: Any) -> None:
        """How each output leaf is made: ("fresh", i, dims) hands over fresh buffer i; ("copy", buf, dims)
        copies any other buffer (an argument, a constant, an intermediate, a fresh buffer used twice)."""
        self.result: list[tuple[str, _Buf, tuple[int, ...] | None]] = []
        taken: set[int] = set()
        for x, s in zip(_flatten(root), flat_shapes(self.exe._glue.root_instruction.shape)):
            dims = tuple(s.dims)
            if x.kind == "fresh" and x.index not in taken:
                taken.add(x.index)
                self.result.append(("fresh", x, None if dims == tuple(self.fresh[x.index].shape) else dims))
            else:
                self.result.append(("copy", x, dims))

    def _compile(self) -> None:
        from .codegen.cpu_runtime import CallPlan

        n_args = len(self.exe._param_specs)
        calls = []
        parallel = None
        for sub, ins, outs in self.steps:
            ptrs = []
            for b in ins + outs:
                if b.kind == "fixed":
                    ptrs.append(("fixed", self.fixed[b.index].ctypes.data))
                else:
                    ptrs.append(("slot", b.index if b.kind == "arg" else n_args + b.index))
            ptrs[len(ins):len(ins)] = [("fixed", c) for c in sub._const_ptrs]
            calls.append((sub.kernel._address, tuple(ptrs)))
            if sub.kernel.parallel and parallel is None:
                parallel = sub.kernel
        self.kernels = [sub.kernel for sub, _, _ in self.steps]   # the plan calls their code: keep them
        self.plan = CallPlan(calls)
        self.slots = (ctypes.c_uint64 * max(1, n_args + len(self.fresh)))()
        self._slots_address = ctypes.addressof(self.slots)
        self._n_args = n_args
        self._fresh_specs = [(tuple(int(d) for d in b.shape), np.dtype(b.dtype),
                              math.prod(b.shape) * np.dtype(b.dtype).itemsize) for b in self.fresh]
        self._apart = any(spec[2] >= APART_MIN_BYTES for spec in self._fresh_specs)
        if parallel is not None:
            from .codegen.llvm_cpu import num_threads

            self._rt = parallel._start_runtime()
            self._threads = num_threads(self.exe.target)
            self._lock = self._rt.lock
        else:
            self._rt = None
            self._lock = threading.Lock()

    def run(self, args: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        """Run on checked arguments (shapes and dtypes right); the outputs as new arrays."""
        slots = self.slots
        keep = [a if a.flags.c_contiguous else aligned_copy(a) for a in args]
        ptrs = [data_address(a) for a in keep]
        if self._apart:   # big outputs placed off the big arguments' page offsets (buffers.aligned_empty_apart)
            fresh = empty_outputs(self._fresh_specs, keep)
        else:
            fresh = [aligned_empty_of(*spec) for spec in self._fresh_specs]
        ptrs += [data_address(f) for f in fresh]
        if self._rt is not None:
            self._rt.ensure_started(self._threads)   # (re)starts the workers after a fork
        with self._lock:   # the slot table and the arena are this executable's: one call at a time
            slots[:len(ptrs)] = ptrs
            self.plan(self._slots_address)
        out = []
        for how, b, dims in self.result:
            if how == "fresh":
                y = fresh[b.index]
                out.append(y if dims is None else y.reshape(dims))
                continue
            src = keep[b.index] if b.kind == "arg" else fresh[b.index] if b.kind == "fresh" else self.fixed[b.index]
            out.append(np.array(src, copy=True).reshape(dims))
        return tuple(out)

    def profile(self, args: list[np.ndarray], repeats: int) -> list[tuple[str, str, float]]:
        """(subgraph, workload key, median seconds) of each kernel call, timed alone on the buffers of one
        full run on `args` (a kernel reads only its inputs, so running it again gives the same outputs)."""
        keep = [a if a.flags.c_contiguous else aligned_copy(a) for a in args]
        fresh = empty_outputs(self._fresh_specs, keep)
        ptr = {("arg", k): data_address(a) for k, a in enumerate(keep)}
        ptr.update({("fresh", k): data_address(f) for k, f in enumerate(fresh)})
        out = []
        with self._lock:
            self.slots[:len(ptr)] = [ptr["arg", k] for k in range(len(keep))] + [ptr["fresh", k]
                                                                              for k in range(len(fresh))]
            self.plan(self._slots_address)
            for sub, ins, outs in self.steps:
                ptrs = [self.fixed[b.index].ctypes.data if b.kind == "fixed" else ptr[b.key] for b in ins]
                ptrs += sub._const_ptrs + [self.fixed[b.index].ctypes.data if b.kind == "fixed" else ptr[b.key]
                                           for b in outs]
                times = []
                for _ in range(max(1, repeats)):
                    t0 = time.perf_counter()
                    sub.kernel.call_unchecked(ptrs)
                    times.append(time.perf_counter() - t0)
                out.append((sub.name, sub.key, float(np.median(times))))
        return out

    def describe(self) -> str:
        return (f"  (cpu call plan: {len(self.steps)} kernel call(s) in one native call, intermediates in one "
                f"{self.arena_bytes / 1024:.0f} KiB arena)")


# ----------------------------------------------------------------------------- the cuda target

class GpuSubgraph(_Subgraph):
    """A subgraph compiled for a GPU: constants uploaded once, outputs preallocated on the device."""

    KIND = "cuda"

    @staticmethod
    def _place(a: np.ndarray):
        from .codegen.cuda_runtime import to_device

        return to_device(a)

    @staticmethod
    def _alloc(shape, dtype):
        from .codegen.cuda_runtime import empty_device

        return empty_device(shape, dtype)

    @staticmethod
    def _ptr(a) -> int:
        return a.ptr

    def run(self, args, fresh: frozenset[int] = frozenset()):
        """Run on DeviceArrays; outputs numbered in `fresh` go to new device arrays (they leave the
        executable), the others to the buffers allocated once."""
        ptrs = []
        for a, (dt, shape) in zip(args, self.in_specs):
            if a.dtype != dt or int(np.prod(a.shape, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
                raise InputError(f"subgraph {self.name}: device operand {a.dtype}{list(a.shape)}, expected "
                                 f"{np.dtype(dt)}{list(shape)}")
            ptrs.append(a.ptr)
        outs, out_ptrs = self._outputs(fresh)
        self.kernel.call_unchecked(ptrs + self._const_ptrs + out_ptrs)
        return tuple(outs) if self.is_tuple else outs[0]


class _GpuGlue:
    """Runs an Executable's glue program with device-resident buffers (see the module map)."""

    _VIEW_OPS = (Op.BITCAST, Op.RESHAPE)

    def __init__(self, exe: Executable):
        self.exe = exe
        self.host_fallbacks: dict[str, int] = {}   # instruction -> times it ran on the host
        self.fast = _FastGpuPlan.build(exe)        # None: some glue op runs on the host (the general path)

    def _args(self, arrays: Sequence[Any]) -> tuple[list, bool]:
        from .codegen.cuda_runtime import as_device, to_device

        params = self.exe.model.module.entry_computation.parameters
        if len(arrays) != len(params):
            raise InputError(f"{self.exe.model.name} takes {len(params)} argument(s), got {len(arrays)}")
        out, host = [], False
        for i, (a, p) in enumerate(zip(arrays, params)):
            want = p.array_shape
            what = f"argument {i} ({p.name})"
            if hasattr(a, "__cuda_array_interface__"):
                d = as_device(a, want.dims, want.dtype.np, what)
                out.append(d if d.ptr % 16 == 0 else d.copy())   # kernels read 16-byte vectors (float4)
                continue
            host = True
            a = np.asarray(a)
            if tuple(a.shape) != want.dims:
                raise InputError(f"{what}: expected shape {list(want.dims)}, got {list(a.shape)}")
            if a.dtype != want.dtype.np:
                raise InputError(f"{what}: expected dtype {want.dtype.np} ({want.dtype.value}), got {a.dtype}")
            out.append(to_device(a))
        return out, host

    def _on_host(self, name: str, comp, operands: list) -> Any:
        """Run one glue instruction / interpreted subgraph on the host (copies both ways)."""
        from .codegen.cuda_runtime import to_device
        from .ir.interp import evaluate_computation

        self.host_fallbacks[name] = self.host_fallbacks.get(name, 0) + 1
        host_ops = [_map_leaves(o, lambda d: d.get()) for o in operands]
        val = evaluate_computation(self.exe._module, comp, host_ops)
        return _map_leaves(val, lambda h: to_device(np.asarray(h)))

    def __call__(self, arrays: Sequence[Any], host: bool | None = None) -> tuple:
        exe = self.exe
        fast = self.fast
        if fast is not None and all(hasattr(type(a), "__cuda_array_interface__") for a in arrays):   # device arrays
            from .codegen.cuda_runtime import device_pointer

            if len(arrays) != len(fast.arg_specs):
                raise InputError(f"{exe.model.name} takes {len(fast.arg_specs)} argument(s), got {len(arrays)}")
            ptrs = [device_pointer(a, *spec) for a, spec in zip(arrays, fast.arg_specs)]
            if not any(p & 15 for p in ptrs):   # else (a view at an odd offset): aligned copies, below
                out = fast.run(ptrs)
                return tuple(y.get() for y in out) if host else out
        args, given_host = self._args(arrays)
        host = given_host if host is None else host
        if fast is not None:
            out = fast.run([a.ptr for a in args])
            return tuple(y.get() for y in out) if host else out
        env: dict[str, Any] = {}
        fresh_ids: set[int] = set()
        for inst in exe._glue.instructions:
            if inst.op is Op.PARAMETER:
                env[inst.name] = args[inst.attr("parameter_number")]
            elif inst.op is Op.FUSION and inst.name in exe._interpreted:
                env[inst.name] = self._on_host(inst.name, exe._interpreted[inst.name], [env[o] for o in inst.operands])
            elif inst.op is Op.FUSION:
                fresh = exe._fresh.get(inst.name, frozenset())
                val = env[inst.name] = exe._subgraphs[inst.name].run([env[o] for o in inst.operands], fresh)
                fresh_ids.update(id(v) for k, v in enumerate(val if isinstance(val, tuple) else (val,)) if k in fresh)
            elif inst.op is Op.TUPLE:
                env[inst.name] = tuple(env[o] for o in inst.operands)
            elif inst.op is Op.GET_TUPLE_ELEMENT:
                env[inst.name] = env[inst.operands[0]][inst.attr("index")]
            elif inst.op in self._VIEW_OPS and not isinstance(env[inst.operands[0]], tuple):
                env[inst.name] = env[inst.operands[0]].reshape(inst.shape.dims)
            else:
                env[inst.name] = self._on_host(inst.name, exe._mini[inst.name], [env[o] for o in inst.operands])
        leaves = _flatten(env[exe._glue.root])
        shapes = flat_shapes(exe._glue.root_instruction.shape)
        out, taken = [], set()
        for x, s in zip(leaves, shapes):  # fresh fusion outputs are handed over; anything else is copied
            if id(x) in fresh_ids and id(x) not in taken:
                taken.add(id(x))
                y = x
            else:
                y = x.copy()
            out.append(y if tuple(y.shape) == s.dims else y.reshape(s.dims))
        if host:
            return tuple(y.get() for y in out)
        return tuple(out)

    def report_lines(self) -> list[str]:
        if not self.host_fallbacks:
            return ["  (cuda: every buffer stays on the device)"]
        return [f"  {n:32s} ran on the host {k} time(s) (copied from and back to the device)"
                for n, k in self.host_fallbacks.items()]


@dataclass(frozen=True)
class _Leaf:
    """A device buffer of the glue program at build time: its slot in the launch program, shape, dtype and
    whether it is a fresh output (a new buffer every call, handed to the caller)."""

    slot: int
    shape: tuple[int, ...]
    dtype: Any
    fresh: bool = False


class _FastGpuPlan:
    """The whole glue program as one `LaunchProgram`: every fusion's kernels with their pointers resolved when
    the executable is built (constants, intermediates, temporaries); per call only the argument pointers and
    the fresh output buffers change.  Built only when every glue op is a fusion, tuple, get-tuple-element or a
    view (reshape/bitcast), i.e. nothing runs on the host."""

    def __init__(self):
        from .codegen.cuda_runtime import LaunchProgram

        self.prog = LaunchProgram()
        self.arg_slots: list[int] = []
        self.fresh: list[_Leaf] = []
        self.result: list[tuple[_Leaf, tuple[int, ...], bool]] = []   # (leaf, shape, copy into a fresh buffer)

    @classmethod
    def build(cls, exe: Executable) -> _FastGpuPlan | None:
        if exe._interpreted:
            return None
        p = cls()
        params = exe.model.module.entry_computation.parameters
        p.arg_slots = [p.prog.slot() for _ in params]
        p.arg_specs = [(tuple(x.array_shape.dims), np.dtype(x.array_shape.dtype.np), f"argument {k} ({x.name})")
                       for k, x in enumerate(params)]
        p.params = params
        env = _walk_glue(exe, p)
        if env is None:
            return None
        taken: set[int] = set()
        for x, s in zip(_flatten(env[exe._glue.root]), flat_shapes(exe._glue.root_instruction.shape)):
            if x.fresh and x.slot not in taken:
                taken.add(x.slot)
                p.result.append((x, tuple(s.dims), False))
            else:   # a parameter, an intermediate or a second use: copied into a buffer of its own
                y = _Leaf(p.prog.slot(), tuple(s.dims), x.dtype, True)
                p.fresh.append(y)
                p.prog.copy(y.slot, x.slot, int(np.prod(s.dims, dtype=np.int64)) * np.dtype(x.dtype).itemsize)
                p.result.append((y, tuple(s.dims), False))
        p.prog.finish()
        p._fresh_index = {y.slot: i for i, y in enumerate(p.fresh)}
        p._fresh_specs = [(y.slot, tuple(int(d) for d in y.shape), np.dtype(y.dtype),
                           int(np.prod(y.shape, dtype=np.int64)) * np.dtype(y.dtype).itemsize) for y in p.fresh]
        p._result = [(p._fresh_index[y.slot], shape if tuple(y.shape) != shape else None) for y, shape, _ in p.result]
        return p

    def _param(self, exe: Executable, k: int) -> _Leaf:
        shape = self.params[k].array_shape
        return _Leaf(self.arg_slots[k], shape.dims, shape.dtype.np)

    def _constant(self, exe: Executable, inst) -> None:
        return None    # constants keep the general path

    def _view(self, exe: Executable, inst, x) -> _Leaf | None:
        return _Leaf(x.slot, tuple(inst.shape.dims), x.dtype, x.fresh) if isinstance(x, _Leaf) else None

    def _fusion(self, exe: Executable, inst, operands: list) -> Any:
        sub = exe._subgraphs[inst.name]
        slots = []
        for a, (dt, shape) in zip(operands, sub.in_specs):
            if not isinstance(a, _Leaf) or np.dtype(a.dtype) != np.dtype(dt) or \
                    int(np.prod(a.shape, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
                return None
            slots.append(a.slot)
        slots += [self.prog.slot(ptr) for ptr in sub._const_ptrs]
        fresh = exe._fresh.get(inst.name, frozenset())
        outs = []
        for k, o in enumerate(sub.outputs):
            if k in fresh:
                leaf = _Leaf(self.prog.slot(), tuple(o.shape), o.dtype, True)
                self.fresh.append(leaf)
            else:
                leaf = _Leaf(self.prog.slot(sub._out_ptrs[k]), tuple(o.shape), o.dtype)
            slots.append(leaf.slot)
            outs.append(leaf)
        self.prog.kernel(sub.kernel, slots)
        return tuple(outs) if sub.is_tuple else outs[0]

    def run(self, ptrs: list[int]) -> tuple:
        """Run on the checked arguments' device pointers; the outputs as new DeviceArrays."""
        from .codegen.cuda_runtime import _new_device_array

        slots = self.prog.slots
        for s, a in zip(self.arg_slots, ptrs):
            slots[s] = a
        bufs = []
        for s, shape, dt, n in self._fresh_specs:
            b = _new_device_array(shape, dt, n)
            slots[s] = b.ptr
            bufs.append(b)
        self.prog.run((*ptrs, *[b.ptr for b in bufs]))   # the key of a CUDA graph (see LaunchProgram)
        return tuple(bufs[i] if shape is None else bufs[i].reshape(shape) for i, shape in self._result)


def _map_leaves(v: Any, fn) -> Any:
    if isinstance(v, tuple):
        return tuple(_map_leaves(e, fn) for e in v)
    return fn(v)
