"""Issue-3 property test (its item 6), run through the sketch sampler of issue 6: for every fused
subgraph of every fixture, many random legal schedules (random splits with non-divisible factors,
reorders, fuse, vectorize of several widths, unroll pragmas, parallel, compute_at at several levels,
cache_write, rfactor) compile with the LLVM CPU backend and agree with the algorithm's numpy evaluation
(`evaluate_compute`; NaN positions must match).  Mutated and crossed-over children are compiled too.
The sampler's coverage of those features is asserted at the end (so the property keeps its teeth)."""

from __future__ import annotations

import random
from functools import cache

import numpy as np
import pytest

import hlotune
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.annotate import sample_schedules
from hlotune.schedule_space.loop_ir import ForKind
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.mutate import crossover, mutate
from hlotune.schedule_space.sketch import generate_sketches
from hlotune.schedule_space.state import replay
from hlotune.schedule_space.steps import CacheWrite, RFactor
from hlotune.schedule_space.task import Task
from hlotune.target import Target
from tests.conftest import MODEL_NAMES, model_path

TARGET = Target.host_cpu()
PER_SUBGRAPH = 8   # sampled schedules compiled per subgraph (spread over its sketches), plus children
COVERAGE: dict = {"nondiv": 0, "widths": set(), "at_levels": set(), "cache_write": 0, "rfactor": 0,
                  "parallel": 0, "unroll": set(), "compiled": 0}


@cache
def _distinct():
    out, seen = [], set()
    for name in MODEL_NAMES:
        for sg in hlotune.load_model(model_path(name)).frontend.subgraphs:
            if sg.workload.key not in seen:
                seen.add(sg.workload.key)
                out.append((f"{name}/{sg.name}", sg))
    return tuple(out)


def _note(task, sk, s) -> None:
    state = replay(task.compute, s)
    for h in sk.tiles:
        COVERAGE["nondiv"] += h.extent % int(np.prod(s.steps[h.step].factors)) != 0
    for st in state.stages:
        for it in st.iters:
            if it.kind is ForKind.VECTORIZED:
                COVERAGE["widths"].add(it.extent)
            COVERAGE["parallel"] += it.kind is ForKind.PARALLEL
            COVERAGE["unroll"] |= {v for name, v in it.pragmas if name == "auto_unroll_max_step"}
        if st.attach.kind == "at":
            COVERAGE["at_levels"].add(state.stage(st.attach.stage).iter_pos(st.attach.iter))
    COVERAGE["cache_write"] += any(isinstance(x, CacheWrite) for x in s.steps)
    COVERAGE["rfactor"] += any(isinstance(x, RFactor) for x in s.steps)


def _run(cd, sched, ins):
    f = lower(cd, sched)
    outs = [np.zeros(o.shape, o.dtype.np) for o in f.outputs]
    build_cpu(f, TARGET)(*ins, *outs)
    return outs


@pytest.mark.parametrize("label,sg", _distinct(), ids=[x for x, _ in _distinct()])
def test_random_sketch_schedules_compile_and_agree(label, sg):
    cd = sg.workload.compute
    task = Task(sg.workload.key, cd, TARGET, name=sg.name)
    n = len(sg.computation.parameters)
    rng = np.random.default_rng(0)
    args = [(rng.standard_normal(b.shape) * 2).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    ins = args + [consts[b.name] for b in cd.inputs[n:]]
    want = evaluate_compute(cd, args)
    sks = generate_sketches(task)
    holed = [s for s in sks if s.has_holes]
    per = max(1, PER_SUBGRAPH // max(1, len(holed)))
    rnd = random.Random(label)
    cases = [(sks[-1], s) for s in sample_schedules(sks[-1], task, 0, 1)]
    for k, sk in enumerate(holed):
        ss = sample_schedules(sk, task, rnd.randrange(1 << 30), per + 1)
        cases += [(sk, s) for s in ss[:per]]
        if len(ss) >= 2 and k < 2:
            for child in (mutate(sk, ss[0], rnd), crossover(sk, ss[0], ss[-1], rnd)):
                if child is not None:
                    cases.append((sk, child))
    for sk, s in cases:
        _note(task, sk, s)
        got = _run(cd, s, ins)
        COVERAGE["compiled"] += 1
        for w, g in zip(want, got):
            assert np.array_equal(np.isnan(w), np.isnan(g)), f"{label}: NaN positions differ\n{s}"
            ok = ~np.isnan(w)
            np.testing.assert_allclose(g[ok], w[ok], rtol=2e-4, atol=2e-4, err_msg=f"{label} {sk.rules}\n{s}")


def test_property_covers_the_schedule_features():
    """Runs after the parametrized cases (same module): the compiled samples exercised every feature."""
    if COVERAGE["compiled"] < 100:
        pytest.skip("run with the whole module")
    assert COVERAGE["nondiv"] >= 20
    assert {2, 4, 8, 16} <= COVERAGE["widths"]
    assert len(COVERAGE["at_levels"]) >= 4
    assert COVERAGE["cache_write"] >= 20 and COVERAGE["rfactor"] >= 20 and COVERAGE["parallel"] >= 50
    assert COVERAGE["unroll"] == {0, 16, 64, 512}
