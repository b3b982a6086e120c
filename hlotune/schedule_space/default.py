"""Default schedules: a sound heuristic per stage kind, so every model runs fast untuned.

Map:
  default_schedule(cd, target) -> list[Step]      the whole compute definition
  _tiled_pair(O, D, ...)        dot / conv: register-tiled reduction D computed at a tile of its
                                elementwise consumer O (or of its own cache_write copy)
  _reduction(R, ...)            row reductions vectorized through rfactor; column reductions
                                vectorized over the contiguous space axis; full reductions split
                                into parallel partials
  _elementwise(S, ...)          parallel outer loop, vectorized innermost axis

Rules (CPU): every stage stays at root except a tiled reduction, which is computed inside the tile
loop of its consumer (Ansor's "fuse the elementwise consumer") or of a local cache_write copy (its
accumulator tile then lives in registers).  Loops are parallel only when a stage has enough work
to pay for waking the thread pool; vector widths are the target's lanes for the element type;
tile sizes are divisors of the extents, so no guards are needed.
"""

from __future__ import annotations

from ..ir.expr import Binary, ComputeDef, Load, Stage, walk
from ..ir.hlo import Op
from ..target import Target
from .loop_ir import ForKind
from .steps import Annotate, CacheWrite, ComputeAt, Fuse, Reorder, RFactor, Split, Step

#: a stage with fewer scalar operations than this runs on one thread
PARALLEL_MIN_WORK = 1 << 16
#: register tile of the tiled reductions: rows x vectors of lanes
TILE_ROWS = 4
TILE_VECS = 2


def default_schedule(cd: ComputeDef, target: Target | None = None) -> list[Step]:
    """Steps of the default schedule of `cd` for `target` (the host CPU if None)."""
    target = target or Target.host_cpu()
    lanes = max(1, target.vector_bits // 32)
    steps: list[Step] = []
    consumers = _consumers(cd)
    done: set[str] = set()
    for stage in reversed(cd.stages):
        if stage.name in done:
            continue
        done.add(stage.name)
        producer = _fusable_producer(cd, stage, consumers)
        if producer is not None:
            done.add(producer.name)
            steps += _tiled_pair(stage.name, producer.name, stage.axes, producer, lanes)
        elif stage.is_reduction and _is_tiled_reduction(stage, lanes):
            steps.append(CacheWrite(stage.name, "local"))
            steps += _tiled_pair(stage.name, stage.name + ".local", stage.axes, stage, lanes)
        elif stage.is_reduction:
            steps += _reduction(stage, lanes)
        else:
            steps += _elementwise(stage, lanes, target.cores)
    return steps


def _consumers(cd: ComputeDef) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s.name: [] for s in cd.stages}
    for s in cd.stages:
        for n in {e.buffer for e in walk(s.body) if isinstance(e, Load)}:
            if n in out:
                out[n].append(s.name)
    return out


def _is_tiled_reduction(stage: Stage, lanes: int) -> bool:
    """A dot- or conv-like reduction: a product of loads, two or more space axes, the last
    one at least a vector wide."""
    if not stage.is_reduction or len(stage.axes) < 2 or not _vector_width(stage.axes[-1].extent, lanes):
        return False
    if stage.reducer is None or stage.reducer.op is not Op.ADD:
        return False
    return any(isinstance(e, Binary) and e.op is Op.MULTIPLY for e in walk(stage.body))


def _fusable_producer(cd: ComputeDef, stage: Stage, consumers: dict[str, list[str]]) -> Stage | None:
    """The tiled reduction that `stage` (elementwise, same axes) can host at its tile loop."""
    if stage.is_reduction:
        return None
    for name in {e.buffer for e in walk(stage.body) if isinstance(e, Load)}:
        prod = cd.stage_by_name.get(name)
        if (prod is not None and prod.name not in cd.outputs and consumers[prod.name] == [stage.name]
                and _is_tiled_reduction(prod, 8) and prod.shape == stage.shape
                and _reads_same_point(stage, prod.name)):
            return prod
    return None


def _reads_same_point(stage: Stage, buf: str) -> bool:
    """Every load of `buf` in `stage` is at the stage's own index (i0, i1, ...)."""
    want = tuple(a.name for a in stage.axes)
    for e in walk(stage.body):
        if isinstance(e, Load) and e.buffer == buf:
            if tuple(getattr(i, "name", None) for i in e.indices) != want:
                return False
    return True


def _vector_width(extent: int, lanes: int) -> int:
    """The widest power-of-two vector (at most `lanes`, at least 4) that divides `extent`; 0 if none."""
    v = lanes
    while v >= 4:
        if extent % v == 0:
            return v
        v //= 2
    return 0


def _divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def _work(stage: Stage) -> int:
    n = 1
    for a in stage.axes + stage.reduce_axes:
        n *= a.extent
    return n


def _tiled_pair(out: str, red: str, axes, red_stage: Stage, lanes: int) -> list[Step]:
    """Tile `out` over its last two axes and compute `red` at the tile (register blocking)."""
    *batch, ax_i, ax_j = [a for a in axes]
    I, J = ax_i.extent, ax_j.extent
    lanes = _vector_width(J, lanes) or 1
    nr = lanes * TILE_VECS if J % (lanes * TILE_VECS) == 0 else lanes
    mr = _divisor_at_most(I, TILE_ROWS)
    ti = _divisor_at_most(I // mr, max(1, 64 // mr))
    tj = _divisor_at_most(J // nr, max(1, 256 // nr))
    i, j = ax_i.name, ax_j.name
    steps: list[Step] = [Split(out, i, (ti, mr)), Split(out, j, (tj, nr))]
    outer = [a.name for a in batch] + [f"{i}.0", f"{j}.0"]
    steps.append(Reorder(out, tuple(outer + [f"{j}.1", f"{i}.1", f"{i}.2", f"{j}.2"])))
    steps.append(Fuse(out, tuple(outer)))
    if _work(red_stage) >= PARALLEL_MIN_WORK:
        steps.append(Annotate(out, "@".join(outer), ForKind.PARALLEL))
    steps.append(ComputeAt(red, out, f"{i}.1"))
    red_axes = [a.name for a in red_stage.reduce_axes]
    steps.append(Reorder(red, tuple([a.name for a in batch] + red_axes + [i, j])))
    if lanes > 1:
        steps += [Split(red, j, (lanes,)), Annotate(red, f"{j}.1", ForKind.VECTORIZED),
                  Annotate(red, f"{j}.0", ForKind.UNROLLED)]
        steps += [Split(out, f"{j}.2", (lanes,)), Annotate(out, f"{j}.2.1", ForKind.VECTORIZED)]
    steps.append(Annotate(red, i, ForKind.UNROLLED))
    return steps


def _contiguous_in(stage: Stage, axis: str) -> bool:
    """Some load of the body has `axis` as its innermost index (unit stride)."""
    for e in walk(stage.body):
        if isinstance(e, Load) and e.indices and getattr(e.indices[-1], "name", None) == axis:
            return True
    return False


def _reduction(stage: Stage, lanes: int) -> list[Step]:
    name = stage.name
    space = [a.name for a in stage.axes]
    last_r = stage.reduce_axes[-1]
    par = _work(stage) >= PARALLEL_MIN_WORK
    steps: list[Step] = []
    if not space:  # full reduction: parallel partial sums over the outer reduce axis
        if len(stage.reduce_axes) < 2 or not par:
            return steps
        outer = stage.reduce_axes[0].name
        rf = name + ".rf"
        steps.append(RFactor(name, outer))
        steps.append(Annotate(rf, outer, ForKind.PARALLEL))
        return steps
    rv = _vector_width(last_r.extent, lanes)
    sv = _vector_width(stage.axes[-1].extent, lanes) if stage.axes else 0
    if _contiguous_in(stage, last_r.name) and rv and last_r.extent >= 4 * rv:
        lanes = rv
        rf = name + ".rf"
        r0, r1 = f"{last_r.name}.0", f"{last_r.name}.1"
        others = [a.name for a in stage.reduce_axes[:-1]]
        steps += [Split(name, last_r.name, (lanes,)), RFactor(name, r1),
                  Reorder(rf, tuple(space + others + [r0, r1])),
                  Annotate(rf, r1, ForKind.VECTORIZED), ComputeAt(rf, name, space[-1])]
    elif sv and _contiguous_in(stage, space[-1]):
        lanes, j = sv, space[-1]
        steps += [Split(name, j, (lanes,))]
        order = space[:-1] + [f"{j}.0"] + [a.name for a in stage.reduce_axes] + [f"{j}.1"]
        steps += [Reorder(name, tuple(order)), Annotate(name, f"{j}.1", ForKind.VECTORIZED)]
        space = space[:-1] + [f"{j}.0"]
    if par:
        steps += _parallel_outer(name, space)
    return steps


def _parallel_outer(name: str, space: list[str]) -> list[Step]:
    """Parallel on the outermost space loop (inner ones may host compute_at stages)."""
    return [Annotate(name, space[0], ForKind.PARALLEL)] if space else []


def _elementwise(stage: Stage, lanes: int, cores: int) -> list[Step]:
    name = stage.name
    axes = [a.name for a in stage.axes]
    if not axes:
        return []
    par = _work(stage) >= PARALLEL_MIN_WORK
    last = stage.axes[-1]
    steps: list[Step] = []
    if _vector_width(last.extent, lanes) and len(axes) > 1:
        lanes = _vector_width(last.extent, lanes)
        steps += [Split(name, last.name, (lanes,)), Annotate(name, f"{last.name}.1", ForKind.VECTORIZED)]
        outer = axes[:-1]
        if par:
            if len(outer) > 1:
                steps += [Fuse(name, tuple(outer)), Annotate(name, "@".join(outer), ForKind.PARALLEL)]
            else:
                steps.append(Annotate(name, outer[0], ForKind.PARALLEL))
        return steps
    fused = axes[0]
    if len(axes) > 1:
        steps.append(Fuse(name, tuple(axes)))
        fused = "@".join(axes)
    n = _work(stage)
    v = _vector_width(n, lanes) or 1
    if v > 1:
        chunks = _divisor_at_most(n // v, 16 * cores) if par else 1
        inner = (n // v) // chunks
        steps += [Split(name, fused, (inner, v)), Annotate(name, f"{fused}.2", ForKind.VECTORIZED)]
        if par:
            steps.append(Annotate(name, f"{fused}.0", ForKind.PARALLEL))
    elif par:
        steps += [Split(name, fused, (n // _divisor_at_most(n, 16 * cores),)),
                  Annotate(name, f"{fused}.0", ForKind.PARALLEL)]
    return steps
