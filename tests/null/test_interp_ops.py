"""Each op of the reference interpreter against an independent numpy / Python formulation."""

from __future__ import annotations

import itertools
import math
import struct

import numpy as np
import pytest

from hlotune.errors import InputError, ShapeError, UnsupportedError
from hlotune.ir import custom_calls
from hlotune.ir.hlo import ArrayShape, Computation, DType, Instruction, Module, Op, TupleShape, make_attrs
from hlotune.ir.interp import RULES, _make_plan, evaluate, evaluate_computation
from hlotune.ir.parser import parse_hlo

F32 = np.float32
RNG = np.random.default_rng(1234)


def run(body: str, *args, extra: str = ""):
    text = f"HloModule t\n\n{extra}\nENTRY e {{\n{body}\n}}\n"
    return evaluate(parse_hlo(text), list(args))


def run1(body: str, *args, extra: str = ""):
    out = run(body, *args, extra=extra)
    assert len(out) == 1
    return out[0]


def rand(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


ADD = "add_c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)\n}\n"
MAX = "max_c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] maximum(a, b)\n}\n"


# ----------------------------------------------------------------------------- table and plumbing

def test_every_op_has_a_rule():
    assert set(RULES) == set(Op)
    assert all(callable(f) for f in RULES.values())


def test_hand_built_module_and_tuple_root():
    s = ArrayShape(DType.F32, (3,))
    comp = Computation("main", (
        Instruction("x", Op.PARAMETER, s, (), make_attrs({"parameter_number": 0})),
        Instruction("y", Op.PARAMETER, s, (), make_attrs({"parameter_number": 1})),
        Instruction("m", Op.MULTIPLY, s, ("x", "y")),
        Instruction("n", Op.NEGATE, s, ("m",)),
        Instruction("t", Op.TUPLE, TupleShape((s, s)), ("n", "x")),
    ), root="t", is_entry=True)
    mod = Module("m", (comp,), "main")
    x, y = np.array([1, 2, 3], F32), np.array([4, 5, -6], F32)
    a, b = evaluate(mod, [x, y])
    np.testing.assert_array_equal(a, -(x * y))
    np.testing.assert_array_equal(b, x)
    nested = evaluate_computation(mod, comp, [x, y])
    assert isinstance(nested, tuple) and len(nested) == 2


def test_argument_checks_name_the_parameter():
    body = "  x = f32[2,3] parameter(0)\n  ROOT n = f32[2,3] negate(x)"
    with pytest.raises(InputError, match="1 arguments"):
        run(body)
    with pytest.raises(InputError, match=r"parameter 0 \(x\).*shape"):
        run(body, np.zeros((3, 2), F32))
    with pytest.raises(InputError, match=r"parameter 0 \(x\).*f32"):
        run(body, np.zeros((2, 3), np.float64))


def test_instructions_out_of_definition_order():
    s = ArrayShape(DType.F32, (2,))
    comp = Computation("main", (
        Instruction("r", Op.ADD, s, ("n", "x")),
        Instruction("n", Op.NEGATE, s, ("m",)),
        Instruction("m", Op.MULTIPLY, s, ("x", "x")),
        Instruction("x", Op.PARAMETER, s, (), make_attrs({"parameter_number": 0})),
    ), root="r", is_entry=True)
    x = np.array([2, -3], F32)
    np.testing.assert_array_equal(evaluate(Module("m", (comp,), "main"), [x])[0], x - x * x)
    cyclic = Computation("main", (
        Instruction("a", Op.NEGATE, s, ("b",)),
        Instruction("b", Op.NEGATE, s, ("a",)),
    ), root="a", is_entry=True)
    with pytest.raises(ShapeError, match="cycle"):
        evaluate(Module("m", (cyclic,), "main"), [])


def test_deep_chain_does_not_recurse_and_frees():
    n = 3000
    lines = ["  v0 = f32[4] parameter(0)"]
    lines += [f"  v{i} = f32[4] negate(v{i - 1})" for i in range(1, n)]
    lines.append(f"  ROOT r = f32[4] add(v{n - 1}, v0)")
    mod = parse_hlo("HloModule deep\nENTRY e {\n" + "\n".join(lines) + "\n}\n")
    x = rand(4)
    np.testing.assert_array_equal(evaluate(mod, [x])[0], (-x if (n - 1) % 2 else x) + x)
    plan = _make_plan(mod.entry_computation)
    freed = [name for f in plan.frees for name in f]
    assert len(freed) == len(set(freed)) == n  # every value but the root freed exactly once
    assert plan.frees[1] == ()  # v0 lives until the root uses it
    assert "v1" in plan.frees[2]


# ----------------------------------------------------------------------------- elementwise

UNARY = {
    "abs": np.abs, "ceil": np.ceil, "cosine": np.cos, "exponential": np.exp, "floor": np.floor,
    "log": lambda x: np.log(np.abs(x)), "negate": np.negative, "sine": np.sin,
    "sqrt": lambda x: np.sqrt(np.abs(x)), "tanh": np.tanh, "exponential-minus-one": np.expm1,
    "log-plus-one": lambda x: np.log1p(np.abs(x)), "logistic": lambda x: 1 / (1 + np.exp(-x)),
    "rsqrt": lambda x: 1 / np.sqrt(np.abs(x)), "erf": np.vectorize(math.erf),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(op):
    x = rand(64)
    arg = np.abs(x) if op in ("log", "sqrt", "log-plus-one", "rsqrt") else x
    got = run1(f"  x = f32[64] parameter(0)\n  ROOT r = f32[64] {op}(x)", arg)
    want = UNARY[op](x.astype(np.float64)).astype(F32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert got.dtype == F32


BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "maximum": np.maximum, "minimum": np.minimum, "atan2": np.arctan2, "remainder": np.fmod,
          "power": lambda a, b: np.power(np.abs(a), b)}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_float(op):
    a, b = rand(5, 7), rand(5, 7)
    if op == "power":
        a = np.abs(a)
    got = run1(f"  a = f32[5,7] parameter(0)\n  b = f32[5,7] parameter(1)\n  ROOT r = f32[5,7] {op}(a, b)", a, b)
    np.testing.assert_allclose(got, BINARY[op](a.astype(np.float64), b.astype(np.float64)).astype(F32), rtol=1e-6)


def test_max_min_propagate_nan():
    a = np.array([np.nan, 1, 2], F32)
    b = np.array([0, np.nan, 3], F32)
    body = "  a = f32[3] parameter(0)\n  b = f32[3] parameter(1)\n  ROOT r = f32[3] {}(a, b)"
    for op, want in (("maximum", [np.nan, np.nan, 3]), ("minimum", [np.nan, np.nan, 2])):
        np.testing.assert_array_equal(run1(body.format(op), a, b), np.array(want, F32))


@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare_with_nan(direction):
    vals = [np.nan, -np.inf, -1.0, 0.0, -0.0, 2.5, np.inf]
    pairs = list(itertools.product(vals, vals))
    a = np.array([p[0] for p in pairs], F32)
    b = np.array([p[1] for p in pairs], F32)
    n = len(pairs)
    got = run1(f"  a = f32[{n}] parameter(0)\n  b = f32[{n}] parameter(1)\n"
               f"  ROOT r = pred[{n}] compare(a, b), direction={direction}", a, b)
    py = {"EQ": lambda x, y: x == y, "NE": lambda x, y: x != y, "LT": lambda x, y: x < y,
          "LE": lambda x, y: x <= y, "GT": lambda x, y: x > y, "GE": lambda x, y: x >= y}[direction]
    want = np.array([py(float(x), float(y)) for x, y in pairs])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.bool_


def test_compare_totalorder():
    a = np.array([-0.0, 1.0, np.nan], F32)
    b = np.array([0.0, 1.0, 1.0], F32)
    got = run1("  a = f32[3] parameter(0)\n  b = f32[3] parameter(1)\n"
               "  ROOT r = pred[3] compare(a, b), direction=LT, type=TOTALORDER", a, b)
    np.testing.assert_array_equal(got, [True, False, False])  # -0 < +0; +nan above everything


def _xla_div(a: int, b: int, bits: int) -> int:
    if b == 0:
        return -1
    if a == -(1 << (bits - 1)) and b == -1:
        return a
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _xla_rem(a: int, b: int, bits: int) -> int:
    if b == 0:
        return a
    if a == -(1 << (bits - 1)) and b == -1:
        return 0
    return a - _xla_div(a, b, bits) * b


@pytest.mark.parametrize("dt,np_dt,bits", [("s32", np.int32, 32), ("s8", np.int8, 8), ("s64", np.int64, 64)])
def test_integer_divide_and_remainder(dt, np_dt, bits):
    lo = -(1 << (bits - 1))
    pairs = [(7, 2), (-7, 2), (7, -2), (-7, -2), (5, 0), (-5, 0), (0, 0), (lo, -1), (lo, 1), (lo, 0), (3, 7), (-3, 7)]
    a = np.array([p[0] for p in pairs], np_dt)
    b = np.array([p[1] for p in pairs], np_dt)
    n = len(pairs)
    body = f"  a = {dt}[{n}] parameter(0)\n  b = {dt}[{n}] parameter(1)\n  ROOT r = {dt}[{n}] {{}}(a, b)"
    np.testing.assert_array_equal(run1(body.format("divide"), a, b),
                                  np.array([_xla_div(x, y, bits) for x, y in pairs], np_dt))
    np.testing.assert_array_equal(run1(body.format("remainder"), a, b),
                                  np.array([_xla_rem(x, y, bits) for x, y in pairs], np_dt))


def test_unsigned_divide_by_zero_is_all_ones():
    a = np.array([7, 200, 9], np.uint8)
    b = np.array([2, 0, 0], np.uint8)
    got = run1("  a = u8[3] parameter(0)\n  b = u8[3] parameter(1)\n  ROOT r = u8[3] divide(a, b)", a, b)
    np.testing.assert_array_equal(got, [3, 255, 255])


def test_integer_power_and_float_remainder_sign():
    a = np.array([2, -2, 1, -1, 3, 0], np.int32)
    b = np.array([10, 3, -5, -3, -1, 0], np.int32)
    got = run1("  a = s32[6] parameter(0)\n  b = s32[6] parameter(1)\n  ROOT r = s32[6] power(a, b)", a, b)
    np.testing.assert_array_equal(got, [1024, -8, 1, -1, 0, 1])
    x = np.array([-7.5, 7.5], F32)
    y = np.array([2, -2], F32)
    got = run1("  a = f32[2] parameter(0)\n  b = f32[2] parameter(1)\n  ROOT r = f32[2] remainder(a, b)", x, y)
    np.testing.assert_array_equal(got, [-1.5, 1.5])


def test_convert_float_to_int_saturates_and_truncates():
    x = np.array([1.9, -1.9, 3e9, -3e9, np.nan, np.inf, -np.inf, -0.5, 2147483520.0], F32)
    got = run1("  x = f32[9] parameter(0)\n  ROOT r = s32[9] convert(x)", x)
    imax, imin = 2**31 - 1, -(2**31)
    np.testing.assert_array_equal(got, np.array([1, -1, imax, imin, 0, imax, imin, 0, 2147483520], np.int32))
    got = run1("  x = f32[9] parameter(0)\n  ROOT r = u8[9] convert(x)", x)
    np.testing.assert_array_equal(got, np.array([1, 0, 255, 0, 0, 255, 0, 0, 255], np.uint8))


def test_convert_bool_and_int_to_float():
    x = np.array([0.0, -0.0, 2.5, np.nan], F32)
    np.testing.assert_array_equal(run1("  x = f32[4] parameter(0)\n  ROOT r = pred[4] convert(x)", x),
                                  [False, False, True, True])
    p = np.array([True, False])
    np.testing.assert_array_equal(run1("  x = pred[2] parameter(0)\n  ROOT r = f32[2] convert(x)", p), [1.0, 0.0])
    i = np.array([16777217, -3], np.int32)
    got = run1("  x = s32[2] parameter(0)\n  ROOT r = f32[2] convert(x)", i)
    np.testing.assert_array_equal(got, np.array([16777216.0, -3.0], F32))


def _bf16_python(v: float) -> float:
    """Round a float32 to bfloat16 (nearest even) with integer arithmetic on its bits."""
    (u,) = struct.unpack("<I", struct.pack("<f", v))
    lower = u & 0xFFFF
    up = u >> 16
    if lower > 0x8000 or (lower == 0x8000 and (up & 1)):
        up += 1
    return struct.unpack("<f", struct.pack("<I", (up << 16) & 0xFFFFFFFF))[0]


def test_bf16_rounding_after_each_op():
    vals = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 3.14159, -2.71828, 65504.0, 1e-30, 3.4e38]
    x = np.array(vals, F32)
    got = run1("  x = f32[8] parameter(0)\n  ROOT r = bf16[8] convert(x)", x)
    assert got.dtype == F32
    np.testing.assert_array_equal(got, np.array([_bf16_python(float(v)) for v in x], F32))
    assert got[0] == 1.0 and got[1] == 1 + 2**-6
    # 1 + 2^-8 in bf16 is 1: the add result is rounded back after the op
    one = np.array([1.0], F32)
    tiny = np.array([2**-8], F32)
    got = run1("  a = bf16[1] parameter(0)\n  b = bf16[1] parameter(1)\n  ROOT r = bf16[1] add(a, b)", one, tiny)
    assert got[0] == 1.0
    # bf16 arguments are rounded on the way in
    got = run1("  a = bf16[1] parameter(0)\n  ROOT r = bf16[1] negate(a)", np.array([1 + 3 * 2**-8], F32))
    assert got[0] == -(1 + 2**-6)


def test_f16_ops_round_to_half():
    a = rand(32).astype(np.float16)
    b = rand(32).astype(np.float16)
    got = run1("  a = f16[32] parameter(0)\n  b = f16[32] parameter(1)\n  ROOT r = f16[32] multiply(a, b)", a, b)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, (a.astype(np.float64) * b.astype(np.float64)).astype(np.float16))


def test_select_clamp_round_sign_isfinite():
    p = np.array([True, False, True])
    a, b = np.array([1, 2, 3], F32), np.array([4, 5, 6], F32)
    got = run1("  p = pred[3] parameter(0)\n  a = f32[3] parameter(1)\n  b = f32[3] parameter(2)\n"
               "  ROOT r = f32[3] select(p, a, b)", p, a, b)
    np.testing.assert_array_equal(got, [1, 5, 3])
    x = np.array([-5, 0.5, 9], F32)
    got = run1("  lo = f32[] constant(0)\n  hi = f32[] constant(1)\n  x = f32[3] parameter(0)\n"
               "  ROOT r = f32[3] clamp(lo, x, hi)", x)
    np.testing.assert_array_equal(got, [0, 0.5, 1])
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999], F32)
    np.testing.assert_array_equal(run1("  x = f32[6] parameter(0)\n  ROOT r = f32[6] round-nearest-even(x)", x),
                                  [0, 2, 2, -0.0, -2, 2])
    x = np.array([-3, 0, 2, np.nan], F32)
    got = run1("  x = f32[4] parameter(0)\n  ROOT r = f32[4] sign(x)", x)
    np.testing.assert_array_equal(got, [-1, 0, 1, np.nan])
    i = np.array([-3, 0, 7], np.int32)
    np.testing.assert_array_equal(run1("  x = s32[3] parameter(0)\n  ROOT r = s32[3] sign(x)", i), [-1, 0, 1])
    x = np.array([1, np.inf, -np.inf, np.nan], F32)
    np.testing.assert_array_equal(run1("  x = f32[4] parameter(0)\n  ROOT r = pred[4] is-finite(x)", x),
                                  [True, False, False, False])


@pytest.mark.parametrize("op", ["and", "or", "xor"])
def test_bitwise_and_logical(op):
    fn = {"and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y}[op]
    a = np.array([0b1100, -1, 5], np.int32)
    b = np.array([0b1010, 7, -6], np.int32)
    got = run1(f"  a = s32[3] parameter(0)\n  b = s32[3] parameter(1)\n  ROOT r = s32[3] {op}(a, b)", a, b)
    np.testing.assert_array_equal(got, [fn(int(x), int(y)) for x, y in zip(a, b)])
    p = np.array([True, True, False, False])
    q = np.array([True, False, True, False])
    got = run1(f"  a = pred[4] parameter(0)\n  b = pred[4] parameter(1)\n  ROOT r = pred[4] {op}(a, b)", p, q)
    np.testing.assert_array_equal(got, [fn(bool(x), bool(y)) for x, y in zip(p, q)])


def test_not_on_pred_and_int():
    np.testing.assert_array_equal(run1("  a = pred[2] parameter(0)\n  ROOT r = pred[2] not(a)",
                                       np.array([True, False])), [False, True])
    np.testing.assert_array_equal(run1("  a = s32[2] parameter(0)\n  ROOT r = s32[2] not(a)",
                                       np.array([0, 5], np.int32)), [-1, -6])


# ----------------------------------------------------------------------------- data movement

def test_broadcast_reshape_transpose_reverse_concat_iota():
    x = rand(3, 4)
    got = run1("  x = f32[3,4] parameter(0)\n  ROOT r = f32[4,2,3] broadcast(x), dimensions={2,0}", x)
    want = np.empty((4, 2, 3), F32)
    for i, j, k in itertools.product(range(4), range(2), range(3)):
        want[i, j, k] = x[k, i]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run1("  x = f32[3,4] parameter(0)\n  ROOT r = f32[2,6] reshape(x)", x),
                                  x.reshape(2, 6))
    y = rand(2, 3, 4)
    got = run1("  x = f32[2,3,4] parameter(0)\n  ROOT r = f32[4,2,3] transpose(x), dimensions={2,0,1}", y)
    np.testing.assert_array_equal(got, np.einsum("abc->cab", y))
    got = run1("  x = f32[2,3,4] parameter(0)\n  ROOT r = f32[2,3,4] reverse(x), dimensions={0,2}", y)
    np.testing.assert_array_equal(got, y[::-1, :, ::-1])
    a, b = rand(2, 3), rand(2, 5)
    got = run1("  a = f32[2,3] parameter(0)\n  b = f32[2,5] parameter(1)\n"
               "  ROOT r = f32[2,8] concatenate(a, b), dimensions={1}", a, b)
    np.testing.assert_array_equal(got, np.hstack([a, b]))
    got = run1("  ROOT r = s32[2,3] iota(), iota_dimension=1")
    np.testing.assert_array_equal(got, [[0, 1, 2], [0, 1, 2]])


def test_bitcast_follows_layouts():
    x = rand(2, 3)
    # same layouts: a reshape
    got = run1("  x = f32[2,3]{1,0} parameter(0)\n  ROOT r = f32[3,2]{1,0} bitcast(x)", x)
    np.testing.assert_array_equal(got, x.reshape(3, 2))
    # a column-major [3,2] holds the same bytes as a row-major [2,3]: a transpose
    got = run1("  x = f32[2,3]{1,0} parameter(0)\n  ROOT r = f32[3,2]{0,1} bitcast(x)", x)
    np.testing.assert_array_equal(got, x.T)
    got = run1("  x = f32[2,3]{1,0} parameter(0)\n  c = f32[2,3]{0,1} copy(x)\n  ROOT r = f32[6]{0} bitcast(c)", x)
    np.testing.assert_array_equal(got, x.T.reshape(-1))


def test_slice_with_strides():
    x = rand(7, 9)
    got = run1("  x = f32[7,9] parameter(0)\n  ROOT r = f32[3,3] slice(x), slice={[1:7:2], [0:9:3]}", x)
    np.testing.assert_array_equal(got, np.array([[x[i, j] for j in (0, 3, 6)] for i in (1, 3, 5)]))


def test_pad_negative_and_interior():
    x = np.array([1, 2, 3], F32)
    got = run1("  x = f32[3] parameter(0)\n  v = f32[] constant(9)\n  ROOT r = f32[6] pad(x, v), padding=-1_2_1", x)
    np.testing.assert_array_equal(got, [9, 2, 9, 3, 9, 9])  # [1 9 2 9 3] -> drop 1 -> add 9 9
    y = np.arange(6, dtype=F32).reshape(2, 3)
    got = run1("  x = f32[2,3] parameter(0)\n  v = f32[] constant(-1)\n"
               "  ROOT r = f32[4,5] pad(x, v), padding=1_0_1x0_-2_2", y)
    # rows: [pad, r0, pad, r1]; cols: c0 _ _ c1 _ _ c2 with the last two removed
    want = np.full((4, 7), -1, F32)
    want[1::2, ::3] = y
    np.testing.assert_array_equal(got, want[:, :5])


def test_dynamic_slice_and_update_clamp():
    x = np.arange(20, dtype=F32).reshape(4, 5)
    body = ("  x = f32[4,5] parameter(0)\n  i = s32[] parameter(1)\n  j = s32[] parameter(2)\n"
            "  ROOT r = f32[2,3] dynamic-slice(x, i, j), dynamic_slice_sizes={2,3}")
    for i, j in [(1, 1), (3, 4), (-5, 9), (0, -1)]:
        ci, cj = min(max(i, 0), 2), min(max(j, 0), 2)
        got = run1(body, x, np.int32(i), np.int32(j))
        np.testing.assert_array_equal(got, x[ci:ci + 2, cj:cj + 3])
    upd = -np.ones((2, 2), F32)
    body = ("  x = f32[4,5] parameter(0)\n  u = f32[2,2] parameter(1)\n  i = s32[] parameter(2)\n"
            "  j = s32[] parameter(3)\n  ROOT r = f32[4,5] dynamic-update-slice(x, u, i, j)")
    got = run1(body, x, upd, np.int32(10), np.int32(-3))
    want = x.copy()
    want[2:4, 0:2] = -1
    np.testing.assert_array_equal(got, want)


def test_gather_take_rows_and_points():
    x = rand(5, 3)
    idx = np.array([4, 0, 2, 7, -1], np.int32)  # out of range indices clamp
    got = run1("  x = f32[5,3] parameter(0)\n  i = s32[5] parameter(1)\n"
               "  ROOT r = f32[5,3] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, "
               "start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}", x, idx)
    np.testing.assert_array_equal(got, x[np.clip(idx, 0, 4)])
    pts = np.array([[1, 2], [4, 0], [0, 1]], np.int32)
    got = run1("  x = f32[5,3] parameter(0)\n  i = s32[3,2] parameter(1)\n"
               "  ROOT r = f32[3] gather(x, i), offset_dims={}, collapsed_slice_dims={0,1}, "
               "start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}", x, pts)
    np.testing.assert_array_equal(got, [x[1, 2], x[4, 0], x[0, 1]])
    # windows of 2 columns starting at a per-row column index, batch dim after the offsets
    y = rand(4, 6)
    cols = np.array([0, 3, 5], np.int32)
    got = run1("  x = f32[4,6] parameter(0)\n  i = s32[3,1] parameter(1)\n"
               "  ROOT r = f32[4,2,3] gather(x, i), offset_dims={0,1}, collapsed_slice_dims={}, "
               "start_index_map={1}, index_vector_dim=1, slice_sizes={4,2}", y, cols[:, None])
    want = np.stack([y[:, min(c, 4):min(c, 4) + 2] for c in cols], axis=-1)
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- reductions

def test_reduce_add_max_with_init():
    x = rand(6, 7)
    got = run1("  x = f32[6,7] parameter(0)\n  c = f32[] constant(10)\n"
               "  ROOT r = f32[6] reduce(x, c), dimensions={1}, to_apply=add_c", x, extra=ADD)
    np.testing.assert_allclose(got, [10 + sum(float(v) for v in row) for row in x], rtol=1e-6)
    got = run1("  x = f32[6,7] parameter(0)\n  c = f32[] constant(5)\n"
               "  ROOT r = f32[7] reduce(x, c), dimensions={0}, to_apply=max_c", x, extra=MAX)
    np.testing.assert_array_equal(got, [max([5.0] + [float(v) for v in x[:, j]]) for j in range(7)])
    got = run1("  x = f32[6,7] parameter(0)\n  c = f32[] constant(0)\n"
               "  ROOT r = f32[] reduce(x, c), dimensions={0,1}, to_apply=add_c", x, extra=ADD)
    np.testing.assert_allclose(got, float(np.sum(x.astype(np.float64))), rtol=1e-6)


def test_reduce_general_combiner_folds_in_order():
    sub = "sub_c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] subtract(a, b)\n}\n"
    x = rand(3, 4)
    got = run1("  x = f32[3,4] parameter(0)\n  c = f32[] constant(1)\n"
               "  ROOT r = f32[3] reduce(x, c), dimensions={1}, to_apply=sub_c", x, extra=sub)
    want = []
    for row in x:
        acc = 1.0
        for v in row:
            acc = acc - float(v)
        want.append(acc)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_reduce_two_operands_argmax():
    comb = """argmax_c {
  av = f32[] parameter(0)
  ai = s32[] parameter(1)
  bv = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(av, bv), direction=GT
  eq = pred[] compare(av, bv), direction=EQ
  lt = pred[] compare(ai, bi), direction=LT
  tie = pred[] and(eq, lt)
  keep = pred[] or(gt, tie)
  v = f32[] select(keep, av, bv)
  i = s32[] select(keep, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
"""
    x = rand(5, 8)
    x[2, 3] = x[2, 6] = 50.0  # a tie: first index wins
    body = ("  x = f32[5,8] parameter(0)\n  io = s32[5,8] iota(), iota_dimension=1\n"
            "  c = f32[] constant(-inf)\n  z = s32[] constant(0)\n"
            "  ROOT r = (f32[5], s32[5]) reduce(x, io, c, z), dimensions={1}, to_apply=argmax_c")
    v, i = run(body, x, extra=comb)
    np.testing.assert_array_equal(v, x.max(axis=1))
    np.testing.assert_array_equal(i, np.argmax(x, axis=1))
    assert i[2] == 3


def _reduce_window_ref(x, init, fn, size, stride, pad, base_dil, win_dil):
    """Direct formulation: dilate, pad with init, then visit every window element."""
    shape = [(n - 1) * b + 1 + lo + hi for n, b, (lo, hi) in zip(x.shape, base_dil, pad)]
    big = np.full(shape, init, np.float64)
    for idx in itertools.product(*(range(n) for n in x.shape)):
        big[tuple(i * b + lo for i, b, (lo, _) in zip(idx, base_dil, pad))] = x[idx]
    out_shape = [(s - (k - 1) * d - 1) // st + 1 for s, k, d, st in zip(shape, size, win_dil, stride)]
    out = np.empty(out_shape)
    for o in itertools.product(*(range(n) for n in out_shape)):
        acc = init
        for k in itertools.product(*(range(n) for n in size)):
            acc = fn(acc, big[tuple(oi * st + ki * d for oi, st, ki, d in zip(o, stride, k, win_dil))])
        out[o] = acc
    return out


@pytest.mark.parametrize("case", [
    dict(size=(2, 2), stride=(2, 2), pad=((0, 1), (1, 0)), base=(1, 1), win=(1, 1)),
    dict(size=(3, 2), stride=(1, 2), pad=((1, 1), (0, 0)), base=(2, 1), win=(1, 2)),
    dict(size=(1, 3), stride=(2, 1), pad=((0, 0), (2, 2)), base=(1, 2), win=(1, 1)),
])
@pytest.mark.parametrize("kind", ["add", "max"])
def test_reduce_window(case, kind):
    x = rand(5, 6)
    fn = (lambda a, b: a + b) if kind == "add" else max
    init = 0.0 if kind == "add" else -np.inf
    want = _reduce_window_ref(x.astype(np.float64), init, fn, case["size"], case["stride"], case["pad"],
                              case["base"], case["win"])
    win = " ".join([
        "size=" + "x".join(map(str, case["size"])), "stride=" + "x".join(map(str, case["stride"])),
        "pad=" + "x".join(f"{lo}_{hi}" for lo, hi in case["pad"]),
        "lhs_dilate=" + "x".join(map(str, case["base"])), "rhs_dilate=" + "x".join(map(str, case["win"]))])
    shape = ",".join(map(str, want.shape))
    got = run1(f"  x = f32[5,6] parameter(0)\n  c = f32[] constant({'0' if kind == 'add' else '-inf'})\n"
               f"  ROOT r = f32[{shape}] reduce-window(x, c), window={{{win}}}, to_apply={kind}_c",
               x, extra=ADD if kind == "add" else MAX)
    np.testing.assert_allclose(got, want.astype(F32), rtol=1e-6)


# ----------------------------------------------------------------------------- dot and convolution

def test_dot_batch_and_contracting_dims():
    a, b = rand(3, 4, 2, 5), rand(5, 2, 3, 6)
    got = run1("  a = f32[3,4,2,5] parameter(0)\n  b = f32[5,2,3,6] parameter(1)\n"
               "  ROOT r = f32[3,4,6] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={3,2}, "
               "rhs_batch_dims={2}, rhs_contracting_dims={0,1}", a, b)
    want = np.einsum("bmkc,ckbn->bmn", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want.astype(F32), rtol=1e-5, atol=1e-6)


def _conv_ref(x, w, stride, pad, lhs_dil, rhs_dil, fgc=1, bgc=1):
    """Naive NCHW/OIHW convolution by index arithmetic."""
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    hh, ww = (h - 1) * lhs_dil[0] + 1 + pad[0][0] + pad[0][1], (wd - 1) * lhs_dil[1] + 1 + pad[1][0] + pad[1][1]
    big = np.zeros((n, c, hh, ww))
    for i, j in itertools.product(range(h), range(wd)):
        y0, x0 = i * lhs_dil[0] + pad[0][0], j * lhs_dil[1] + pad[1][0]
        if 0 <= y0 < hh and 0 <= x0 < ww:
            big[:, :, y0, x0] = x[:, :, i, j]
    oh = (hh - (kh - 1) * rhs_dil[0] - 1) // stride[0] + 1
    ow = (ww - (kw - 1) * rhs_dil[1] - 1) // stride[1] + 1
    ob = n // bgc
    out = np.zeros((ob, o, oh, ow))
    for b, f, yy, xx in itertools.product(range(ob), range(o), range(oh), range(ow)):
        g = f // (o // fgc)
        bg = f // (o // bgc)
        acc = 0.0
        for cc, ky, kx in itertools.product(range(ci), range(kh), range(kw)):
            acc += big[bg * ob + b, g * ci + cc, yy * stride[0] + ky * rhs_dil[0],
                       xx * stride[1] + kx * rhs_dil[1]] * w[f, cc, ky, kx]
        out[b, f, yy, xx] = acc
    return out


CONV_CASES = [
    dict(stride=(1, 1), pad=((1, 1), (1, 1)), lhs=(1, 1), rhs=(1, 1), fgc=1, bgc=1, n=2, c=3, o=4),
    dict(stride=(2, 1), pad=((0, 1), (2, 0)), lhs=(1, 1), rhs=(2, 1), fgc=1, bgc=1, n=1, c=2, o=3),
    dict(stride=(1, 2), pad=((1, 0), (0, 0)), lhs=(2, 1), rhs=(1, 1), fgc=1, bgc=1, n=2, c=2, o=2),
    dict(stride=(1, 1), pad=((-1, 1), (1, 1)), lhs=(1, 1), rhs=(1, 1), fgc=1, bgc=1, n=1, c=2, o=2),
    dict(stride=(1, 1), pad=((1, 1), (0, 1)), lhs=(1, 1), rhs=(1, 1), fgc=2, bgc=1, n=2, c=4, o=6),
    dict(stride=(1, 1), pad=((1, 1), (1, 1)), lhs=(1, 1), rhs=(1, 1), fgc=3, bgc=1, n=1, c=3, o=3),
    dict(stride=(1, 1), pad=((0, 0), (0, 0)), lhs=(1, 1), rhs=(1, 1), fgc=1, bgc=2, n=2, c=3, o=4),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("labels", ["nchw", "nhwc"])
def test_convolution(case, labels):
    n, c, o, kh, kw, h, wd = case["n"], case["c"], case["o"], 3, 2, 6, 5
    x = rand(n, c, h, wd)
    w = rand(o, c // case["fgc"], kh, kw)
    want = _conv_ref(x.astype(np.float64), w.astype(np.float64), case["stride"], case["pad"], case["lhs"],
                     case["rhs"], case["fgc"], case["bgc"])
    win = " ".join([
        f"size={kh}x{kw}", "stride=" + "x".join(map(str, case["stride"])),
        "pad=" + "x".join(f"{lo}_{hi}" for lo, hi in case["pad"]),
        "lhs_dilate=" + "x".join(map(str, case["lhs"])), "rhs_dilate=" + "x".join(map(str, case["rhs"]))])
    if labels == "nchw":
        xs, ws, dl, out = x, w, "bf01_oi01->bf01", want
    else:  # NHWC input, HWIO kernel, output with features first: f01b
        xs, ws, dl = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0), "b01f_01io->f01b"
        out = want.transpose(1, 2, 3, 0)
    shp = lambda a: ",".join(map(str, a.shape))
    got = run1(f"  x = f32[{shp(xs)}] parameter(0)\n  w = f32[{shp(ws)}] parameter(1)\n"
               f"  ROOT r = f32[{shp(out)}] convolution(x, w), window={{{win}}}, dim_labels={dl}, "
               f"feature_group_count={case['fgc']}, batch_group_count={case['bgc']}",
               np.ascontiguousarray(xs), np.ascontiguousarray(ws))
    np.testing.assert_allclose(got, out.astype(F32), rtol=1e-5, atol=1e-5)


def test_convolution_window_reversal():
    x, w = rand(1, 1, 5, 1), rand(1, 1, 3, 1)
    got = run1("  x = f32[1,1,5,1] parameter(0)\n  w = f32[1,1,3,1] parameter(1)\n"
               "  ROOT r = f32[1,1,3,1] convolution(x, w), window={size=3x1 rhs_reversal=1x0}, "
               "dim_labels=bf01_oi01->bf01",
               x, w)
    want = np.array([sum(x[0, 0, i + k, 0] * w[0, 0, 2 - k, 0] for k in range(3)) for i in range(3)])
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-5)


def test_conv_bench_size_is_fast():
    import time
    x, w = rand(8, 56, 56, 64), rand(3, 3, 64, 64) * 0.05
    t = time.perf_counter()
    got = run1("  x = f32[8,56,56,64] parameter(0)\n  w = f32[3,3,64,64] parameter(1)\n"
               "  ROOT r = f32[8,56,56,64] convolution(x, w), window={size=3x3 pad=1_1x1_1}, "
               "dim_labels=b01f_01io->b01f",
               x, w.astype(F32))
    assert time.perf_counter() - t < 3.0
    # spot-check one output position against a direct sum
    b, i, j = 3, 0, 17
    patch = np.zeros((3, 3, 64))
    for di, dj in itertools.product(range(3), range(3)):
        if 0 <= i + di - 1 < 56 and 0 <= j + dj - 1 < 56:
            patch[di, dj] = x[b, i + di - 1, j + dj - 1]
    want = np.einsum("hwc,hwco->o", patch, w.astype(F32).astype(np.float64))
    np.testing.assert_allclose(got[b, i, j], want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- calls and custom-calls

def test_call_and_fusion():
    callee = ("sq {\n  p = f32[4] parameter(0)\n  q = f32[4] parameter(1)\n  m = f32[4] multiply(p, p)\n"
              "  ROOT r = f32[4] subtract(m, q)\n}\n")
    x, y = rand(4), rand(4)
    for op in ("call(x, y), to_apply=sq", "fusion(x, y), kind=kLoop, calls=sq"):
        got = run1(f"  x = f32[4] parameter(0)\n  y = f32[4] parameter(1)\n  ROOT r = f32[4] {op}", x, y,
                   extra=callee)
        np.testing.assert_allclose(got, x * x - y, rtol=1e-6)


def _gemm_config(extra: str = "", beta: int = 0, epilogue: str = "DEFAULT", alpha: float = 1) -> str:
    dims = ('{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],'
            '"rhs_contracting_dimensions":["0"]}')
    return (f'{{"gemm_backend_config":{{"alpha_imag":0,"alpha_real":{alpha},"beta":{beta},'
            f'"dot_dimension_numbers":{dims},"epilogue":"{epilogue}"{extra}}}}}')


def test_cublas_gemm_with_alpha_beta_and_bias_relu():
    a, b, c, bias = rand(4, 3), rand(3, 5), rand(4, 5), rand(5)
    got = run("  a = f32[4,3] parameter(0)\n  b = f32[3,5] parameter(1)\n  c = f32[4,5] parameter(2)\n"
              "  cc = (f32[4,5], s8[64]) custom-call(a, b, c), custom_call_target=\"__cublas$lt$matmul\", "
              f"backend_config={_gemm_config(beta=2, alpha=0.5)}\n"
              "  ROOT g = f32[4,5] get-tuple-element(cc), index=0", a, b, c)[0]
    np.testing.assert_allclose(got, 0.5 * (a.astype(np.float64) @ b) + 2 * c, rtol=1e-5, atol=1e-6)
    got = run("  a = f32[4,3] parameter(0)\n  b = f32[3,5] parameter(1)\n  v = f32[5] parameter(2)\n"
              "  ROOT cc = (f32[4,5], s8[64]) custom-call(a, b, v), custom_call_target=\"__cublas$lt$matmul\", "
              f"backend_config={_gemm_config(epilogue='BIAS_RELU')}", a, b, bias)
    np.testing.assert_allclose(got[0], np.maximum(a.astype(np.float64) @ b + bias, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], np.zeros(64, np.int8))


def test_cudnn_conv_bias_relu():
    x, w, bias = rand(1, 5, 5, 2), rand(3, 3, 2, 4), rand(4)
    cfg = ('{"cudnn_conv_backend_config":{"activation_mode":"kRelu","conv_result_scale":1,'
           '"leakyrelu_alpha":0,"side_input_scale":0}}')
    got = run("  x = f32[1,5,5,2] parameter(0)\n  w = f32[3,3,2,4] parameter(1)\n  b = f32[4] parameter(2)\n"
              "  cc = (f32[1,5,5,4], u8[0]) custom-call(x, w, b), window={size=3x3 pad=1_1x1_1}, "
              "dim_labels=b01f_01io->b01f, custom_call_target=\"__cudnn$convBiasActivationForward\", "
              f"backend_config={cfg}\n  ROOT g = f32[1,5,5,4] get-tuple-element(cc), index=0", x, w, bias)[0]
    ref = _conv_ref(x.transpose(0, 3, 1, 2).astype(np.float64), w.transpose(3, 2, 0, 1).astype(np.float64),
                    (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1))
    np.testing.assert_allclose(got, np.maximum(ref.transpose(0, 2, 3, 1) + bias, 0), rtol=1e-5, atol=1e-5)


def test_unknown_custom_call_is_unsupported():
    with pytest.raises(UnsupportedError, match="mystery") as e:
        run("  x = f32[2] parameter(0)\n  ROOT r = f32[2] custom-call(x), custom_call_target=\"mystery\"",
            np.zeros(2, F32))
    assert e.value.op == "r" and e.value.line is not None


def test_describe_custom_call_specs_and_errors():
    mod = parse_hlo("HloModule t\nENTRY e {\n  a = f32[4,3] parameter(0)\n  b = f32[3,5] parameter(1)\n"
                    "  ROOT cc = (f32[4,5], s8[64]) custom-call(a, b), custom_call_target=\"__cublas$gemm\", "
                    f"backend_config={_gemm_config(epilogue='RELU', alpha=2)}\n}}\n")
    spec = custom_calls.describe_custom_call(mod.entry_computation.root_instruction)
    assert isinstance(spec, custom_calls.GemmSpec)
    assert (spec.lhs_contracting_dims, spec.rhs_contracting_dims, spec.alpha, spec.activation) == ((1,), (0,), 2.0,
                                                                                                   "relu")
    bad = mod.entry_computation.root_instruction.with_attrs(backend_config='{"gemm_backend_config": {oops')
    with pytest.raises(UnsupportedError, match="malformed"):
        custom_calls.describe_custom_call(bad)
    bad = mod.entry_computation.root_instruction.with_attrs(backend_config=_gemm_config(epilogue="D_AMAX"))
    with pytest.raises(UnsupportedError, match="D_AMAX"):
        custom_calls.describe_custom_call(bad)


def test_shape_mismatch_names_instruction():
    with pytest.raises(ShapeError, match="r"):
        run("  x = f32[2,3] parameter(0)\n  ROOT r = f32[3,3] negate(x)", np.zeros((2, 3), F32))
