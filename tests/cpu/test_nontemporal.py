"""Non-temporal stores (llvm_emit `nontemporal_buffers`): which outputs get them, and results equal to numpy
whether the output's address allows them (16-byte aligned) or not (the normal-store path)."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.buffers import aligned_empty
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.codegen.llvm_emit import nontemporal_buffers
from hlotune.ir.expr import Binary, Compare, Const, Load, Var
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.loop_ir import Allocate, BufferDecl, For, ForKind, If, LoopFunc, Seq, Store

S64 = DType.S64
ENV = "HLOTUNE_NONTEMPORAL_STORE_BYTES"


def c(v: int) -> Const:
    return Const(v, S64)


def axpb(n: int, lanes: int, dt: DType, accumulate: bool = False, parallel: bool = True) -> LoopFunc:
    """y[i] = 2 x[i] + 1 (or y[i] += x[i]), vectorized by `lanes`, a tail guard when lanes do not divide n."""
    i, v = Var("i"), Var("v")
    idx = i * lanes + v
    x = Load("x", (idx,), dt)
    val = (Binary(Op.ADD, Load("y", (idx,), dt), x, dt) if accumulate
           else Binary(Op.ADD, Binary(Op.MULTIPLY, x, Const(2.0, dt), dt), Const(1.0, dt), dt))
    store = Store("y", (idx,), val)
    body = If(Compare("LT", idx, c(n)), store) if n % lanes else store
    kind = ForKind.PARALLEL if parallel else ForKind.SERIAL
    nest = For(i, c(0), c(-(-n // lanes)), kind, For(v, c(0), c(lanes), ForKind.VECTORIZED, body))
    return LoopFunc(f"axpb_{lanes}_{dt.name}_{int(accumulate)}", (BufferDecl("x", (n,), dt),),
                    (BufferDecl("y", (n,), dt),), nest)


def _view(n: int, dt: DType, offset: int) -> np.ndarray:
    """A contiguous array of n NaNs starting `offset` elements past a 64-byte boundary (an element the kernel
    does not write stays NaN and fails the comparison)."""
    a = aligned_empty((n + offset,), dt.np)[offset:]
    a.fill(np.nan)
    return a


@pytest.mark.parametrize("dt,lanes", [(DType.F32, 4), (DType.F32, 8), (DType.F32, 16), (DType.F64, 4),
                                      (DType.F64, 8)])
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_results_match_numpy_aligned_or_not(monkeypatch, dt, lanes, offset):
    monkeypatch.setenv(ENV, "1")
    n = 4099
    kern = build_cpu(axpb(n, lanes, dt))
    assert "!nontemporal" in kern.optimized_ir and "sfence" in kern.optimized_ir
    x = np.random.default_rng(lanes + offset).standard_normal(n).astype(dt.np)
    y = _view(n, dt, offset)
    kern(x, y)
    np.testing.assert_array_equal(y, x * dt.np.type(2) + dt.np.type(1))


def test_off_below_the_threshold_and_when_disabled(monkeypatch):
    f = axpb(1024, 8, DType.F32)
    monkeypatch.setenv(ENV, str(1024 * 4 + 1))   # one byte more than y
    assert nontemporal_buffers(f, 1024 * 4 + 1) == frozenset()
    assert "!nontemporal" not in build_cpu(f).llvm_ir
    monkeypatch.setenv(ENV, "0")
    assert "!nontemporal" not in build_cpu(f).llvm_ir
    assert nontemporal_buffers(f, 1024 * 4) == {"y"}


def test_not_for_a_buffer_the_kernel_reads(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    n = 1000
    f = axpb(n, 8, DType.F32, accumulate=True)
    assert nontemporal_buffers(f, 1) == frozenset()
    kern = build_cpu(f)
    assert "!nontemporal" not in kern.llvm_ir
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, np.float32)
    kern(x, y)
    np.testing.assert_array_equal(y, x + 1)


def test_not_in_a_kernel_with_a_local_buffer():
    f = axpb(64, 8, DType.F32)
    t = Allocate("t", DType.F32, (8,), "local", Seq((Store("t", (c(0),), Const(0.0, DType.F32)), f.body)))
    g = LoopFunc("with_local", f.inputs, f.outputs, t)
    assert nontemporal_buffers(f, 1) == {"y"}
    assert nontemporal_buffers(g, 1) == frozenset()


def test_serial_kernel_fences_too(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    n = 96
    kern = build_cpu(axpb(n, 16, DType.F32, parallel=False))
    assert "!nontemporal" in kern.optimized_ir and "sfence" in kern.optimized_ir
    x = np.linspace(-1, 1, n, dtype=np.float32)
    y = _view(n, DType.F32, 0)
    kern(x, y)
    np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(1))
