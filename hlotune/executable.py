"""Whole-model executables: the glue program running compiled subgraphs in order.

Map:
  choose_schedule(workload, db, target)  best tuned steps for a workload, else the default schedule
  plan_schedules(model, ...)             key -> (printed loop nest, source), for `inspect --schedule`
  CompiledSubgraph                        one fused subgraph: kernel, constant inputs, output buffers
  Executable                              `exe(*arrays) -> tuple[np.ndarray]`, `exe.report()`

The glue is the entry computation of the fused program: parameters, fusion calls, tuples,
get-tuple-element and a few layout ops (bitcast/reshape of parameters), which are run with the
reference interpreter's rules (they move no data or only reshape).  Output buffers of every
subgraph are allocated once, when the executable is built, and reused by every call; the arrays
returned to the caller are copies, so a later call never changes earlier results.  Compiled
kernels are cached in memory per (workload key, schedule, target) (see `codegen.llvm_cpu`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import config
from .errors import InputError, UnsupportedError
from .ir.hlo import Op, flat_shapes
from .target import Target


@dataclass(frozen=True)
class Choice:
    """The schedule used for one workload and where it came from."""

    steps: tuple
    source: str            # "default" | "tuned (exact target)" | "tuned (same family)"
    median_s: float | None = None


def _open_db(tuning_log: Any):
    if tuning_log is None:
        return None
    from .database import open_database

    return open_database(tuning_log)


def choose_schedule(workload, db, target: Target) -> Choice:
    """The best valid tuned schedule of `workload` in `db` for `target`, else the default one."""
    from .schedule_space.default import default_schedule
    from .schedule_space.steps import schedule_from_json

    if db is not None:
        found = db.best(workload.key, target.fingerprint, family=target.family)
        if found is not None:
            rec, matched = found.record, found.matched
            steps = schedule_from_json(json.loads(rec.steps)).steps
            return Choice(steps, f"tuned ({'exact target' if matched == 'exact' else 'same family'})",
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


class CompiledSubgraph:
    """One fused subgraph compiled for the target, with its preallocated outputs."""

    def __init__(self, sg, choice: Choice, target: Target):
        from .codegen.llvm_cpu import build_cpu
        from .ir.compute import constant_values
        from .schedule_space.lower import lower

        cd = sg.workload.compute
        self.name = sg.name
        self.key = sg.workload.key
        self.choice = choice
        self.n_params = len(sg.computation.parameters)
        t0 = time.perf_counter()
        self.func = lower(cd, choice.steps, name=_kernel_name(sg.name))
        self.kernel = build_cpu(self.func, target)
        self.compile_s = time.perf_counter() - t0
        consts = constant_values(cd)
        self.consts = [np.ascontiguousarray(consts[b.name]) for b in cd.inputs[self.n_params:]]
        self.outputs = [np.empty(b.shape, dtype=b.dtype.np) for b in self.func.outputs]
        self.is_tuple = sg.computation.root_instruction.shape.is_tuple()
        self.in_specs = [(b.dtype.np, b.shape) for b in self.func.inputs[: self.n_params]]

    def run(self, args: Sequence[np.ndarray], fresh: frozenset[int] = frozenset()):
        """Run on `args`; outputs numbered in `fresh` go to new arrays (they leave the executable),
        the others to the buffers allocated once."""
        ins = [a if a.dtype == dt and a.shape == shape and a.flags.c_contiguous
               else np.ascontiguousarray(a, dtype=dt).reshape(shape) for a, (dt, shape) in zip(args, self.in_specs)]
        outs = self.outputs if not fresh else [np.empty_like(o) if k in fresh else o
                                               for k, o in enumerate(self.outputs)]
        self.kernel(*ins, *self.consts, *outs)
        return tuple(outs) if self.is_tuple else outs[0]


class Executable:
    """A whole model compiled for a target: `exe(*arrays) -> tuple of numpy arrays`."""

    def __init__(self, model, tuning_log: Any = None, target: str = "cpu"):
        if target != "cpu":
            raise UnsupportedError(f"target {target!r} is not available in this build (only 'cpu')")
        t0 = time.perf_counter()
        self.model = model
        self.target = Target.from_string(target)
        fe = model.frontend
        db = _open_db(tuning_log)
        choices: dict[str, Choice] = {}
        self._subgraphs: dict[str, CompiledSubgraph] = {}
        for sg in fe.subgraphs:
            wl = sg.workload
            if wl.key not in choices:
                choices[wl.key] = choose_schedule(wl, db, self.target)
                config.debug(3, "schedule for %s (%s): %s", wl.key, choices[wl.key].source, choices[wl.key].steps)
            self._subgraphs[sg.name] = CompiledSubgraph(sg, choices[wl.key], self.target)
        self._choices = choices
        self._interpreted = {sg.name: sg.computation for sg, _ in fe.unsupported}
        self._glue = fe.program.module.entry_computation
        self._params = self._glue.parameters
        self._module = fe.program.module
        self._fresh = _outputs_reaching_root(self._glue)
        self._mini = {i.name: _single_op_computation(self._glue, i) for i in self._glue.instructions
                      if i.op not in (Op.PARAMETER, Op.FUSION, Op.TUPLE, Op.GET_TUPLE_ELEMENT)}
        self.compile_s = time.perf_counter() - t0
        config.debug(2, "compiled %s in %.3f s (%d subgraphs)", model.name, self.compile_s, len(self._subgraphs))

    def _check(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        params = self.model.module.entry_computation.parameters
        if len(arrays) != len(params):
            raise InputError(f"{self.model.name} takes {len(params)} argument(s), got {len(arrays)}")
        out = []
        for i, (a, p) in enumerate(zip(arrays, params)):
            a = np.asarray(a)
            want = p.array_shape
            if tuple(a.shape) != want.dims:
                raise InputError(f"argument {i} ({p.name}): expected shape {list(want.dims)}, got {list(a.shape)}")
            if a.dtype != want.dtype.np:
                raise InputError(f"argument {i} ({p.name}): expected dtype {want.dtype.np} ({want.dtype.value}), "
                                 f"got {a.dtype}")
            out.append(a)
        return out

    def __call__(self, *arrays: Any) -> tuple[np.ndarray, ...]:
        from .ir.interp import evaluate_computation

        args = self._check(arrays)
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
        return "\n".join(lines)

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
