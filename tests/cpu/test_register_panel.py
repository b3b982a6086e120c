"""The packed GEMM's register panel (`default._register_panel`): with 32 vector registers, a cache tile of one
micro-tile row whose micro-tile is 8 vectors wide (2 x 128 with 16 lanes) when the column-panel plan's packed slab of
B fits in L1 (a short reduction), else 4 vectors wide (64 columns, up to 6 rows; the tile plan, B packed once and
shared, always so, over a cache tile of one micro-tile); unchanged with 16 registers, padded columns or a padded
convolution.  Compiled at both vector widths with 2 cores whatever the host (LLVM splits
512-bit vectors on an AVX2 host) and compared to numpy."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from hlotune.api import load_model
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.schedule_space import default as D
from hlotune.schedule_space.default import default_schedule, gemm_sketch
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.steps import Pack, Pad, Split
from hlotune.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from awkward_gemm import hlo, numpy_dense  # noqa: E402   (relu(x @ w + b), batched with `batch`)

_TWO = dataclasses.replace(Target.host_cpu(), cores=2, l1d_bytes=48 * 1024)
ISAS = {"avx2": dataclasses.replace(_TWO, vector_bits=256), "avx512": dataclasses.replace(_TWO, vector_bits=512)}


def _compute(b, m, k, n, t=False):
    (sg,) = load_model(hlo(m, k, n, t, b)).frontend.subgraphs
    return sg.workload.compute


def _dot(cd):
    return next(s for s in cd.stages if s.reduce_axes)


def _plan(cd, tgt):
    return D._gemm_plan(_dot(cd), tgt, tgt.vector_bits // 32)


def _run(cd, steps, tgt, b, m, k, n, t=False, seed=0):
    rng = np.random.default_rng(seed)
    lead = (b,) if b else ()
    x = rng.standard_normal(lead + (m, k), dtype=np.float32)
    w = rng.standard_normal(lead + ((n, k) if t else (k, n)), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    out = np.full(lead + (m, n), np.nan, dtype=np.float32)
    build_cpu(lower(cd, steps), tgt)(x, w, bias, out)
    np.testing.assert_allclose(out, numpy_dense(x, w, bias, t), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("b, m, k, n, t, nvec, mr", [
    (16, 256, 64, 256, False, 8, 2),     # the slab (64 x 128 floats, 32 KB) fits 2/3 of a 48 KB L1: 2 x 128
    (4, 256, 64, 256, True, 8, 2),       # B stored [N, K] (q @ k^T): the same tile out of the transposed pack
    (4, 256, 128, 256, False, 4, 4),     # 64 KB would not: 4 vectors, 4 rows (the best divisor of 256 up to 6)
    (4, 96, 128, 256, False, 4, 6),      # 96 rows: 6 (24 accumulators, 4 B vectors and a broadcast)
    (4, 255, 64, 256, False, 8, 2),      # odd rows: padded to 256 (`steps.Pad`)
    (2, 256, 1024, 256, False, 4, 4),    # a long reduction, k blocked: 4 vectors
])
def test_register_panel_plan_and_results(b, m, k, n, t, nvec, mr):
    tgt = ISAS["avx512"]
    cd = _compute(b, m, k, n, t)
    plan = _plan(cd, tgt)
    assert plan.panel and (plan.nvec, plan.mr, plan.tm) == (nvec, mr, mr)
    assert plan.panel % plan.nr == 0 and plan.ip == (-(-m // mr) * mr if m % mr else 0)
    steps = default_schedule(cd, tgt)
    dot = _dot(cd).name
    assert [p.factor for p in steps if isinstance(p, Pack)] == [nvec * 16]   # B packed in slabs of the tile's width
    assert Split(dot, "i2", (nvec, 16)) in steps and Split(dot, "i1", (mr,)) in steps
    assert bool([s for s in steps if isinstance(s, Pad)]) == bool(m % mr)
    # the cache tile is one row of micro-tiles: its accumulator buffer holds mr x panel floats (a 2 x 128 tile is
    # all of it, promoted to registers once unrolled); the old plan's held 64 rows
    assert f"alloc {dot}: f32[1,{mr},{plan.panel}] in local" in str(lower(cd, steps))
    _run(cd, steps, tgt, b, m, k, n, t)


@pytest.mark.parametrize("m, k, n", [(4096, 64, 256), (1024, 512, 256)])
def test_tile_plan_takes_the_narrow_register_panel(m, k, n):
    """A dense layer with too few column panels for the cores (B packed once, shared by the row tiles): a 4 x 64
    micro-tile that is the whole cache tile (the 2 x 128 one measured 0.85x here)."""
    tgt = ISAS["avx512"]
    cd = _compute(0, m, k, n)
    plan = _plan(cd, tgt)
    assert not plan.panel and (plan.nvec, plan.mr, plan.tm, plan.tn) == (4, 4, 4, 64)
    steps = default_schedule(cd, tgt)
    dot = _dot(cd).name
    assert Split(dot, "i1", (4, 16)) in steps and [p.factor for p in steps if isinstance(p, Pack)] == [64]
    assert f"alloc {dot}: f32[4,64] in local" in str(lower(cd, steps))
    _run(cd, steps, tgt, 0, m, k, n)


@pytest.mark.parametrize("b, m, k, n, short", [(16, 256, 64, 256, True), (4, 256, 128, 256, False),
                                               (0, 1024, 64, 256, True)])
def test_avx2_plan_has_no_register_panel(b, m, k, n, short):
    """16 registers: no register panel; the plan keeps its 2-vector micro-tile, over a cache tile of several
    micro-tile rows, or of one with B unpacked when the reduction is short (`_unpacked_in_registers`,
    tests/cpu/test_unpacked_in_registers.py)."""
    tgt = ISAS["avx2"]
    cd = _compute(b, m, k, n)
    plan = _plan(cd, tgt)
    assert plan.nvec <= 2 and plan.unpacked == short
    assert plan.tm == plan.mr if short else plan.tm > plan.mr
    _run(cd, default_schedule(cd, tgt), tgt, b, m, k, n)


def test_padded_columns_keep_the_two_vector_tile():
    """Columns padded to a multiple of the two-vector micro-tile (`_gemm_width`'s padding) keep that tile (a longer
    reduction than `_unpacked_short_k` takes: that plan reads B unpacked, tests/cpu/test_unpacked_short_k.py)."""
    tgt = ISAS["avx512"]
    cd = _compute(2, 256, 512, 784)
    plan = _plan(cd, tgt)
    assert plan.jp and plan.nvec == 2 and not plan.unpacked
    _run(cd, default_schedule(cd, tgt), tgt, 2, 256, 512, 784)


def test_gemm_sketch_row_hole_over_the_new_tile():
    """The packed-GEMM sketch built from the default keeps its row and k holes; its default point is the default."""
    tgt = ISAS["avx512"]
    cd = _compute(16, 256, 64, 256)
    steps, holes = gemm_sketch(cd, tgt)
    plan = _plan(cd, tgt)
    row = next(h for h in holes if h[1] == 256)
    filled = list(steps)
    for k_, extent, _most in holes:   # the row tile, and the k block (all of k when the plan does not block it)
        filled[k_] = dataclasses.replace(filled[k_], factors=(plan.tm if k_ == row[0] else plan.kc or extent,))
    assert filled == default_schedule(cd, tgt)


@pytest.mark.parametrize("b, m, k, n", [(3, 40, 16, 128), (2, 130, 48, 256), (5, 64, 200, 128), (1, 18, 64, 512)])
def test_small_batched_layers_match_numpy(b, m, k, n):
    for tgt in ISAS.values():
        cd = _compute(b, m, k, n)
        _run(cd, default_schedule(cd, tgt), tgt, b, m, k, n, seed=b + m)


def test_fuzzed_batched_layers():
    """`benchmarks/fuzz_dense_shapes.py --max-batch` at a small count: random batched layers against numpy with the
    host's own plans (the register panel among them on an AVX-512 host)."""
    from fuzz_dense_shapes import fuzz

    n, failures, plans = fuzz(16, 11, (40, 160, 300, 4))
    assert n == 16 and not failures, failures
    if Target.host_cpu().vector_bits >= 512:
        assert any(p.startswith("register panel") for p in plans), plans


def test_serial_gemm_takes_the_tile_rule():
    """Too little work for threads: enough columns for 8 panels, but no column-panel plan (`_panel_width` is 0: the
    serial tile plan), so the tile plan's narrow register panel (the 2 x 128 tile measured 0.84x there)."""
    tgt = ISAS["avx512"]
    cd = _compute(8, 16, 2, 128)
    plan = _plan(cd, tgt)
    assert D._work(_dot(cd)) < D.PARALLEL_MIN_WORK
    assert not plan.panel and (plan.nvec, plan.tm, plan.tn) == (4, 4, 64)
    _run(cd, default_schedule(cd, tgt), tgt, 8, 16, 2, 128)


def test_ansor_sketch_seed_splits_the_wide_tile():
    """The multi-level tiling sketches' default-like seed (`annotate.default_like`) follows the plan, but a sketch's
    innermost tile is at most 64: the 2 x 128 tile becomes two 64-wide ones (without that the seed was dropped)."""
    from hlotune.schedule_space.annotate import decisions_of
    from hlotune.schedule_space.task import Task
    from hlotune.search.space import TaskSpace

    tgt = ISAS["avx512"]
    (sg,) = load_model(hlo(1024, 64, 1024)).frontend.subgraphs
    assert _plan(sg.workload.compute, tgt).nr == 128
    space = TaskSpace(Task(sg.workload.key, sg.workload.compute, tgt, 1, "dense", float(sg.workload.flops)))
    assert space.seeds
    tiles = [decisions_of(space.sketch_of(s), s).tiles for s in space.seeds]
    assert all((1, 2, 64) in t and (1, 1, 2) in t for t in tiles), tiles
