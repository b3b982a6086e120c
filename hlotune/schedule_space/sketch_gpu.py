"""GPU sketches (cuda targets): schedule structures with holes, their sampler, mutations and crossover.

Map:
  Kernel                  one kernel of a GPU schedule: kind (tiled, row, serial, elementwise, full, single), the
                          stage whose loops it binds, the stage computed inside it, sizes, structure variant
  KNOBS / SHAPE_KNOBS     the holes of a kernel kind, in decision order; shape knobs are constrained together
                          (enumerated once per kernel: `_shape_points`), the others are free
  GpuSketch               a `sketch.Sketch` (same id / rules / steps / has_holes interface as the CPU sketches)
                          whose holes are per-kernel knobs: .sample(task, rng, n), .mutate(schedule, rng),
                          .crossover(a, b, rng), .default_like()
  generate_gpu_sketches(task_or_cd, target, default=True) -> list[Sketch]   (space.py's table for "cuda")
  gpu_steps(sketch, decisions) -> list[Step]      the schedule of one point of a sketch
  decisions_of_gpu(sketch, schedule)              a point back from its schedule (registry of points built here)

Sketch rules, visited from the last stage to the first (as on the CPU):
  inline        every non-output elementwise stage is computed inline (no kernel, no round trip to memory)
  tile          a dot/conv-like reduction (sum of products, two or more space axes): multi-level tiling of its
                space axes into block (blockIdx.x, batch axes fused in) / thread (threadIdx.x, the two tile levels
                fused) / register (unrolled) levels, the reduction computed at the thread level with its last
                reduce axis split into an outer step and a block of `bk` (S S R R S: Ansor's SSSRRSRS without the
                vthread level, see below); fused into its elementwise consumer when it has one (compute_at),
                else cache_write to a local stage; with two plain input operands, two variants: shared-memory
                cache_read of both operands at each bk step with cooperative fetching by all threads of the block
                (`vec` consecutive elements per thread), or direct reads
  split_k       a dot of two plain inputs (K >= SPLIT_K_MIN_K) as partial dots over `parts` slices of K (rfactor;
                the partials a batch of the tiling above with shared operands), then their sum: in the elementwise
                consumer's thread loop (`split_k_fuse`) or a kernel of its own (`split_k`: the dot alone or an output)
  cross_thread  a reduction with space axes and at least 32 reduced points: one block per output point, the
                reduction split over `threads` threads (rfactor; the codegen combines the partials with warp
                shuffles), the per-thread serial part optionally unrolled
  serial        a reduction computed by one thread per output point (also an alternative to cross_thread)
  full          a reduction to a scalar: partials per (block, thread), a second cross-thread level
  elementwise   fuse all axes, blockIdx / `per` elements per thread (unrolled) / threadIdx
Every kernel also has an `unroll` knob: an auto_unroll_max_step pragma from {0, 16, 64, 512, 1024} on its block
loop (the codegen unrolls a serial loop whose fully unrolled size is within it).  Tiled kernels with shared operands
have an `mma` knob where the tiling fits the tensor-core GEMM template (TJ = 4, MR even, NR = 8, BK a multiple of
16): 0 or 3, a ("tensor_core", 3) pragma on the K-tile loop (3xTF32 mma.sync in `codegen.cuda._gemm_mma_text`).
Plus the default GPU schedule as a hole-free sketch (id of ("default",), as on the CPU).

Not yet: a vthread level (the codegen runs VTHREAD loops as unrolled serial loops, so a strided thread tile needs
a compute_at region that is not an interval), real vector (float4) loads in the cooperative fetch (`vec` > 1 is
an unrolled loop of consecutive elements per thread).

Mutations (`MUTATION_GROUPS`): tile size (a register-tile factor, the reduction block or the parts of K; or moving a
factor between the register and thread levels of one axis), thread binding (threads per block, the thread grid of a
tile, elements per thread, blocks of partials), unroll (pragma, unrolled inner loops), fetch vector width,
tensor cores (the `mma` knob).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

from ..errors import ScheduleError
from ..ir.expr import Axis, ComputeDef, Stage
from ..ir.hlo import DType
from ..target import Target
from .default_gpu import (
    _consumers,
    _contiguous_in,
    _fusable_producer,
    _is_tiled_reduction,
    _product_of_two_inputs,
    _shape,
    default_gpu_schedule,
)
from .loop_ir import ForKind
from .sketch import Sketch
from .steps import (
    Annotate,
    CacheRead,
    CacheWrite,
    ComputeAt,
    ComputeInline,
    Fuse,
    Pragma,
    Reorder,
    RFactor,
    Schedule,
    Split,
    Step,
)

UNROLL_GPU = (0, 16, 64, 512, 1024)
THREAD_CHOICES = (32, 64, 128, 256, 512, 1024)
PER_CHOICES = (1, 2, 4, 8)
VEC_CHOICES = (1, 2, 4)
MAX_REG_TILE = 8            # register tile factor per axis
MAX_THREAD_TILE = 32        # thread grid per axis of a tiled kernel
MAX_ACCUMULATORS = 64       # mr * nr
MAX_BLOCK_ACCUMULATORS = 16384   # mr * nr * threads (registers per block)
STATIC_SHARED = 48 * 1024
MAX_SKETCHES = 8

KNOBS: dict[str, tuple[str, ...]] = {
    "tiled": ("mr", "nr", "ti", "tj", "bk", "vec", "kunroll", "unroll", "mma"),
    "splitk": ("parts", "mr", "nr", "ti", "tj", "bk", "vec", "kunroll", "unroll"),
    "row": ("threads", "userial", "unroll"),
    "serial": ("threads", "per", "unroll"),
    "elementwise": ("threads", "per", "unroll"),
    "full": ("threads", "blocks", "unroll"),
    "single": (),
}
SHAPE_KNOBS: dict[str, tuple[str, ...]] = {
    "tiled": ("mr", "nr", "ti", "tj", "bk"),
    "splitk": ("parts", "mr", "nr", "ti", "tj", "bk"),
    "row": ("threads",),
    "serial": ("threads", "per"),
    "elementwise": ("threads", "per"),
    "full": ("threads", "blocks"),
    "single": (),
}
#: mutation groups: (name, knobs, weight)
MUTATION_GROUPS = (
    ("tile_size", ("mr", "nr", "bk", "parts"), 0.45),
    ("thread_binding", ("ti", "tj", "threads", "per", "blocks"), 0.3),
    ("unroll", ("unroll", "kunroll", "userial"), 0.15),
    ("vector", ("vec",), 0.1),
    ("tensor_core", ("mma",), 0.1),
)
#: TF32 passes a tiled kernel may choose (`mma` knob: a ("tensor_core", 3) pragma on its K-tile loop; the code
#: generator's GEMM template then runs on tensor cores, 3xTF32, where the tiling fits it: shared operands, TJ = 4,
#: MR even, NR = 8, BK a multiple of 16, float32)
MMA_CHOICES = (0, 3)
TRIES = 8
#: split K (`splitk` kernels, the default's `default_gpu._split_k` as a sketch): parts of K from 2 to SPLIT_K_MAX_PARTS
#: whose slice is a multiple of 4 and at least SPLIT_K_MIN_SLICE, for dots of two plain inputs with K >= SPLIT_K_MIN_K
SPLIT_K_MAX_PARTS = 16
SPLIT_K_MIN_SLICE = 16
SPLIT_K_MIN_K = 64


@dataclass(frozen=True)
class Kernel:
    """One kernel: `kind`, the stage `stage` whose loops are bound, `red` the reduction computed inside it
    (tiled), `shared` (tiled: shared-memory operands), `sizes` ((name, value) pairs: tiled I, J, K, elem;
    row / full rn or n; serial / elementwise n), `cache_write` (tiled: `red` is `stage`.local)."""

    kind: str
    stage: str
    red: str = ""
    shared: bool = False
    cache_write: bool = False
    sizes: tuple[tuple[str, int], ...] = ()

    def size(self, name: str) -> int:
        return dict(self.sizes)[name]


@dataclass(frozen=True)
class GpuSketch(Sketch):
    """A GPU sketch: `steps` are the common prefix (inlining), `kernels` carry the holes (see KNOBS)."""

    kernels: tuple[Kernel, ...] = ()
    max_threads: int = 1024
    shared_bytes: int = STATIC_SHARED

    @property
    def has_holes(self) -> bool:
        return any(KNOBS[k.kind] for k in self.kernels)

    def sample(self, task=None, rng=0, n: int = 1) -> list[Schedule]:
        return sample_gpu(self, task, rng, n)

    def mutate(self, schedule: Schedule, rng=None) -> Schedule | None:
        return mutate_gpu(self, schedule, rng)

    def crossover(self, a: Schedule, b: Schedule, rng=None) -> Schedule | None:
        return crossover_gpu(self, a, b, rng)

    def default_like(self) -> Schedule | None:
        return default_like_gpu(self)

    def __str__(self) -> str:
        lines = [f"gpu sketch {self.id}: {' ; '.join(self.rules)}"]
        lines += [f"  {k:2d} {s}" for k, s in enumerate(self.steps)]
        for k in self.kernels:
            extra = " shared" if k.shared else ""
            lines.append(f"  kernel {k.kind} {k.stage}{' <- ' + k.red if k.red else ''}{extra}: "
                         f"holes {', '.join(KNOBS[k.kind]) or '-'}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- analysis -> kernels

def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _elem_size(dtype) -> int:
    import numpy as np

    return int(np.dtype(dtype.np).itemsize)


def _kernel_options(cd: ComputeDef, stage: Stage, cons, inlined: set[str], done: set[str]) -> list[Kernel]:
    """The structure alternatives of the kernel that schedules `stage` (first: the default's structure)."""
    prod = _fusable_producer(cd, stage, cons, inlined)
    if prod is not None:
        done.add(prod.name)
        return _tiled_options(cd, stage.name, prod.name, stage.axes, prod, False) + _splitk_options(cd, stage, prod)
    if _is_tiled_reduction(stage):
        return _tiled_options(cd, stage.name, stage.name + ".local", stage.axes, stage, True) + \
            _splitk_options(cd, None, stage)
    if stage.is_reduction:
        rn = _prod(a.extent for a in stage.reduce_axes)
        if not stage.axes:
            n = rn
            return [Kernel("full", stage.name, sizes=(("n", n),)) if n >= 4 * 32 else Kernel("single", stage.name)]
        n = _prod(a.extent for a in stage.axes)
        serial = Kernel("serial", stage.name, sizes=(("n", n),))
        if rn >= 32:
            row = Kernel("row", stage.name, sizes=(("rn", rn),))
            contiguous = _contiguous_in(stage, stage.reduce_axes[-1].name) and rn >= 64
            return [row, serial] if contiguous else [serial, row]
        return [serial]
    if not stage.axes:
        return [Kernel("single", stage.name)]
    return [Kernel("elementwise", stage.name, sizes=(("n", _prod(a.extent for a in stage.axes)),))]


def _tiled_options(cd, out, red, axes, red_stage, cw) -> list[Kernel]:
    *_, ax_i, ax_j = list(axes)
    elem = max((_elem_size(b.dtype) for b in cd.inputs), default=4)
    sizes = (("I", ax_i.extent), ("J", ax_j.extent), ("K", red_stage.reduce_axes[-1].extent), ("elem", elem))
    plain = Kernel("tiled", out, red, False, cw, sizes)
    if _product_of_two_inputs(cd, red_stage) is not None:
        return [Kernel("tiled", out, red, True, cw, sizes), plain]
    return [plain]


def _split_parts(K: int) -> list[int]:
    return [p for p in range(2, SPLIT_K_MAX_PARTS + 1)
            if K % p == 0 and (K // p) % 4 == 0 and K // p >= SPLIT_K_MIN_SLICE]


def _splitk_options(cd: ComputeDef, cons: Stage | None, red: Stage) -> list[Kernel]:
    """A split-K kernel of dot `red` (with its elementwise consumer `cons`, or alone), where it applies."""
    if (_product_of_two_inputs(cd, red) is None or len(red.reduce_axes) != 1 or len(red.axes) != 2
            or red.dtype is not DType.F32
            or red.reduce_axes[0].extent < SPLIT_K_MIN_K or not _split_parts(red.reduce_axes[0].extent)):
        return []
    elem = max((_elem_size(b.dtype) for b in cd.inputs), default=4)
    ax_i, ax_j = red.axes
    sizes = (("I", ax_i.extent), ("J", ax_j.extent), ("K", red.reduce_axes[0].extent), ("elem", elem))
    return [Kernel("splitk", cons.name if cons is not None else red.name, red.name, True, cons is None, sizes)]


def _plan(cd: ComputeDef) -> tuple[list[str], list[list[Kernel]]]:
    """(inlined stages in step order, per kernel its structure alternatives) in the default's order."""
    cons = _consumers(cd)
    done: set[str] = set()
    inlined = {s.name for s in cd.stages if not s.is_reduction and s.name not in cd.outputs}
    options: list[list[Kernel]] = []
    for stage in reversed(cd.stages):
        if stage.name in done or stage.name in inlined:
            continue
        done.add(stage.name)
        options.append(_kernel_options(cd, stage, cons, inlined, done))
    pos = {s.name: k for k, s in enumerate(cd.stages)}
    return sorted(inlined, key=lambda n: -pos[n]), options


# ----------------------------------------------------------------------------- knob domains

def _divs(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _bk_choices(K: int) -> list[int]:
    if K < 4:
        return [K]
    return [d for d in _divs(K, 32) if d >= 2 and d < K] or [K]


def _thread_choices(n: int, maxthr: int) -> list[int]:
    return sorted({min(t, n) for t in THREAD_CHOICES if t <= maxthr})


def _row_threads(rn: int, maxthr: int) -> list[int]:
    pw = [t for t in THREAD_CHOICES if t <= min(rn, maxthr)]
    div = [t for t in pw if rn % t == 0]
    return div or pw or [1]


@lru_cache(maxsize=4096)
def _shape_points(k: Kernel, maxthr: int, smem: int) -> tuple[tuple[int, ...], ...]:
    """Every legal assignment of the kernel's shape knobs (SHAPE_KNOBS order)."""
    if k.kind == "splitk":
        out = []
        for p in _split_parts(k.size("K")):
            part = Kernel("tiled", k.stage, k.red, True, k.cache_write,
                          tuple((n, v // p if n == "K" else v) for n, v in k.sizes))
            out += [(p, *x) for x in _shape_points(part, maxthr, smem)]
        return tuple(out)
    if k.kind == "tiled":
        I, J, K, elem = k.size("I"), k.size("J"), k.size("K"), k.size("elem")
        out = []
        for mr, nr in itertools.product(_divs(I, MAX_REG_TILE), _divs(J, MAX_REG_TILE)):
            if mr * nr > MAX_ACCUMULATORS:
                continue
            need = min(32, (I // mr) * (J // nr))
            for ti, tj in itertools.product(_divs(I // mr, MAX_THREAD_TILE), _divs(J // nr, MAX_THREAD_TILE)):
                t = ti * tj
                if t > maxthr or t < need or mr * nr * t > MAX_BLOCK_ACCUMULATORS:
                    continue
                for bk in _bk_choices(K):
                    if k.shared and (ti * mr + tj * nr) * bk * elem > smem:
                        continue
                    out.append((mr, nr, ti, tj, bk))
        return tuple(out)
    if k.kind == "row":
        return tuple((t,) for t in _row_threads(k.size("rn"), maxthr))
    if k.kind in ("serial", "elementwise"):
        n = k.size("n")
        return tuple((t, p) for t in _thread_choices(n, maxthr) for p in PER_CHOICES if p == 1 or n >= p * t)
    if k.kind == "full":
        n = k.size("n")
        ts = [t for t in THREAD_CHOICES if t <= maxthr and n % t == 0 and n >= 4 * t] or \
            [d for d in _divs(n, maxthr) if n >= 4 * d][-1:]
        return tuple((t, b) for t in ts for b in _divs(n // t, 1024))
    return ((),)


def _free_domain(k: Kernel, knob: str, d: dict) -> list[int]:
    if knob == "unroll":
        return list(UNROLL_GPU)
    if knob == "vec":
        return list(VEC_CHOICES) if k.shared else [1]
    if knob == "kunroll":
        return [0, 1]
    if knob == "mma":
        fits = (k.shared and k.size("elem") == 4 and d["tj"] == 4 and d["mr"] % 2 == 0 and d["nr"] == 8
                and d["bk"] % 16 == 0 and d["bk"] < k.size("K"))
        return list(MMA_CHOICES) if fits else [0]
    if knob == "userial":
        return [0, 1] if 1 < k.size("rn") // d["threads"] <= 64 else [0]
    raise KeyError(knob)


def _sample_kernel(k: Kernel, sk: GpuSketch, rng: random.Random) -> tuple[int, ...]:
    pts = _shape_points(k, sk.max_threads, sk.shared_bytes)
    if not pts:
        raise ScheduleError(f"no legal GPU tiling of {k.stage}")
    d = dict(zip(SHAPE_KNOBS[k.kind], pts[rng.randrange(len(pts))]))
    for knob in KNOBS[k.kind]:
        if knob not in d:
            dom = _free_domain(k, knob, d)
            d[knob] = dom[rng.randrange(len(dom))]
    return tuple(d[x] for x in KNOBS[k.kind])


# ----------------------------------------------------------------------------- decisions -> steps

def _fuse_all(name: str, iters: list[str]) -> tuple[list[Step], str]:
    if len(iters) == 1:
        return [], iters[0]
    return [Fuse(name, tuple(iters))], "@".join(iters)


def _pragma(stage: str, it: str, v: int) -> list[Step]:
    return [Pragma(stage, it, "auto_unroll_max_step", int(v))] if v else []


def _tiled_steps(cd: ComputeDef, k: Kernel, d: dict) -> list[Step]:
    out, red = k.stage, k.red
    base = cd.stage(out)
    red_stage = base if k.cache_write else cd.stage(red)
    steps: list[Step] = [CacheWrite(out, "local")] if k.cache_write else []
    pair = _product_of_two_inputs(cd, red_stage) if k.shared else None
    return steps + _tile_nest(cd, out, red, list(base.axes), list(red_stage.reduce_axes), pair, d)


def _splitk_steps(cd: ComputeDef, k: Kernel, d: dict) -> list[Step]:
    """The partial dots over d["parts"] slices of K (rfactor: stage <red>.rf, a batch of tiled dots), then their sum:
    in the consumer's thread loop (one kernel), or alone (`k.cache_write`: an output, or no elementwise consumer)."""
    red = cd.stage(k.red)
    (ax_i, ax_j), r = red.axes, red.reduce_axes[0]
    parts = d["parts"]
    rf, kn = f"{red.name}.rf", r.name
    steps: list[Step] = [Split(red.name, kn, (r.extent // parts,)), RFactor(red.name, f"{kn}.0"),
                         CacheWrite(rf, "local")]
    steps += _tile_nest(cd, rf, rf + ".local", [Axis(f"{kn}.0", parts), ax_i, ax_j],
                        [Axis(f"{kn}.1", r.extent // parts)], _product_of_two_inputs(cd, red), d)
    if k.cache_write:   # the dot alone (an output, or no elementwise consumer)
        return steps + _sum_kernel(red.name, [ax_i.name, ax_j.name], red.axes) + \
            [Annotate(red.name, f"{kn}.0", ForKind.UNROLLED)]
    cons = cd.stage(k.stage)
    steps += _sum_kernel(k.stage, [a.name for a in cons.axes], cons.axes)
    return steps + [ComputeAt(red.name, k.stage, f"{'@'.join(a.name for a in cons.axes)}.1"),
                    Annotate(red.name, f"{kn}.0", ForKind.UNROLLED)]


def _sum_kernel(name: str, iters: list[str], axes) -> list[Step]:
    """blockIdx.x / threadIdx.x (256 threads or fewer) over all of a stage's fused space axes."""
    fs, f = _fuse_all(name, iters)
    t = max(x for x in _divs(_prod(a.extent for a in axes), 256))
    return fs + [Split(name, f, (t,)), Annotate(name, f"{f}.0", ForKind.BLOCK_X),
                 Annotate(name, f"{f}.1", ForKind.THREAD_X)]


def _tile_nest(cd: ComputeDef, out: str, red: str, axes: list, k_axes: list, pair, d: dict) -> list[Step]:
    """Multi-level tiling of `out` over `axes` (batch..., i, j) with `red` computed at its thread level over `k_axes`,
    shared-memory tiles of `pair`'s operands (None: direct reads)."""
    *batch, ax_i, ax_j = axes
    mr, nr, ti, tj, bk = d["mr"], d["nr"], d["ti"], d["tj"], d["bk"]
    i, j = ax_i.name, ax_j.name
    steps: list[Step] = []
    if pair is not None:
        steps += [CacheRead(pair[0], "shared", (red,)), CacheRead(pair[1], "shared", (red,))]
    steps += [Split(out, i, (ti, mr)), Split(out, j, (tj, nr))]
    blocks = [a.name for a in batch] + [f"{i}.0", f"{j}.0"]
    steps.append(Reorder(out, tuple(blocks + [f"{i}.1", f"{j}.1", f"{i}.2", f"{j}.2"])))
    bname = "@".join(blocks)
    steps += [Fuse(out, tuple(blocks)), Annotate(out, bname, ForKind.BLOCK_X)]
    thr = f"{i}.1@{j}.1"
    steps += [Fuse(out, (f"{i}.1", f"{j}.1")), Annotate(out, thr, ForKind.THREAD_X)]
    steps += [Annotate(out, f"{i}.2", ForKind.UNROLLED), Annotate(out, f"{j}.2", ForKind.UNROLLED)]
    steps.append(ComputeAt(red, out, thr))
    klast = k_axes[-1].name
    korder = [a.name for a in k_axes[:-1]]
    if 1 < bk < k_axes[-1].extent:
        steps.append(Split(red, klast, (bk,)))
        korder += [f"{klast}.0", f"{klast}.1"]
        kin = f"{klast}.1"
    else:
        korder += [klast]
        kin = klast
    steps.append(Reorder(red, tuple([a.name for a in batch] + korder + [i, j])))
    if d["kunroll"]:
        steps.append(Annotate(red, kin, ForKind.UNROLLED))
    steps += [Annotate(red, i, ForKind.UNROLLED), Annotate(red, j, ForKind.UNROLLED)]
    if pair is not None:
        at = korder[-2] if len(korder) >= 2 else (korder[0] if korder else i)
        nthreads, vec = ti * tj, d["vec"]
        for src in pair:
            sh = f"{src}.shared"
            steps.append(ComputeAt(sh, red, at))
            ax = [f"ax{q}" for q in range(len(_shape(cd, src)))]
            fs, fused = _fuse_all(sh, ax)
            steps += fs
            if vec > 1:
                steps += [Split(sh, fused, (nthreads, vec)), Annotate(sh, f"{fused}.1", ForKind.THREAD_X),
                          Annotate(sh, f"{fused}.2", ForKind.UNROLLED)]
            else:
                steps += [Split(sh, fused, (nthreads,)), Annotate(sh, f"{fused}.1", ForKind.THREAD_X)]
    if d.get("mma") and pair is not None and kin != klast:   # the K-tile loop: GEMM template on tensor cores
        steps.append(Pragma(red, f"{klast}.0", "tensor_core", int(d["mma"])))
    return steps + _pragma(out, bname, d["unroll"])


def _row_steps(cd: ComputeDef, k: Kernel, d: dict) -> list[Step]:
    st = cd.stage(k.stage)
    name, t = st.name, d["threads"]
    steps, r = _fuse_all(name, [a.name for a in st.reduce_axes])
    steps += [Split(name, r, (t,)), RFactor(name, f"{r}.1")]
    rf = name + ".rf"
    fs, s = _fuse_all(name, [a.name for a in st.axes])
    steps += fs + [Annotate(name, s, ForKind.BLOCK_X), ComputeAt(rf, name, s),
                   Annotate(rf, f"{r}.1", ForKind.THREAD_X)]
    if d["userial"]:
        steps.append(Annotate(rf, f"{r}.0", ForKind.UNROLLED))
    return steps + _pragma(name, s, d["unroll"])


def _elementwise_steps(cd: ComputeDef, k: Kernel, d: dict) -> list[Step]:
    st = cd.stage(k.stage)
    name, t, per = st.name, d["threads"], d["per"]
    steps, f = _fuse_all(name, [a.name for a in st.axes])
    if per > 1:
        steps += [Split(name, f, (per, t)), Annotate(name, f"{f}.0", ForKind.BLOCK_X),
                  Annotate(name, f"{f}.1", ForKind.UNROLLED), Annotate(name, f"{f}.2", ForKind.THREAD_X)]
    else:
        steps += [Split(name, f, (t,)), Annotate(name, f"{f}.0", ForKind.BLOCK_X),
                  Annotate(name, f"{f}.1", ForKind.THREAD_X)]
    return steps + _pragma(name, f"{f}.0", d["unroll"])


def _full_steps(cd: ComputeDef, k: Kernel, d: dict) -> list[Step]:
    st = cd.stage(k.stage)
    name, t, nblocks = st.name, d["threads"], d["blocks"]
    n = k.size("n")
    steps, r = _fuse_all(name, [a.name for a in st.reduce_axes])
    serial = n // t // nblocks
    steps += [Split(name, r, (serial, t)), Reorder(name, (f"{r}.0", f"{r}.2", f"{r}.1")),
              Fuse(name, (f"{r}.0", f"{r}.2")), RFactor(name, f"{r}.0@{r}.2")]
    rf = name + ".rf"
    p = f"{r}.0@{r}.2"
    steps += [Split(rf, p, (t,)), Annotate(rf, f"{p}.0", ForKind.BLOCK_X), Annotate(rf, f"{p}.1", ForKind.THREAD_X)]
    if nblocks > 1:
        steps += [Split(name, p, (t,)), RFactor(name, f"{p}.1"), Annotate(name + ".rf_", f"{p}.1", ForKind.THREAD_X)]
    return steps + _pragma(rf, f"{p}.0", d["unroll"])


_STEPS = {"tiled": _tiled_steps, "splitk": _splitk_steps, "row": _row_steps, "serial": _elementwise_steps,
          "elementwise": _elementwise_steps, "full": _full_steps, "single": lambda cd, k, d: []}


def gpu_steps(sketch: GpuSketch, decisions: tuple[tuple[int, ...], ...]) -> list[Step]:
    """The steps of the point `decisions` (per kernel, values in KNOBS order) of `sketch`."""
    steps: list[Step] = list(sketch.steps)
    for k, dv in zip(sketch.kernels, decisions):
        steps += _STEPS[k.kind](sketch.compute, k, dict(zip(KNOBS[k.kind], dv)))
    return steps


# ----------------------------------------------------------------------------- points <-> schedules

#: schedule key -> (sketch id, decisions) of every point built here (mutation and crossover read parents back)
_POINTS: OrderedDict[str, tuple[str, tuple]] = OrderedDict()
_POINTS_MAX = 200_000


def _realize(sketch: GpuSketch, decisions: tuple, workload_key: str | None = None) -> Schedule:
    """The schedule of a point (replayed: an illegal point raises ScheduleError)."""
    from .annotate import make_schedule
    from .state import remember, replay

    steps = tuple(gpu_steps(sketch, decisions))
    state = replay(sketch.compute, steps)
    remember(state)
    s = make_schedule(workload_key or sketch.workload_key, state.steps, sketch.id)
    _POINTS[s.key] = (sketch.id, decisions)
    _POINTS.move_to_end(s.key)
    while len(_POINTS) > _POINTS_MAX:
        _POINTS.popitem(last=False)
    return s


def decisions_of_gpu(sketch: GpuSketch, schedule: Schedule) -> tuple | None:
    """The point of `schedule` when it was built in this process from `sketch`, else None."""
    got = _POINTS.get(schedule.key)
    if got is None or got[0] != sketch.id:
        return None
    return got[1]


def _rand(rng) -> random.Random:
    from .annotate import as_random

    return as_random(rng)


def sample_gpu(sketch: GpuSketch, task=None, rng=0, n: int = 1) -> list[Schedule]:
    """Up to `n` distinct schedules of `sketch`, each replaying (legal) and within the device's limits."""
    rnd = _rand(rng)
    wk = getattr(task, "key", None) or sketch.workload_key
    out: list[Schedule] = []
    seen: set[str] = set()
    for _ in range(4 * n + 8):
        if len(out) >= n:
            break
        try:
            d = tuple(_sample_kernel(k, sketch, rnd) for k in sketch.kernels)
            s = _realize(sketch, d, wk)
        except ScheduleError:
            continue
        if s.key not in seen:
            seen.add(s.key)
            out.append(s)
    return out


def _knob_alternatives(sketch: GpuSketch, k: Kernel, cur: tuple, knob: str) -> list[tuple]:
    """Points of kernel `k` that differ from `cur` in `knob` (shape knobs: legal shape points; for the register
    tile factors also the points moving a factor between the register and thread level of the same axis)."""
    names = KNOBS[k.kind]
    d = dict(zip(names, cur))
    shape = SHAPE_KNOBS[k.kind]
    if knob in shape:
        pts = _shape_points(k, sketch.max_threads, sketch.shared_bytes)
        cs = tuple(d[x] for x in shape)
        q = shape.index(knob)
        alts = [p for p in pts if p[q] != cs[q] and all(p[m] == cs[m] for m in range(len(shape)) if m != q)]
        if k.kind in ("tiled", "splitk") and knob in ("mr", "nr", "ti", "tj"):
            a, b = (shape.index("mr"), shape.index("ti")) if knob in ("mr", "ti") else \
                (shape.index("nr"), shape.index("tj"))
            alts += [p for p in pts if p[a] * p[b] == cs[a] * cs[b] and p[a] != cs[a]
                     and all(p[m] == cs[m] for m in range(len(shape)) if m not in (a, b))]
        out = []
        for p in alts:
            e = dict(d)
            e.update(zip(shape, p))
            for free in ("userial", "mma"):
                if free in e and e[free] not in _free_domain(k, free, e):
                    e[free] = 0
            out.append(tuple(e[x] for x in names))
        return out
    dom = _free_domain(k, knob, d)
    return [tuple(v if x == knob else d[x] for x in names) for v in dom if v != d[knob]]


def mutate_gpu(sketch: GpuSketch, schedule: Schedule, rng=None) -> Schedule | None:
    """One mutation (a group by MUTATION_GROUPS' weights, then a knob of a kernel), or None."""
    rnd = _rand(rng)
    dec = decisions_of_gpu(sketch, schedule)
    if dec is None:
        return None
    groups = list(MUTATION_GROUPS)
    for _ in range(TRIES):
        if not groups:
            break
        g = rnd.choices(groups, [w for *_, w in groups])[0]
        opts = [(ki, knob) for ki, k in enumerate(sketch.kernels) for knob in KNOBS[k.kind] if knob in g[1]]
        rnd.shuffle(opts)
        for ki, knob in opts:
            alts = _knob_alternatives(sketch, sketch.kernels[ki], dec[ki], knob)
            if not alts:
                continue
            new = dec[:ki] + (alts[rnd.randrange(len(alts))],) + dec[ki + 1:]
            try:
                return _realize(sketch, new, schedule.workload_key)
            except ScheduleError:
                continue
        groups.remove(g)
    return None


def crossover_gpu(sketch: GpuSketch, a: Schedule, b: Schedule, rng=None) -> Schedule | None:
    """Each kernel's decisions from one parent at random (None with fewer than two differing kernels)."""
    rnd = _rand(rng)
    da, db = decisions_of_gpu(sketch, a), decisions_of_gpu(sketch, b)
    if da is None or db is None or da == db:
        return None
    diff = [k for k in range(len(da)) if da[k] != db[k]]
    if len(diff) < 2:
        return None
    for _ in range(TRIES):
        pick = [rnd.random() < 0.5 for _ in da]
        child = tuple(x if p else y for x, y, p in zip(da, db, pick))
        if child in (da, db):
            continue
        try:
            return _realize(sketch, child, a.workload_key)
        except ScheduleError:
            continue
    return None


def _default_point(sketch: GpuSketch, k: Kernel) -> tuple[int, ...] | None:
    """The default GPU schedule's choices for kernel `k` (default_gpu's heuristics), when legal."""
    from .default_gpu import _WARP_ROW_TILES, SMS, THREADS, _divisor_at_most, _pow2_at_most

    d: dict[str, int] = {"unroll": 0, "vec": 1, "kunroll": 1, "userial": 0, "mma": 0}
    if k.kind == "splitk":     # not the default's structure (the default sketch itself splits where it does)
        return None
    if k.kind == "tiled":
        I, J, K = k.size("I"), k.size("J"), k.size("K")
        fits = [t for t in _WARP_ROW_TILES if I % (t[0] * t[2]) == 0 and J % (t[1] * t[3]) == 0]
        sms = sketch.target.cores if sketch.target.kind == "cuda" else SMS
        pick = next((t for t in fits if (I // (t[0] * t[2])) * (J // (t[1] * t[3])) >= 0.9 * sms),
                    fits[-1] if fits else None)
        if pick is None:   # default_gpu's fallback for small outputs
            big = I * J >= 512 * 512
            mr, nr = _divisor_at_most(I, 8 if big else 4), _divisor_at_most(J, 8 if big else 4)
            ti, tj = _divisor_at_most(I // mr, 16), _divisor_at_most(J // nr, 16)
            pick = (mr, nr, ti, tj)
        d.update(zip(("mr", "nr", "ti", "tj"), pick))
        d["bk"] = _divisor_at_most(K, 16)
        if d["bk"] not in _bk_choices(K):
            d["bk"] = _bk_choices(K)[-1]
    elif k.kind == "row":
        rn = k.size("rn")
        d["threads"] = _pow2_at_most(rn, THREADS)
        d["userial"] = int(1 < rn // d["threads"] <= 32)
    elif k.kind in ("serial", "elementwise"):
        n = k.size("n")
        d["threads"] = min(THREADS, n)
        d["per"] = 4 if n >= d["threads"] * 4 * 1024 else 1
    elif k.kind == "full":
        n = k.size("n")
        d["threads"] = _divisor_at_most(n, THREADS)
        d["blocks"] = _divisor_at_most(n // d["threads"], 264)
    shape = tuple(d[x] for x in SHAPE_KNOBS[k.kind])
    if shape not in _shape_points(k, sketch.max_threads, sketch.shared_bytes):
        return None
    return tuple(d[x] for x in KNOBS[k.kind])


def default_like_gpu(sketch: GpuSketch) -> Schedule | None:
    """The point of `sketch` with the default GPU schedule's tile sizes / threads (where the search starts),
    None when one of its kernels has no such legal point."""
    dec = []
    for k in sketch.kernels:
        p = _default_point(sketch, k)
        if p is None:
            return None
        dec.append(p)
    try:
        return _realize(sketch, tuple(dec))
    except ScheduleError:
        return None


# ----------------------------------------------------------------------------- generation

def _sketch_id(rules: tuple[str, ...]) -> str:
    return "sk-" + hashlib.sha256("|".join(rules).encode()).hexdigest()[:12]


def _rule_name(k: Kernel) -> str:
    if k.kind == "tiled":
        return f"{k.stage}:tile{'_cache_write' if k.cache_write else '_fuse'}{'_shared' if k.shared else ''}"
    if k.kind == "splitk":
        return f"{k.stage}:split_k{'' if k.cache_write else '_fuse'}"
    return f"{k.stage}:{ {'row': 'cross_thread'}.get(k.kind, k.kind)}"


def generate_gpu_sketches(task_or_cd, target: Target | None = None, default: bool = True) -> list[Sketch]:
    """The GPU sketches of a Task (or a ComputeDef) for a cuda `target`: every combination of the kernels'
    structure alternatives (at most MAX_SKETCHES, the default's structure first), plus the default GPU schedule
    as a hole-free sketch when `default`.  Deterministic (same input, same sketches and ids)."""
    from ..ir.workload import workload_key

    cd: ComputeDef = getattr(task_or_cd, "compute", task_or_cd)
    target = target or getattr(task_or_cd, "target", None) or _default_target()
    key = getattr(task_or_cd, "key", None) or workload_key(cd)
    maxthr = target.max_threads_per_block or 1024
    smem = min(STATIC_SHARED, target.shared_mem_bytes or STATIC_SHARED)
    inlined, options = _plan(cd)
    prefix = tuple(ComputeInline(n) for n in inlined)
    out: list[Sketch] = []
    for combo in itertools.islice(itertools.product(*options), MAX_SKETCHES):
        rules = tuple(f"{n}:inline" for n in inlined) + tuple(_rule_name(k) for k in combo)
        sk = GpuSketch(_sketch_id(("gpu",) + rules), rules, key, cd, target, prefix, kernels=tuple(combo),
                       max_threads=maxthr, shared_bytes=smem)
        if sk.has_holes and all(_shape_points(k, maxthr, smem) for k in combo):
            out.append(sk)
    if default:
        steps = tuple(default_gpu_schedule(cd, target))
        out.append(Sketch(_sketch_id(("default",)), ("default",), key, cd, target, steps))
    return out


def _default_target() -> Target:
    return Target(kind="cuda", name="generic", cores=132, arch="sm_90", shared_mem_bytes=227 * 1024,
                  max_threads_per_block=1024)


__all__ = ["Kernel", "GpuSketch", "KNOBS", "SHAPE_KNOBS", "MUTATION_GROUPS", "UNROLL_GPU", "generate_gpu_sketches",
           "gpu_steps", "sample_gpu", "mutate_gpu", "crossover_gpu", "default_like_gpu", "decisions_of_gpu"]

