"""Each optimization pass alone on small hand-written modules (checked against the interpreter),
then the whole pipeline on every fixture (checked against JAX's outputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hlotune.ir.hlo import Op
from hlotune.ir.interp import evaluate
from hlotune.ir.parser import load_hlo, parse_hlo
from hlotune.ir.passes import (
    algebraic_simplify,
    constant_folding,
    cse,
    dce,
    inline_calls,
    legalize_custom_calls,
    optimize,
    simplify_tuples,
)
from hlotune.ir.verify import verify_module

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
RNG = np.random.default_rng(7)


def ops(m, comp=None):
    c = m.entry_computation if comp is None else m.computation(comp)
    return [i.op for i in c]


def rand_args(m):
    out = []
    for p in m.entry_computation.parameters:
        s = p.array_shape
        out.append(RNG.standard_normal(s.dims).astype(s.dtype.np) if s.dtype.is_float
                   else RNG.integers(0, 3, s.dims).astype(s.dtype.np))
    return out


def same(before, after, args=None):
    """The rewritten module verifies and computes what the original computes."""
    verify_module(after)
    args = rand_args(before) if args is None else args
    for a, b in zip(evaluate(before, args), evaluate(after, args), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def hlo(body: str, params: str = "x = f32[4,8]{1,0} parameter(0)", extra: str = "") -> object:
    return parse_hlo(f"HloModule t\n\n{extra}\nENTRY main {{\n  {params}\n{body}\n}}\n")


# --------------------------------------------------------------------------- inline_calls

NESTED_CALLS = """
inner {
  a = f32[4,8]{1,0} parameter(0)
  ROOT n = f32[4,8]{1,0} negate(a)
}

middle {
  a = f32[4,8]{1,0} parameter(0)
  b = f32[4,8]{1,0} parameter(1)
  c = f32[4,8]{1,0} call(a), to_apply=inner
  ROOT s = f32[4,8]{1,0} add(c, b)
}
"""


def test_inline_calls_nested_and_fresh_names():
    m = hlo("  y = f32[4,8]{1,0} exponential(x)\n  a = f32[4,8]{1,0} call(x, y), to_apply=middle\n"
            "  ROOT c = f32[4,8]{1,0} call(a, a), to_apply=middle", extra=NESTED_CALLS)
    out = inline_calls(m)
    assert Op.CALL not in ops(out)
    assert [c.name for c in out.computations] == ["main"]
    names = [i.name for i in out.entry_computation]
    assert len(names) == len(set(names))
    assert ops(out).count(Op.NEGATE) == 2
    same(m, out)


def test_inline_calls_is_pure():
    m = hlo("  ROOT c = f32[4,8]{1,0} call(x, x), to_apply=middle", extra=NESTED_CALLS)
    text = repr(m)
    inline_calls(m)
    assert repr(m) == text


# --------------------------------------------------------------------------- dce / cse

def test_dce_removes_dead_instructions_and_computations():
    m = hlo("  d = f32[4,8]{1,0} exponential(x)\n  ROOT r = f32[4,8]{1,0} negate(x)", extra=NESTED_CALLS)
    out = dce(m)
    assert ops(out) == [Op.PARAMETER, Op.NEGATE]
    assert [c.name for c in out.computations] == ["main"]
    same(m, out)


def test_dce_keeps_unused_parameters():
    m = hlo("  y = f32[2]{0} parameter(1)\n  ROOT r = f32[4,8]{1,0} negate(x)")
    assert ops(dce(m)).count(Op.PARAMETER) == 2


def test_cse_merges_equal_instructions_and_constants():
    m = hlo("  c1 = f32[] constant(2)\n  c2 = f32[] constant(2)\n"
            "  b1 = f32[4,8]{1,0} broadcast(c1), dimensions={}\n  b2 = f32[4,8]{1,0} broadcast(c2), dimensions={}\n"
            "  e1 = f32[4,8]{1,0} multiply(x, b1)\n  e2 = f32[4,8]{1,0} multiply(x, b2)\n"
            "  ROOT r = f32[4,8]{1,0} subtract(e1, e2)")
    out = dce(cse(m))
    assert ops(out).count(Op.MULTIPLY) == 1 and ops(out).count(Op.CONSTANT) == 1
    same(m, out)


def test_cse_keeps_different_attributes():
    m = hlo("  a = f32[8,4]{1,0} transpose(x), dimensions={1,0}\n  b = f32[4,8]{1,0} reshape(x)\n"
            "  c = f32[4,8]{1,0} reshape(a)\n  ROOT r = f32[4,8]{1,0} add(b, c)")
    out = cse(m)
    assert ops(out).count(Op.RESHAPE) == 2


# --------------------------------------------------------------------------- constant folding

def test_constant_folding_folds_small_results():
    m = hlo("  a = s32[] constant(3)\n  b = f32[] convert(a)\n  c = f32[] constant(256)\n  d = f32[] subtract(c, b)\n"
            "  g = pred[] compare(d, c), direction=LT\n  bg = pred[4,8]{1,0} broadcast(g), dimensions={}\n"
            "  z = f32[4,8]{1,0} negate(x)\n  ROOT r = f32[4,8]{1,0} select(bg, x, z)")
    out = dce(constant_folding(m))
    consts = [i for i in out.entry_computation if i.op is Op.CONSTANT]
    assert [i.attr("literal") for i in consts] == ["true"]
    assert Op.CONVERT not in ops(out) and Op.SUBTRACT not in ops(out)
    same(m, out)


def test_constant_folding_keeps_broadcasts_and_big_results():
    m = hlo("  c = f32[] constant(2)\n  b = f32[64,64]{1,0} broadcast(c), dimensions={}\n"
            "  n = f32[64,64]{1,0} negate(b)\n  s = f32[4,8]{1,0} broadcast(c), dimensions={}\n"
            "  ROOT r = f32[4,8]{1,0} add(x, s)", params="x = f32[4,8]{1,0} parameter(0)")
    out = constant_folding(m)
    assert ops(out).count(Op.BROADCAST) == 2 and Op.NEGATE in ops(out)


def test_constant_folding_small_array():
    m = hlo("  c = f32[3]{0} constant({1, 2, 3})\n  n = f32[3]{0} negate(c)\n  ROOT r = f32[3]{0} add(x, n)",
            params="x = f32[3]{0} parameter(0)")
    out = dce(constant_folding(m))
    assert Op.NEGATE not in ops(out)
    same(m, out)


# --------------------------------------------------------------------------- algebraic simplification

ONE = "  one = f32[] constant(1)\n  ones = f32[4,8]{1,0} broadcast(one), dimensions={}\n"
ZERO = "  zero = f32[] constant(0)\n  zeros = f32[4,8]{1,0} broadcast(zero), dimensions={}\n"
ALGEBRA_CASES = {
    "mul_one": (ONE + "  ROOT r = f32[4,8]{1,0} multiply(x, ones)", Op.MULTIPLY),
    "one_mul": (ONE + "  ROOT r = f32[4,8]{1,0} multiply(ones, x)", Op.MULTIPLY),
    "add_zero": (ZERO + "  ROOT r = f32[4,8]{1,0} add(zeros, x)", Op.ADD),
    "sub_zero": (ZERO + "  ROOT r = f32[4,8]{1,0} subtract(x, zeros)", Op.SUBTRACT),
    "div_one": (ONE + "  ROOT r = f32[4,8]{1,0} divide(x, ones)", Op.DIVIDE),
    "neg_neg": ("  a = f32[4,8]{1,0} negate(x)\n  ROOT r = f32[4,8]{1,0} negate(a)", Op.NEGATE),
    "max_same": ("  ROOT r = f32[4,8]{1,0} maximum(x, x)", Op.MAXIMUM),
    "transpose_transpose": ("  a = f32[8,4]{1,0} transpose(x), dimensions={1,0}\n"
                            "  ROOT r = f32[4,8]{1,0} transpose(a), dimensions={1,0}", Op.TRANSPOSE),
    "reshape_reshape": ("  a = f32[32]{0} reshape(x)\n  ROOT r = f32[4,8]{1,0} reshape(a)", Op.RESHAPE),
    "identity_broadcast": ("  ROOT r = f32[4,8]{1,0} broadcast(x), dimensions={0,1}", Op.BROADCAST),
    "identity_convert": ("  ROOT r = f32[4,8]{1,0} convert(x)", Op.CONVERT),
    "convert_roundtrip": ("  a = f64[4,8]{1,0} convert(x)\n  ROOT r = f32[4,8]{1,0} convert(a)", Op.CONVERT),
    "identity_slice": ("  ROOT r = f32[4,8]{1,0} slice(x), slice={[0:4], [0:8]}", Op.SLICE),
    "select_true": ("  t = pred[] constant(true)\n  p = pred[4,8]{1,0} broadcast(t), dimensions={}\n"
                    "  n = f32[4,8]{1,0} negate(x)\n  ROOT r = f32[4,8]{1,0} select(p, x, n)", Op.SELECT),
    "select_same": ("  p = pred[4,8]{1,0} compare(x, x), direction=LT\n"
                    "  ROOT r = f32[4,8]{1,0} select(p, x, x)", Op.SELECT),
}


@pytest.mark.parametrize("case", sorted(ALGEBRA_CASES))
def test_algebraic_rule(case):
    body, gone = ALGEBRA_CASES[case]
    m = hlo(body)
    out = dce(algebraic_simplify(m))
    assert gone not in ops(out), case
    same(m, out)


def test_algebra_composes_transposes_and_broadcasts():
    m = hlo("  a = f32[8,4]{1,0} transpose(x), dimensions={1,0}\n"
            "  b = f32[4,8,2]{2,1,0} broadcast(a), dimensions={1,0}\n"
            "  c = f32[2,4,8]{2,1,0} broadcast(x), dimensions={1,2}\n"
            "  d = f32[3,2,4,8]{3,2,1,0} broadcast(c), dimensions={1,2,3}\n"
            "  t1 = f32[4,2,3]{2,1,0} parameter(1)\n  t2 = f32[3,4,2]{2,1,0} transpose(t1), dimensions={2,0,1}\n"
            "  t3 = f32[2,3,4]{2,1,0} transpose(t2), dimensions={2,0,1}\n"
            "  ROOT r = (f32[4,8,2]{2,1,0}, f32[3,2,4,8]{3,2,1,0}, f32[2,3,4]{2,1,0}) tuple(b, d, t3)")
    out = dce(algebraic_simplify(m))
    entry = out.entry_computation
    assert [entry[o].operands[0] for o in entry.root_instruction.operands] == ["a", "x", "t1"]
    same(m, out)


def test_algebra_keeps_non_identities():
    m = hlo("  two = f32[] constant(2)\n  twos = f32[4,8]{1,0} broadcast(two), dimensions={}\n"
            "  a = f32[4,8]{1,0} multiply(x, twos)\n  b = f32[8,4]{1,0} transpose(a), dimensions={1,0}\n"
            "  ROOT r = f32[4,8]{1,0} reshape(b)")
    assert algebraic_simplify(m) == m


# --------------------------------------------------------------------------- tuples

def test_simplify_tuples():
    m = hlo("  y = f32[4,8]{1,0} parameter(1)\n  t = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(x, y)\n"
            "  a = f32[4,8]{1,0} get-tuple-element(t), index=1\n  n = f32[4,8]{1,0} negate(a)\n"
            "  u = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(n, x)\n  g0 = f32[4,8]{1,0} get-tuple-element(u), index=0\n"
            "  g1 = f32[4,8]{1,0} get-tuple-element(u), index=1\n"
            "  ROOT r = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(g0, g1)")
    out = dce(simplify_tuples(m))
    e = out.entry_computation
    assert e.root_instruction.op is Op.TUPLE and Op.GET_TUPLE_ELEMENT not in ops(out)
    assert e["n"].operands == ("y",)
    same(m, out)


def test_simplify_tuples_tuple_of_gtes_is_the_tuple():
    m = hlo("  t = (f32[4,8]{1,0}, f32[4,8]{1,0}) parameter(0)\n"
            "  g0 = f32[4,8]{1,0} get-tuple-element(t), index=0\n  g1 = f32[4,8]{1,0} get-tuple-element(t), index=1\n"
            "  ROOT r = (f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(g0, g1)", params="")
    assert dce(simplify_tuples(m)).entry_computation.root == "t"


# --------------------------------------------------------------------------- custom calls

GEMM_CFG = ('{"gemm_backend_config":{"alpha_real":2,"alpha_imag":0,"beta":1,"epilogue":"BIAS_RELU",'
            '"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],'
            '"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}')


def test_legalize_gemm_with_alpha_beta_bias_relu():
    m = hlo("  w = f32[8,6]{1,0} parameter(1)\n  c = f32[4,6]{1,0} parameter(2)\n  b = f32[6]{0} parameter(3)\n"
            "  cc = (f32[4,6]{1,0}, s8[64]{0}) custom-call(x, w, c, b), "
            "custom_call_target=\"__cublas$lt$matmul\", "
            f"backend_config={GEMM_CFG}\n"
            "  ROOT g = f32[4,6]{1,0} get-tuple-element(cc), index=0")
    out = dce(simplify_tuples(legalize_custom_calls(m)))
    got = ops(out)
    assert Op.CUSTOM_CALL not in got and Op.DOT in got and Op.MAXIMUM in got
    a = rand_args(m)
    want = np.maximum(2 * a[0] @ a[1] + a[2] + a[3][None, :], 0)
    np.testing.assert_allclose(evaluate(out, a)[0], want, rtol=1e-5, atol=1e-5)
    same(m, out, a)


@pytest.mark.parametrize("name", ["conv2d_bias_relu", "dense_bias_relu", "transformer_block", "mlp2"])
def test_legalize_gpu_fixtures(name):
    m = load_hlo(MODELS / name / f"{name}.bench.gpu.opt.hlo")
    out = dce(simplify_tuples(legalize_custom_calls(m)))
    assert Op.CUSTOM_CALL not in ops(out)
    assert {Op.DOT, Op.CONVOLUTION} & set(ops(out))
    verify_module(out)
    if name == "conv2d_bias_relu":
        assert Op.MAXIMUM in ops(out) and Op.ADD in ops(out)


# --------------------------------------------------------------------------- the pipeline on fixtures

def fixture_args(name):
    d = np.load(MODELS / name / f"{name}.npz")
    n_in = sum(k.startswith("arg") for k in d.files)
    n_out = sum(k.startswith("out") for k in d.files)
    return [d[f"arg{i}"] for i in range(n_in)], [d[f"out{i}"] for i in range(n_out)]


FIXTURES = sorted(p for p in MODELS.glob("*/*.hlo") if ".bench" not in p.name)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_optimize_preserves_semantics(path):
    m = optimize(load_hlo(path))
    verify_module(m)
    assert Op.CALL not in ops(m)
    args, outs = fixture_args(path.parent.name)
    for got, want in zip(evaluate(m, args), outs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_optimize_simplifies_layernorm():
    m = load_hlo(MODELS / "layernorm" / "layernorm.hlo")
    out = optimize(m)
    n = len(out.entry_computation.instructions)
    assert n < len(inline_calls(m).entry_computation.instructions)
    assert Op.SELECT not in ops(out) and Op.COMPARE not in ops(out)  # the `where` with a constant predicate
    assert optimize(out) == out  # a fixed point
