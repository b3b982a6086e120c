"""Public Python API: load a model, inspect it, run it with the reference interpreter, compile it.

Map:
  load_model(model, *example_args) -> Model   path / HLO text / JAX function -> verified Module
  Model                                        the module plus its front-end products (lazy)
  frontend(module) -> Frontend                 optimize -> fuse -> compute definitions -> workloads
  reference_run(model, inputs)                 numpy interpreter on the original module
  inspect_model(...) -> InspectReport          what `hlotune inspect` prints
  compile(model, tuning_log=None, target="cpu") -> Executable   (see executable.py)
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from . import config
from .errors import HlotuneError, InputError, UnsupportedError
from .ir.hlo import Module, flat_shapes


@dataclass(frozen=True)
class Subgraph:
    """One fused subgraph of a model, with its algorithm and workload key."""

    name: str            # the fusion instruction in the glue program
    kind: str            # loop | input | output | opaque
    computation: Any     # hlo.Computation
    workload: Any        # workload.Workload (key, compute, weight, flops, bytes, ...)


@dataclass(frozen=True)
class Frontend:
    module: Module        # the verified input module
    optimized: Module     # after the pass pipeline
    program: Any          # fusion.FusedProgram (glue module + subgraphs)
    subgraphs: tuple[Subgraph, ...]
    #: fused subgraphs with no compute definition (e.g. variadic reduce): (FusedSubgraph, reason);
    #: executables run them with the reference interpreter
    unsupported: tuple = ()
    timings: dict = field(default_factory=dict, compare=False)


def frontend(module: Module) -> Frontend:
    """Run the front end: passes, fusion, compute definitions, workload keys."""
    from .ir.fusion import fuse
    from .ir.passes import optimize
    from .ir.workload import extract_workloads

    t0 = time.perf_counter()
    optimized = optimize(module)
    t1 = time.perf_counter()
    program = fuse(optimized)
    t2 = time.perf_counter()
    pairs = extract_workloads(program, skip_unsupported=True)
    t3 = time.perf_counter()
    subs = tuple(Subgraph(sg.name, sg.kind, sg.computation, wl) for sg, wl in pairs)
    unsupported = _unsupported(program, {sg.name for sg, _ in pairs})
    timings = {"passes_s": t1 - t0, "fusion_s": t2 - t1, "compute_s": t3 - t2}
    config.debug(1, "front end: %d subgraphs (%d distinct workloads)", len(subs),
                 len({s.workload.key for s in subs}))
    config.debug(2, "front end timings: %s", timings)
    for sg, why in unsupported:
        config.debug(1, "subgraph %s has no compute definition (%s): it runs in the interpreter", sg.name, why)
    return Frontend(module, optimized, program, subs, unsupported, timings)


def _unsupported(program, supported: set[str]) -> tuple:
    from .ir.compute import compute_definition

    out = []
    for sg in program.subgraphs:
        if sg.name not in supported:
            try:
                compute_definition(sg.computation, program.module, name=sg.name)
                why = "unsupported"
            except UnsupportedError as e:
                why = e.message
            out.append((sg, why))
    return tuple(out)


class Model:
    """A model given to hlotune: the parsed, verified HLO module and its front-end products."""

    def __init__(self, module: Module, source: str | None = None):
        self.module = module
        self.source = source

    @cached_property
    def frontend(self) -> Frontend:
        return frontend(self.module)

    @property
    def name(self) -> str:
        return self.module.name

    def input_shapes(self):
        return tuple(p.shape for p in self.module.entry_computation.parameters)

    def output_shapes(self):
        return flat_shapes(self.module.entry_computation.root_instruction.shape)

    def __repr__(self) -> str:
        return f"Model({self.module.name!r}, {len(self.module.computations)} computations)"


def _jax_to_hlo(fn: Any, example_args: Sequence[Any]) -> str:
    try:
        import jax  # noqa: F401  (optional extra)
    except ImportError:
        raise InputError("a JAX function was given but JAX is not installed (pip install 'hlotune[jax]')") from None
    if not example_args:
        raise InputError("a JAX function needs example arguments: load_model(fn, *example_args)")
    import jax
    return jax.jit(fn).lower(*example_args).compiler_ir("hlo").as_hlo_text()


def _read_text(model: str) -> tuple[str, str | None]:
    """(text, file name or None) for a path or HLO text."""
    if "HloModule" in model and ("{" in model or "\n" in model):
        return model, None
    path = os.fspath(model)
    if not os.path.exists(path):
        raise InputError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise InputError(f"model path is a directory, not an HLO text file: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(), path
    except UnicodeDecodeError:
        raise InputError(f"model file is not text (HLO text expected): {path}") from None
    except OSError as e:
        raise InputError(f"cannot read model file {path}: {e.strerror}") from None


def load_model(model: Any, *example_args: Any) -> Model:
    """Load a model: a path to HLO text (.hlo/.txt), HLO text itself, a `Model`, a `Module`,
    or a JAX function with example arguments (needs the `jax` extra)."""
    from .ir.parser import parse_hlo
    from .ir.verify import verify_module

    if isinstance(model, Model):
        return model
    if isinstance(model, Module):
        return Model(verify_module(model))
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if callable(model):
        text, file = _jax_to_hlo(model, example_args), None
    elif isinstance(model, str):
        text, file = _read_text(model)
    else:
        raise InputError(f"cannot load a model from {type(model).__name__}; give a path, HLO text or a JAX function")
    try:
        module = verify_module(parse_hlo(text, file=file))
    except HlotuneError as e:
        raise (e.with_file(file) if file else e) from None
    return Model(module, text)


def reference_run(model: Any, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Run the model with the numpy HLO interpreter (exact HLO semantics)."""
    from .ir.interp import evaluate

    m = load_model(model)
    return evaluate(m.module, [np.asarray(x) for x in inputs])


@dataclass
class InspectReport:
    model: str
    subgraphs: list[dict]
    schedules: dict[str, str] = field(default_factory=dict)
    unsupported: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"model": self.model, "subgraphs": self.subgraphs, "schedules": self.schedules,
                "unsupported": self.unsupported}

    def text(self) -> str:
        lines = [f"model {self.model}: {len(self.subgraphs)} distinct subgraph(s)"]
        for u in self.unsupported:
            lines.append(f"  (subgraph {u['name']} runs in the reference interpreter: {u['reason']})")
        for s in self.subgraphs:
            lines.append("")
            lines.append(f"subgraph {s['name']}  key={s['key']}  weight={s['weight']}  kind={s['kind']}")
            lines.append(f"  ops: {', '.join(s['opcodes'])}")
            lines.append(f"  inputs: {', '.join(s['inputs'])}  ->  outputs: {', '.join(s['outputs'])}")
            lines.append(f"  flops: {s['flops']:.4g}  bytes: {s['bytes']}")
            lines.extend("  " + ln for ln in s["compute"].splitlines())
            if s["key"] in self.schedules:
                lines.append("  loop nest" + (f" ({s['schedule_source']})" if s.get("schedule_source") else "") + ":")
                lines.extend("    " + ln for ln in self.schedules[s["key"]].splitlines())
        return "\n".join(lines)


def _shape_text(shape) -> str:
    return f"{shape.dtype.value}[{','.join(map(str, shape.dims))}]" if hasattr(shape, "dims") else str(shape)


def inspect_model(model: Any, schedule: bool = False, tuning_log: Any = None, target: str = "cpu") -> InspectReport:
    """The fused subgraphs of a model (one entry per distinct workload key)."""
    m = load_model(model)
    fe = m.frontend
    seen: dict[str, dict] = {}
    for sg in fe.subgraphs:
        wl = sg.workload
        if wl.key in seen:
            continue
        seen[wl.key] = {
            "name": sg.name, "key": wl.key, "weight": wl.weight, "kind": sg.kind,
            "opcodes": list(wl.opcodes), "flops": float(wl.flops), "bytes": int(wl.bytes),
            "inputs": [f"{b.dtype.value}[{','.join(map(str, b.shape))}]" for b in wl.compute.inputs],
            "outputs": [_shape_text(s) for s in flat_shapes(sg.computation.root_instruction.shape)],
            "compute": str(wl.compute),
        }
    report = InspectReport(m.name, list(seen.values()),
                           unsupported=[{"name": sg.name, "reason": why} for sg, why in fe.unsupported])
    if schedule:
        from .executable import plan_schedules

        for key, (loop_text, source) in plan_schedules(m, tuning_log=tuning_log, target=target).items():
            report.schedules[key] = loop_text
            if key in seen:
                seen[key]["schedule_source"] = source
    return report


def compile(model: Any, tuning_log: Any = None, target: str = "cpu"):  # noqa: A001 - public name by contract
    """Compile a whole model; returns an `Executable` (`exe(*arrays) -> tuple of arrays`).

    Each subgraph uses the best schedule in `tuning_log` for this target when there is one,
    otherwise its default schedule; `exe.report()` says which."""
    from .executable import Executable

    if target not in ("cpu", "cuda"):
        raise UnsupportedError(f"unknown target {target!r} (expected 'cpu' or 'cuda')")
    return Executable(load_model(model), tuning_log=tuning_log, target=target)


def tune(model: Any, tuning_log: Any = None, target: str | Sequence[str] = "cpu", trials: int | None = None,
         time_budget: float | str | None = None, seed: int = 0, workers: int | None = None,
         cost_model: Any = None, policy: str = "evolutionary", ray: str | None = None, **options: Any):
    """Tune every subgraph of `model`, recording measurements in `tuning_log`; returns a `TuneReport`.

    `tuning_log`: a path (.db SQLite, .jsonl), a SQLAlchemy URL or a Database (default
    `<log_dir>/<model name>.db`).  Budgets: `trials` (total measurements of this model's subgraphs in the
    database, earlier runs included; default 1000 when no time budget is given) and/or `time_budget`
    (seconds or "8h", earlier runs included).  Running it again continues where it stopped.  `policy`:
    "evolutionary" (cost-model-guided, the default), "random" or "optuna" (TPE).  `cost_model`: a path to a
    pretrained model, a model object, "none" (a fresh model) or None (setting `cost_model`, default "auto": the
    model shipped with hlotune on the CPU).  Other options (see `search.tuner.tune_model`): batch_size,
    population, generations, early_stopping, timing (measure.runner.TimingConfig), measurer, progress,
    stream, log_dir, write_log.

    `ray`: measure on a Ray cluster ("auto", an address, or "local"; see docs/distributed.md), where "cpu" /
    "cuda" mean every target of that kind the cluster's nodes announce.  `target` may list several targets
    (e.g. ["cpu", "cuda"]): they are tuned at once and a `search.distributed.MultiTuneReport` is returned
    when there is more than one target fingerprint."""
    from .database import open_database
    from .search.tuner import parse_duration, tune_model

    if ray is not None or not isinstance(target, str):
        return _tune_targets(model, tuning_log, [target] if isinstance(target, str) else list(target), ray,
                             trials=trials, time_budget=parse_duration(time_budget), seed=seed, workers=workers,
                             cost_model=cost_model, policy=policy, **options)
    if target not in ("cpu", "cuda"):
        raise UnsupportedError(f"unknown target {target!r} (expected 'cpu' or 'cuda')")
    tgt = _detect_target(target)
    m = load_model(model)
    log_dir = options.pop("log_dir", None) or str(config.get("log_dir"))
    if tuning_log is None:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in m.name) or "model"
        os.makedirs(log_dir, exist_ok=True)
        tuning_log = os.path.join(log_dir, f"{safe}.db")
    db = open_database(tuning_log)
    location = tuning_log if isinstance(tuning_log, str) else os.fspath(tuning_log) \
        if isinstance(tuning_log, os.PathLike) else getattr(db, "location", "")
    if isinstance(location, str) and "://" not in location and os.path.exists(location):
        location = os.path.abspath(location)
    try:
        return tune_model(m, db, tgt, trials=trials, time_budget=parse_duration(time_budget),
                          seed=seed, workers=workers, cost_model=cost_model, policy=policy, log_dir=log_dir,
                          db_location=location, **options)
    finally:
        if db is not tuning_log:
            db.close()


def _detect_target(kind: str):
    """The Target of `kind` on this machine; for cuda an UnsupportedError "no CUDA device: ..." when there is no
    usable GPU (no pycuda, no driver, no device)."""
    from .target import Target

    if kind != "cuda":
        return Target.from_string(kind)
    try:
        return Target.from_string("cuda")
    except HlotuneError as e:
        raise UnsupportedError(f"no CUDA device: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _tune_targets(model: Any, tuning_log: Any, targets: list[str], ray: str | None, **kw: Any):
    """`tune` for several targets and/or on a Ray cluster (search/distributed.py)."""
    from .search.distributed import tune_targets

    for t in targets:
        if t not in ("cpu", "cuda"):
            raise UnsupportedError(f"unknown target {t!r} (expected 'cpu' or 'cuda')")
    m = load_model(model)
    log_dir = kw.pop("log_dir", None) or str(config.get("log_dir"))
    if tuning_log is None:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in m.name) or "model"
        os.makedirs(log_dir, exist_ok=True)
        tuning_log = os.path.join(log_dir, f"{safe}.db")
    return tune_targets(m, tuning_log, targets, ray, log_dir=log_dir, **kw)
