"""Row (normalization) fusion: which graphs become one row subgraph (softmax, layernorm, RMS norm, the
attention softmax) and which do not (column reductions, long rows, transposes, dots, the setting off);
the glue module still computes what the original does (HLO interpreter); the default schedule of a row
subgraph computes every statistic at the host's parallel row loop and is right (loop-IR interpreter vs
`evaluate_compute`); every sketch of a row subgraph gives valid, right schedules."""

from __future__ import annotations

import random

import numpy as np
import pytest

import hlotune
from hlotune.ir import fusion
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.ir.fusion import fuse
from hlotune.ir.hlo import Op
from hlotune.ir.interp import evaluate
from hlotune.ir.parser import load_hlo
from hlotune.ir.passes import optimize
from hlotune.schedule_space.annotate import check_state, sample_schedules
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import ForKind
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.mutate import mutate
from hlotune.schedule_space.sketch import generate_sketches
from hlotune.schedule_space.state import replay
from hlotune.schedule_space.task import Task
from hlotune.target import Target
from tests.conftest import model_io, model_path
from tests.null.test_fusion import check_semantics, check_structure, count, module, sub_ops

#: a fixed AVX-512 two-core target (the schedules do not depend on the machine running the tests)
TARGET = Target(kind="cpu", name="skylake-avx512", triple="x86_64-unknown-linux-gnu", cores=2, vector_bits=512)

SOFTMAX = ("  z = f32[] constant(0)\n  ninf = f32[] constant(-inf)\n"
           "  mx = f32[16]{0} reduce(x, ninf), dimensions={1}, to_apply=max_f\n"
           "  bm = f32[16,64]{1,0} broadcast(mx), dimensions={0}\n  s = f32[16,64]{1,0} subtract(x, bm)\n"
           "  e = f32[16,64]{1,0} exponential(s)\n  r = f32[16]{0} reduce(e, z), dimensions={1}, to_apply=add_f\n"
           "  b = f32[16,64]{1,0} broadcast(r), dimensions={0}\n  ROOT d = f32[16,64]{1,0} divide(e, b)")


def _program(name: str, kind: str = "hlo"):
    return fuse(optimize(load_hlo(model_path(name, kind))))


def _reduces(sg) -> int:
    return sum(i.op is Op.REDUCE for i in sg.computation)


@pytest.mark.parametrize("kind", ["hlo", "bench.hlo"])
def test_softmax_is_one_subgraph(kind):
    p = _program("softmax", kind)
    check_structure(p)
    (sg,) = p.subgraphs
    assert sg.kind == "input" and _reduces(sg) == 2 and {Op.EXP, Op.DIVIDE} <= sub_ops(sg)
    assert _broadcasts_own_reduce(sg)


def test_layernorm_is_one_subgraph_and_matches_jax():
    m = optimize(load_hlo(model_path("layernorm")))
    p = fuse(m)
    check_structure(p)
    (sg,) = p.subgraphs
    assert _reduces(sg) == 2 and Op.SQRT in sub_ops(sg)
    args, outs = model_io("layernorm")
    np.testing.assert_allclose(evaluate(p.module, args)[0], outs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["rmsnorm_swiglu", "transformer_block", "mlp2"])
def test_norm_inside_a_model_is_one_subgraph_without_dots(name):
    m = optimize(load_hlo(model_path(name)))
    p = fuse(m)
    check_structure(p)
    n_dots = sum(i.op is Op.DOT for i in m.entry_computation)
    assert count(p, {Op.DOT}) == n_dots                             # no dot duplicated
    assert all(sum(i.op is Op.DOT for i in s.computation) <= 1 for s in p.subgraphs)
    rows = [s for s in p.subgraphs if Op.REDUCE in sub_ops(s)]
    assert len(rows) == 1 and Op.DOT not in sub_ops(rows[0])      # the whole normalization, no dot
    args, outs = model_io(name)
    for got, want in zip(evaluate(p.module, args), outs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_reduce_feeding_a_reduce_along_the_row_fuses():
    m = module("  z = f32[] constant(0)\n  r1 = f32[16]{0} reduce(x, z), dimensions={1}, to_apply=add_f\n"
               "  b = f32[16,64]{1,0} broadcast(r1), dimensions={0}\n  s = f32[16,64]{1,0} subtract(x, b)\n"
               "  r2 = f32[16]{0} reduce(s, z), dimensions={1}, to_apply=max_f\n  ROOT o = f32[16]{0} negate(r2)")
    p = fuse(m)
    check_structure(p)
    (sg,) = p.subgraphs
    assert _reduces(sg) == 2 and Op.NEGATE in sub_ops(sg)
    check_semantics(m, p)


def test_softmax_with_row_vectors_and_rank3_rows():
    m = module("  z = f32[] constant(0)\n  g = f32[64]{0} parameter(1)\n"
               "  r = f32[4,16]{1,0} reduce(x, z), dimensions={2}, to_apply=add_f\n"
               "  b = f32[4,16,64]{2,1,0} broadcast(r), dimensions={0,1}\n"
               "  gb = f32[4,16,64]{2,1,0} broadcast(g), dimensions={2}\n"
               "  s = f32[4,16,64]{2,1,0} subtract(x, b)\n  ROOT o = f32[4,16,64]{2,1,0} multiply(s, gb)",
               params="x = f32[4,16,64]{2,1,0} parameter(0)")
    p = fuse(m)
    check_structure(p)
    assert len(p.subgraphs) == 1
    check_semantics(m, p)


@pytest.mark.parametrize("case", ["off", "column", "long_row", "transpose", "full"])
def test_what_does_not_row_fuse(case, monkeypatch):
    body = SOFTMAX
    params = "x = f32[16,64]{1,0} parameter(0)"
    if case == "off":
        monkeypatch.setenv("HLOTUNE_ROW_FUSION", "0")
    elif case == "column":      # a reduction over the major dim, read back along it
        body = ("  z = f32[] constant(0)\n  r = f32[64]{0} reduce(x, z), dimensions={0}, to_apply=add_f\n"
                "  b = f32[16,64]{1,0} broadcast(r), dimensions={1}\n  e = f32[16,64]{1,0} exponential(x)\n"
                "  r2 = f32[64]{0} reduce(e, z), dimensions={0}, to_apply=add_f\n"
                "  b2 = f32[16,64]{1,0} broadcast(r2), dimensions={1}\n  s = f32[16,64]{1,0} subtract(b2, b)\n"
                "  ROOT d = f32[16,64]{1,0} divide(e, s)")
    elif case == "long_row":
        monkeypatch.setattr(fusion, "ROW_FUSION_MAX_BYTES", 64 * 4 - 4)
    elif case == "transpose":   # the statistic is read across rows
        body = ("  z = f32[] constant(0)\n  r = f32[64]{0} reduce(x, z), dimensions={1}, to_apply=add_f\n"
                "  b = f32[64,64]{1,0} broadcast(r), dimensions={0}\n  t = f32[64,64]{1,0} transpose(b), "
                "dimensions={1,0}\n  r2 = f32[64]{0} reduce(t, z), dimensions={1}, to_apply=add_f\n"
                "  ROOT o = f32[64]{0} negate(r2)")
        params = "x = f32[64,64]{1,0} parameter(0)"
    elif case == "full":        # a reduction to a scalar is not a row reduction
        body = ("  z = f32[] constant(0)\n  r = f32[] reduce(x, z), dimensions={0,1}, to_apply=add_f\n"
                "  b = f32[16,64]{1,0} broadcast(r), dimensions={}\n  e = f32[16,64]{1,0} exponential(x)\n"
                "  r2 = f32[] reduce(e, z), dimensions={0,1}, to_apply=add_f\n"
                "  b2 = f32[16,64]{1,0} broadcast(r2), dimensions={}\n  ROOT d = f32[16,64]{1,0} divide(b2, b)")
    m = module(body, params)
    p = fuse(m)
    check_structure(p)
    assert len(p.subgraphs) >= 2 and not any(_broadcasts_own_reduce(s) for s in p.subgraphs)
    check_semantics(m, p)


def _broadcasts_own_reduce(sg) -> bool:
    """A reduce result broadcast to a larger shape inside the same subgraph (what only row fusion does)."""
    comp = sg.computation
    red = {i.name for i in comp if i.op is Op.REDUCE}
    seen = set(red)
    for i in comp:   # topological order: follow reshapes / elementwise of the statistics
        if i.operands and any(o in seen for o in i.operands):
            if i.op is Op.BROADCAST and i.array_shape.size > comp[i.operands[0]].array_shape.size:
                return True
            seen.add(i.name)
    return False


def test_dot_never_joins_a_row_subgraph():
    m = module("  w = f32[64,64]{1,0} parameter(1)\n"
               "  dd = f32[16,64]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
               + SOFTMAX.replace("(x, ninf)", "(dd, ninf)").replace("subtract(x, bm)", "subtract(dd, bm)"))
    p = fuse(m)
    check_structure(p)
    assert all(not (Op.DOT in sub_ops(s) and Op.REDUCE in sub_ops(s)) for s in p.subgraphs)
    assert sum(_reduces(s) == 2 for s in p.subgraphs) == 1
    check_semantics(m, p)


# ----------------------------------------------------------------------------- schedules

def _row_subgraph(text: str):
    (sg,) = hlotune.load_model(text).frontend.subgraphs
    return sg


def _text(rows: int, row: int) -> str:
    return (f"HloModule t\n\nadd_f {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
            f"  ROOT s = f32[] add(a, b)\n}}\n"
            f"max_f {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] maximum(a, b)\n}}\n"
            f"\nENTRY main {{\n  x = f32[{rows},{row}]{{1,0}} parameter(0)\n"
            + SOFTMAX.replace("[16,64]", f"[{rows},{row}]").replace("[16]", f"[{rows}]") + "\n}\n")


def _check_numerics(sg, steps, seed=0):
    cd = sg.workload.compute
    rng = np.random.default_rng(seed)
    n = len(sg.computation.parameters)
    args = [rng.standard_normal(b.shape).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    ins = args + [consts[b.name] for b in cd.inputs[n:]]
    want = evaluate_compute(cd, args)
    got = evaluate_loop_func(lower(cd, steps), ins)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,row", [(8, 64), (6, 48), (4, 1024), (32, 10)])
def test_default_schedule_computes_statistics_per_row(rows, row):
    sg = _row_subgraph(_text(rows, row))
    cd = sg.workload.compute
    steps = default_schedule(cd, TARGET)
    state = replay(cd, steps)
    (host,) = cd.outputs
    if row % 4 == 0:   # a vectorizable row: every other stage is computed at the host's row loop
        for st in state.stages:
            if st.name != host:
                assert st.attach.kind == "at", (st.name, st.attach)
        assert state.stage(host).iters[0].kind in (ForKind.PARALLEL, ForKind.SERIAL)
        assert any(it.kind is ForKind.VECTORIZED for st in state.stages for it in st.iters)
    _check_numerics(sg, steps)


def test_default_schedule_is_parallel_over_rows_at_bench_size():
    sg = _row_subgraph(_text(4096, 1024))
    cd = sg.workload.compute
    state = replay(cd, default_schedule(cd, TARGET))
    host = state.stage(cd.outputs[0])
    assert host.iters[0].kind is ForKind.PARALLEL
    loops = [it for st in state.stages for it in st.iters if it.kind is ForKind.PARALLEL]
    assert len(loops) == 1


def test_every_sketch_of_a_row_subgraph_gives_right_schedules():
    sg = _row_subgraph(_text(8, 64))
    cd = sg.workload.compute
    task = Task(sg.workload.key, cd, TARGET, name=sg.name)
    sketches = generate_sketches(task)
    assert any(s.rules == ("default",) for s in sketches)
    (row,) = [s for s in sketches if s.rules[0].endswith(":row")]
    assert row.tiles and all(r.endswith(":row_member") for r in row.rules[1:])
    rng = random.Random(2)
    children = 0
    for k, sk in enumerate(sketches):
        for s in sample_schedules(sk, task, k, 3):
            check_state(replay(cd, s))
            _check_numerics(sg, s.steps, k)
            if sk is row:   # the search can tune it: the statistics stay at the host's row loop
                state = replay(cd, s)
                assert all(st.attach.kind == "at" for st in state.stages if st.name != cd.outputs[0])
                child = mutate(sk, s, rng)
                if child is not None:
                    children += 1
                    check_state(replay(cd, child))
                    _check_numerics(sg, child.steps, k)
    assert children
