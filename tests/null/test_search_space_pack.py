"""The search space's packing choice and default-like seeds, the fast schedule key, the template-state cache and
the evolutionary search starting from the default's blocking (issue 6)."""

from __future__ import annotations

import random

import numpy as np

import hlotune
from hlotune.cost_model.model import RandomModel
from hlotune.schedule_space.annotate import (
    decisions_of,
    default_like,
    make_schedule,
    realize,
    sample_schedules,
)
from hlotune.schedule_space.default import _gemm_plan
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.mutate import mutate_pack, mutate_tile_size
from hlotune.schedule_space.sketch import generate_sketches
from hlotune.schedule_space.state import loads_of, replay
from hlotune.schedule_space.steps import Pack, Schedule, Split
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.search.evolutionary import EvolutionarySearch
from hlotune.search.space import TaskSpace, derive_rng, sample_random
from hlotune.target import Target
from tests.conftest import model_path

TARGET = Target.host_cpu()


def _task(name: str, kind: str = "bench.hlo"):
    m = hlotune.load_model(str(model_path(name, kind)))
    return tasks_from_subgraphs(m.frontend.subgraphs, TARGET)[0]


def _packs(s: Schedule) -> list[Pack]:
    return [x for x in s.steps if isinstance(x, Pack)]


def test_tiled_sketches_offer_packing_with_the_micro_tile_width():
    task = _task("dense_bias_relu")
    for sk in generate_sketches(task):
        if not sk.has_holes or sk.rules == ("gemm_panel",):   # the default's plan: B packed per task, no choice
            continue
        site = next(x for x in sk.sites if x.stage == "dot_general_1")
        assert site.pack is not None and site.pack.buffer == "param_1"
        ss = sample_schedules(sk, task, 5, 40)
        packed = [s for s in ss if _packs(s)]
        assert 5 <= len(packed) < len(ss)          # a decision: both ways occur
        for s in packed:
            (p,) = _packs(s)
            j_tile = s.steps[sk.tiles[site.pack.tile].step]
            assert isinstance(j_tile, Split) and j_tile.iter == "i1"
            assert p.factor == j_tile.factors[-1] and p.axis == 1 and p.outer_pos == 0
            assert realize(sk, decisions_of(sk, s)) == s
            assert decisions_of(sk, s).pack[[x.stage for x in sk.sites].index("dot_general_1")] == 1


def test_mutate_pack_toggles_packing():
    task = _task("dense_bias_relu")
    sk = generate_sketches(task)[0]
    rng = random.Random(1)
    for s in sample_schedules(sk, task, 2, 10):
        c = mutate_pack(sk, s, rng)
        if c is not None:
            assert bool(_packs(c)) != bool(_packs(s))
            replay(task.compute, c)


def test_default_like_is_the_default_gemm_blocking_and_computes_right():
    task = _task("matmul")
    plan = _gemm_plan(task.compute.stages[0], TARGET, max(1, TARGET.vector_bits // 32))
    seeds = TaskSpace(task).seeds
    assert seeds, "matmul must have a default-like seed"
    s = seeds[0]
    sk = next(x for x in generate_sketches(task) if x.id == s.sketch)
    d = decisions_of(sk, s)
    assert d.tiles[0] == (1, plan.tm // plan.mr, plan.mr) and d.tiles[1] == (1, plan.tn // plan.nr, plan.nr)
    assert d.tiles[2] == ((plan.kc or 1024),)
    (p,) = _packs(s)
    assert p.factor == plan.nr
    # the same decisions on the small matmul compute the right thing (loop-IR interpreter vs numpy)
    small = _task("matmul", "hlo")
    like = [x for x in (default_like(k) for k in generate_sketches(small)) if x is not None]
    assert like
    cd = small.compute
    small_plan = _gemm_plan(cd.stages[0], TARGET, max(1, TARGET.vector_bits // 32))
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    want = ins[0] @ ins[1]
    for s in like:
        assert bool(_packs(s)) != small_plan.unpacked   # 64 x 48 x 32: B unpacked with 16 vector registers
        (out,) = evaluate_loop_func(lower(cd, s), ins)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_default_like_mutates_into_valid_neighbours():
    task = _task("dense_bias_relu")
    space = TaskSpace(task)
    (seed, *_) = space.seeds
    sk = space.by_id[seed.sketch]
    rng = random.Random(0)
    kids = [mutate_tile_size(sk, seed, rng) for _ in range(20)]
    kids = [k for k in kids if k is not None]
    assert len({k.key for k in kids}) >= 5
    for k in kids:
        replay(task.compute, k)


def test_make_schedule_key_matches_the_canonical_key():
    for name in ("dense_bias_relu", "softmax", "conv2d_bias_relu"):
        task = _task(name, "hlo")
        for s in sample_random(TaskSpace(task), random.Random(0), 40):
            assert s.key == Schedule(s.workload_key, s.steps, s.sketch).key
    s = make_schedule("w", (), "")
    assert s.key == Schedule("w", ()).key


def test_loads_of_is_cached_and_right():
    task = _task("dense_bias_relu", "hlo")
    body = task.compute.stages[0].body
    assert loads_of(body) == {"param_0", "param_1"}
    assert loads_of(body) is loads_of(body)


def test_evolutionary_search_measures_the_seeds_first_and_keeps_them_in_the_population():
    task = _task("matmul")
    space = TaskSpace(task)
    ev = EvolutionarySearch(space, RandomModel(0), population=64, generations=1)
    batch = ev.propose(8, set(), derive_rng(0, 1))
    keys = [s.key for s in batch]
    assert keys[:len(space.seeds)] == [s.key for s in space.seeds]
    batch2 = ev.propose(8, set(keys), derive_rng(0, 2))
    assert not {s.key for s in batch2} & set(keys)
    init, _ = ev._initial(random.Random(0))
    assert {s.key for s in space.seeds} <= {s.key for s in init}


def test_packed_transposed_b_in_sampled_schedules_computes_right():
    """A Q K^T-like dot (B contiguous along k): sampled schedules that pack B copy it in k blocks
    (`default.transposed_pack`) and compute the dot (loop-IR interpreter against numpy)."""
    from hlotune.schedule_space.task import Task
    from tests.null.test_pack import _dot, _run

    cd = _dot(16, 32, 32, b_transposed=True, batch=2)
    task = Task("qk-test", cd, TARGET, 1, "qk", 2.0 * 2 * 16 * 32 * 32)
    checked = 0
    for sk in generate_sketches(task):
        for s in sample_schedules(sk, task, 3, 12):
            packs = _packs(s)
            if not packs or packs[0].stage != "B":
                continue
            assert any(isinstance(x, Split) and x.stage == "B.pack" and x.factors == (16,) for x in s.steps), str(s)
            _run(cd, s.steps)
            checked += 1
    assert checked >= 3
