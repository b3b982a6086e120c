"""Compute definitions of fused subgraphs, evaluated with numpy, against the HLO interpreter."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from hlotune.errors import UnsupportedError
from hlotune.ir.compute import bounds, compute_definition, constant_values, simplify_index
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.ir.expr import INDEX, Const, Var
from hlotune.ir.fusion import fuse
from hlotune.ir.hlo import DType, Op
from hlotune.ir.interp import evaluate_computation
from hlotune.ir.parser import parse_hlo
from hlotune.ir.passes import optimize

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
NAMES = sorted(p.name for p in MODELS.iterdir() if p.is_dir())
#: skip the numeric comparison of subgraphs with more work than this (points over all stages)
MAX_WORK = 3e6


def _random_args(comp, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for p in comp.parameters:
        s = p.shape
        if s.dtype is DType.PRED:
            out.append(rng.random(s.dims) < 0.5)
        elif s.dtype.is_int:
            out.append(rng.integers(-7, 8, size=s.dims).astype(s.dtype.np))
        else:
            out.append(rng.standard_normal(s.dims).astype(s.dtype.np))
    return out


def _work(cd) -> int:
    return sum(math.prod(s.shape) * math.prod(a.extent for a in s.reduce_axes) for s in cd.stages)


def check(comp, module, seed: int = 0, max_work: float = float("inf")):
    """Build, evaluate on random inputs, compare with the interpreter; returns the ComputeDef."""
    cd = compute_definition(comp, module)
    if _work(cd) > max_work:
        return cd
    args = _random_args(comp, seed)
    ref = evaluate_computation(module, comp, args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    got = evaluate_compute(cd, args)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
        if r.dtype.kind == "f":
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=str(cd))
        else:
            np.testing.assert_array_equal(g, r, err_msg=str(cd))
    return cd


def _fusion_computations(module):
    called = {i.attr("calls") for c in module.computations for i in c if i.op is Op.FUSION}
    return [c for c in module.computations if c.name in called]


# ----------------------------------------------------------------------------- fixtures

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("suffix", [".opt.hlo", ".bench.gpu.opt.hlo"])
def test_xla_fusions(name, suffix):
    """XLA's own fusion computations of the optimized fixtures."""
    m = parse_hlo((MODELS / name / f"{name}{suffix}").read_text())
    comps = _fusion_computations(m)
    assert comps or "gpu" in suffix  # a lone cuBLAS custom-call has no fusion
    for c in comps:
        check(c, m, max_work=MAX_WORK)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("suffix", [".hlo", ".bench.hlo"])
def test_hlotune_fusions(name, suffix):
    """optimize + fuse of the JAX-written fixtures, every subgraph."""
    prog = fuse(optimize(parse_hlo((MODELS / name / f"{name}{suffix}").read_text())))
    assert prog.subgraphs
    for sg in prog.subgraphs:
        check(sg.computation, prog.module, max_work=MAX_WORK)


# ----------------------------------------------------------------------------- snippets

ADD = "add_c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)\n}\n"
MAX = "max_c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] maximum(a, b)\n}\n"
GENERAL = ("gen_c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ab = f32[] abs(b)\n"
           "  h = f32[] constant(0.5)\n  m = f32[] multiply(a, h)\n  ROOT r = f32[] add(m, ab)\n}\n")


def snippet(body: str, extra: str = ""):
    m = parse_hlo(f"HloModule t\n\n{extra}\nENTRY e {{\n{body}\n}}\n")
    return m.entry_computation, m


def run_snippet(body: str, extra: str = "", seed: int = 0):
    comp, m = snippet(body, extra)
    return check(comp, m, seed)


SNIPPETS = {
    "pad_negative_interior": """
  p0 = f32[3,4] parameter(0)
  p1 = f32[] parameter(1)
  ROOT r = f32[6,5] pad(p0, p1), padding=-1_2_1x2_-1_0""",
    "pad_interior_both": """
  p0 = f32[3,2] parameter(0)
  c = f32[] constant(-2)
  ROOT r = f32[10,5] pad(p0, c), padding=1_2_2x0_1_2""",
    "concatenate": """
  p0 = f32[2,3] parameter(0)
  p1 = f32[2,1] parameter(1)
  p2 = f32[2,4] parameter(2)
  ROOT r = f32[2,8] concatenate(p0, p1, p2), dimensions={1}""",
    "reverse_slice_transpose": """
  p0 = f32[4,6,3] parameter(0)
  r = f32[4,6,3] reverse(p0), dimensions={0,2}
  s = f32[2,3,3] slice(r), slice={[1:4:2], [0:6:2], [0:3]}
  ROOT t = f32[3,2,3] transpose(s), dimensions={2,0,1}""",
    "reshape_split_merge": """
  p0 = f32[6,4] parameter(0)
  a = f32[2,3,2,2] reshape(p0)
  b = f32[3,2,2,2] transpose(a), dimensions={1,0,3,2}
  ROOT c = f32[12,2] reshape(b)""",
    "bitcast_layout": """
  p0 = f32[4,6]{1,0} parameter(0)
  ROOT b = f32[6,4]{0,1} bitcast(p0)""",
    "broadcast_iota_convert_compare_select_clamp": """
  p0 = f32[5] parameter(0)
  p1 = f32[3,5] parameter(1)
  b = f32[3,5] broadcast(p0), dimensions={1}
  i = s32[3,5] iota(), iota_dimension=0
  f = f32[3,5] convert(i)
  c = pred[3,5] compare(p1, f), direction=GT
  s = f32[3,5] select(c, b, p1)
  lo = f32[] constant(-0.5)
  hi = f32[] constant(0.5)
  ROOT k = f32[3,5] clamp(lo, s, hi)""",
    "int_div_rem": """
  p0 = s32[4,5] parameter(0)
  p1 = s32[4,5] parameter(1)
  d = s32[4,5] divide(p0, p1)
  r = s32[4,5] remainder(p0, p1)
  ROOT a = s32[4,5] add(d, r)""",
    "dynamic_slice_update": """
  p0 = f32[6,5] parameter(0)
  i = s32[] parameter(1)
  j = s32[] parameter(2)
  u = f32[2,2] parameter(3)
  d = f32[3,2] dynamic-slice(p0, i, j), dynamic_slice_sizes={3,2}
  ROOT w = f32[6,5] dynamic-update-slice(p0, u, j, i)""",
    "gather_rows": """
  p0 = f32[10,4] parameter(0)
  ix = s32[3] parameter(1)
  ROOT g = f32[3,4] gather(p0, ix), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0},"""
    " index_vector_dim=1, slice_sizes={1,4}",
    "array_constant": """
  p0 = f32[2,3] parameter(0)
  c = f32[2,3] constant({ {1, 2, 3}, {4, 5, 6} })
  ROOT a = f32[2,3] multiply(p0, c)""",
    "dot_batch_two_contracting": """
  p0 = f32[2,3,4,5] parameter(0)
  p1 = f32[2,5,4,6] parameter(1)
  ROOT d = f32[2,3,6] dot(p0, p1), lhs_batch_dims={0}, lhs_contracting_dims={2,3}, rhs_batch_dims={0},"""
    " rhs_contracting_dims={2,1}",
    "dot_mixed_types": """
  p0 = s32[3,4] parameter(0)
  p1 = f32[4,2] parameter(1)
  c = f32[3,4] convert(p0)
  ROOT d = f32[3,2] dot(c, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}""",
}


@pytest.mark.parametrize("key", sorted(SNIPPETS))
def test_snippet(key):
    run_snippet(SNIPPETS[key], seed=hash(key) % 1000)


def test_dynamic_slice_with_parameter_offsets_clamps():
    body = """
  p0 = f32[6,5] parameter(0)
  i = s32[] parameter(1)
  j = s32[] parameter(2)
  ROOT d = f32[3,2] dynamic-slice(p0, i, j), dynamic_slice_sizes={3,2}"""
    comp, m = snippet(body)
    cd = compute_definition(comp, m)
    x = np.arange(30, dtype=np.float32).reshape(6, 5)
    for i, j in [(0, 0), (2, 1), (9, -4), (-3, 7)]:
        got = evaluate_compute(cd, [x, np.int32(i), np.int32(j)])[0]
        ii, jj = min(max(i, 0), 3), min(max(j, 0), 3)
        np.testing.assert_array_equal(got, x[ii:ii + 3, jj:jj + 2])


def test_reduce_window_padding_stride_dilation():
    body = """
  p0 = f32[7,6] parameter(0)
  c = f32[] constant(-inf)
  ROOT r = f32[4,4] reduce-window(p0, c), window={size=3x2 stride=2x2 pad=1_1x1_2 rhs_dilate=1x2}, to_apply=max_c"""
    cd = run_snippet(body, MAX)
    assert cd.stages[-1].reducer.op is Op.MAXIMUM
    body = """
  p0 = f32[4,3] parameter(0)
  c = f32[] constant(0.25)
  ROOT r = f32[4,5] reduce-window(p0, c), window={size=3x2 stride=2x1 pad=1_2x0_1 lhs_dilate=2x2}, to_apply=add_c"""
    run_snippet(body, ADD)


def test_reduce_window_parameter_init():
    body = """
  p0 = f32[8,6] parameter(0)
  p1 = f32[] parameter(1)
  ROOT r = f32[4,6] reduce-window(p0, p1), window={size=2x1 stride=2x1}, to_apply=add_c"""
    cd = run_snippet(body, ADD)
    assert [s.name for s in cd.stages] == ["r_red", "r"]


@pytest.mark.parametrize("conv", [
    # stride, padding, rhs dilation, NHWC / HWIO
    ("f32[2,7,6,3]", "f32[3,2,3,4]", "f32[2,4,3,4]",
     "window={size=3x2 stride=2x2 pad=1_1x0_1 rhs_dilate=1x2}, dim_labels=b01f_01io->b01f"),
    # feature groups, NCHW / OIHW, lhs dilation, reversal
    ("f32[1,4,3,3]", "f32[6,2,2,2]", "f32[1,6,6,4]",
     "window={size=2x2 pad=1_1x0_0 lhs_dilate=2x2 rhs_reversal=1x0}, dim_labels=bf01_oi01->bf01, "
     "feature_group_count=2"),
    # 1-D, odd labels
    ("f32[5,2,3]", "f32[3,2,4]", "f32[4,7,3]",
     "window={size=3 stride=1 pad=2_2}, dim_labels=0fb_0io->f0b"),
])
def test_convolution(conv):
    x, w, out, attrs = conv
    body = f"""
  p0 = {x} parameter(0)
  p1 = {w} parameter(1)
  ROOT c = {out} convolution(p0, p1), {attrs}"""
    cd = run_snippet(body)
    assert cd.stages[0].reducer.op is Op.ADD


def test_general_combiner():
    body = """
  p0 = f32[3,5] parameter(0)
  c = f32[] constant(1)
  ROOT r = f32[3] reduce(p0, c), dimensions={1}, to_apply=gen_c"""
    cd = run_snippet(body, GENERAL)
    red = cd.stages[-1].reducer
    assert red.op is None and red.combiner is not None


def test_known_combiners():
    for op, dt, init in [("multiply", "f32", "1"), ("minimum", "f32", "inf"), ("and", "pred", "true"),
                         ("or", "s32", "0")]:
        comb = (f"c_{op} {{\n  a = {dt}[] parameter(0)\n  b = {dt}[] parameter(1)\n"
                f"  ROOT r = {dt}[] {op}(b, a)\n}}\n")
        body = f"""
  p0 = {dt}[4,3] parameter(0)
  c = {dt}[] constant({init})
  ROOT r = {dt}[3] reduce(p0, c), dimensions={{0}}, to_apply=c_{op}"""
        cd = run_snippet(body, comb)
        assert cd.stages[-1].reducer.op is Op(op)


def test_multi_output_and_shared_transcendental():
    body = """
  p0 = f32[4,5] parameter(0)
  e = f32[4,5] exponential(p0)
  a = f32[4,5] add(e, p0)
  m = f32[4,5] multiply(e, e)
  c = f32[] constant(0)
  s = f32[4] reduce(m, c), dimensions={1}, to_apply=add_c
  ROOT t = (f32[4,5], f32[4], f32[4,5], f32[4,5], f32[4]) tuple(a, s, p0, a, s)"""
    cd = run_snippet(body, ADD)
    names = [s.name for s in cd.stages]
    assert "e" in names  # exp has two users: materialized, not recomputed
    assert len(cd.outputs) == 5 and len(set(cd.outputs)) == 5  # copies for the repeats and the parameter


def test_cheap_multi_user_is_inlined():
    body = """
  p0 = f32[4,5] parameter(0)
  n = f32[4,5] negate(p0)
  a = f32[4,5] add(n, p0)
  ROOT m = f32[4,5] multiply(n, a)"""
    cd = run_snippet(body)
    assert [s.name for s in cd.stages] == ["m"]


def test_array_constant_is_an_input_buffer():
    comp, m = snippet(SNIPPETS["array_constant"])
    cd = compute_definition(comp, m)
    assert [b.name for b in cd.inputs] == ["p0", "const_0"]
    np.testing.assert_array_equal(constant_values(cd)["const_0"], [[1, 2, 3], [4, 5, 6]])


def test_variadic_reduce_is_unsupported():
    comb = ("arg {\n  a = f32[] parameter(0)\n  b = s32[] parameter(1)\n  c = f32[] parameter(2)\n"
            "  d = s32[] parameter(3)\n  ROOT t = (f32[], s32[]) tuple(a, b)\n}\n")
    body = """
  p0 = f32[4,3] parameter(0)
  p1 = s32[4,3] parameter(1)
  c = f32[] constant(0)
  z = s32[] constant(0)
  ROOT r = (f32[3], s32[3]) reduce(p0, p1, c, z), dimensions={0}, to_apply=arg"""
    comp, m = snippet(body, comb)
    with pytest.raises(UnsupportedError, match="r"):
        compute_definition(comp, m)


def test_readable_definitions():
    comp, m = snippet(SNIPPETS["reshape_split_merge"])
    text = str(compute_definition(comp, m))
    assert "* 1)" not in text and "+ 0)" not in text
    comp, m = snippet(SNIPPETS["dot_batch_two_contracting"])
    st = compute_definition(comp, m).stages[0]
    assert [a.name for a in st.axes] == ["i0", "i1", "i2"] and [a.name for a in st.reduce_axes] == ["r0", "r1"]
    assert str(st.body) == "(p0[i0, i1, r0, r1] * p1[i0, r1, r0, i2])"


def test_simplify_index():
    i, j = Var("i", INDEX), Var("j", INDEX)
    ext = {"i": 5, "j": 4}
    assert str(simplify_index((i * 4 + j) // 4, ext)) == "i"
    assert str(simplify_index((i * 4 + j) % 4, ext)) == "j"
    assert str(simplify_index(i * 1 + 0, ext)) == "i"
    assert str(simplify_index((i * 8 + j * 2) // 2, ext)) == "((i * 4) + j)"
    assert str(simplify_index(Const(3, INDEX) * 4 - 2, ext)) == "10"
    assert bounds(simplify_index((i + 3) % 2, ext), ext) == (0, 1)
    # unknown sign: kept
    assert "/" in str(simplify_index((i - 2) // 2, ext))


@pytest.mark.parametrize("name,suffix", [("matmul", "hlo"), ("batch_matmul", "hlo"), ("mlp_train_step", "hlo"),
                                         ("dense_bias_relu", "hlo"), ("transformer_block", "hlo")])
def test_dot_fast_path_equals_grid_path(name, suffix, monkeypatch):
    """Dot-like stages are evaluated by one float64 einsum; the grid path (exact float64 products, float64 sum)
    gives the same float32 results, and the fast path is taken for at least one stage of every such model."""
    import hlotune.ir.compute_eval as ce

    prog = fuse(optimize(parse_hlo((MODELS / name / f"{name}.{suffix}").read_text())))
    taken = []
    orig = ce._sum_of_products

    def spy(stage, bufs):
        out = orig(stage, bufs)
        taken.append(out is not None)
        return out

    for sg in prog.subgraphs:
        comp = sg.computation
        cd = compute_definition(comp, prog.module)
        if _work(cd) > 3e7:
            continue
        args = _random_args(comp, 1)
        monkeypatch.setattr(ce, "_sum_of_products", spy)
        fast = evaluate_compute(cd, args)
        monkeypatch.setattr(ce, "_sum_of_products", lambda stage, bufs: None)
        slow = evaluate_compute(cd, args)
        for f, s in zip(fast, slow):
            assert f.dtype == s.dtype and f.shape == s.shape
            np.testing.assert_allclose(f, s, rtol=2e-7, atol=1e-30)
    assert any(taken)
