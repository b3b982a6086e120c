"""Loop partitioning of guarded tails (hlotune/codegen/partition.py), compared to the reference:

- hand-built nests with random linear guards (every direction, negative coefficients, conjunctions, else
  branches, hot and cold placements) run in the loop-IR interpreter before and after the pass: identical outputs
  (unwritten elements stay NaN, so a lost or extra store shows);
- random schedules of the fixtures' subgraphs (the sketch sampler draws non-dividing tiles): the same check, and
  the compiled kernels with the pass on and off agree;
- the packed-GEMM block of 133 rows (of 256) that ran 1.7x slower than a 128-row one: after the pass no guard
  is re-tested inside the reduction loop, and the compiled kernel matches numpy.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

import hlotune
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.codegen.partition import partition_tails
from hlotune.ir.expr import INDEX, Binary, Cast, Compare, Const, Var, walk
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.annotate import sample_schedules
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import BufferDecl, For, ForKind, If, LoopFunc, Seq, Store, stmt_children, walk_stmts
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.mutate import _decode, _replaying
from hlotune.schedule_space.simplify import ic
from hlotune.schedule_space.sketch import generate_sketches
from hlotune.schedule_space.task import Task
from hlotune.target import Target
from tests.conftest import MODELS_DIR, model_path

TARGET = Target.host_cpu()
F32 = DType.F32


def _v(name):
    return Var(name, INDEX)


def _lin(rnd, names):
    e = ic(rnd.randint(-6, 6))
    for n in names:
        k = rnd.choice([-3, -2, -1, 1, 2, 3])
        e = Binary(Op.ADD, e, Binary(Op.MULTIPLY, _v(n), ic(k), INDEX), INDEX)
    return e


def _cond(rnd, names):
    c = None
    for _ in range(rnd.choice([1, 1, 2])):
        use = [n for n in names if rnd.random() < 0.7] or names[:1]
        x = Compare(rnd.choice(["LT", "LE", "GT", "GE", "LT", "EQ"]), _lin(rnd, use), ic(rnd.randint(-4, 24)))
        c = x if c is None else Binary(Op.AND, c, x, DType.PRED)
    return c


def _value(names, salt):
    e = ic(salt)
    for k, n in enumerate(names):
        e = Binary(Op.ADD, e, Binary(Op.MULTIPLY, _v(n), ic(7 ** k + 1), INDEX), INDEX)
    return Cast(e, F32)


def _nest(rnd):
    """out[v, w] written under a random guard; an inner loop r (not in the guard) makes it hot when present."""
    lo, n, m = rnd.randint(0, 3), rnd.randint(2, 9), rnd.randint(2, 8)
    hot = rnd.random() < 0.6
    wkind = rnd.choice([ForKind.SERIAL, ForKind.UNROLLED, ForKind.VECTORIZED])
    names = ["v", "w"] if rnd.random() < 0.8 else ["v"]
    idx = (Binary(Op.SUBTRACT, _v("v"), ic(lo), INDEX), _v("w"))
    then = Store("out", idx, _value(["v", "w", "r"] if hot else ["v", "w"], 1))
    other = Store("out", idx, _value(["v", "w"], 1000)) if rnd.random() < 0.3 else None
    inner = For(_v("w"), ic(0), ic(m), wkind, If(_cond(rnd, names), then, other))
    if hot:
        inner = For(_v("r"), ic(0), ic(3), ForKind.SERIAL, inner)
    vkind = rnd.choice([ForKind.SERIAL, ForKind.UNROLLED])
    body = For(_v("v"), ic(lo), ic(n), vkind, inner)
    return LoopFunc("k", (), (BufferDecl("out", (n, m), F32),), body)


def _same(a, b):
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def test_random_guarded_nests_keep_their_meaning():
    rnd = random.Random(7)
    changed = split = 0
    for _ in range(600):
        f = _nest(rnd)
        g = partition_tails(f)
        assert _same(evaluate_loop_func(f, []), evaluate_loop_func(g, [])), f"{f}\n--- partitioned:\n{g}"
        if g is not f:
            changed += 1
            split += isinstance(g.body, Seq)
    assert changed >= 100 and split >= 50, (changed, split)   # the pass acted on many nests, split some


def _hot_guards(f: LoopFunc) -> int:
    """Ifs re-tested inside a loop whose variable their condition does not use, that loop lying inside the
    outermost loop whose variable the condition uses."""
    count = 0

    def visit(s, loops):
        nonlocal count
        if isinstance(s, If):
            names = {n.name for n in walk(s.cond) if isinstance(n, Var)}
            pos = [i for i, x in enumerate(loops) if x.var.name in names]
            count += bool(pos) and any(x.var.name not in names for x in loops[min(pos) + 1:])
        inner = loops + [s] if isinstance(s, For) else loops
        for c in stmt_children(s):
            visit(c, inner)

    visit(f.body, [])
    return count


def _loops(f: LoopFunc) -> int:
    return sum(isinstance(s, For) for s in walk_stmts(f.body))


@pytest.mark.parametrize("model", ["dense_bias_relu", "mlp2", "rmsnorm_swiglu", "conv2d_bias_relu", "batch_matmul"])
def test_sampled_schedules_keep_their_meaning(model, monkeypatch):
    changed = 0
    for sg in hlotune.load_model(model_path(model)).frontend.subgraphs:
        cd = sg.workload.compute
        task = Task(sg.workload.key, cd, TARGET, name=sg.name)
        rng = np.random.default_rng(0)
        ins = [rng.standard_normal(b.shape).astype(b.dtype.np) for b in cd.inputs]
        for sk in generate_sketches(task):
            for s in sample_schedules(sk, task, 1, 10):
                f = lower(cd, s)
                g = partition_tails(f)
                if g is f:
                    continue
                changed += 1
                ref = evaluate_loop_func(f, ins)
                assert _same(ref, evaluate_loop_func(g, ins)), f"{model}/{sg.name}\n{s}"
                outs = []
                for on in ("0", "1"):
                    monkeypatch.setenv("HLOTUNE_LOOP_PARTITION", on)
                    o = [np.zeros(b.shape, b.dtype.np) for b in f.outputs]
                    build_cpu(f, TARGET)(*ins, *o)
                    outs.append(o)
                for x, y, want in zip(*outs, ref):   # on against off; the compiled split nest against the interpreter
                    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5, err_msg=f"{model}/{sg.name}\n{s}")
                    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4, err_msg=f"{model}/{sg.name}\n{s}")
    assert changed >= 1


def _panel_case():
    sg = next(s for s in hlotune.load_model(str(MODELS_DIR / "mlp2" / "mlp2.bench.hlo")).frontend.subgraphs
              if s.name == "max.3")
    cd = sg.workload.compute
    task = Task(sg.workload.key, cd, TARGET, name=sg.name)
    sk = next((k for k in generate_sketches(task) if "gemm_panel" in k.rules), None)
    if sk is None:
        pytest.skip("this host's default schedule for the GEMM is not the packed panel")
    s = sample_schedules(sk, task, 0, 1)[0]
    d = _decode(sk, s)
    (ragged,) = _replaying(sk, s, [replace(d, tiles=((133,), (98,)))])
    return cd, ragged


def test_ragged_gemm_block_loses_its_guard_in_the_reduction_loop(monkeypatch):
    cd, sched = _panel_case()
    f = lower(cd, sched)
    g = partition_tails(f)
    assert _hot_guards(f) >= 1 and _hot_guards(g) == 0, g
    assert _loops(g) <= 2 * _loops(f)          # the split copies the small tile nest only
    rng = np.random.default_rng(1)
    ins = [rng.standard_normal(b.shape).astype(b.dtype.np) for b in cd.inputs]
    x, w, b = ins
    want = np.maximum(x.astype(np.float64) @ w + b, 0)
    monkeypatch.setenv("HLOTUNE_LOOP_PARTITION", "1")
    out = np.zeros(f.outputs[0].shape, np.float32)
    build_cpu(f, TARGET)(*ins, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


def test_the_setting_turns_the_pass_off(monkeypatch):
    from hlotune.codegen.llvm_emit import emit_module
    cd, sched = _panel_case()
    f = lower(cd, sched)
    texts = []
    for on in ("0", "1"):
        monkeypatch.setenv("HLOTUNE_LOOP_PARTITION", on)
        texts.append(str(emit_module(f, "x86_64-unknown-linux-gnu")[0]))
    off, on = texts
    assert off != on
    monkeypatch.setenv("HLOTUNE_LOOP_PARTITION", "0")
    assert str(emit_module(partition_tails(f), "x86_64-unknown-linux-gnu")[0]) == on


def test_decided_guards_and_empty_pieces():
    """A guard true on a prefix and false on the rest only shrinks the loop (no copy); a loop whose guard is
    never true disappears."""
    v, w = _v("v"), _v("w")
    st = Store("out", (v, w), Cast(Binary(Op.ADD, v, w, INDEX), F32))
    # v < 5 over v in [0, 8): for v in [0, 5) without the guard
    shrink = For(v, ic(0), ic(8), ForKind.SERIAL,
                 For(w, ic(0), ic(4), ForKind.SERIAL, If(Compare("LT", v, ic(5)), st)))
    f = LoopFunc("k", (), (BufferDecl("out", (8, 4), F32),), shrink)
    g = partition_tails(f)
    assert isinstance(g.body, For) and g.body.extent == Const(5, INDEX) and not any(
        isinstance(s, If) for s in walk_stmts(g.body))
    assert _same(evaluate_loop_func(f, []), evaluate_loop_func(g, []))
    dead = replace(f, body=replace(shrink, body=For(w, ic(0), ic(4), ForKind.SERIAL,
                                                    If(Compare("GT", v, ic(50)), st))))
    assert partition_tails(dead).body == Seq(())


def test_cuts_fall_where_a_guard_changes_class():
    """The cut points of `k * v + rest < 0` (rest in [rlo, rhi]) against a brute-force classification of each v
    as always true, mixed or always false."""
    from hlotune.codegen.partition import _breaks, _Conjunct
    rnd = random.Random(3)
    for _ in range(3000):
        k = rnd.choice([-5, -3, -2, -1, 1, 2, 3, 7])
        rlo = rnd.randint(-40, 20)
        rhi = rlo + rnd.randint(0, 15)
        lo = rnd.randint(-3, 5)
        hi = lo + rnd.randint(1, 12)
        cls = ["T" if k * x + rhi < 0 else ("F" if k * x + rlo >= 0 else "M") for x in range(lo, hi + 1)]
        want = {lo + i for i in range(1, len(cls)) if cls[i] != cls[i - 1]}
        assert _breaks(_Conjunct(k, rlo, rhi, True), lo, hi) == want, (k, rlo, rhi, lo, hi)
