"""Cost-model features: hand-computed values on a hand-built matmul tile, log scaling, and the fast
(template, numpy) path against the exact LoopFunc path on many schedules of the fixture subgraphs."""

import numpy as np
import pytest

import hlotune
from hlotune.cost_model.fast_features import batch_features, exact_features
from hlotune.cost_model.features import FEATURE_NAMES, NUM_FEATURES, features_of_func, log_scale
from hlotune.cost_model.sampling import factor_variants
from hlotune.ir.expr import Binary, Const, Load, Var
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.loop_ir import BufferDecl, For, ForKind, LoopFunc, Seq, Store
from hlotune.schedule_space.steps import Schedule
from hlotune.target import Target
from tests.conftest import model_path

F32, I = DType.F32, DType.S64
COL = {n: i for i, n in enumerate(FEATURE_NAMES)}


@pytest.fixture(autouse=True)
def _every_structure_gets_a_template(monkeypatch):
    """The fast-path tests below hold few schedules per rfactor structure: let every one have its template (the
    search verifies one only once it was asked for often: `fast_features.RFACTOR_TEMPLATE_MIN_USES`), so they
    check the templates against the exact path, not the exact path against itself."""
    from hlotune.cost_model import fast_features

    monkeypatch.setattr(fast_features, "RFACTOR_TEMPLATE_MIN_USES", 1)


def _v(n):
    return Var(n, I)


def _matmul_func():
    """C[i, j] += A[i, k] * B[k, j] over i < 8, j < 16 (vectorized), k < 32."""
    i, j, k = _v("i"), _v("j"), _v("k")
    upd = Store("C", (i, j), Binary(Op.ADD, Load("C", (i, j), F32),
                                    Binary(Op.MULTIPLY, Load("A", (i, k), F32), Load("B", (k, j), F32), F32), F32))
    body = For(i, Const(0, I), Const(8, I), ForKind.PARALLEL,
               For(k, Const(0, I), Const(32, I), ForKind.SERIAL,
                   For(j, Const(0, I), Const(16, I), ForKind.VECTORIZED, upd)))
    return LoopFunc("mm", (BufferDecl("A", (8, 32), F32), BufferDecl("B", (32, 16), F32)),
                    (BufferDecl("C", (8, 16), F32),), body)


def _raw(x):
    return np.sign(x) * (2.0 ** np.abs(x) - 1.0)


def test_log_scale():
    x = np.array([0.0, 1.0, 3.0, -7.0, 1023.0])
    np.testing.assert_allclose(log_scale(x), [0, 1, 2, -3, 10])


def test_matmul_tile_hand_computed():
    X = features_of_func(_matmul_func(), 0.0)
    assert X.shape == (1, NUM_FEATURES)
    r = _raw(X[0])
    n = 8 * 32 * 16

    def f(name):
        return round(float(r[COL[name]]), 6)

    assert f("float_mad") == pytest.approx(n) and f("float_addsub") == 0 and f("float_mul") == 0
    assert f("vec_len") == 16 and f("vec_pos_innermost") == 1 and f("parallel_prod") == 8
    assert f("parallel_pos_outer") == 1 and f("num_loops") == 3 and f("outer_prod") == pytest.approx(n)
    # buffers by bytes: C (read+write: 2 accesses), then A and B (ties: by name)
    assert f("B0.acc_readwrite") == 1 and f("B0.bytes") == pytest.approx(2 * n * 4)
    assert f("B0.unique_bytes") == pytest.approx(8 * 16 * 4)
    assert f("B0.reuse_loop") == 1 and f("B0.reuse_ct") == pytest.approx(32)       # k does not move C
    assert f("B0.reuse_dis_iter") == pytest.approx(16)
    assert f("B0.stride") == 1 and f("B0.lines") == pytest.approx(2 * n / 16)
    # A[i, k]: j does not move it -> reuse at the innermost loop, stride over k is 1
    assert f("B1.acc_read") == 1 and f("B1.unique_bytes") == pytest.approx(8 * 32 * 4)
    assert f("B1.reuse_ct") == pytest.approx(16) and f("B1.reuse_dis_iter") == pytest.approx(1)
    assert f("B1.stride") == 1
    # B[k, j]: unique 32 x 16, reused across i (outermost)
    assert f("B2.unique_bytes") == pytest.approx(32 * 16 * 4) and f("B2.reuse_ct") == pytest.approx(8)
    assert f("B2.reuse_dis_iter") == pytest.approx(32 * 16)
    assert f("B2.unique_lines") == pytest.approx(32 * 1)


def test_extent_one_loops_change_nothing():
    fn = _matmul_func()
    wrapped = LoopFunc(fn.name, fn.inputs, fn.outputs,
                       For(_v("z"), Const(0, I), Const(1, I), ForKind.SERIAL, fn.body))
    np.testing.assert_array_equal(features_of_func(fn, 0.0), features_of_func(wrapped, 0.0))


_T = Target.host_cpu()


@pytest.mark.parametrize("name,kind", [("dense_bias_relu", "hlo"), ("dense_bias_relu", "bench.hlo"),
                                       ("matmul", "hlo"), ("conv2d_bias_relu", "hlo"), ("batch_matmul", "hlo"),
                                       ("softmax", "hlo"), ("layernorm", "hlo")])
def test_fast_path_equals_exact(name, kind):
    m = hlotune.load_model(model_path(name, kind))
    checked = 0
    for sg in m.frontend.subgraphs:
        cd = sg.workload.compute
        rng = np.random.default_rng(1)
        vs = [Schedule(sg.workload.key, s) for s in factor_variants(cd, default_schedule(cd, _T), rng, 6)]
        for s, fast in zip(vs, batch_features(cd, vs, sg.workload.key)):
            exact = exact_features(cd, s)
            np.testing.assert_allclose(fast, exact, atol=1e-6, err_msg=f"{sg.name} {s.steps}")
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("name,kind,n", [("dense_bias_relu", "hlo", 40), ("dense_bias_relu", "bench.hlo", 24),
                                         ("mlp_train_step", "hlo", 8), ("sin_mul_add", "hlo", 12),
                                         ("softmax", "bench.hlo", 6), ("layernorm", "hlo", 6)])
def test_fast_path_equals_exact_on_sketch_samples(name, kind, n):
    """Random schedules of every sketch (multi-level tiling, packed layouts, fused-then-split elementwise
    loops, unroll pragmas, cache_write, rfactor fallbacks), featurized in one batch, against lowering each."""
    import random

    from hlotune.schedule_space.task import Task
    from hlotune.search.space import TaskSpace, sample_random

    m = hlotune.load_model(model_path(name, kind))
    checked = 0
    for sg in m.frontend.subgraphs:
        w = sg.workload
        space = TaskSpace(Task(w.key, w.compute, _T, 1, sg.name, float(w.flops)))
        scheds = sample_random(space, random.Random(3), n)
        for s, fast in zip(scheds, batch_features(w.compute, scheds, w.key)):
            np.testing.assert_allclose(fast, exact_features(w.compute, s), atol=1e-6, err_msg=f"{sg.name} {s.steps}")
            checked += 1
    assert checked > 0


def test_fused_loop_stride_is_one():
    """max_3[f // 32, f % 32] over a fused loop f: one step moves one element (stride 1, not 1 + 32/32)."""
    f = _v("f")
    st = Store("C", (Binary(Op.DIVIDE, f, Const(32, I), I), Binary(Op.REMAINDER, f, Const(32, I), I)),
               Load("A", (Binary(Op.DIVIDE, f, Const(32, I), I), Binary(Op.REMAINDER, f, Const(32, I), I)), F32))
    fn = LoopFunc("copy", (BufferDecl("A", (8, 32), F32),), (BufferDecl("C", (8, 32), F32),),
                  For(f, Const(0, I), Const(256, I), ForKind.PARALLEL, st))
    r = _raw(features_of_func(fn, 0.0)[0])
    assert round(float(r[COL["B0.stride"]]), 6) == 1 and round(float(r[COL["B1.stride"]]), 6) == 1
    assert float(r[COL["B0.lines"]]) == pytest.approx(256 / 16)


def test_loop_features_hand_computed(monkeypatch):
    """The parallel / vector / innermost-access / unroll / cache-fit columns on the matmul tile, against a
    machine of 2 threads, 512-bit vectors, 1 KiB L1 and 4 KiB L2."""
    from hlotune.cost_model import features

    monkeypatch.setattr(features, "machine", lambda: (2, 512, 1024, 4096))
    r = _raw(features_of_func(_matmul_func(), 0.0)[0])
    n = 8 * 32 * 16

    def f(name):
        return round(float(r[COL[name]]), 6)

    assert f("par_launches") == 1 and f("par_extent") == 8 and f("par_balance") == 1
    assert f("par_work") == pytest.approx(n / 8)
    # j (16 lanes of f32 in 512 bits) is the innermost loop and moves C: vector code; C (read + write) and B
    # contiguous along j, A broadcast
    assert f("vec_ok") == 1 and f("vec_regs") == 1 and f("vec_rem") == 0
    assert (f("vec_contig"), f("vec_bcast"), f("vec_gather")) == (3, 1, 0)
    assert (f("inner_len"), f("inner_contig"), f("inner_bcast"), f("inner_gather")) == (16, 3, 1, 0)
    assert f("unroll_copies") == 1                      # no pragma: the vectorized loop is one copy
    assert f("write_ratio") == pytest.approx(32)       # k revisits every C element
    # footprint inside j: C 64 + A 4 + B 64 bytes (fits 1 KiB); inside k: 64 + 128 + 2048 (fits 4 KiB);
    # the whole nest: 512 + 1024 + 2048 (fits 4 KiB)
    assert f("l1_fit_prod") == 16 and f("l2_fit_prod") == pytest.approx(n)
    # program columns (one statement): n mads; C read + written, A and B read, 4 bytes each
    assert f("prog_statements") == 1 and f("prog_ops") == pytest.approx(n) and f("prog_outer_prod") == pytest.approx(n)
    assert f("prog_bytes") == pytest.approx(4 * n * 4) and f("prog_intensity") == pytest.approx(1 / 16)


def test_program_columns_repeat_in_every_row():
    """A two-statement program (init + update): prog_* columns sum both statements and are equal in both rows."""
    i, k = _v("i"), _v("k")
    init = Store("C", (i,), Const(0.0, F32))
    upd = Store("C", (i,), Binary(Op.ADD, Load("C", (i,), F32), Load("A", (i, k), F32), F32))
    body = For(i, Const(0, I), Const(4, I), ForKind.SERIAL,
               Seq((init, For(k, Const(0, I), Const(8, I), ForKind.SERIAL, upd))))
    fn = LoopFunc("rs", (BufferDecl("A", (4, 8), F32),), (BufferDecl("C", (4,), F32),), body)
    X = features_of_func(fn, 0.0)
    r = _raw(X)
    assert X.shape[0] == 2
    cols = [COL[c] for c in ("prog_statements", "prog_ops", "prog_outer_prod", "prog_bytes", "prog_intensity")]
    np.testing.assert_array_equal(X[0, cols], X[1, cols])
    assert r[0, COL["prog_statements"]] == pytest.approx(2) and r[0, COL["prog_ops"]] == pytest.approx(32)
    assert r[0, COL["prog_outer_prod"]] == pytest.approx(4 + 32)
    assert r[0, COL["prog_bytes"]] == pytest.approx(4 * 4 + (2 * 32 + 32) * 4)     # init writes; update C r/w + A


def test_loop_features_inner_parallel_unroll_gather(monkeypatch):
    """C[z, p, u] = A[u, p] with a parallel p inside a serial z (launched 3 times), u unrolled by the
    pragma (4 <= 8), and A read with stride 5 along u (gathered)."""
    from hlotune.cost_model import features

    monkeypatch.setattr(features, "machine", lambda: (2, 512, 1024, 4096))
    z, p, u = _v("z"), _v("p"), _v("u")
    st = Store("C", (z, p, u), Load("A", (u, p), F32))
    body = For(z, Const(0, I), Const(3, I), ForKind.SERIAL,
               For(p, Const(0, I), Const(5, I), ForKind.PARALLEL,
                   For(u, Const(0, I), Const(4, I), ForKind.SERIAL, st, (("auto_unroll_max_step", 8),))))
    fn = LoopFunc("t", (BufferDecl("A", (4, 5), F32),), (BufferDecl("C", (3, 5, 4), F32),), body)
    r = _raw(features_of_func(fn, 0.0)[0])

    def f(name):
        return round(float(r[COL[name]]), 6)

    assert f("par_launches") == 3 and f("par_extent") == 5
    assert f("par_balance") == pytest.approx(5 / 6) and f("par_work") == pytest.approx(4)
    assert f("vec_ok") == 0 and f("vec_contig") == 0 and f("vec_regs") == 0
    assert (f("inner_len"), f("inner_contig"), f("inner_bcast"), f("inner_gather")) == (4, 1, 0, 1)
    assert f("unroll_copies") == 4 and f("write_ratio") == pytest.approx(1)


def test_fused_loop_reaching_both_halves_has_stride_one():
    """B[((f // 16) % 2) * 16 + f % 16] is B[f % 32]: one step of f moves it by 1 (the fast path's split
    relation says so too), not by 1 + 1."""
    f = _v("f")
    idx = Binary(Op.ADD, Binary(Op.MULTIPLY, Binary(Op.REMAINDER, Binary(Op.DIVIDE, f, Const(16, I), I),
                                                    Const(2, I), I), Const(16, I), I),
                 Binary(Op.REMAINDER, f, Const(16, I), I), I)
    st = Store("C", (f,), Load("B", (idx,), F32))
    fn = LoopFunc("bc", (BufferDecl("B", (32,), F32),), (BufferDecl("C", (64,), F32),),
                  For(f, Const(0, I), Const(64, I), ForKind.SERIAL, st))
    r = _raw(features_of_func(fn, 0.0)[0])
    assert round(float(r[COL["B0.stride"]]), 6) == 1 and round(float(r[COL["B1.stride"]]), 6) == 1


def test_column_panel_pack_regions_need_no_fallback(monkeypatch):
    """The column-panel GEMM (default.py) packs each parallel task's panel of B inside the parallel loop: the
    copy B.pack[j // 32, k, j % 32] is read there over one panel, and bound inference gives it 1 (or
    panel / 32) along j // 32 -- the integer terms of j divided by 32, the ones within one period dropped
    -- not the linearized span 1 + 31/32.  The template expresses it for every tile size (no candidate
    falls back to lowering) and equals lowering each candidate."""
    from hlotune.cost_model import fast_features
    from hlotune.schedule_space.steps import Annotate, ComputeAt, Pack, Reorder, Split

    P, V, U = ForKind.PARALLEL, ForKind.VECTORIZED, ForKind.UNROLLED
    steps = (Pack("param_1", ("dot_general_1",), 1, 32, 0), Split("param_1.pack", "ax2", (4,), True),
             Annotate("param_1.pack", "ax2.1", V), Split("max_3", "i0", (8,), True), Split("max_3", "i1", (32,), True),
             Reorder("max_3", ("i1.0", "i0.0", "i0.1", "i1.1")), Annotate("max_3", "i1.0", P),
             Split("max_3", "i1.1", (32,), True), Annotate("max_3", "i1.1.1", V),
             ComputeAt("dot_general_1", "max_3", "i0.0"), ComputeAt("param_1.pack", "max_3", "i1.0"),
             Split("dot_general_1", "r0", (1,), True), Split("dot_general_1", "i0", (2,), True),
             Split("dot_general_1", "i1", (32, 32), True),
             Reorder("dot_general_1", ("r0.0", "i1.0", "i0.0", "r0.1", "i0.1", "i1.1", "i1.2")),
             Annotate("dot_general_1", "i0.1", U), Annotate("dot_general_1", "i1.1", U),
             Annotate("dot_general_1", "i1.2", V))
    m = hlotune.load_model(model_path("dense_bias_relu", "bench.hlo"))
    sg = next(s for s in m.frontend.subgraphs if s.name == "max.3")
    cd, key = sg.workload.compute, sg.workload.key
    vs = [Schedule(key, s) for s in [steps] + factor_variants(cd, steps, np.random.default_rng(2), 16, max_inner=32)]
    exact = [exact_features(cd, s) for s in vs]
    assert all(x is not None for x in exact)
    pack_sizes = {round(float(_raw(x[0, COL["alloc_size"]]))) for x in exact}
    assert 1024 * 32 * 4 in pack_sizes and len(pack_sizes) > 1        # one panel, and wider ones
    monkeypatch.setattr(fast_features, "exact_features", lambda cd, s: pytest.fail(f"fell back: {s.steps}"))
    for s, fast, ex in zip(vs, batch_features(cd, vs, key + "-panel-test"), exact):
        np.testing.assert_allclose(fast, ex, atol=1e-6, err_msg=f"{s.steps}")


def test_guard_index_and_register_tile_columns(monkeypatch):
    """Feature version 4: a split tail (C[i0 * 4 + i1] over 3 x 4 iterations of a 10-element C: the store is
    guarded in the innermost loop, 12 / 10 padded), a fused loop indexed f // 32, f % 32 (a division along the
    innermost loop in both accesses), and the register tile of the matmul (inside k: 16 accumulators of C, one
    A and 16 B elements loaded)."""
    from hlotune.cost_model import features

    monkeypatch.setattr(features, "machine", lambda: (2, 512, 1024, 4096))
    i0, i1 = _v("i0"), _v("i1")
    flat = Binary(Op.ADD, Binary(Op.MULTIPLY, i0, Const(4, I), I), i1, I)
    st = Store("C", (flat,), Load("A", (flat,), F32))
    fn = LoopFunc("tail", (BufferDecl("A", (10,), F32),), (BufferDecl("C", (10,), F32),),
                  For(i0, Const(0, I), Const(3, I), ForKind.PARALLEL,
                      For(i1, Const(0, I), Const(4, I), ForKind.SERIAL, st)))
    r = _raw(features_of_func(fn, 0.0)[0])
    f = lambda name: round(float(r[COL[name]]), 6)    # noqa: E731
    assert (f("guard_dims"), f("guard_inner"), f("guard_execs")) == (1, 1, 12)
    assert f("pad_ratio") == pytest.approx(12 / 10) and f("idx_div") == 0 and f("rt_elems") == 0

    g = _v("g")
    div, rem = Binary(Op.DIVIDE, g, Const(32, I), I), Binary(Op.REMAINDER, g, Const(32, I), I)
    fn = LoopFunc("copy", (BufferDecl("A", (8, 32), F32),), (BufferDecl("C", (8, 32), F32),),
                  For(g, Const(0, I), Const(256, I), ForKind.PARALLEL,
                      Store("C", (div, rem), Load("A", (div, rem), F32))))
    r = _raw(features_of_func(fn, 0.0)[0])
    assert (f("idx_div"), f("idx_div_inner"), f("guard_dims"), f("pad_ratio")) == (2, 2, 0, 1)

    r = _raw(features_of_func(_matmul_func(), 0.0)[0])
    assert (f("rt_elems"), f("rt_regs"), f("rt_loads")) == (16, 1, 17)
    assert f("rt_inten") == pytest.approx(16 / 17) and f("guard_dims") == 0 and f("idx_div") == 0


def test_batch_grouping_key_and_factor_rows():
    """The batch path groups by `key_and_row` (small-int tokens for the blanked steps): equal keys exactly when the
    structure keys are equal, and the row is what the structure's template reads (the numbers at its refs:
    split factors, or an unroll pragma's value at position -1);
    and the batch path gives the exact path's features."""
    import random

    from hlotune.cost_model.fast_features import Template, key_and_row, structure_key
    from hlotune.schedule_space.task import Task
    from hlotune.search.space import TaskSpace, sample_random

    m = hlotune.load_model(model_path("dense_bias_relu", "hlo"))
    sg = m.frontend.subgraphs[0]
    w = sg.workload
    space = TaskSpace(Task(w.key, w.compute, _T, 1, sg.name, float(w.flops)))
    scheds = sample_random(space, random.Random(7), 30)
    got = [key_and_row(s) for s in scheds]
    for a, (ka, _) in zip(scheds, got):
        for b, (kb, _) in zip(scheds, got):
            assert (ka == kb) == (structure_key(a) == structure_key(b))
    for s, (_, row) in list(zip(scheds, got))[:8]:
        tpl = Template.build(w.compute, s)
        want = [s.steps[i].factors[p] if p >= 0 else s.steps[i].value for i, p in tpl.refs]
        assert row == want
    for s, fast in zip(scheds, batch_features(w.compute, scheds, w.key + "-grouping-test")):
        np.testing.assert_allclose(fast, exact_features(w.compute, s), atol=1e-6, err_msg=f"{s.steps}")


@pytest.mark.parametrize("name,kind", [("mlp_train_step", "hlo"), ("sum_reduce", "hlo"), ("softmax", "hlo")])
def test_rfactor_schedules_fast_path(name, kind):
    """Schedules with an RFactor: the template keeps the splits before it fixed (part of the grouping key) and
    instantiates the rest; features equal the exact path's (including a factor-1 split, whose loops of extent 1
    alone count as no loop), and the template is built for every one of mlp_train_step's and sum_reduce's (a
    softmax row sketch, whose stage is read by consumers of different rank, falls back to lowering)."""
    import random

    from hlotune.cost_model.fast_features import Template, Unsupported, key_and_row
    from hlotune.schedule_space.steps import RFactor, Split
    from hlotune.schedule_space.task import Task
    from hlotune.search.space import TaskSpace, sample_random

    m = hlotune.load_model(model_path(name, kind))
    checked = built = 0
    for sg in m.frontend.subgraphs:
        w = sg.workload
        space = TaskSpace(Task(w.key, w.compute, _T, 1, sg.name, float(w.flops)))
        scheds = [s for s in sample_random(space, random.Random(5), 200)
                  if any(isinstance(x, RFactor) for x in s.steps)][:30]
        for s, fast in zip(scheds, batch_features(w.compute, scheds, w.key + "-rfactor-test")):
            np.testing.assert_allclose(fast, exact_features(w.compute, s), atol=1e-6, err_msg=f"{sg.name} {s.steps}")
            checked += 1
            try:
                tpl = Template.build(w.compute, s)
            except Unsupported:
                continue
            if not tpl.reproduces_representative(s):
                continue
            built += 1
            rf = next(i for i, x in enumerate(s.steps) if isinstance(x, RFactor))
            assert all(i > rf for i, _ in tpl.refs)                 # nothing before the RFactor is instantiated
            row = key_and_row(s)[1]
            assert row == [s.steps[i].factors[p] if p >= 0 else s.steps[i].value for i, p in tpl.refs]
            if any(isinstance(x, Split) for x in s.steps[:rf]):     # the fixed factors are part of the key
                other = [x for x in scheds if key_and_row(x)[0] == key_and_row(s)[0]]
                assert all(x.steps[:rf] == s.steps[:rf] for x in other)
    assert checked > 0
    if name != "softmax":
        assert built == checked


def test_rfactor_templates_wait_for_enough_candidates(monkeypatch):
    """With the search's rule, a plain structure gets its template at its first candidate; an rfactor structure
    whose blanked structure is not yet verified takes the exact path until RFACTOR_TEMPLATE_MIN_USES candidates
    of it (any fixed factors: the test-size sum_reduce's default with its split factors varied) were asked for,
    one batch at a time; then it is verified and templated.  Features equal the exact path's throughout."""
    from hlotune.cost_model import fast_features as ff
    from hlotune.schedule_space.steps import RFactor

    monkeypatch.setattr(ff, "RFACTOR_TEMPLATE_MIN_USES", 4)
    for name, need in (("dense_bias_relu", 1), ("sum_reduce", 4)):
        (sg,) = hlotune.load_model(model_path(name, "hlo")).frontend.subgraphs
        cd, key = sg.workload.compute, sg.workload.key + "-min-uses-test"
        base = default_schedule(cd, _T)
        assert any(isinstance(x, RFactor) for x in base) == (need > 1)
        vs = [Schedule(sg.workload.key, s) for s in factor_variants(cd, base, np.random.default_rng(4), 12)]
        vs = list({repr(s.steps): s for s in vs}.values())[:need + 2]
        assert len(vs) == need + 2
        blanked = ff._blanked(key, vs[0].steps)
        assert all(ff._blanked(key, s.steps) == blanked for s in vs)
        for i, s in enumerate(vs):
            (fast,) = batch_features(cd, [s], key)
            np.testing.assert_allclose(fast, exact_features(cd, s), atol=1e-6, err_msg=f"{name} {s.steps}")
            tkey = (key, ff.key_and_row(s)[0])
            assert (tkey in ff._TEMPLATES) == (i + 1 >= need), (name, i)
            if need > 1:
                assert (blanked in ff._RF_VERDICT) == (i + 1 >= need), (name, i)
