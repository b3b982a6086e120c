"""Sketch generation for the CPU (Ansor's sketch rules): the structure of a schedule, with holes.

Map:
  TileHole, Site, Sketch     a sketch: template steps (Split factors None = holes), the tile holes, and the
                             annotation sites (which stage may get parallel / vectorize / unroll / a
                             sampled compute location / packing of its B operand); `id` is a short hash
                             of the rule path
  PackChoice, pack_choice    the packing decision of a tiled dot-like stage (GEMM's packed B panels)
  generate_sketches(task_or_cd, target) -> list[Sketch]
  RULES                      the rule table (name, condition, apply, skip_rest), visited for every stage
                             from the last stage to the first
  analysis helpers           needs_multi_level_tiling, fusible_consumer, needs_rfactor, is_cheap_elementwise

Rules (CPU), in table order; the first rule whose `skip_rest` is set and whose condition holds ends the
visit of a stage:
  row             the host of a row subgraph (`default.row_sketch`: softmax, layernorm after row fusion): the
                  default's row plan -- statistics and full-row intermediates computed at the host's parallel
                  row loop -- with holes for the rows per parallel task and the vector lanes (1 sketch).  The
                  per-stage sketches are not made for such a subgraph: they compute the statistics in separate
                  passes or recompute them per element (measured 1.4-2x slower, and slow to evaluate)
  row_member      a stage the row rule scheduled: nothing more
  inline          cheap elementwise non-output stage: compute_inline
  fusion_host     the elementwise consumer that a tiled producer fuses (its loops come from that rule)
  tile_fuse       multi-level tiling SSRSRS (space axes in 4 levels, reduce axes in 2, order
                  S0 S1 R0 S2 R1 S3) of a reduction with data reuse, its elementwise consumer split
                  following the tiles and the reduction computed at the consumer's level 1 or 2 (2 sketches)
  cache_write     same tiling when there is no fusible consumer: cache_write to a local stage, tiled and
                  computed at level 1 or 2 of the (now copying) original (2 sketches; the rest also runs)
  tile            the plain tiling (no fusion), root
                  (all three: when the tiled stage is dot-like with a reused B operand, its site carries a
                  PackChoice: the annotator decides whether B is packed into panels as wide as the innermost
                  tile of the last space axis -- the vectorized micro-tile width -- so the tile sizes, the
                  k-blocking (R1) and the packing are searched together; the default's GEMM blocking is a
                  point of the tile_fuse@1 / cache_write@1 sketches, see `annotate.default_like`)
  rfactor         a reduction whose output is small: fuse the reduce axes, split (hole), rfactor the
                  outer part (parallel partials) or the inner part (vectorized partials) (2 sketches)
  reduction       other reductions: split the last space axis (hole), order space, j.0, reduce, j.1
  elementwise     fuse all axes, split in 3 (holes: parallel chunk, serial, vector lanes)
Plus one sketch with the default schedule (`default.default_schedule`, no holes), so the search can always
reach the default's quality, and, when the default has a column-panel GEMM (each parallel task packs the B panel
it reads, `default._panel_tiles`), the sketch `gemm_panel`: the default's steps with that GEMM's row tile and
k block as holes (`default.gemm_sketch`), so tuning searches around the default's blocking.

A sketch's template refers to stages and iterators by name, so annotation steps appended after it (see
`annotate`) and mutations can address loops without renumbering.  Sketch ids are stable: the same
compute definition and target give the same ids in every process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir.expr import ComputeDef, Load, Stage, Unary, Var, walk
from ..ir.hlo import TRANSCENDENTAL
from ..target import Target
from .default import PACK_MIN_ROWS, _b_operand, _reuse_rows, default_schedule, gemm_sketch, row_sketch
from .steps import CacheWrite, ComputeAt, ComputeInline, FollowSplit, Fuse, Reorder, RFactor, Split, Step

#: the innermost tile factor of a multi-level tiling is at most this
MAX_INNERMOST = 64
#: the block of a reduce axis (k-blocking: the R1 level of SSRSRS) is at most this
MAX_REDUCE_BLOCK = 512
#: vector lanes are at most this
MAX_LANES = 16
#: auto_unroll_max_step values the annotator picks from
UNROLL_CHOICES = (0, 16, 64, 512)
#: an elementwise stage with more expression nodes than this is not "cheap" (not always inlined)
CHEAP_NODES = 24


@dataclass(frozen=True)
class TileHole:
    """A Split step of the template whose factors the annotator fills: `n` factors (outer level first)
    for an iterator of `extent`; the innermost factor is at most `max_innermost`."""

    step: int
    stage: str
    iter: str
    extent: int
    n: int
    max_innermost: int = MAX_INNERMOST


@dataclass(frozen=True)
class PackChoice:
    """Packing a reused operand of a tiled stage, decided by the annotator at the stage's site: buffer
    `buffer`, read by `reader`, copied into root stage `name` with dimension `axis` split by the factor of
    level `level` of tile hole `tile` (the innermost space tile of the stage's last axis: the vectorized
    micro-tile width, so each panel is contiguous along the reduction), outer part at `outer_pos`
    (`steps.Pack`)."""

    buffer: str
    reader: str
    name: str
    axis: int
    outer_pos: int
    tile: int
    level: int


@dataclass(frozen=True)
class Site:
    """What the annotator may decide for one stage: fuse its outer space loops and make them parallel,
    vectorize its innermost loop (as is, or after splitting off a lane count), put an
    auto_unroll_max_step pragma on its outermost loop, and choose its compute location (root, inline,
    or a loop of its consumer)."""

    stage: str
    parallel: bool = False
    vector: bool = False
    unroll: bool = False
    location: bool = False
    inlinable: bool = False
    pack: PackChoice | None = None


@dataclass(frozen=True)
class Sketch:
    """A schedule template: `steps` with holes (`tiles`), annotation `sites`, the rule path `rules`."""

    id: str
    rules: tuple[str, ...]
    workload_key: str
    compute: ComputeDef = field(repr=False, compare=False)
    target: Target = field(repr=False, compare=False)
    steps: tuple[Step, ...]
    tiles: tuple[TileHole, ...] = ()
    sites: tuple[Site, ...] = ()

    @property
    def has_holes(self) -> bool:
        return bool(self.tiles or self.sites)

    def __str__(self) -> str:
        lines = [f"sketch {self.id}: {' ; '.join(self.rules)}"]
        holes = {h.step: h for h in self.tiles}
        for k, s in enumerate(self.steps):
            lines.append(f"  {k:2d} {s}" + ("   <- hole" if k in holes else ""))
        for s in self.sites:
            flags = [n for n in ("parallel", "vector", "unroll", "location") if getattr(s, n)]
            if s.pack is not None:
                flags.append(f"pack {s.pack.buffer} -> {s.pack.name}")
            lines.append(f"  site {s.stage}: {', '.join(flags) or '-'}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- analysis

def _reads(stage: Stage) -> list[str]:
    out: list[str] = []
    for e in walk(stage.body):
        if isinstance(e, Load) and e.buffer not in out:
            out.append(e.buffer)
    return out


def _consumers(cd: ComputeDef) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s.name: [] for s in cd.stages}
    for s in cd.stages:
        for b in _reads(s):
            if b in out:
                out[b].append(s.name)
    return out


def _index_vars(e) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def needs_multi_level_tiling(stage: Stage) -> bool:
    """Ansor's test: a reduction whose loads together miss at least two space axes (data reuse)."""
    if not stage.is_reduction or not stage.axes:
        return False
    space = {a.name for a in stage.axes}
    missing = 0
    seen = set()
    for e in walk(stage.body):
        if isinstance(e, Load) and (e.buffer, e.indices) not in seen:
            seen.add((e.buffer, e.indices))
            used = set().union(*(_index_vars(i) for i in e.indices)) if e.indices else set()
            missing += len(space - used)
    return missing >= 2


def _reads_same_point(stage: Stage, buf: str) -> bool:
    want = tuple(a.name for a in stage.axes)
    for e in walk(stage.body):
        if isinstance(e, Load) and e.buffer == buf:
            if tuple(getattr(i, "name", None) if isinstance(i, Var) else None for i in e.indices) != want:
                return False
    return True


def fusible_consumer(cd: ComputeDef, stage: Stage, consumers: dict[str, list[str]]) -> Stage | None:
    """The elementwise consumer that tiled `stage` can be computed inside: its only consumer, not a
    reduction, same shape, reading `stage` at its own point; `stage` is not an output."""
    if stage.name in cd.outputs or len(consumers[stage.name]) != 1:
        return None
    d = cd.stage(consumers[stage.name][0])
    if d.is_reduction or d.shape != stage.shape or not _reads_same_point(d, stage.name):
        return None
    return d


def is_cheap_elementwise(cd: ComputeDef, stage: Stage, consumers: dict[str, list[str]]) -> bool:
    """Inlining costs little: few nodes and no transcendental function, or only elementwise consumers."""
    if stage.is_reduction:
        return False
    nodes = list(walk(stage.body))
    if all(not cd.stage(c).is_reduction for c in consumers[stage.name]):
        return len(nodes) <= 4 * CHEAP_NODES
    return len(nodes) <= CHEAP_NODES and not any(isinstance(e, Unary) and e.op in TRANSCENDENTAL for e in nodes)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def needs_rfactor(stage: Stage, target: Target) -> bool:
    """A reduction over at least 2 points whose output is too small to keep the cores busy (fewer than
    16 x cores points) or smaller than the reduction."""
    if not stage.is_reduction or needs_multi_level_tiling(stage):
        return False
    space = _prod(a.extent for a in stage.axes)
    red = _prod(a.extent for a in stage.reduce_axes)
    return red >= 2 and (space < 16 * max(1, target.cores) or space < red)


def pack_choice(cd: ComputeDef, stage: Stage, reader: str, tile: int, taken: set[str]) -> PackChoice | None:
    """The packing choice of a multi-level tiled dot-like `stage` (computed as `reader`): its B operand (read
    at the last space axis and the longest reduce axis as plain variables) when it is an input or another
    stage and at least PACK_MIN_ROWS output rows reuse each element; `tile` is the index of the last space
    axis' tile hole (3 factors: the pack factor is its innermost one).  `taken` holds the names in use."""
    found = _b_operand(stage)
    if found is None:
        return None
    load, p, q = found
    if load.buffer in (stage.name, reader) or _reuse_rows(stage, load) < PACK_MIN_ROWS:
        return None
    rest = [d for d in range(len(load.indices)) if d != p]
    name = f"{load.buffer}.pack"
    while name in taken:
        name += "_"
    return PackChoice(load.buffer, reader, name, p, rest.index(q), tile, 2)


# ----------------------------------------------------------------------------- generation state

@dataclass(frozen=True)
class _Gen:
    """A partial sketch while the rules run."""

    steps: tuple[Step, ...] = ()
    tiles: tuple[TileHole, ...] = ()
    sites: tuple[Site, ...] = ()
    rules: tuple[str, ...] = ()

    def add(self, rule: str, steps=(), tiles=(), sites=()) -> _Gen:
        return _Gen(self.steps + tuple(steps), self.tiles + tuple(tiles), self.sites + tuple(sites),
                    self.rules + (rule,))


@dataclass
class _Ctx:
    cd: ComputeDef
    target: Target
    consumers: dict[str, list[str]]
    hosts: dict[str, str]  # fusible consumer -> tiled producer
    names: set[str] = field(default_factory=set)   # stage and input names of the compute definition
    row: tuple[list[Step], set[str]] | None = None  # `default.row_sketch`: template with holes, its stages

    def fused(self, stage: Stage) -> Stage | None:
        if not needs_multi_level_tiling(stage):
            return None
        return fusible_consumer(self.cd, stage, self.consumers)


def _multi_level_tile(gen: _Gen, name: str, space: list[tuple[str, int]], red: list[tuple[str, int]]):
    """SSRSRS on stage `name`: returns (steps, holes, split step index per space axis)."""
    steps: list[Step] = []
    holes: list[TileHole] = []
    idx: list[int] = []
    base = len(gen.steps)
    for a, ext in space:
        idx.append(base + len(steps))
        holes.append(TileHole(base + len(steps), name, a, ext, 3))
        steps.append(Split(name, a, (None, None, None)))
    for a, ext in red:
        holes.append(TileHole(base + len(steps), name, a, ext, 1, MAX_REDUCE_BLOCK))
        steps.append(Split(name, a, (None,)))
    s = [a for a, _ in space]
    r = [a for a, _ in red]

    def lv(names, k):
        return [f"{a}.{k}" for a in names]

    steps.append(Reorder(name, tuple(lv(s, 0) + lv(s, 1) + lv(r, 0) + lv(s, 2) + lv(r, 1) + lv(s, 3))))
    return steps, holes, idx


def _fuse_into(name: str, host: str, host_axes: list[str], split_idx: list[int], level: int) -> list[Step]:
    """Split the consumer `host` following the tiles of `name` and compute `name` at its level `level`."""
    steps: list[Step] = [FollowSplit(host, a, k, level + 1) for a, k in zip(host_axes, split_idx)]
    order = [f"{a}.{lv}" for lv in range(level + 1) for a in host_axes]
    steps.append(Reorder(host, tuple(order)))
    steps.append(ComputeAt(name, host, f"{host_axes[-1]}.{level - 1}"))
    return steps


def _axes(stage: Stage):
    return [(a.name, a.extent) for a in stage.axes], [(a.name, a.extent) for a in stage.reduce_axes]


# ----------------------------------------------------------------------------- rules

def _c_row(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return ctx.row is not None and s.name in ctx.row[1] and s.name in ctx.cd.outputs   # the host


def _a_row(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    steps, _ = ctx.row
    extent = {a.name: a.extent for a in s.axes}
    holes = []
    for k, st in enumerate(steps):
        if isinstance(st, Split) and None in st.factors:
            lanes = st.iter == ctx.cd.stage(st.stage).axes[-1].name
            ext = ctx.cd.stage(st.stage).axes[-1].extent if lanes else _prod(extent[a] for a in st.iter.split("@"))
            holes.append(TileHole(len(gen.steps) + k, st.stage, st.iter, ext, 1, MAX_LANES if lanes else MAX_INNERMOST))
    return [gen.add(f"{s.name}:row", steps, holes, [Site(s.name, unroll=True)])]


def _c_row_member(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return ctx.row is not None and s.name in ctx.row[1] and any(r.endswith(":row") for r in gen.rules)


def _a_row_member(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    return [gen.add(f"{s.name}:row_member")]


def _c_inline(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return (not s.is_reduction and s.name not in ctx.cd.outputs and s.name not in ctx.hosts
            and is_cheap_elementwise(ctx.cd, s, ctx.consumers))


def _a_inline(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    return [gen.add(f"{s.name}:inline", [ComputeInline(s.name)])]


def _c_host(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return s.name in ctx.hosts


def _a_host(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    return [gen.add(f"{s.name}:fusion_host")]


def _c_tile_fuse(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return ctx.fused(s) is not None


def _pack_of(ctx: _Ctx, gen: _Gen, stage: Stage, reader: str, n_space: int) -> PackChoice | None:
    if not n_space:
        return None
    taken = ctx.names | {x.pack.name for x in gen.sites if x.pack is not None}
    return pack_choice(ctx.cd, stage, reader, len(gen.tiles) + n_space - 1, taken)


def _tiled_with_host(ctx: _Ctx, gen: _Gen, rule: str, stage: Stage, name: str, host: Stage, space, red,
                     pre=()) -> list[_Gen]:
    out = []
    for level in (1, 2):
        g = gen.add(rule + f"@{level}", pre)
        steps, holes, idx = _multi_level_tile(g, name, space, red)
        steps += _fuse_into(name, host.name, [a.name for a in host.axes], idx, level)
        pack = _pack_of(ctx, g, stage, name, len(space))
        sites = [Site(name, vector=True, unroll=True, pack=pack), Site(host.name, parallel=True, vector=True)]
        out.append(_Gen(g.steps + tuple(steps), g.tiles + tuple(holes), g.sites + tuple(sites), g.rules))
    return out


def _a_tile_fuse(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    space, red = _axes(s)
    return _tiled_with_host(ctx, gen, f"{s.name}:tile_fuse", s, s.name, ctx.fused(s), space, red)


def _c_tiling(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return needs_multi_level_tiling(s)


def _a_cache_write(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    space, red = _axes(s)
    local = f"{s.name}.local"
    copy = Stage(s.name, s.axes, Load(local, tuple(a.var for a in s.axes), s.dtype), s.dtype)
    return _tiled_with_host(ctx, gen, f"{s.name}:cache_write", s, local, copy, space, red,
                            [CacheWrite(s.name, "local")])


def _a_tile(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    space, red = _axes(s)
    steps, holes, _ = _multi_level_tile(gen, s.name, space, red)
    pack = _pack_of(ctx, gen, s, s.name, len(space))
    return [gen.add(f"{s.name}:tile", steps, holes, [Site(s.name, parallel=True, vector=True, unroll=True,
                                                             pack=pack)])]


def _c_rfactor(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return needs_rfactor(s, ctx.target)


def _a_rfactor(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    space = [a.name for a in s.axes]
    red = [a.name for a in s.reduce_axes]
    pre: list[Step] = []
    r = red[0]
    if len(red) > 1:
        pre.append(Fuse(s.name, tuple(red)))
        r = "@".join(red)
    ext = _prod(a.extent for a in s.reduce_axes)
    rf = f"{s.name}.rf"
    out = []
    for part in (0, 1):
        g = gen.add(f"{s.name}:rfactor{'_inner' if part else '_outer'}", pre)
        hole = TileHole(len(g.steps), s.name, r, ext, 1)
        steps: list[Step] = [Split(s.name, r, (None,)), RFactor(s.name, f"{r}.{part}")]
        if part == 1:
            steps.append(Reorder(rf, tuple(space + [f"{r}.0", f"{r}.1"])))
        sites = [Site(rf, parallel=True, vector=part == 1, unroll=True, location=bool(space)),
                 Site(s.name, parallel=bool(space), unroll=True, location=s.name not in ctx.cd.outputs)]
        out.append(_Gen(g.steps + tuple(steps), g.tiles + (hole,), g.sites + tuple(sites), g.rules))
    return out


def _c_reduction(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return s.is_reduction


def _a_reduction(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    site = Site(s.name, parallel=bool(s.axes), vector=bool(s.axes), unroll=True, location=s.name not in ctx.cd.outputs)
    if not s.axes:
        return [gen.add(f"{s.name}:reduction", sites=[site])]
    *other, last = [a.name for a in s.axes]
    red = [a.name for a in s.reduce_axes]
    hole = TileHole(len(gen.steps), s.name, last, s.axes[-1].extent, 1, MAX_LANES)
    steps = [Split(s.name, last, (None,)), Reorder(s.name, tuple(other + [f"{last}.0"] + red + [f"{last}.1"]))]
    return [gen.add(f"{s.name}:reduction", steps, [hole], [site])]


def _c_elementwise(ctx: _Ctx, gen: _Gen, s: Stage) -> bool:
    return not s.is_reduction


def _a_elementwise(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    out_ = s.name in ctx.cd.outputs
    site = Site(s.name, parallel=bool(s.axes), vector=bool(s.axes), location=not out_, inlinable=not out_)
    if not s.axes:
        return [gen.add(f"{s.name}:elementwise", sites=[site])]
    names = [a.name for a in s.axes]
    steps: list[Step] = []
    f = names[0]
    if len(names) > 1:
        steps.append(Fuse(s.name, tuple(names)))
        f = "@".join(names)
    hole = TileHole(len(gen.steps) + len(steps), s.name, f, _prod(a.extent for a in s.axes), 2, MAX_LANES)
    steps.append(Split(s.name, f, (None, None)))
    return [gen.add(f"{s.name}:elementwise", steps, [hole], [site])]


@dataclass(frozen=True)
class Rule:
    name: str
    condition: Callable[[_Ctx, _Gen, Stage], bool]
    apply: Callable[[_Ctx, _Gen, Stage], list[_Gen]]
    skip_rest: bool


RULES: tuple[Rule, ...] = (
    Rule("row", _c_row, _a_row, True),
    Rule("row_member", _c_row_member, _a_row_member, True),
    Rule("inline", _c_inline, _a_inline, True),
    Rule("fusion_host", _c_host, _a_host, True),
    Rule("tile_fuse", _c_tile_fuse, _a_tile_fuse, True),
    Rule("cache_write", _c_tiling, _a_cache_write, False),
    Rule("tile", _c_tiling, _a_tile, True),
    Rule("rfactor", _c_rfactor, _a_rfactor, False),
    Rule("reduction", _c_reduction, _a_reduction, True),
    Rule("elementwise", _c_elementwise, _a_elementwise, True),
)


def _visit(ctx: _Ctx, gen: _Gen, s: Stage) -> list[_Gen]:
    out: list[_Gen] = []
    for rule in RULES:
        if rule.condition(ctx, gen, s):
            out += rule.apply(ctx, gen, s)
            if rule.skip_rest:
                break
    return out


def _sketch_id(rules: tuple[str, ...]) -> str:
    return "sk-" + hashlib.sha256("|".join(rules).encode()).hexdigest()[:12]


def generate_sketches(task_or_cd, target: Target | None = None, default: bool = True) -> list[Sketch]:
    """The CPU sketches of a Task (or a ComputeDef): every rule path, plus the default schedule as a
    hole-free sketch when `default`.  Deterministic (same input, same sketches and ids)."""
    from ..ir.workload import workload_key

    cd: ComputeDef = getattr(task_or_cd, "compute", task_or_cd)
    target = target or getattr(task_or_cd, "target", None) or Target.host_cpu()
    key = getattr(task_or_cd, "key", None) or workload_key(cd)
    cons = _consumers(cd)
    hosts: dict[str, str] = {}
    for s in cd.stages:
        if needs_multi_level_tiling(s):
            d = fusible_consumer(cd, s, cons)
            if d is not None:
                hosts[d.name] = s.name
    ctx = _Ctx(cd, target, cons, hosts, {st.name for st in cd.stages} | {b.name for b in cd.inputs},
               row_sketch(cd, target))
    gens = [_Gen()]
    for s in reversed(cd.stages):
        gens = [g2 for g in gens for g2 in _visit(ctx, g, s)]
    out: list[Sketch] = []
    seen: set[tuple] = set()
    for g in gens:
        if (g.steps, g.tiles, g.sites) in seen:
            continue
        seen.add((g.steps, g.tiles, g.sites))
        out.append(Sketch(_sketch_id(g.rules), g.rules, key, cd, target, g.steps, g.tiles, g.sites))
    panel = gemm_sketch(cd, target)
    if panel is not None:
        steps, holes = panel
        tiles = tuple(TileHole(k, steps[k].stage, steps[k].iter, ext, 1, cap) for k, ext, cap in holes)
        out.append(Sketch(_sketch_id(("gemm_panel",)), ("gemm_panel",), key, cd, target, tuple(steps), tiles))
    if default:
        steps = tuple(default_schedule(cd, target))
        out.append(Sketch(_sketch_id(("default",)), ("default",), key, cd, target, steps))
    return out


def sketch_by_id(sketches: list[Sketch]) -> dict[str, Sketch]:
    """id -> sketch (for looking up the sketch of a Schedule via `schedule.sketch`)."""
    return {s.id: s for s in sketches}


__all__ = ["TileHole", "Site", "PackChoice", "pack_choice", "Sketch", "RULES", "Rule", "generate_sketches",
           "sketch_by_id",
           "needs_multi_level_tiling", "fusible_consumer", "needs_rfactor", "is_cheap_elementwise",
           "MAX_INNERMOST", "MAX_REDUCE_BLOCK", "MAX_LANES", "UNROLL_CHOICES"]
