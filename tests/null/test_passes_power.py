"""algebraic_simplify: power by a small constant exponent becomes multiplies (or 1, x, 1/x); checked against
numpy's power (float64 reference) in ulps, special values included, and the cases that must stay a power."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.hlo import Op
from hlotune.ir.interp import evaluate
from hlotune.ir.parser import parse_hlo
from hlotune.ir.passes import POWER_BY_MULTIPLY, algebraic_simplify, dce, optimize
from hlotune.ir.verify import verify_module

TY = {np.float32: "f32", np.float64: "f64"}


def power_module(exponent: str, ty: str = "f32", n: int = 64) -> object:
    return parse_hlo(f"HloModule p\n\nENTRY main {{\n  x = {ty}[{n}]{{0}} parameter(0)\n"
                     f"  c = {ty}[] constant({exponent})\n  b = {ty}[{n}]{{0}} broadcast(c), dimensions={{}}\n"
                     f"  ROOT r = {ty}[{n}]{{0}} power(x, b)\n}}\n")


def inputs(dtype, n: int = 64) -> np.ndarray:
    info = np.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, info.tiny, -info.max, 2.0, -3.0, 0.5],
                       dtype=dtype)
    rng = np.random.default_rng(3)
    mags = np.exp(rng.uniform(-30, 30, n - special.size)) * rng.choice([-1.0, 1.0], n - special.size)
    return np.concatenate([special, mags.astype(dtype)])


def ulps(got: np.ndarray, ref: np.ndarray, dtype) -> np.ndarray:
    """|got - ref| in ulps of dtype at ref (ref in float64 or long double); equal specials count 0."""
    ref = ref.astype(np.longdouble)
    _, e = np.frexp(np.abs(ref))
    info = np.finfo(dtype)
    ulp = np.ldexp(np.longdouble(1), np.maximum(e, info.minexp + 1) - info.nmant - 1)
    with np.errstate(all="ignore"):
        err = np.abs(got.astype(np.longdouble) - ref) / ulp
        rounded = ref.astype(dtype)
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    return np.where(same, 0.0, np.where(np.isfinite(err), err, np.inf))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n", POWER_BY_MULTIPLY)
def test_power_by_constant_becomes_multiplies(n, dtype):
    m = power_module(repr(n), TY[dtype])
    out = dce(algebraic_simplify(m))
    verify_module(out)
    assert Op.POWER not in [i.op for i in out.entry_computation]
    x = inputs(dtype)
    (got,) = evaluate(out, [x])
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.longdouble), np.longdouble(n))
    err = ulps(np.asarray(got), ref, dtype)
    bound = 0.5 if n in (0.0, 1.0, 2.0, -1.0) else 2.0  # one correctly rounded op, or two roundings
    assert err.max() <= bound, (n, x[np.argmax(err)], got[np.argmax(err)], ref[np.argmax(err)])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(ref.astype(dtype)[got == 0]))


def test_power_pipeline_on_fused_expression():
    """optimize() leaves no power for x**3 * 0.5 and computes what the original computes."""
    m = parse_hlo("HloModule p\n\nENTRY main {\n  x = f32[8,16]{1,0} parameter(0)\n  c = f32[] constant(3)\n"
                  "  b = f32[8,16]{1,0} broadcast(c), dimensions={}\n  p = f32[8,16]{1,0} power(x, b)\n"
                  "  h = f32[] constant(0.5)\n  hb = f32[8,16]{1,0} broadcast(h), dimensions={}\n"
                  "  ROOT r = f32[8,16]{1,0} multiply(p, hb)\n}\n")
    out = optimize(m)
    assert Op.POWER not in [i.op for i in out.entry_computation]
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_allclose(evaluate(out, [x])[0], evaluate(m, [x])[0], rtol=3e-7, atol=0)


@pytest.mark.parametrize("exponent,ty", [("0.5", "f32"), ("2.5", "f32"), ("-2", "f32"), ("5", "f64"), ("2", "s32")])
def test_power_kept(exponent, ty):
    m = power_module(exponent, ty)
    assert algebraic_simplify(m) == m


def test_power_by_variable_kept():
    m = parse_hlo("HloModule p\n\nENTRY main {\n  x = f32[4]{0} parameter(0)\n  y = f32[4]{0} parameter(1)\n"
                  "  ROOT r = f32[4]{0} power(x, y)\n}\n")
    assert algebraic_simplify(m) == m
