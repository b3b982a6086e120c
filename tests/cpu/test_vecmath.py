"""Accuracy and special values of hlotune.codegen.vecmath against numpy (long double references).

Harness: an LLVM module with `kernel(out, x[, y], n)` = a vector loop (8 x f32 / 4 x f64) calling
`emit_math` plus a scalar tail, optimized at O3 (new pass manager), JIT-compiled with MCJIT for the
host and called through ctypes on numpy arrays.
"""

from __future__ import annotations

import ctypes
import functools
import math
import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from hlotune.codegen.vecmath import POWER_F64_EXTREME_ULP, TRIG_ACCURATE_RANGE, ULP_BOUNDS, emit_math
from hlotune.errors import UnsupportedError
from hlotune.ir.hlo import Op

LD = np.longdouble
WIDTH = {np.float32: 8, np.float64: 4}

ULP_BOUND = ULP_BOUNDS  # (float32, float64) max ulp, documented in vecmath


# ---------------------------------------------------------------------------------------------------
# harness


@functools.cache
def _target_machine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(), opt=3)


def _build_ir(op: Op, dtype, arity: int) -> ir.Module:
    fty = ir.FloatType() if dtype == np.float32 else ir.DoubleType()
    width = WIDTH[dtype]
    vty = ir.VectorType(fty, width)
    i64 = ir.IntType(64)
    ptr = fty.as_pointer()
    mod = ir.Module(name=f"vecmath_{op.name}")
    mod.triple = llvm.get_process_triple()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr] * (1 + arity) + [i64]), "kernel")
    out, *ins, n = fn.args
    entry, vhead, vbody, thead, tbody, done = (fn.append_basic_block(s) for s in
                                               ("entry", "vhead", "vbody", "thead", "tbody", "done"))
    b = ir.IRBuilder(entry)
    b.branch(vhead)
    # vector loop: while i + W <= n
    b.position_at_end(vhead)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.cbranch(b.icmp_signed("<=", b.add(i, ir.Constant(i64, width)), n), vbody, thead)
    b.position_at_end(vbody)
    args = [b.load(b.bitcast(b.gep(p, [i]), vty.as_pointer()), align=4) for p in ins]
    b.store(emit_math(b, op, args), b.bitcast(b.gep(out, [i]), vty.as_pointer()), align=4)
    i_next = b.add(i, ir.Constant(i64, width))
    i.add_incoming(i_next, vbody)
    b.branch(vhead)
    # scalar tail
    b.position_at_end(thead)
    j = b.phi(i64)
    j.add_incoming(i, vhead)
    b.cbranch(b.icmp_signed("<", j, n), tbody, done)
    b.position_at_end(tbody)
    sargs = [b.load(b.gep(p, [j])) for p in ins]
    b.store(emit_math(b, op, sargs), b.gep(out, [j]))
    j.add_incoming(b.add(j, ir.Constant(i64, 1)), tbody)
    b.branch(thead)
    b.position_at_end(done)
    b.ret_void()
    return mod


@functools.cache
def _compiled(op: Op, dtype):
    arity = 2 if op in (Op.POWER, Op.ATAN2) else 1
    mod = llvm.parse_assembly(str(_build_ir(op, dtype, arity)))
    mod.verify()
    tm = _target_machine()
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    mod.verify()
    asm = tm.emit_assembly(mod)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    cty = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    proto = ctypes.CFUNCTYPE(None, *[ctypes.POINTER(cty)] * (1 + arity), ctypes.c_int64)
    fn = proto(engine.get_function_address("kernel"))
    return engine, fn, str(mod), asm


def run(op: Op, dtype, *xs: np.ndarray) -> np.ndarray:
    """Evaluate the JIT-compiled elementwise kernel of `op` on arrays of `dtype`."""
    _, fn, _, _ = _compiled(op, dtype)
    arrs = [np.ascontiguousarray(np.broadcast_to(x, xs[0].shape), dtype=dtype) for x in xs]
    out = np.empty_like(arrs[0])
    cty = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    fn(*[a.ctypes.data_as(ctypes.POINTER(cty)) for a in [out, *arrs]], out.size)
    return out


# ---------------------------------------------------------------------------------------------------
# references and ulp measurement

_erf = np.vectorize(math.erf, otypes=[np.float64])

REF = {
    Op.EXP: np.exp, Op.EXPM1: np.expm1, Op.LOG: np.log, Op.LOG1P: np.log1p, Op.SQRT: np.sqrt,
    Op.RSQRT: lambda x: 1 / np.sqrt(x), Op.TANH: np.tanh, Op.LOGISTIC: lambda x: 1 / (1 + np.exp(-x)),
    Op.SINE: np.sin, Op.COSINE: np.cos, Op.ERF: lambda x: _erf(x.astype(np.float64)).astype(LD),
    Op.ATAN2: np.arctan2, Op.POWER: np.power,
}


def reference(op: Op, *xs: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REF[op](*[x.astype(LD) for x in xs]).astype(LD)


def ulp_error(got: np.ndarray, ref: np.ndarray, dtype) -> np.ndarray:
    """|got - ref| in ulps of dtype at ref; where ref rounds to inf/nan, 0 if equal (nan: both nan) else inf."""
    info = np.finfo(dtype)
    with np.errstate(all="ignore"):
        rounded = ref.astype(dtype)
    _, e = np.frexp(np.abs(ref))
    e = np.maximum(e, info.minexp + 1)
    ulp = np.ldexp(LD(1), e - info.nmant - 1)
    with np.errstate(all="ignore"):
        err = np.abs(got.astype(LD) - ref) / ulp
    special = ~np.isfinite(rounded)
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    err = np.where(special, np.where(same, 0, np.inf), err)
    return np.where(np.isfinite(rounded) & ~np.isfinite(got), np.inf, err)


def sweep(dtype, n: int = 100_000) -> np.ndarray:
    """Log-spaced magnitudes over every exponent (smallest denormal to max), both signs, and specials."""
    info = np.finfo(dtype)
    tiny = float(np.nextafter(dtype(0), dtype(1)))
    with np.errstate(all="ignore"):
        mags = np.geomspace(tiny, float(info.max), n).astype(dtype)
    return np.concatenate([mags, -mags, specials(dtype)])


def specials(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    tiny = np.nextafter(dtype(0), dtype(1))
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, tiny, -tiny, info.tiny, -info.tiny, info.tiny / 3, 1.0, -1.0,
            info.max, -info.max, info.eps, 0.5, 2.0]
    return np.array(vals, dtype=dtype)


def uniform(dtype, lo: float, hi: float, n: int = 20_000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, n).astype(dtype)


#: |x| up to which sin/cos keep their ulp bound (Cody-Waite reduction); beyond: bounded, see docs
TRIG_LIMIT = dict(zip([np.float32, np.float64], TRIG_ACCURATE_RANGE))

INTERESTING = {
    Op.EXP: (-110, 90), Op.EXPM1: (-2, 2), Op.LOG: (0, 4), Op.LOG1P: (-1, 2), Op.SQRT: (0, 10), Op.RSQRT: (0, 10),
    Op.TANH: (-5, 5), Op.LOGISTIC: (-110, 40), Op.SINE: (-10, 10), Op.COSINE: (-10, 10), Op.ERF: (-5, 5),
}


def unary_inputs(op: Op, dtype) -> np.ndarray:
    x = np.concatenate([sweep(dtype), uniform(dtype, *INTERESTING[op]), uniform(dtype, -1e-3, 1e-3, 2000)])
    if op in (Op.SINE, Op.COSINE):
        near = (np.arange(1, 63_000, dtype=LD) * (LD(np.pi) / 2)).astype(dtype)  # near multiples of pi/2
        lim = TRIG_LIMIT[dtype]
        x = np.concatenate([x[~(np.abs(x) > lim)], near, -near, uniform(dtype, -1e5, 1e5), uniform(dtype, -lim, lim)])
    return x


def _max_ulp(op, dtype, *xs):
    got = run(op, dtype, *xs)
    ref = reference(op, *xs)
    err = ulp_error(got, ref, dtype)
    k = int(np.argmax(err))
    return float(err[k]), [x[k] for x in xs], got[k], ref[k]


DTYPES = [np.float32, np.float64]
UNARY = [Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.SQRT, Op.RSQRT, Op.TANH, Op.LOGISTIC, Op.SINE, Op.COSINE, Op.ERF]


# ---------------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", UNARY, ids=lambda o: o.name)
def test_unary_ulp(op, dtype):
    x = unary_inputs(op, dtype)
    err, at, got, ref = _max_ulp(op, dtype, x)
    assert err <= ULP_BOUND[op][dtype == np.float64], f"{op} {dtype.__name__}: {err} ulp at x={at} got {got} ref {ref}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", UNARY, ids=lambda o: o.name)
def test_unary_special_values(op, dtype):
    x = specials(dtype)
    got = run(op, dtype, x)
    with np.errstate(all="ignore"):
        ref = reference(op, x).astype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    exact = (np.isinf(ref) | (ref == 0) | np.isinf(x) | (x == 0)) & ~np.isnan(ref)
    np.testing.assert_array_equal(got[exact], ref[exact])
    np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(ref[exact]))


def _pairs(dtype, n: int = 60_000, seed: int = 1):
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    lo = math.log2(float(np.nextafter(dtype(0), dtype(1))))
    e = rng.uniform(lo, math.log2(float(info.max)), (2, n))
    v = (np.exp2(e) * rng.choice([-1.0, 1.0], (2, n))).astype(dtype)
    return v[0], v[1]


def _special_grid(dtype):
    info = np.finfo(dtype)
    vals = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, np.inf, -np.inf, np.nan,
                     info.tiny / 4, -info.tiny / 4, info.max, -info.max], dtype=dtype)
    a, b = np.meshgrid(vals, vals)
    return a.ravel(), b.ravel()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_atan2_ulp(dtype):
    y, x = _pairs(dtype)
    u = uniform(dtype, -3, 3, 20_000, seed=2), uniform(dtype, -3, 3, 20_000, seed=3)
    y, x = np.concatenate([y, u[0]]), np.concatenate([x, u[1]])
    err, at, got, ref = _max_ulp(Op.ATAN2, dtype, y, x)
    assert err <= ULP_BOUND[Op.ATAN2][dtype == np.float64], f"{err} ulp at {at}: {got} vs {ref}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_power_ulp(dtype):
    rng = np.random.default_rng(4)
    x = np.exp(rng.uniform(-40, 40, 60_000)).astype(dtype) * rng.choice([-1, 1], 60_000).astype(dtype)
    y = rng.uniform(-8, 8, 60_000).astype(dtype)
    y[::3] = np.round(y[::3])  # integers (negative bases give finite results)
    xb = uniform(dtype, 0, 2.5, 20_000, seed=5)
    yb = uniform(dtype, -60, 60, 20_000, seed=6) if dtype == np.float32 else uniform(dtype, -400, 400, 20_000, 6)
    x, y = np.concatenate([x, xb]), np.concatenate([y, yb])
    err, at, got, ref = _max_ulp(Op.POWER, dtype, x, y)
    assert err <= ULP_BOUND[Op.POWER][dtype == np.float64], f"{err} ulp at {at}: {got} vs {ref}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_power_near_overflow_and_underflow(dtype):
    """|y log x| up to the overflow threshold: float64 loses a few bits of log (documented bound 24 ulp)."""
    rng = np.random.default_rng(7)
    lim = 88.0 if dtype == np.float32 else 709.0
    x = np.exp(rng.uniform(-20, 20, 50_000)).astype(dtype)
    y = (rng.uniform(-lim, lim, 50_000) / np.log(x.astype(np.float64))).astype(dtype)
    err, at, got, ref = _max_ulp(Op.POWER, dtype, x, y)
    bound = ULP_BOUND[Op.POWER][0] if dtype == np.float32 else POWER_F64_EXTREME_ULP
    assert err <= bound, f"{err} ulp at {at}: {got} vs {ref}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", [Op.POWER, Op.ATAN2], ids=lambda o: o.name)
def test_binary_special_values(op, dtype):
    a, b = _special_grid(dtype)
    got = run(op, dtype, a, b)
    with np.errstate(all="ignore"):
        ref = (np.power(a, b) if op == Op.POWER else np.arctan2(a, b)).astype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    exact = np.isinf(ref) | (ref == 0) | (ref == 1) | np.isinf(a) | np.isinf(b)
    if op == Op.POWER:
        exact |= (b == np.round(b)) & (b >= 0) & (np.abs(a) <= 3)  # small integer powers are exact
    np.testing.assert_array_equal(got[exact], ref[exact])
    exact &= ~np.isnan(ref)
    np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(ref[exact]))
    err = ulp_error(got, reference(op, a, b), dtype)
    assert err.max() <= ULP_BOUND[op][dtype == np.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", [Op.SINE, Op.COSINE], ids=lambda o: o.name)
def test_trig_beyond_range_is_bounded(op, dtype):
    x = sweep(dtype)
    x = x[np.abs(x) > TRIG_LIMIT[dtype]]
    got = run(op, dtype, x)
    fin = np.isfinite(x)
    assert np.all(np.abs(got[fin]) <= 1)
    assert np.all(np.isnan(got[~fin]))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", [Op.FLOOR, Op.CEIL, Op.ROUND_NEAREST_EVEN, Op.ABS, Op.SIGN], ids=lambda o: o.name)
def test_simple_ops_exact(op, dtype):
    x = np.concatenate([sweep(dtype, 2000), uniform(dtype, -5, 5, 2000), np.array([0.5, 1.5, 2.5, -0.5], dtype)])
    ref = {Op.FLOOR: np.floor, Op.CEIL: np.ceil, Op.ROUND_NEAREST_EVEN: np.rint, Op.ABS: np.abs,
           Op.SIGN: np.sign}[op](x)
    if op == Op.SIGN:
        ref = np.where(x == 0, x, ref)  # XLA: sign(-0) = -0 (numpy gives +0)
    got = run(op, dtype, x)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(ref))


#: a call to a non-intrinsic, or to an intrinsic that LLVM lowers to a libm call
_LIBM = re.compile(r"@((?!llvm\.)[\w.$]+|llvm\.(exp|exp2|exp10|log|log2|log10|sin|cos|tan|pow|powi|atan|atan2|"
                   r"sinh|cosh|tanh|asin|acos|ldexp|frexp)\.[\w.]+)\(")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", UNARY + [Op.POWER, Op.ATAN2], ids=lambda o: o.name)
def test_loop_is_vector_math_without_calls(op, dtype):
    _, _, opt_ir, asm = _compiled(op, dtype)
    vec = f"<{WIDTH[dtype]} x {'float' if dtype == np.float32 else 'double'}>"
    calls = [ln for ln in opt_ir.splitlines() if re.search(r"\bcall\b", ln) and _LIBM.search(ln)]
    assert calls == [], calls
    if op not in (Op.SQRT, Op.RSQRT):
        assert re.search(r"call <\d+ x (float|double)> @llvm\.fma\.v", opt_ir), "no vector fma in the optimized loop"
        assert re.search(r"vfmadd\w*\s.*[yz]mm", asm), "no packed fma in the machine code"
    assert re.search(rf"store {re.escape(vec)}", opt_ir), "the loop does not store vectors"
    assert not re.search(r"\bcall\w*\s+\w*(exp|log|sin|cos|tanh|pow|atan|erf|sqrt|fmod)", asm)


def _per_vector(opt_ir: str, dtype, pattern: str) -> float:
    """How many IR lines of the vector loop match `pattern` per vector stored (the loop may be unrolled)."""
    ty = "float" if dtype == np.float32 else "double"
    lanes = rf"<{WIDTH[dtype]} x "
    stores = len(re.findall(rf"store {re.escape(lanes)}{ty}>", opt_ir))
    lines = [ln for ln in opt_ir.splitlines() if lanes in ln and re.search(pattern, ln)]
    return len(lines) / stores


#: vector instructions per result vector of the optimized loop: a regression guard on the cost of the hot
#: functions of the elementwise models (tanh was ~52 with a dead exp path and two specials selects)
MAX_VECTOR_INSTRUCTIONS = {Op.TANH: 30, Op.EXP: 30, Op.SINE: 38, Op.LOGISTIC: 38}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("op", sorted(MAX_VECTOR_INSTRUCTIONS, key=lambda o: o.name), ids=lambda o: o.name)
def test_hot_functions_stay_lean(op, dtype):
    _, _, opt_ir, _ = _compiled(op, dtype)
    n_div = _per_vector(opt_ir, dtype, r"= fdiv ")
    assert n_div == (1 if op in (Op.TANH, Op.LOGISTIC) else 0), n_div
    n = _per_vector(opt_ir, dtype, r"^\s*%\S+ = ")
    extra = 8 if dtype == np.float64 else 0  # f64 polynomials are longer
    assert n <= MAX_VECTOR_INSTRUCTIONS[op] + extra, f"{op}: {n} vector instructions per vector"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_exp_reduction_is_lean(dtype):
    """exp's hot loop has no round-to-integer, float-to-int conversion, NaN-ignoring min/max or NaN select (the
    shifter trick gives n, and the clamp lets NaN through): with them it took three more vector instructions per
    vector (exp 1.22x slower on a Zen 1 core, docs/codegen.md)."""
    _, _, opt_ir, _ = _compiled(Op.EXP, dtype)
    for pattern in (r"llvm\.roundeven", r"= fptosi ", r"llvm\.(minnum|maxnum)", r"fcmp uno "):
        assert _per_vector(opt_ir, dtype, pattern) == 0, pattern


def test_ir_verifies_for_all_widths_and_types():
    ops = [Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.TANH, Op.LOGISTIC, Op.SINE, Op.COSINE, Op.ERF, Op.SQRT,
           Op.RSQRT, Op.POWER, Op.ATAN2]
    mod = ir.Module(name="widths")
    for k, ty in enumerate([ir.FloatType(), ir.DoubleType(), ir.VectorType(ir.FloatType(), 1),
                            ir.VectorType(ir.FloatType(), 3), ir.VectorType(ir.DoubleType(), 16)]):
        for op in ops:
            arity = 2 if op in (Op.POWER, Op.ATAN2) else 1
            fn = ir.Function(mod, ir.FunctionType(ty, [ty] * arity), f"f{k}_{op.name}")
            b = ir.IRBuilder(fn.append_basic_block())
            b.ret(emit_math(b, op, list(fn.args)))
    llvm.parse_assembly(str(mod)).verify()


def test_rejects_bad_types():
    mod = ir.Module(name="bad")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ir.IntType(32), ir.VectorType(ir.FloatType(), 17)]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(UnsupportedError):
        emit_math(b, Op.EXP, [fn.args[0]])
    with pytest.raises(UnsupportedError):
        emit_math(b, Op.EXP, [fn.args[1]])
    with pytest.raises(UnsupportedError):
        emit_math(b, Op.ADD, [fn.args[1], fn.args[1]])
