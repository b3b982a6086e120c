"""Measurement on a Ray cluster: builders as Ray tasks, runners as Ray actors pinned to a target.

Map:
  run_resource(fp) / build_resource(fp)   the custom Ray resources a node announces for a target fingerprint:
                                          "hlotune-run:<fp>" = how many runners (devices) it has for the target,
                                          "hlotune-build:<fp>" = how many builds it may run at once
  node_resources(kinds, gpus)             this machine's announcement (`python -m hlotune.measure.ray_runner`
                                          prints it for `ray start --resources '...'`)
  ACTOR_KINDS                             target kind -> how a runner actor is placed (GPUs per actor)
  RayPool(targets, address, ...)          connects to the cluster, resolves the targets ("cpu", "cuda" = every
                                          fingerprint of that kind the cluster announces; a Target = exactly it),
                                          keeps one runner actor per device of each target
    .targets / .measurer(target) -> RayMeasurer / .interrupt() / .stats / .close()
  RayMeasurer                             ProgramMeasurer's interface (`measure_batch`, `close`, `runner.timeout`)
                                          for one target of the pool
  _RunnerActor                            the actor: checks that its machine is the target it announces, owns a
                                          local runner (measurer.RUNNERS: LocalRunner, GpuRunner), caches task data
  _build_remote                           the builder task: a LocalBuilder of one process per Ray worker (so a
                                          crash, hang or runaway allocation in LLVM kills only that process)

Placement: a runner actor asks for {"hlotune-run:<fp>": 1} plus ACTOR_KINDS[kind]["num_gpus"] GPUs, so a node
with 8 GPUs that announces "hlotune-run:<fp>": 8 gets 8 actors, each seeing only its own GPU (Ray sets
CUDA_VISIBLE_DEVICES per actor, so the GpuRunner's "device 0" is the actor's GPU).  A CPU node announces 1: one
runner per machine, as a timed kernel uses every core.  The pool keeps as many actors per target as the alive
nodes announce, adding actors when nodes join.  Builds ask for {"hlotune-build:<fp>": 1} and one CPU; for a CPU
target with no build resource in the cluster they go to any node (LLVM emits code for the target's triple, CPU
name and features on any host of the same architecture).

Dispatch (RayMeasurer.measure_batch): every candidate's build is submitted at once; each finished build goes to
a queue, and a queued candidate is sent to an idle actor of its target as soon as there is one, the one idle
longest when there are several (one candidate per actor at a time: the runner times one kernel at a time
anyway).  The object code goes from the builder's node to the actor's node through the object store, never
through the driver.  Task inputs and reference outputs are computed once in the driver and put in the object
store once per task; each actor fetches them once per task.

Failures: a candidate's own faults (crash, hang, wrong answer, memory) are handled inside the actor's local
runner (its child process dies and is replaced, the candidate gets its error kind), exactly as locally.  An
actor that dies (its node is lost, the process is killed) is dropped and replaced when its target still has
capacity; the candidate it had is built and sent again (at most `max_attempts` times in all, after which it is
recorded with error kind "unknown" and a message saying the runner was lost).  A builder task whose node dies is
retried by Ray.  When no runner of a target is alive or can be placed for `no_runner_timeout` seconds, the
queued candidates of that target end as "unknown" ("no runner ... in the cluster").  So every candidate of a
batch gets exactly one result, and the driver (search/tuner.py) writes one record per result, in one
transaction per batch: a record is written exactly once, and never silently dropped.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import HlotuneError, InputError, UnsupportedError
from ..target import Target
from .builder import BuildJob, LocalBuilder
from .measurer import _kernel_name, make_runner
from .records import BuildResult, ErrorKind, MeasureInput, MeasureResult
from .reference import task_data
from .runner import TimingConfig

RUN_PREFIX = "hlotune-run:"
BUILD_PREFIX = "hlotune-build:"

#: target kind -> how a runner actor is placed: GPUs per actor (one actor per device of a node)
ACTOR_KINDS: dict[str, dict[str, float]] = {"cpu": {"num_gpus": 0}, "cuda": {"num_gpus": 1}}
#: task data kept per actor (least recently used tasks are dropped beyond this)
ACTOR_TASKS = 16
#: seconds an actor may take to start (import hlotune, detect the target, start its runner process)
ACTOR_START_TIMEOUT = 180.0


def run_resource(fingerprint: str) -> str:
    """The custom resource that says how many runners (devices) a node has for a target."""
    return RUN_PREFIX + fingerprint


def build_resource(fingerprint: str) -> str:
    """The custom resource that says how many builds for a target a node may run at once."""
    return BUILD_PREFIX + fingerprint


def _gpu_count() -> int:
    try:
        import pycuda.driver as drv
        drv.init()
        return int(drv.Device.count())
    except Exception:  # no pycuda, no driver, no device
        return 0


def node_resources(kinds: Sequence[str] = ("cpu", "cuda"), gpus: int | None = None) -> dict[str, float]:
    """The resources this machine announces to Ray (`ray start --resources '<json>'`): for each target kind
    found here, one runner per device and one build slot per core."""
    from .builder import default_workers

    out: dict[str, float] = {}
    cores = float(default_workers())
    for kind in kinds:
        try:
            t = Target.from_string(kind)
        except HlotuneError:
            continue
        devices = 1 if kind == "cpu" else (gpus if gpus is not None else _gpu_count())
        if devices > 0:
            out[run_resource(t.fingerprint)] = float(devices)
            out[build_resource(t.fingerprint)] = cores
    return out


def _ray():
    try:
        import ray
    except ImportError:
        raise UnsupportedError("distributed tuning needs Ray: pip install 'hlotune[distributed]'") from None
    return ray


# ----------------------------------------------------------------------------- on the cluster's nodes

_BUILDER: LocalBuilder | None = None
_BUILDER_LOCK = threading.Lock()


def _build_remote(job: BuildJob, timeout: float) -> tuple[tuple[bool, str, str], BuildResult]:
    """A builder task: (ok, error kind, message) for the driver, and the BuildResult for the runner."""
    global _BUILDER
    with _BUILDER_LOCK:
        if _BUILDER is None:
            _BUILDER = LocalBuilder(n_workers=1, timeout=timeout)
        _BUILDER.timeout = float(timeout)
        res = _BUILDER.build([job])[0]
    return (res.ok, res.error_kind.value, res.error_msg[:200]), res


class _RunnerActor:
    """A runner on one device of one target (wrapped by `ray.remote` in RayPool)."""

    def __init__(self, target_json: str | None, kind: str, fingerprint: str, check_target: bool,
                 timing: TimingConfig, timeout: float):
        local = Target.from_string(kind) if (check_target or target_json is None) else None
        if check_target and local.fingerprint != fingerprint:
            raise HlotuneError(f"node {socket.gethostname()} announces target {fingerprint} but its {kind} is "
                               f"{local.fingerprint} (fix its `ray start --resources`)")
        self.target = Target.from_json(target_json) if target_json else local
        self.runner = make_runner(self.target, timing, timeout=timeout)
        self.runner.start()
        self.data: collections.OrderedDict[str, Any] = collections.OrderedDict()

    def info(self) -> dict[str, Any]:
        import ray
        ctx = ray.get_runtime_context()
        ids = ctx.get_accelerator_ids() if hasattr(ctx, "get_accelerator_ids") else {}
        return {"node_id": ctx.get_node_id(), "host": socket.gethostname(), "gpu_ids": list(ids.get("GPU", [])),
                "target": self.target.to_json(), "fingerprint": self.target.fingerprint}

    def run(self, key: str, data_box: list, build: BuildResult, timeout: float, fault: str | None = None):
        import ray
        if key not in self.data:
            self.data[key] = ray.get(data_box[0])
            while len(self.data) > ACTOR_TASKS:
                self.data.popitem(last=False)
        self.data.move_to_end(key)
        self.runner.timeout = float(timeout)
        return self.runner.run_one(self.data[key], build, fault)


# ----------------------------------------------------------------------------- the driver side

@dataclass
class _Slot:
    """One runner actor as the driver sees it."""

    handle: Any
    ready_ref: Any
    info: dict | None = None
    ref: Any = None            # the run in flight (None: idle)
    sent_at: float = 0.0
    candidate: Any = None      # the _Candidate of `ref` (None for an orphan of an interrupted batch)
    idle_since: float = 0.0    # when its last run ended (the longest idle gets the next candidate)


@dataclass
class _Candidate:
    index: int
    inp: MeasureInput
    job: BuildJob
    attempt: int = 0
    build_ref: Any = None      # the BuildResult in the object store


@dataclass
class _TargetGroup:
    """The runner actors of one target fingerprint."""

    fingerprint: str
    kind: str
    target: Target | None
    num_gpus: float
    optional: bool = False     # found by kind ("cpu"): dropped with a warning when its runners cannot start
    slots: list[_Slot] = field(default_factory=list)
    start_failures: int = 0
    last_error: str = ""
    last_refresh: float = 0.0
    data_refs: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    stats: dict = field(default_factory=lambda: {"candidates": 0, "requeued": 0, "actor_deaths": 0,
                                                 "actors_started": 0, "lost": 0,
                                                 "by_node": collections.Counter()})


class _Timeout:
    """What `search.tuner._limit_run_time` adjusts: the per-candidate run timeout sent with each candidate."""

    def __init__(self, timeout: float):
        self.timeout = float(timeout)


class RayPool:
    """Runner actors for several targets on a Ray cluster (see the module docstring).

    `targets`: "cpu" / "cuda" (every fingerprint of that kind announced by the cluster's nodes) or Target objects
    (exactly that fingerprint).  `address`: a Ray address, "auto" (the running cluster), "local" (start Ray on
    this machine with `node_resources()`), or None when `ray.init` was already called.  `check_target`: each
    actor checks that its machine's detected target has the fingerprint it serves (off only in tests, where
    custom resources stand in for machines).  `num_gpus`: {fingerprint: GPUs per actor}, overriding ACTOR_KINDS
    (tests, where custom resources and Ray's declared GPUs stand in for GPU machines)."""

    def __init__(self, targets: Sequence[str | Target], address: str | None = "auto", *,
                 timing: TimingConfig | None = None, timeout: float = 10.0, build_timeout: float = 15.0,
                 seed: int = 0, check_target: bool = True, num_gpus: dict[str, float] | None = None,
                 max_attempts: int = 3, no_runner_timeout: float = 300.0, start_timeout: float = ACTOR_START_TIMEOUT):
        self.ray = _ray()
        self.timing = timing or TimingConfig()
        self.timeout, self.build_timeout = float(timeout), float(build_timeout)
        self.seed, self.check_target, self.max_attempts = seed, check_target, max(1, int(max_attempts))
        self.no_runner_timeout, self.start_timeout = float(no_runner_timeout), float(start_timeout)
        self._num_gpus = dict(num_gpus or {})
        self._stop = threading.Event()
        self._own_ray = False
        self._connect(address)
        self._actor_cls = self.ray.remote(_RunnerActor)
        self._build_fn = self.ray.remote(_build_remote)
        self.groups: dict[str, _TargetGroup] = {}
        try:
            for spec in targets:
                self._add_target(spec)
            self._wait_started()
        except BaseException:
            self.close()
            raise

    # ---- set-up ---------------------------------------------------------------------------------
    def _connect(self, address: str | None) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        kw = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True)
        try:
            if address == "local":
                ray.init(resources=node_resources(), **kw)
            else:
                ray.init(address=address, **kw)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise InputError(f"cannot connect to the Ray cluster at {address!r}: {e}") from None
        self._own_ray = True

    def _capacity(self, fingerprint: str) -> float:
        name = run_resource(fingerprint)
        return sum(float(n.get("Resources", {}).get(name, 0.0)) for n in self.ray.nodes() if n.get("Alive"))

    def _placeable(self, fingerprint: str, gpus: float) -> bool:
        name = run_resource(fingerprint)
        return any(n.get("Alive") and n.get("Resources", {}).get(name, 0.0) >= 1
                   and n.get("Resources", {}).get("GPU", 0.0) >= gpus for n in self.ray.nodes())

    def _announced(self, kind: str) -> list[str]:
        fps = set()
        for n in self.ray.nodes():
            if n.get("Alive"):
                for name, amount in n.get("Resources", {}).items():
                    if name.startswith(RUN_PREFIX) and amount > 0 and name[len(RUN_PREFIX):].startswith(kind + "-"):
                        fps.add(name[len(RUN_PREFIX):])
        return sorted(fps)

    def _add_target(self, spec: str | Target) -> None:
        if isinstance(spec, Target):
            pairs = [(spec.fingerprint, spec.kind, spec)]
            optional = False
            if self._capacity(spec.fingerprint) <= 0:
                raise InputError(f"no node of the Ray cluster announces target {spec.fingerprint} "
                                 f"(resource {run_resource(spec.fingerprint)!r})")
        else:
            kind = {"host": "cpu", "llvm": "cpu", "gpu": "cuda"}.get(spec.strip().lower(), spec.strip().lower())
            if kind not in ACTOR_KINDS:
                raise InputError(f"unknown target {spec!r} (expected one of {', '.join(ACTOR_KINDS)})")
            fps = self._announced(kind)
            if not fps:
                raise InputError(f"no node of the Ray cluster announces a {kind!r} target (start each node with "
                                 f"`ray start --resources \"$(python -m hlotune.measure.ray_runner)\"`)")
            pairs = [(fp, kind, None) for fp in fps]
            optional = True
        for fp, kind, target in pairs:
            if fp in self.groups:
                continue
            gpus = float(self._num_gpus.get(fp, ACTOR_KINDS[kind]["num_gpus"]))
            if not self._placeable(fp, gpus):
                raise InputError(f"no node of the Ray cluster has both {run_resource(fp)!r} and {gpus:g} GPU(s) "
                                 f"for a runner of target {fp}")
            g = _TargetGroup(fp, kind, target, gpus, optional=optional)
            self.groups[fp] = g
            self._refresh(g, force=True)

    def _new_slot(self, g: _TargetGroup) -> None:
        opts: dict[str, Any] = {"resources": {run_resource(g.fingerprint): 1}, "num_cpus": 0, "max_restarts": 0}
        if g.num_gpus:
            opts["num_gpus"] = g.num_gpus
        h = self._actor_cls.options(**opts).remote(g.target.to_json() if g.target else None, g.kind, g.fingerprint,
                                                   self.check_target, self.timing, self.timeout)
        g.slots.append(_Slot(h, h.info.remote(), sent_at=time.monotonic()))
        g.stats["actors_started"] += 1

    def _refresh(self, g: _TargetGroup, force: bool = False) -> float:
        """Start actors until the group has as many as its alive nodes announce; returns that capacity."""
        now = time.monotonic()
        if not force and now - g.last_refresh < 1.0:
            return -1.0
        g.last_refresh = now
        cap = self._capacity(g.fingerprint)
        while len(g.slots) < cap and g.start_failures < 3 * max(1, int(cap)):
            self._new_slot(g)
        return cap

    def _on_ready(self, g: _TargetGroup, slot: _Slot) -> None:
        try:
            slot.info = self.ray.get(slot.ready_ref)
        except Exception as e:
            g.start_failures += 1
            g.last_error = _short(e)
            self._drop(g, slot, count_death=False)
            return
        slot.ready_ref = None
        if g.target is None:
            g.target = Target.from_json(slot.info["target"])

    def _wait_started(self) -> None:
        """Block until every target has its Target (from a started actor).  A fingerprint found by kind whose
        runners cannot start (e.g. a node announcing a target it is not) is dropped with a warning; an explicit
        Target, or a kind left with no fingerprint, is an error."""
        deadline = time.monotonic() + self.start_timeout
        for fp, g in list(self.groups.items()):
            why = ""
            while g.target is None or not any(s.info for s in g.slots):
                starting = [s for s in g.slots if s.ready_ref is not None]
                if not starting or time.monotonic() > deadline:
                    why = g.last_error or "no runner actor could be placed"
                    break
                ready, _ = self.ray.wait([s.ready_ref for s in starting], num_returns=1, timeout=1.0)
                for s in starting:
                    if s.ready_ref in ready:
                        self._on_ready(g, s)
                self._refresh(g)
            if not why:
                continue
            if not g.optional:
                raise HlotuneError(f"no runner for target {fp} could start: {why}")
            warnings.warn(f"target {fp} is left out: no runner could start ({why})", stacklevel=3)
            for s in list(g.slots):
                self._drop(g, s, count_death=False)
            del self.groups[fp]
        if not self.groups:
            raise HlotuneError("no runner of the requested targets could start on the Ray cluster")

    def _drop(self, g: _TargetGroup, slot: _Slot, count_death: bool = True) -> None:
        if slot in g.slots:
            g.slots.remove(slot)
        if count_death:
            g.stats["actor_deaths"] += 1
        try:
            self.ray.kill(slot.handle, no_restart=True)
        except Exception:
            pass

    # ---- public ---------------------------------------------------------------------------------
    @property
    def targets(self) -> list[Target]:
        """The resolved targets (one per fingerprint), in the order they were added."""
        return [g.target for g in self.groups.values()]

    def measurer(self, target: Target | str) -> RayMeasurer:
        """A measurer for one of the pool's targets (by Target or fingerprint)."""
        fp = target if isinstance(target, str) else target.fingerprint
        if fp not in self.groups:
            raise InputError(f"target {fp} is not one of the pool's ({', '.join(self.groups)})")
        return RayMeasurer(self, self.groups[fp])

    @property
    def stats(self) -> dict[str, dict]:
        """Per target fingerprint: candidates, requeued, actor deaths, actors started, lost, per-node counts."""
        return {fp: {**g.stats, "by_node": dict(g.stats["by_node"]), "actors": len(g.slots)}
                for fp, g in self.groups.items()}

    def actor_info(self) -> dict[str, list[dict]]:
        """Per target fingerprint: node, host, GPU ids of each started actor."""
        return {fp: [s.info for s in g.slots if s.info] for fp, g in self.groups.items()}

    def interrupt(self) -> None:
        """Make every measure_batch in progress (any thread) stop with KeyboardInterrupt."""
        self._stop.set()

    def close(self) -> None:
        """Kill the actors (and shut Ray down when this pool started or connected it)."""
        for g in getattr(self, "groups", {}).values():
            for s in list(g.slots):
                self._drop(g, s, count_death=False)
            g.data_refs.clear()
        if self._own_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self._own_ray = False

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _where(info: dict | None) -> str:
    """host:node (first 8 hex digits of the Ray node id), plus :gpuN for a runner with GPUs."""
    info = info or {}
    gpus = ",".join(str(g) for g in info.get("gpu_ids", []))
    return f"{info.get('host', '?')}:{info.get('node_id', '?')[:8]}" + (f":gpu{gpus}" if gpus else "")


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    cause = [ln for ln in text if "Error" in ln or "error" in ln]
    return (cause[-1] if cause else (text[0] if text else type(e).__name__))[:300]


class RayMeasurer:
    """Measures batches of one target's candidates on the pool's actors (ProgramMeasurer's interface)."""

    def __init__(self, pool: RayPool, group: _TargetGroup):
        self.pool, self.group = pool, group
        self.runner = _Timeout(pool.timeout)
        self.stats = {"batches": 0, "candidates": 0, "wall_s": 0.0}

    # ---- helpers --------------------------------------------------------------------------------
    def _data_ref(self, task) -> Any:
        g = self.group
        if task.key not in g.data_refs:
            try:
                g.data_refs[task.key] = self.pool.ray.put(task_data(task, self.pool.seed))
            except Exception as e:  # the reference cannot run: every candidate of the task fails
                g.data_refs[task.key] = e
            while len(g.data_refs) > 4 * ACTOR_TASKS:
                g.data_refs.popitem(last=False)
        return g.data_refs[task.key]

    def _submit_build(self, c: _Candidate) -> Any:
        pool, g = self.pool, self.group
        name = build_resource(g.fingerprint)
        opts: dict[str, Any] = {"num_cpus": 1, "num_returns": 2, "max_retries": 3}
        if name in pool.ray.cluster_resources() or g.kind != "cpu":
            opts["resources"] = {name: 1}
        info_ref, c.build_ref = pool._build_fn.options(**opts).remote(c.job, pool.build_timeout)
        return info_ref

    # ---- the batch ------------------------------------------------------------------------------
    def measure_batch(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Build and run every candidate on the cluster; results in input order (see the module docstring)."""
        t0 = time.perf_counter()
        inputs = list(inputs)
        results: list[MeasureResult | None] = [None] * len(inputs)
        builds: dict[Any, _Candidate] = {}
        queue: collections.deque[_Candidate] = collections.deque()
        for i, inp in enumerate(inputs):
            data = self._data_ref(inp.task)
            if isinstance(data, Exception):
                results[i] = MeasureResult((), ErrorKind.UNKNOWN,
                                           f"no reference for the task: {type(data).__name__}: {data}")
            elif inp.schedule.workload_key != inp.task.key:
                results[i] = MeasureResult((), ErrorKind.INSTANTIATION,
                                           f"schedule is for workload {inp.schedule.workload_key}, not {inp.task.key}")
            elif inp.task.target.fingerprint != self.group.fingerprint:
                results[i] = MeasureResult((), ErrorKind.UNKNOWN, f"candidate is for target "
                                           f"{inp.task.target.fingerprint}, not {self.group.fingerprint}")
            else:
                job = BuildJob(inp.task.compute, tuple(inp.schedule.steps), inp.task.target, _kernel_name(inp))
                c = _Candidate(i, inp, job)
                builds[self._submit_build(c)] = c
        try:
            self._loop(inputs, results, builds, queue)
        finally:
            for ref in builds:
                try:
                    self.pool.ray.cancel(ref, force=True)
                except Exception:
                    pass
        self.stats["batches"] += 1
        self.stats["candidates"] += len(inputs)
        self.stats["wall_s"] += time.perf_counter() - t0
        return results  # type: ignore[return-value]

    def _loop(self, inputs, results, builds, queue) -> None:
        pool, g, ray = self.pool, self.group, self.pool.ray
        no_runner_since: float | None = None
        while any(r is None for r in results):
            if pool._stop.is_set():
                raise KeyboardInterrupt
            cap = pool._refresh(g)
            # hand out queued candidates to idle actors, the longest idle first (so every node gets its share)
            for s in sorted((s for s in g.slots if s.info is not None and s.ref is None), key=lambda s: s.idle_since):
                if not queue:
                    break
                c = queue.popleft()
                s.ref = s.handle.run.remote(c.inp.task.key, [g.data_refs[c.inp.task.key]], c.build_ref,
                                            self.runner.timeout)
                s.sent_at, s.candidate = time.monotonic(), c
            # no runner for a while: fail what waits
            if queue and not g.slots and cap == 0:
                no_runner_since = no_runner_since or time.monotonic()
                if time.monotonic() - no_runner_since > pool.no_runner_timeout:
                    while queue:
                        c = queue.popleft()
                        results[c.index] = MeasureResult((), ErrorKind.UNKNOWN,
                                                         f"no runner for target {g.fingerprint} in the cluster")
                        g.stats["lost"] += 1
                    continue
            else:
                no_runner_since = None
            refs = list(builds) + [s.ref for s in g.slots if s.ref is not None] + \
                [s.ready_ref for s in g.slots if s.ready_ref is not None]
            if not refs:
                time.sleep(0.2)
                continue
            ready, _ = ray.wait(refs, num_returns=1, timeout=0.5, fetch_local=False)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            ready = set(ready)
            for ref in [r for r in builds if r in ready]:
                c = builds.pop(ref)
                self._on_build(c, ref, results, queue, builds)
            for s in list(g.slots):
                if s.ready_ref is not None and s.ready_ref in ready:
                    pool._on_ready(g, s)
                elif s.ref is not None and s.ref in ready:
                    self._on_run(s, results, queue, builds)
            self._watchdog(results, queue, builds)

    def _on_build(self, c: _Candidate, ref, results, queue, builds) -> None:
        try:
            ok, kind, msg = self.pool.ray.get(ref)
        except Exception as e:   # the builder task failed beyond Ray's retries
            results[c.index] = MeasureResult((), ErrorKind.COMPILE, f"builder task failed: {_short(e)}")
            return
        if not ok:   # no need to ship the failed build to a runner
            results[c.index] = MeasureResult((), ErrorKind(kind), msg)
            return
        queue.append(c)

    def _on_run(self, s: _Slot, results, queue, builds) -> None:
        pool, g = self.pool, self.group
        c, ref = s.candidate, s.ref
        s.ref, s.candidate, s.idle_since = None, None, time.monotonic()
        try:
            res = pool.ray.get(ref)
        except pool.ray.exceptions.RayTaskError as e:   # an exception inside the actor's method (a bug)
            if c is not None:
                results[c.index] = MeasureResult((), ErrorKind.UNKNOWN, f"runner actor failed: {_short(e)}")
            return
        except Exception as e:   # the actor (its node) died, or the build's object was lost with a node
            pool._drop(g, s)
            if c is not None:
                self._requeue(c, f"runner lost ({_short(e)})", results, builds)
            return
        if c is None:   # an orphan from an interrupted batch
            return
        results[c.index] = res
        g.stats["candidates"] += 1
        g.stats["by_node"][_where(s.info)] += 1

    def _requeue(self, c: _Candidate, why: str, results, builds) -> None:
        g = self.group
        c.attempt += 1
        if c.attempt >= self.pool.max_attempts:
            results[c.index] = MeasureResult((), ErrorKind.UNKNOWN, f"measured {c.attempt} times, {why}")
            g.stats["lost"] += 1
            return
        g.stats["requeued"] += 1
        builds[self._submit_build(c)] = c   # built again: the old object code may have been on the lost node

    def _watchdog(self, results, queue, builds) -> None:
        """An actor that does not answer long after its runner's timeout (a hung or cut-off node) is killed and
        its candidate sent again."""
        g = self.group
        limit = 2 * self.runner.timeout + 60.0
        now = time.monotonic()
        for s in list(g.slots):
            if s.ref is not None and now - s.sent_at > limit:
                c = s.candidate
                self.pool._drop(g, s)
                if c is not None:
                    self._requeue(c, f"runner did not answer in {limit:g} s", results, builds)
            elif s.ready_ref is not None and now - s.sent_at > self.pool.start_timeout:
                g.start_failures += 1
                g.last_error = "actor did not start in time"
                self.pool._drop(g, s, count_death=False)

    def close(self) -> None:
        """Nothing to stop: the pool owns the actors."""

    def __enter__(self) -> RayMeasurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":   # print this machine's resources for `ray start --resources`
    import json

    print(json.dumps(node_resources()))
