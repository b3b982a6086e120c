"""Unpacked B in registers with 16 vector registers (`default._unpacked_in_registers`): on an AVX2 target a GEMM with
one reduce axis of at most UNPACKED16_MAX_K (or UNPACKED16_LONG_K with at most UNPACKED16_LONG_K_EXTENT rows and
columns), B contiguous along the columns with its K x N floats within UNPACKED16_L2 of L2 and rows x K at most
UNPACKED_MAX_ROWS_K reads B as it is, each cache tile one mr x nr micro-tile over the whole reduction (no L1 copy of
the accumulators, no pack); a last column tile that nr does not divide overlaps the one before.  Otherwise the packed
plan.  Compiled with 2 cores whatever the host and compared to numpy."""

from __future__ import annotations

import dataclasses

import pytest

from hlotune.schedule_space import default as D
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.steps import Pack, Pad, Split
from tests.cpu.test_register_panel import ISAS, _compute, _dot, _plan, _run
from tests.cpu.test_unpacked_short_k import default_like_seeds

#: L1 48 KiB (ISAS), L2 512 KiB whatever the host: B within 256 KiB takes the plan
AVX2 = dataclasses.replace(ISAS["avx2"], l2_bytes=512 * 1024)
AVX512 = dataclasses.replace(ISAS["avx512"], l2_bytes=512 * 1024)


@pytest.mark.parametrize("b, m, k, n", [
    (16, 256, 64, 256),    # batch_matmul's bench shape
    (0, 1024, 32, 256),
    (0, 256, 96, 512),     # B 192 KiB
    (4, 512, 64, 128),     # batched, B per batch
    (0, 256, 64, 500),     # 500 columns: 31 full tiles and one overlapping the 32nd
    (0, 64, 48, 32),       # matmul's test shape (too little work for threads: serial)
    (0, 64, 256, 64),      # a longer reduction over few rows and columns (UNPACKED16_LONG_K)
    (0, 64, 1024, 64),     # B 256 KiB, rows x K at UNPACKED_MAX_ROWS_K
    (4, 128, 256, 128),    # batched, long K
    (0, 100, 300, 100),    # long K, 100 columns: the last tile overlaps
])
def test_unpacked_plan_and_results(b, m, k, n):
    cd = _compute(b, m, k, n)
    plan = _plan(cd, AVX2)
    assert plan.unpacked and plan.tm == plan.mr and plan.tn == plan.nr and not plan.kc
    assert not plan.jp and not plan.panel and not plan.ip
    steps = default_schedule(cd, AVX2)
    dot = _dot(cd)
    assert not [s for s in steps if isinstance(s, Pack | Pad)]        # B read as it is, columns not padded
    i, j = dot.axes[-2].name, dot.axes[-1].name
    out = next(s.name for s in cd.stages if s.name in cd.outputs)
    assert Split(out, i, (plan.mr,)) in steps and Split(out, j, (plan.nr,)) in steps   # a tile = a micro-tile
    assert not any(isinstance(s, Split) and s.iter == dot.reduce_axes[0].name for s in steps)  # the whole reduction
    assert ".pack" not in str(lower(cd, steps))
    _run(cd, steps, AVX2, b, m, k, n)


@pytest.mark.parametrize("tgt, b, m, k, n, t, why", [
    (AVX2, 0, 256, 128, 256, False, "K over UNPACKED16_MAX_K, 256 rows over UNPACKED16_LONG_K_EXTENT"),
    (AVX2, 0, 64, 128, 256, False, "K over UNPACKED16_MAX_K, 256 columns over UNPACKED16_LONG_K_EXTENT"),
    (AVX2, 0, 32, 2048, 32, False, "K over UNPACKED16_LONG_K"),
    (AVX2, 0, 256, 96, 1024, False, "B (384 KiB) over half of L2"),
    (AVX2, 0, 2048, 64, 256, False, "rows x K over UNPACKED_MAX_ROWS_K: the pack pays for itself"),
    (AVX2, 0, 256, 64, 256, True, "B stored [N, K]: not contiguous along the columns"),
    (AVX2, 0, 251, 64, 256, False, "prime rows: padded to the micro-tile"),
    (AVX512, 16, 256, 64, 256, False, "32 vector registers: the register panel"),
])
def test_packed_plan_kept(tgt, b, m, k, n, t, why):
    cd = _compute(b, m, k, n, t)
    plan = _plan(cd, tgt)
    assert not plan.unpacked, why
    steps = default_schedule(cd, tgt)
    assert [s for s in steps if isinstance(s, Pack)], why
    _run(cd, steps, tgt, b, m, k, n, t)


def test_rule_off_is_the_packed_plan(monkeypatch):
    """With UNPACKED16_MAX_K at 0 the same GEMM packs B again (the rule is the only difference)."""
    cd = _compute(16, 256, 64, 256)
    monkeypatch.setattr(D, "UNPACKED16_MAX_K", 0)
    plan = _plan(cd, AVX2)
    assert not plan.unpacked and plan.tm > plan.mr
    assert [s for s in default_schedule(cd, AVX2) if isinstance(s, Pack)]


def test_default_like_seed_follows_the_plan():
    """The Ansor sketches' default-like seed: tiles of one micro-tile over the whole reduction, B not packed
    (although the sketch could pack it: 256 columns)."""
    cd = _compute(16, 256, 64, 256)
    plan = _plan(cd, AVX2)
    dot = _dot(cd)
    seeds = default_like_seeds(cd, AVX2)
    assert seeds
    for sk, d in seeds:
        assert not any(d.pack), sk.rules
        got = {h.iter: d.tiles[n] for n, h in enumerate(sk.tiles)}
        assert got[dot.axes[-2].name][-2:] == (1, plan.mr) and got[dot.axes[-1].name][-2:] == (1, plan.nr)
        assert got[dot.reduce_axes[0].name] == (64,)
