"""Schedule steps (Ansor/Halide vocabulary) and schedules, as data.

Map:
  Step kinds     Split FollowSplit FollowFusedSplit Reorder Fuse ComputeAt ComputeInline ComputeRoot
                 CacheRead CacheWrite RFactor Annotate Pragma StorageAlign Pack Pad (frozen dataclasses)
  STEP_KINDS     JSON tag -> class
  step_to_json / step_from_json        one step <-> a JSON-able dict {"step": tag, fields...}
  step_str / parse_step                one step <-> one readable line: `split stage="C" iter="i" factors=[8,4]`
  Schedule       (workload_key, steps, sketch id) with a cached structural `key` (sha256 of the canonical JSON)
  schedule_to_json / schedule_from_json, str(Schedule) / parse_schedule

Stages and iterators are referred to by NAME, not by index.  Names are stable: a stage keeps its
name when cache_read / cache_write / rfactor insert stages (which would shift Ansor's indices), and
iterator names are generated deterministically by the steps themselves (split of `i` gives `i.0`,
`i.1`, ...; fuse of `i.0`, `j.0` gives `i.0@j.0`; cache_write of `C` adds stage `C.local`; cache_read
of `A` for scope shared adds `A.shared`; rfactor of `C` adds `C.rf`; pack of `B` adds `B.pack`).  So replay
is deterministic, steps read well in logs, and mutation / crossover can move a step between schedules of the same
sketch without renumbering.  `FollowSplit` / `FollowFusedSplit` refer to earlier Split steps by
their position in the step list (as Ansor does), so a tile-size mutation of the source split is
followed automatically.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, dataclass, fields
from functools import cached_property

from ..errors import ScheduleError
from .loop_ir import ForKind


class Step:
    """Base class of schedule steps."""

    __slots__ = ()
    tag = ""


@dataclass(frozen=True)
class Split(Step):
    """Split iterator `iter` of `stage` into len(factors)+1 iterators `iter.0` (outermost) ...
    With inner_to_outer, `factors` are the extents of `iter.1 .. iter.n` and `iter.0` gets
    ceil(extent / prod); otherwise they are the extents of `iter.0 .. iter.n-1` and the innermost
    gets the rest.  When the product does not divide the extent, the tail is guarded (`If`).
    A factor of None is undetermined (a sketch); replaying it raises ScheduleError."""

    stage: str
    iter: str
    factors: tuple[int | None, ...]
    inner_to_outer: bool = True
    tag = "split"


@dataclass(frozen=True)
class FollowSplit(Step):
    """Split `iter` into `n_split` parts following Split step number `src_step`: its first
    n_split-2 factors, then the product of the remaining ones."""

    stage: str
    iter: str
    src_step: int
    n_split: int
    tag = "follow_split"


@dataclass(frozen=True)
class FollowFusedSplit(Step):
    """Split `iter` in two with factor (or nparts) = product over `src_steps` of their factor at
    `level` (for a loop fused from several split iterators)."""

    stage: str
    iter: str
    src_steps: tuple[int, ...]
    level: int
    factor_or_nparts: bool = True
    tag = "follow_fused_split"


@dataclass(frozen=True)
class Reorder(Step):
    """Set the loop order of `stage` (a permutation of all its iterators, outermost first)."""

    stage: str
    order: tuple[str, ...]
    tag = "reorder"


@dataclass(frozen=True)
class Fuse(Step):
    """Fuse adjacent iterators (outer to inner) into one named `a@b@...`."""

    stage: str
    iters: tuple[str, ...]
    tag = "fuse"


@dataclass(frozen=True)
class ComputeAt(Step):
    """Compute `stage` inside loop `iter` of its consumer `target` (only the region needed there)."""

    stage: str
    target: str
    iter: str
    tag = "compute_at"


@dataclass(frozen=True)
class ComputeInline(Step):
    stage: str
    tag = "compute_inline"


@dataclass(frozen=True)
class ComputeRoot(Step):
    stage: str
    tag = "compute_root"


@dataclass(frozen=True)
class CacheRead(Step):
    """Add stage `<stage>.<scope>` copying buffer `stage` (an input or a stage); `readers` read the copy."""

    stage: str
    scope: str
    readers: tuple[str, ...]
    tag = "cache_read"


@dataclass(frozen=True)
class CacheWrite(Step):
    """Add stage `<stage>.<scope>` that computes what `stage` computed; `stage` becomes a copy of it."""

    stage: str
    scope: str
    tag = "cache_write"


@dataclass(frozen=True)
class RFactor(Step):
    """Add stage `<stage>.rf` with reduce iterator `iter` turned into its first space axis
    (partial reductions); `stage` then reduces the partials over `iter`."""

    stage: str
    iter: str
    tag = "rfactor"


@dataclass(frozen=True)
class Annotate(Step):
    """Set the loop kind of an iterator: parallel, vectorized, unrolled, GPU bindings, or serial."""

    stage: str
    iter: str
    kind: ForKind
    tag = "annotate"


@dataclass(frozen=True)
class Pragma(Step):
    """A pragma on a loop, e.g. ("auto_unroll_max_step", 64); it becomes `For.annotations`."""

    stage: str
    iter: str
    name: str
    value: int
    tag = "pragma"


@dataclass(frozen=True)
class StorageAlign(Step):
    """Pad the buffer of `stage` so that the stride of dimension `axis` is `offset` mod `factor`."""

    stage: str
    axis: int
    factor: int
    offset: int
    tag = "storage_align"


@dataclass(frozen=True)
class Pack(Step):
    """Add root stage `<stage>.pack`, a copy of buffer `stage` (an input or a stage) in a blocked layout:
    dimension `axis` is split by `factor` (when it does not divide it, the copy has ceil(extent / factor) blocks,
    the last padded with copies of the last element along `axis`); the outer part becomes dimension
    `outer_pos` among the other dimensions and the inner part the last dimension.  `readers` read the
    copy: `B[k, j]` becomes `B.pack[j / f, k, j % f]` for axis=1, outer_pos=0 (contiguous panels of
    `f` columns, GEMM's packed B).  E.g. f32[K, N] -> f32[N/f, K, f]; f32[b, N, K] with axis=1,
    outer_pos=1 -> f32[b, N/f, K, f]."""

    stage: str
    readers: tuple[str, ...]
    axis: int
    factor: int
    outer_pos: int = 0
    tag = "pack"


@dataclass(frozen=True)
class Pad(Step):
    """Compute stage `stage` over a larger domain: its space axis `iter` (not yet split or fused) runs to `extent`
    instead of its own extent, loads whose index could then pass their buffer's bounds are clamped into them.  The
    extra elements are computed and never read (the stage's consumers read what they read before), so the stage
    must not be an output.  What it is for: a dot whose output columns take no full vector (509) computes a
    multiple of its micro-tile (512) out of a padded packed B (`Pack` with a non-dividing factor), with no tail
    guard in its inner loops (MetaSchedule's PadEinsum does the same)."""

    stage: str
    iter: str
    extent: int
    tag = "pad"


STEP_KINDS: dict[str, type] = {c.tag: c for c in (
    Split, FollowSplit, FollowFusedSplit, Reorder, Fuse, ComputeAt, ComputeInline, ComputeRoot,
    CacheRead, CacheWrite, RFactor, Annotate, Pragma, StorageAlign, Pack, Pad)}


def _jsonable(v):
    if isinstance(v, ForKind):
        return v.value
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


def step_to_json(step: Step) -> dict:
    """A JSON-able dict: {"step": tag, field: value, ...} (field order fixed)."""
    out: dict = {"step": step.tag}
    for f in fields(step):
        out[f.name] = _jsonable(getattr(step, f.name))
    return out


def step_from_json(d: dict) -> Step:
    """Inverse of `step_to_json`; raises ScheduleError on an unknown or malformed step."""
    if not isinstance(d, dict) or d.get("step") not in STEP_KINDS:
        raise ScheduleError(f"unknown schedule step {d!r}")
    cls = STEP_KINDS[d["step"]]
    kw = {}
    try:
        for f in fields(cls):
            if f.name not in d:
                if f.default is MISSING:
                    raise KeyError(f.name)
                continue
            v = d[f.name]
            if isinstance(v, list):
                v = tuple(v)
            if cls is Annotate and f.name == "kind":
                v = ForKind(v)
            kw[f.name] = v
        extra = set(d) - {f.name for f in fields(cls)} - {"step"}
        if extra:
            raise ScheduleError(f"step {d['step']}: unknown fields {sorted(extra)}")
        return cls(**kw)
    except (KeyError, TypeError, ValueError) as e:
        raise ScheduleError(f"malformed {d['step']} step {d!r}: {e}") from None


def _dump(v) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=True)


def step_str(step: Step) -> str:
    """One readable line: the tag, then `field=<json>` for each field."""
    d = step_to_json(step)
    return " ".join([d.pop("step")] + [f"{k}={_dump(v)}" for k, v in d.items()])


def parse_step(line: str) -> Step:
    """Inverse of `step_str`."""
    line = line.strip()
    tag, _, rest = line.partition(" ")
    d: dict = {"step": tag}
    dec = json.JSONDecoder()
    pos = 0
    while pos < len(rest):
        if rest[pos] == " ":
            pos += 1
            continue
        eq = rest.find("=", pos)
        if eq < 0:
            raise ScheduleError(f"cannot parse step line {line!r}")
        key = rest[pos:eq]
        try:
            v, pos = dec.raw_decode(rest, eq + 1)
        except json.JSONDecodeError as e:
            raise ScheduleError(f"cannot parse step line {line!r}: {e}") from None
        d[key] = v
    return step_from_json(d)


@dataclass(frozen=True)
class Schedule:
    """A schedule: the workload it applies to, its steps in order, and the id of the sketch it was
    sampled from ("" for a hand-written or default schedule)."""

    workload_key: str
    steps: tuple[Step, ...]
    sketch: str = ""

    @cached_property
    def key(self) -> str:
        """Structural hash (hex sha256 of the canonical JSON); equal schedules have equal keys."""
        text = json.dumps(schedule_to_json(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def __str__(self) -> str:
        head = f"schedule {_dump(self.workload_key)}" + (f" sketch {_dump(self.sketch)}" if self.sketch else "")
        return "\n".join([head] + [step_str(s) for s in self.steps]) + "\n"


def schedule_to_json(s: Schedule) -> dict:
    """{"workload_key", "sketch" (only when set, so keys of sketch-less schedules stay as they were), "steps"}."""
    out: dict = {"workload_key": s.workload_key}
    if s.sketch:
        out["sketch"] = s.sketch
    out["steps"] = [step_to_json(x) for x in s.steps]
    return out


def schedule_from_json(d: dict) -> Schedule:
    try:
        return Schedule(str(d["workload_key"]), tuple(step_from_json(x) for x in d["steps"]), str(d.get("sketch", "")))
    except (KeyError, TypeError, AttributeError) as e:
        raise ScheduleError(f"malformed schedule: {e}") from None


def parse_schedule(text: str) -> Schedule:
    """Inverse of `str(schedule)`."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines or not lines[0].startswith("schedule "):
        raise ScheduleError("schedule text must start with `schedule \"<workload key>\"`")
    head = lines[0][len("schedule "):].strip()
    dec = json.JSONDecoder()
    try:
        key, pos = dec.raw_decode(head)
        rest = head[pos:].strip()
        sketch = ""
        if rest:
            if not rest.startswith("sketch "):
                raise ScheduleError(f"bad schedule header {lines[0]!r}: expected `sketch \"<id>\"` after the key")
            sketch = str(json.loads(rest[len("sketch "):]))
    except json.JSONDecodeError as e:
        raise ScheduleError(f"bad schedule header {lines[0]!r}: {e}") from None
    return Schedule(str(key), tuple(parse_step(ln) for ln in lines[1:]), sketch)
