"""Sketches, random annotation, mutation and crossover (issue 6): the rules give the expected sketch
families on every fixture subgraph; every sampled, mutated or crossed-over schedule replays, lowers and
computes what the algorithm says (loop-IR interpreter against `evaluate_compute`, on the small
fixtures); seeded sampling is reproducible; schedules round-trip through JSON with their sketch id."""

from __future__ import annotations

import json
import random
import time
from functools import cache

import numpy as np
import pytest

import hlotune
from hlotune.errors import ScheduleError
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.annotate import (
    check_state,
    decisions_of,
    factor_schemes,
    realize,
    sample_schedules,
)
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import ForKind
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.mutate import (
    crossover,
    ladder_moves,
    mutate,
    mutate_compute_location,
    mutate_parallel,
    mutate_tile_size,
    mutate_unroll,
    outward_moves,
    unroll_moves,
)
from hlotune.schedule_space.sketch import UNROLL_CHOICES, generate_sketches, needs_multi_level_tiling, needs_rfactor
from hlotune.schedule_space.state import replay
from hlotune.schedule_space.steps import (
    CacheWrite,
    ComputeAt,
    Reorder,
    RFactor,
    Schedule,
    parse_schedule,
    schedule_from_json,
    schedule_to_json,
)
from hlotune.schedule_space.task import Task
from hlotune.target import Target
from tests.conftest import MODEL_NAMES, model_path

TARGET = Target.host_cpu()
#: the loop-IR interpreter is slow: check numerics only where the largest stage does less than this
MAX_WORK = 40000


@cache
def _subgraphs(name: str, kind: str):
    return hlotune.load_model(model_path(name, kind)).frontend.subgraphs


def _distinct(kind: str):
    out, seen = [], set()
    for name in MODEL_NAMES:
        for sg in _subgraphs(name, kind):
            if sg.workload.key not in seen:
                seen.add(sg.workload.key)
                out.append((f"{name}/{sg.name}", sg))
    return out


def _work(cd) -> int:
    return max(int(np.prod(s.shape)) * int(np.prod([a.extent for a in s.reduce_axes] or [1])) for s in cd.stages)


def _io(sg, seed=0):
    cd = sg.workload.compute
    n = len(sg.computation.parameters)
    rng = np.random.default_rng(seed)
    args = [(np.abs(rng.standard_normal(b.shape)) + 0.5).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    return args + [consts[b.name] for b in cd.inputs[n:]], evaluate_compute(cd, args)


def _check_numerics(cd, sched, ins, want, label):
    got = evaluate_loop_func(lower(cd, sched), ins)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5, equal_nan=True, err_msg=f"{label}\n{sched}")


def _task(sg) -> Task:
    return Task(sg.workload.key, sg.workload.compute, TARGET, name=sg.name)


# ----------------------------------------------------------------------------- rules

@pytest.mark.parametrize("kind", ["hlo", "bench.hlo"])
def test_sketch_families_on_every_fixture(kind):
    for label, sg in _distinct(kind):
        cd = sg.workload.compute
        sks = generate_sketches(_task(sg))
        ids = [s.id for s in sks]
        assert len(set(ids)) == len(ids), label
        assert [s.id for s in generate_sketches(cd, TARGET)] == ids, f"{label}: ids not stable"
        rules = [" ; ".join(s.rules) for s in sks]
        assert rules[-1] == "default" and not sks[-1].has_holes
        for st in cd.stages:
            mine = [r for r in rules if f"{st.name}:" in r]
            if any(f"{st.name}:row" in r for r in mine):   # a row subgraph: the row plan's sketch (row fusion)
                assert all(f"{st.name}:row" in r for r in mine), label
                continue
            if needs_multi_level_tiling(st):
                if any(f"{st.name}:tile_fuse@" in r for r in mine):
                    assert {f"{st.name}:tile_fuse@1", f"{st.name}:tile_fuse@2"} <= {
                        x.strip() for r in mine for x in r.split(";")}, label
                else:
                    assert any(f"{st.name}:cache_write@1" in r for r in mine), label
                    assert any(f"{st.name}:cache_write@2" in r for r in mine), label
                    assert any(f"{st.name}:tile" in r.split(" ; ") or r.endswith(f"{st.name}:tile") for r in mine)
            elif needs_rfactor(st, TARGET):
                assert any("rfactor_outer" in r for r in mine) and any("rfactor_inner" in r for r in mine), label
                assert any(f"{st.name}:reduction" in r for r in mine), label
            elif st.is_reduction:
                assert any(f"{st.name}:reduction" in r for r in mine), label
            elif st.name in cd.outputs:
                assert any(f"{st.name}:elementwise" in r or f"{st.name}:fusion_host" in r for r in mine), label


def _ssrsrs_order(sk, stage):
    for s in sk.steps:
        if isinstance(s, Reorder) and s.stage == stage:
            return [n.rsplit(".", 1)[1] + ("r" if n.startswith("r") else "s") for n in s.order]
    return None


def test_dense_sketches_are_ssrsrs_with_fusion_at_two_levels():
    (sg,) = _subgraphs("dense_bias_relu", "bench.hlo")
    sks = generate_sketches(_task(sg))
    fused = [s for s in sks if any("tile_fuse" in r for r in s.rules)]
    assert len(fused) == 2
    for level, sk in zip((1, 2), fused):
        assert _ssrsrs_order(sk, "dot_general_1") == ["0s", "0s", "1s", "1s", "0r", "2s", "2s", "1r", "3s", "3s"]
        at = [s for s in sk.steps if isinstance(s, ComputeAt)]
        assert at == [ComputeAt("dot_general_1", "max_3", f"i1.{level - 1}")]
        assert [(h.iter, h.n, h.extent) for h in sk.tiles] == [("i0", 3, 512), ("i1", 3, 1024), ("r0", 1, 1024)]
    (mm,) = _subgraphs("matmul", "bench.hlo")
    cw = [s for s in generate_sketches(_task(mm)) if any("cache_write" in r for r in s.rules)]
    assert len(cw) == 2 and all(isinstance(s.steps[0], CacheWrite) for s in cw)
    (rs,) = _subgraphs("sum_reduce", "bench.hlo")
    rf = [s for s in generate_sketches(_task(rs)) if any("rfactor" in r for r in s.rules)]
    assert len(rf) == 2 and all(any(isinstance(x, RFactor) for x in s.steps) for s in rf)


def test_factor_schemes():
    fs = factor_schemes(24, 2, 4)
    assert all(24 % (a * b) == 0 and b <= 4 for a, b in fs)
    brute = {(a, b) for a in range(1, 25) for b in range(1, 5) if 24 % (a * b) == 0}
    assert set(fs) == brute and len(fs) == len(brute)
    assert factor_schemes(24, 2, 4) is fs  # cached


# ----------------------------------------------------------------------------- samples compute right

@pytest.mark.parametrize("label,sg", _distinct("hlo"), ids=[x for x, _ in _distinct("hlo")])
def test_samples_replay_lower_and_compute_right(label, sg):
    cd = sg.workload.compute
    task = _task(sg)
    check = _work(cd) <= MAX_WORK
    ins, want = _io(sg) if check else (None, None)
    for sk in generate_sketches(task):
        ss = sample_schedules(sk, task, 7, 6 if check else 12)
        assert ss, f"{label}: no schedule from {sk.rules}"
        assert len({s.key for s in ss}) == len(ss)
        for s in ss:
            assert s.sketch == sk.id and s.workload_key == task.key
            state = replay(cd, s)
            if sk.has_holes:
                check_state(state)
                assert realize(sk, decisions_of(sk, s)) == s
            if check:
                _check_numerics(cd, s, ins, want, f"{label} {sk.rules}")
            else:
                lower(cd, s)


def test_seeded_sampling_is_reproducible():
    (sg,) = _subgraphs("conv2d_bias_relu", "hlo")
    task = _task(sg)
    for sk in generate_sketches(task):
        a = sample_schedules(sk, task, 123, 10)
        assert a == sample_schedules(sk, task, 123, 10)
        assert a == sample_schedules(sk, task, random.Random(123), 10)
        if sk.has_holes:
            assert a != sample_schedules(sk, task, 124, 10)
    g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
    sk = generate_sketches(task)[0]
    assert sample_schedules(sk, task, g1, 5) == sample_schedules(sk, task, g2, 5)


def test_schedule_json_round_trip_keeps_sketch():
    (sg,) = _subgraphs("dense_bias_relu", "hlo")
    task = _task(sg)
    sk = generate_sketches(task)[0]
    for s in sample_schedules(sk, task, 3, 5):
        d = json.loads(json.dumps(schedule_to_json(s)))
        assert d["sketch"] == sk.id
        assert schedule_from_json(d) == s and parse_schedule(str(s)) == s
        assert schedule_from_json(d).key == s.key
        assert Schedule(s.workload_key, s.steps).key != s.key  # the sketch id is part of the key


def test_sample_space_has_what_the_property_test_needs():
    """Across the fixtures' sketches: non-divisible tiles (guarded tails), several vector widths,
    compute_at at several levels, cache_write and rfactor, parallel and unroll pragmas."""
    seen = {"nondiv": 0, "widths": set(), "at_levels": set(), "cache_write": 0, "rfactor": 0, "unroll": set()}
    for _, sg in _distinct("hlo"):
        task = _task(sg)
        for sk in generate_sketches(task):
            for s in sample_schedules(sk, task, 1, 8):
                state = replay(task.compute, s)
                for h in sk.tiles:
                    if h.extent % int(np.prod(s.steps[h.step].factors)):
                        seen["nondiv"] += 1
                for st in state.stages:
                    for it in st.iters:
                        if it.kind is ForKind.VECTORIZED:
                            seen["widths"].add(it.extent)
                        seen["unroll"] |= {v for name, v in it.pragmas if name == "auto_unroll_max_step"}
                    if st.attach.kind == "at":
                        t = state.stage(st.attach.stage)
                        seen["at_levels"].add(t.iter_pos(st.attach.iter))
                seen["cache_write"] += any(isinstance(x, CacheWrite) for x in s.steps)
                seen["rfactor"] += any(isinstance(x, RFactor) for x in s.steps)
    assert seen["nondiv"] >= 20
    assert {2, 4, 8, 16} <= seen["widths"]
    assert len(seen["at_levels"]) >= 4
    assert seen["cache_write"] >= 20 and seen["rfactor"] >= 20
    assert set(seen["unroll"]) == {0, 16, 64, 512}


# ----------------------------------------------------------------------------- mutation, crossover

MUTATION_FIXTURES = [("dense_bias_relu", 0), ("conv2d_bias_relu", 0), ("softmax", 0), ("mlp_train_step", 10),
                     ("mlp_train_step", 0), ("sum_reduce", 0), ("layernorm", 0), ("rmsnorm_swiglu", 2)]


@pytest.mark.parametrize("name,k", MUTATION_FIXTURES)
def test_mutations_and_crossover_are_valid_and_compute_right(name, k):
    sg = _subgraphs(name, "hlo")[k]
    cd = sg.workload.compute
    task = _task(sg)
    ins, want = _io(sg, 1)
    rng = random.Random(9)
    counts = {}
    for sk in generate_sketches(task):
        if not sk.has_holes:
            s = sample_schedules(sk, task, 0, 1)[0]
            assert mutate_tile_size(sk, s, rng) is None and crossover(sk, s, s, rng) is None
            continue
        ss = sample_schedules(sk, task, 2, 6)
        for op in (mutate_tile_size, mutate_unroll, mutate_compute_location, mutate_parallel, mutate):
            for parent in ss[:2]:
                child = op(sk, parent, rng)
                if child is None:
                    continue
                counts[op.__name__] = counts.get(op.__name__, 0) + 1
                assert child.steps != parent.steps and child.sketch == sk.id
                check_state(replay(cd, child))
                _check_numerics(cd, child, ins, want, f"{name} {op.__name__} {sk.rules}")
        for a, b in zip(ss[:3], ss[3:6]):
            child = crossover(sk, a, b, rng)
            if child is None:
                continue
            counts["crossover"] = counts.get("crossover", 0) + 1
            assert child.steps not in (a.steps, b.steps)
            da, db, dc = decisions_of(sk, a), decisions_of(sk, b), decisions_of(sk, child)
            assert all(t in (x, y) for t, x, y in zip(dc.tiles, da.tiles, db.tiles))
            _check_numerics(cd, child, ins, want, f"{name} crossover {sk.rules}")
    assert counts.get("mutate_tile_size", 0) >= 2 and counts.get("crossover", 0) >= 1
    if any(site.unroll for sk in generate_sketches(task) for site in sk.sites):
        assert counts.get("mutate_unroll", 0) >= 2


def test_compute_location_and_parallel_mutations_change_those_decisions():
    # a subgraph with a non-output stage whose compute location is a hole (which one depends on the fusion rules)
    task, sk = next((t, k) for t in map(_task, _subgraphs("mlp_train_step", "hlo")) for k in generate_sketches(t)
                    if k.sites and any(x.location for x in k.sites))
    rng = random.Random(4)
    s = sample_schedules(sk, task, 0, 1)[0]
    d = decisions_of(sk, s)
    moved = {decisions_of(sk, c).loc for c in (mutate_compute_location(sk, s, rng) for _ in range(12)) if c}
    assert moved and d.loc not in moved
    (dense,) = _subgraphs("dense_bias_relu", "bench.hlo")
    task = _task(dense)
    sk = generate_sketches(task)[1]
    s = sample_schedules(sk, task, 0, 1)[0]
    c = mutate_parallel(sk, s, rng)
    assert c is not None and decisions_of(sk, c).par != decisions_of(sk, s).par


def test_outward_moves_split_work_outward_and_compute_right():
    """`outward_moves`: one level of one tile hole divided by its smallest prime (the hole's outer loop takes it),
    parallel fuse counts drawn anew, other decisions kept; each valid, distinct, computing the right values."""
    for name, k in (("dense_bias_relu", 0), ("conv2d_bias_relu", 0)):
        sg = _subgraphs(name, "hlo")[k]
        task, cd = _task(sg), sg.workload.compute
        ins, want = _io(sg, 2)
        sk = next(x for x in generate_sketches(task) if x.has_holes and any(site.parallel for site in x.sites))
        s = max(sample_schedules(sk, task, 5, 40), key=lambda x: sum(sum(f) for f in decisions_of(sk, x).tiles))
        d = decisions_of(sk, s)
        moves = outward_moves(sk, s)
        assert moves and len({m.key for m in moves}) == len(moves) and s.key not in {m.key for m in moves}
        assert [m.key for m in outward_moves(sk, s)] == [m.key for m in moves]        # deterministic
        pars = set()
        for m in moves:
            dm = decisions_of(sk, m)
            changed = [(a, b) for a, b in zip(d.tiles, dm.tiles) if a != b]
            assert len(changed) == 1
            (a, b), = changed
            lv = [j for j in range(len(a)) if a[j] != b[j]]
            assert len(lv) == 1 and a[lv[0]] % b[lv[0]] == 0 and all(
                (a[lv[0]] // b[lv[0]]) % q for q in range(2, a[lv[0]] // b[lv[0]]))     # a prime
            assert (dm.loc, dm.vec, dm.unroll, dm.pack) == (d.loc, d.vec, d.unroll, d.pack)
            pars.add(dm.par)
            check_state(replay(cd, m.steps))
        assert len(pars) >= 2                                                            # counts drawn anew
        for m in moves[:: max(1, len(moves) // 4)]:
            _check_numerics(cd, m, ins, want, f"{name} outward move")
    flat = realize(sk, type(d)(tuple((1,) * len(t) for t in d.tiles), d.loc, d.par, d.vec, d.unroll, d.pack),
                   random.Random(0), s.workload_key)
    assert all(all(x == 1 for x in t) for t in decisions_of(sk, flat).tiles) and outward_moves(sk, flat) == []


def _ladder_variants(d) -> set:
    """Every (hole, level, factor) one ladder step from `d`'s tiles: x / 4, x / 16 where they divide, x * 4, x * 16."""
    return {(h, lv, y) for h, f in enumerate(d.tiles) for lv, x in enumerate(f)
            for m in (4, 16) for y in ((x // m,) if x % m == 0 else ()) + (x * m,)}


def test_ladder_moves_scale_one_tile_level_by_4_or_16_and_compute_right():
    """`ladder_moves`: one level of one tile hole multiplied or divided by 4 or 16 (the hole's outer loop takes the
    rest), every other decision kept; valid, distinct, deterministic, computing the right values, downward steps
    among them; a schedule whose tiles are all 1 moves up only."""
    for name in ("dense_bias_relu", "conv2d_bias_relu"):
        sg = _subgraphs(name, "hlo")[0]
        task, cd = _task(sg), sg.workload.compute
        ins, want = _io(sg, 4)
        sk = next(x for x in generate_sketches(task) if x.has_holes and x.tiles)
        s = max(sample_schedules(sk, task, 6, 40), key=lambda x: sum(sum(f) for f in decisions_of(sk, x).tiles))
        d = decisions_of(sk, s)
        moves = ladder_moves(sk, s)
        assert moves and len({m.key for m in moves}) == len(moves) and s.key not in {m.key for m in moves}
        assert [m.key for m in ladder_moves(sk, s)] == [m.key for m in moves]           # deterministic
        expect, got = _ladder_variants(d), set()
        for m in moves:
            dm = decisions_of(sk, m)
            assert (dm.loc, dm.par, dm.vec, dm.unroll, dm.pack) == (d.loc, d.par, d.vec, d.unroll, d.pack)
            changed = [(h, lv, dm.tiles[h][lv]) for h in range(len(d.tiles)) for lv in range(len(d.tiles[h]))
                       if dm.tiles[h][lv] != d.tiles[h][lv]]
            assert len(changed) == 1 and changed[0] in expect
            got.add(changed[0])
            check_state(replay(cd, m.steps))
        assert any(y < d.tiles[h][lv] for h, lv, y in got)                               # downward steps too
        for m in moves[:: max(1, len(moves) // 4)]:
            _check_numerics(cd, m, ins, want, f"{name} ladder move")
    flat = realize(sk, type(d)(tuple((1,) * len(t) for t in d.tiles), d.loc, d.par, d.vec, d.unroll, d.pack),
                   random.Random(0), s.workload_key)
    ups = ladder_moves(sk, flat)
    assert ups and all(sorted(x for t in decisions_of(sk, m).tiles for x in t if x > 1) in ([4], [16]) for m in ups)


def test_unroll_moves_set_each_other_pragma_value_and_compute_right():
    """`unroll_moves`: for each unroll site, the schedule with that site's auto_unroll_max_step set to each other
    value of UNROLL_CHOICES, every other decision kept; valid, distinct, deterministic, computing the right
    values; a sketch without unroll sites gives none."""
    for name in ("dense_bias_relu", "conv2d_bias_relu"):
        sg = _subgraphs(name, "hlo")[0]
        task, cd = _task(sg), sg.workload.compute
        ins, want = _io(sg, 3)
        sketches = generate_sketches(task)
        sk = next(x for x in sketches if x.has_holes and any(site.unroll for site in x.sites))
        s = sample_schedules(sk, task, 7, 1)[0]
        d = decisions_of(sk, s)
        moves = unroll_moves(sk, s)
        sites = [k for k, site in enumerate(sk.sites) if site.unroll]
        assert len(moves) == len(sites) * (len(UNROLL_CHOICES) - 1)
        assert len({m.key for m in moves}) == len(moves) and s.key not in {m.key for m in moves}
        assert [m.key for m in unroll_moves(sk, s)] == [m.key for m in moves]          # deterministic
        got = set()
        for m in moves:
            dm = decisions_of(sk, m)
            assert (dm.tiles, dm.loc, dm.par, dm.vec, dm.pack) == (d.tiles, d.loc, d.par, d.vec, d.pack)
            changed = [k for k in range(len(d.unroll)) if dm.unroll[k] != d.unroll[k]]
            assert len(changed) == 1 and changed[0] in sites
            got.add((changed[0], dm.unroll[changed[0]]))
            check_state(replay(cd, m.steps))
            _check_numerics(cd, m, ins, want, f"{name} unroll move")
        assert got == {(k, u) for k in sites for u in UNROLL_CHOICES if u != d.unroll[k]}
        bare = next((x for x in sketches if not any(site.unroll for site in x.sites)), None)
        if bare is not None:
            assert unroll_moves(bare, sample_schedules(bare, task, 0, 1)[0]) == []


def test_decisions_of_rejects_other_sketches():
    (sg,) = _subgraphs("dense_bias_relu", "hlo")
    task = _task(sg)
    a, b = generate_sketches(task)[:2]
    s = sample_schedules(a, task, 0, 1)[0]
    with pytest.raises(ScheduleError):
        decisions_of(b, s)
    assert crossover(b, s, s) is None and mutate_tile_size(b, s) is None


def test_sampling_speed_dense_bench():
    """About 2048 candidates per search round must take well under a few seconds."""
    (sg,) = _subgraphs("dense_bias_relu", "bench.hlo")
    task = _task(sg)
    sks = [s for s in generate_sketches(task) if s.has_holes]
    t0 = time.perf_counter()
    n = sum(len(sample_schedules(sk, task, 11, 256)) for sk in sks)
    rate = n / (time.perf_counter() - t0)
    print(f"\nsampling (incl. replay validation): {rate:.0f} schedules/s on dense_bias_relu bench")
    assert n >= 400 and rate > 300


# ----------------------------------------------------------------------------- hand-built definitions

def test_inline_and_compute_location_rules_on_hand_built_definitions():
    """The fixtures have no non-output elementwise stage; these do: cheap ones are inlined, an exp read
    by a reduction gets a compute-location site (root, inline or a consumer loop); all samples compute
    right."""
    from tests.null.test_lower import CDS, _inputs

    chain = generate_sketches(CDS["chain"](), TARGET)
    assert chain[0].rules == ("C:elementwise", "B:inline", "A:inline")
    locs = set()
    for name in ("chain", "softmax", "conv"):
        cd = CDS[name]()
        ins = _inputs(cd)
        want = evaluate_compute(cd, ins)
        for sk in generate_sketches(cd, TARGET):
            for s in sample_schedules(sk, None, 5, 3):
                if sk.has_holes:
                    locs |= {x[0] for x in decisions_of(sk, s).loc if x}
                _check_numerics(cd, s, ins, want, f"{name} {sk.rules}")
    assert locs == {"root", "inline", "at"}


@pytest.mark.parametrize("model", ["mlp_train_step", "transformer_block", "layernorm", "conv2d_bias_relu"])
def test_default_like_seeds_on_every_subgraph(model):
    """Every subgraph's search seeds (`default_like` of each sketch) build without error: an elementwise stage
    tiled by tile_fuse has no reduce axis and is no GEMM (this crashed `hlotune tune` on mlp_train_step)."""
    from hlotune.search.space import TaskSpace

    for kind in ("hlo", "bench.hlo"):
        for sg in _subgraphs(model, kind):
            space = TaskSpace(_task(sg))
            for s in space.seeds:
                assert s.workload_key == sg.workload.key
