"""A float vector divided by a uniform divisor (llvm_emit `FuncEmitter._uniform_division`): multiplied by the
divisor's reciprocal, as XLA's simplifier rewrites A / broadcast(B), when that reciprocal is a normal number; the
division itself otherwise, and wherever the divisor varies.  Compared bit for bit with numpy's a * (1 / c) or a / c
and, for the reciprocal form, within 1.5 ulp of the division."""

from __future__ import annotations

import numpy as np
import pytest

import hlotune.codegen.llvm_emit as le
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.ir.expr import Binary, Const, Load, Var
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.loop_ir import BufferDecl, For, ForKind, LoopFunc, Store

from ..null.test_passes_power import ulps

S64 = DType.S64
N = 1024


def divide_kernel(dt: DType, lanes: int, uniform: bool) -> LoopFunc:
    """y[i] = x[i] / s[0] (uniform) or x[i] / s[i] (varying), vectorized by `lanes`."""
    i, v = Var("i"), Var("v")
    idx = i * lanes + v
    den = Load("s", (Const(0, S64),) if uniform else (idx,), dt)
    body = Store("y", (idx,), Binary(Op.DIVIDE, Load("x", (idx,), dt), den, dt))
    nest = For(i, Const(0, S64), Const(N // lanes, S64), ForKind.SERIAL,
               For(v, Const(0, S64), Const(lanes, S64), ForKind.VECTORIZED, body))
    s_shape = (1,) if uniform else (N,)
    return LoopFunc(f"div_{dt.name}_{lanes}_{int(uniform)}", (BufferDecl("x", (N,), dt), BufferDecl("s", s_shape, dt)),
                    (BufferDecl("y", (N,), dt),), nest)


def dividends(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -3.0, info.tiny, info.tiny / 8, -info.max, info.max],
                       dtype=dtype)
    rng = np.random.default_rng(5)
    k = N - special.size
    mags = np.exp(rng.uniform(-60, 60, k)) * rng.choice([-1.0, 1.0], k)
    return np.concatenate([special, mags.astype(dtype)])


def run(func: LoopFunc, x: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, str]:
    kern = build_cpu(func)
    y = np.full(N, np.nan, x.dtype)
    kern(x, s, y)
    return y, kern.optimized_ir


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all((a == b) & (np.signbit(a) == np.signbit(b)) | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("dt, lanes", [(DType.F32, 8), (DType.F32, 16), (DType.F64, 4)])
@pytest.mark.parametrize("c", [3.0, -0.1, 1e-3, 1024.0, 7e30, 1e-30])
def test_reciprocal_form_in_range(dt, lanes, c):
    npt = dt.np.type
    x = dividends(dt.np)
    s = np.array([c], dt.np)
    y, text = run(divide_kernel(dt, lanes, True), x, s)
    with np.errstate(all="ignore"):
        want = x * (npt(1.0) / s[0])
        exact = x / s[0]
    assert same_bits(y, want)
    finite = np.isfinite(exact) & np.isfinite(want) & (np.abs(exact) >= np.finfo(dt.np).tiny)
    assert ulps(y[finite], exact[finite].astype(np.longdouble), dt.np).max() <= 1.5
    assert " fmul " in text


@pytest.mark.parametrize("c", [0.0, -0.0, np.inf, np.nan, 1e-40, 3e38, -2.0 ** 127])
def test_division_where_the_reciprocal_is_not_normal(c):
    """Zero, inf, NaN, a subnormal or a divisor above 2^126: the reciprocal would be inf, zero or subnormal, so the
    vector division runs (the uniform branch) and the result is the division's, bit for bit."""
    x = dividends(np.float32)
    y, _ = run(divide_kernel(DType.F32, 8, True), x, np.array([c], np.float32))
    with np.errstate(all="ignore"):
        assert same_bits(y, x / np.float32(c))


def test_varying_divisor_and_rule_off_divide(monkeypatch):
    x = dividends(np.float32)
    s = np.random.default_rng(6).uniform(0.1, 9.0, N).astype(np.float32)
    y, _ = run(divide_kernel(DType.F32, 8, False), x, s)
    with np.errstate(all="ignore"):
        assert same_bits(y, x / s)
    monkeypatch.setattr(le, "UNIFORM_DIVISION", False)
    f = divide_kernel(DType.F32, 8, True)
    f = LoopFunc(f.name + "_off", f.inputs, f.outputs, f.body)   # a new kernel name: not the cached build
    y, _ = run(f, x, np.array([3.0], np.float32))
    with np.errstate(all="ignore"):
        assert same_bits(y, x / np.float32(3.0))
