"""The column-panel GEMM plan of the default schedule (`default._panel_width`, `_panel_tiles`): each parallel task
packs the B panel it reads inside its own loop.  Compiled results against numpy; the plan's shape (where the
packed copy lives) and when it is not used."""

import dataclasses

import numpy as np
import pytest

import hlotune
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default import _gemm_plan, default_schedule
from hlotune.schedule_space.loop_ir import Allocate, For, ForKind, walk_stmts
from hlotune.schedule_space.lower import lower
from hlotune.target import Target

TWO_CORES = dataclasses.replace(Target.host_cpu(), cores=2)
#: the plan depends on the vector width (register count, panel width, k block), so every test runs at both
#: widths whatever the host: an AVX2 host once showed a default outside the sketch that AVX-512 hosts never hit
#: (LLVM splits 512-bit vectors on an AVX2 host, so both widths also build and run everywhere)
WIDTHS = {"avx2": dataclasses.replace(TWO_CORES, vector_bits=256),
          "avx512": dataclasses.replace(TWO_CORES, vector_bits=512)}


def _dot(lhs, rhs, out, lc, rc, lb="", rb="", epilogue=False):
    dims = f"lhs_contracting_dims={{{lc}}}, rhs_contracting_dims={{{rc}}}"
    if lb:
        dims = f"lhs_batch_dims={{{lb}}}, rhs_batch_dims={{{rb}}}, " + dims
    s = lambda t: "f32[" + ",".join(map(str, t)) + "]"   # noqa: E731
    body = [f"  a = {s(lhs)} parameter(0)", f"  b = {s(rhs)} parameter(1)"]
    if epilogue:   # dense + bias + relu: the consumer hosts the dot's tile
        body += [f"  c = {s(out[-1:])} parameter(2)", f"  d = {s(out)} dot(a, b), {dims}",
                 f"  e = {s(out)} broadcast(c), dimensions={{{len(out) - 1}}}", f"  f = {s(out)} add(d, e)",
                 "  z = f32[] constant(0)", f"  zb = {s(out)} broadcast(z), dimensions={{}}",
                 f"  ROOT r = {s(out)} maximum(f, zb)"]
    else:
        body.append(f"  ROOT d = {s(out)} dot(a, b), {dims}")
    return "HloModule m\n\nENTRY main {\n" + "\n".join(body) + "\n}\n"


CASES = {
    "matmul": _dot((256, 512), (512, 512), (256, 512), 1, 0),
    "dense_bias_relu": _dot((128, 256), (256, 512), (128, 512), 1, 0, epilogue=True),
    "batched_own_b": _dot((4, 64, 128), (4, 128, 256), (4, 64, 256), 2, 1, "0", "0"),   # 256 columns: packed on AVX2
    "b_transposed": _dot((128, 256), (512, 256), (128, 512), 1, 1),
}


def _gemm_subgraph(text):
    (sg,) = [s for s in hlotune.load_model(text).frontend.subgraphs if s.workload.flops > 1e6]
    return sg.workload.compute


def _pack_allocs(func):
    """(Allocate of a packed copy, inside a parallel loop?) for each packed copy."""
    out = []

    def visit(s, in_par):
        if isinstance(s, Allocate) and s.buffer.endswith(".pack"):
            out.append((s, in_par))
        if isinstance(s, For):
            in_par = in_par or s.kind is ForKind.PARALLEL
        for c in _children(s):
            visit(c, in_par)
    visit(func.body, False)
    return out


def _children(s):
    for name in ("body", "then", "otherwise"):
        c = getattr(s, name, None)
        if c is None:
            continue
        yield from (c if isinstance(c, tuple) else (c,))


@pytest.mark.parametrize("isa", sorted(WIDTHS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_panel_plan_is_correct_and_packs_inside_the_task(case, isa):
    tgt = WIDTHS[isa]
    cd = _gemm_subgraph(CASES[case])
    red = next(s for s in cd.stages if s.is_reduction)
    plan = _gemm_plan(red, tgt, tgt.vector_bits // 32)
    assert plan is not None and plan.panel and plan.panel % plan.nr == 0
    func = lower(cd, default_schedule(cd, tgt))
    packs = _pack_allocs(func)
    assert packs and all(in_par for _, in_par in packs), "B is packed inside the parallel task"
    (alloc, _), = packs
    k = max(a.extent for a in red.reduce_axes)
    assert int(np.prod(alloc.shape)) == k * plan.panel     # one task's panel, not all of B
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    want = evaluate_compute(cd, args)
    outs = [np.zeros(cd.stage(o).shape, np.float32) for o in cd.outputs]
    build_cpu(func, tgt)(*args, *outs)
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("isa", sorted(WIDTHS))
@pytest.mark.parametrize("text,cores", [
    (_dot((256, 512), (512, 64), (256, 64), 1, 0), 16),             # too few column panels for 16 cores
    (_dot((4, 64, 128), (128, 256), (4, 64, 256), 2, 0), 2),        # B shared by the batch
])
def test_tile_plan_is_kept(text, cores, isa):
    """Tiles of rows and columns, B packed once before them (root), when the column-panel plan does not apply;
    the result still matches."""
    cd = _gemm_subgraph(text)
    red = next(s for s in cd.stages if s.is_reduction)
    tgt = dataclasses.replace(WIDTHS[isa], cores=cores)
    assert _gemm_plan(red, tgt, tgt.vector_bits // 32).panel == 0
    func = lower(cd, default_schedule(cd, tgt))
    assert [in_par for _, in_par in _pack_allocs(func)] == [False]
    assert any(isinstance(s, For) and s.kind is ForKind.PARALLEL for s in walk_stmts(func.body))
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    (want,) = evaluate_compute(cd, args)
    out = np.zeros(want.shape, np.float32)
    build_cpu(func, tgt)(*args, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("isa", sorted(WIDTHS))
def test_gemm_panel_sketch_holds_the_default_and_its_samples_compute_the_dot(isa):
    tgt = WIDTHS[isa]
    from hlotune.schedule_space.annotate import sample_schedules
    from hlotune.schedule_space.sketch import generate_sketches
    from hlotune.schedule_space.steps import Split

    cd = _gemm_subgraph(CASES["dense_bias_relu"])
    (sk,) = [s for s in generate_sketches(cd, tgt) if s.rules == ("gemm_panel",)]
    assert [(h.iter, h.n) for h in sk.tiles] == [("i0", 1), ("r0", 1)]      # row tile, k block
    red = next(s for s in cd.stages if s.is_reduction)
    plan = _gemm_plan(red, tgt, tgt.vector_bits // 32)
    filled = list(sk.steps)
    for h, f in zip(sk.tiles, (plan.tm, plan.kc or red.reduce_axes[-1].extent)):
        filled[h.step] = Split(h.stage, h.iter, (f,))
    assert lower(cd, filled).key == lower(cd, default_schedule(cd, tgt)).key   # the default is a point
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    (want,) = evaluate_compute(cd, args)
    for s in sample_schedules(sk, None, 3, 3):
        out = np.zeros(want.shape, np.float32)
        build_cpu(lower(cd, s.steps), tgt)(*args, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
