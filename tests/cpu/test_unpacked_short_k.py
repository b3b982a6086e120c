"""Unpacked B for short reductions (`default._unpacked_short_k`): a GEMM whose plan would pad its columns and pack B
in a pass of its own reads B as it is when the target has 32 vector registers, B is contiguous along the columns, the
rows are a multiple of UNPACKED_TILE_M, rows x K is at most UNPACKED_MAX_ROWS_K and a K x 32 panel of B fits
UNPACKED_L1 of L1: 8 x 32 micro-tiles over the whole reduction, cache tiles of 16 rows x 32 columns, the last column
tile overlapping the one before.  Otherwise the padded, packed plan.  Compiled with 2 cores whatever the host (LLVM
splits 512-bit vectors on an AVX2 host) and compared to numpy."""

from __future__ import annotations

import pytest

from hlotune.schedule_space import default as D
from hlotune.schedule_space.annotate import decisions_of, default_like
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.sketch import generate_sketches
from hlotune.schedule_space.steps import Pack, Pad, Split
from tests.cpu.test_register_panel import ISAS, _compute, _dot, _plan, _run


@pytest.mark.parametrize("b, m, k, n", [
    (0, 256, 256, 784),    # mlp_grad_dot_9's shape with A not transposed: a 256 x 32 panel is 32 KB, 2/3 of 48 KB
    (0, 64, 64, 500),      # 500 columns: 15 full tiles and one overlapping the 16th
    (0, 32, 128, 1000),
    (4, 32, 64, 250),      # batched, B per batch
    (0, 64, 20, 94),       # too little work for threads: the same tiles, serial
])
def test_unpacked_plan_and_results(b, m, k, n):
    tgt = ISAS["avx512"]
    cd = _compute(b, m, k, n)
    plan = _plan(cd, tgt)
    assert plan.unpacked and (plan.mr, plan.nr, plan.tm, plan.tn, plan.kc) == (8, 32, D.UNPACKED_TILE_M, 32, 0)
    assert not plan.jp and not plan.panel and not plan.ip
    steps = default_schedule(cd, tgt)
    dot = _dot(cd).name
    assert not [s for s in steps if isinstance(s, Pack | Pad)]        # B read as it is, columns not padded
    i, j = _dot(cd).axes[-2].name, _dot(cd).axes[-1].name
    assert Split(dot, i, (8,)) in steps and Split(dot, j, (2, 16)) in steps
    assert not any(isinstance(s, Split) and s.stage == dot and s.iter == _dot(cd).reduce_axes[0].name
                   for s in steps)                                    # the whole reduction per micro-tile
    loops = str(lower(cd, steps))
    assert f"alloc {dot}: f32[" in loops and ".pack" not in loops
    _run(cd, steps, tgt, b, m, k, n)


@pytest.mark.parametrize("isa, b, m, k, n, t, why", [
    ("avx512", 0, 256, 512, 784, False, "a 512 x 32 panel (64 KB) is over 2/3 of L1"),
    ("avx2", 0, 256, 128, 500, False, "16 vector registers (K over `_unpacked_in_registers`' limit)"),
    ("avx512", 0, 250, 64, 500, False, "rows not a multiple of 16"),
    ("avx512", 0, 512, 256, 784, False, "rows x K over UNPACKED_MAX_ROWS_K: the pack pays for itself"),
    ("avx512", 0, 256, 64, 500, True, "B stored [N, K]: not contiguous along the columns"),
])
def test_padded_plan_kept(isa, b, m, k, n, t, why):
    tgt = ISAS[isa]
    cd = _compute(b, m, k, n, t)
    plan = _plan(cd, tgt)
    assert not plan.unpacked, why
    steps = default_schedule(cd, tgt)
    assert plan.jp and [s for s in steps if isinstance(s, Pack)], why   # the padded, packed plan
    assert [s for s in steps if isinstance(s, Pad)], why
    _run(cd, steps, tgt, b, m, k, n, t)


def test_unpacked_plan_off_is_the_padded_plan(monkeypatch):
    """With the L1 share at 0 the rule never holds: the same GEMM takes the padded, packed plan (the rule is the
    only difference)."""
    tgt = ISAS["avx512"]
    cd = _compute(0, 256, 256, 784)
    monkeypatch.setattr(D, "UNPACKED_L1", 0.0)
    plan = _plan(cd, tgt)
    assert not plan.unpacked and plan.jp == 800
    steps = default_schedule(cd, tgt)
    assert [s for s in steps if isinstance(s, Pack)] and [s for s in steps if isinstance(s, Pad)]


def default_like_seeds(cd, tgt) -> list:
    """(sketch, decisions) of each sketch's default-like seed (`annotate.default_like`) for `tgt`."""
    seeds = []
    for sk in generate_sketches(cd, tgt):
        s = default_like(sk)
        if s is not None:
            seeds.append((sk, decisions_of(sk, s)))
    return seeds


def test_default_like_seed_follows_the_unpacked_plan():
    """The Ansor sketches' default-like seed follows the plan: 16-row and 32-column tiles over the whole reduction,
    B not packed (the sketches' pack needs columns that its width divides; the padded plan's seed had 64-row
    tiles)."""
    tgt = ISAS["avx512"]
    cd = _compute(0, 64, 64, 500)
    seeds = default_like_seeds(cd, tgt)
    assert seeds
    for sk, d in seeds:
        assert not any(d.pack), sk.rules
        i_hole = next(h for h, hole in enumerate(sk.tiles) if hole.iter == _dot(cd).axes[-2].name)
        k_hole = next(h for h, hole in enumerate(sk.tiles) if hole.iter == _dot(cd).reduce_axes[0].name)
        assert d.tiles[i_hole] == (1, 2, 8) and d.tiles[k_hole] == (64,)
