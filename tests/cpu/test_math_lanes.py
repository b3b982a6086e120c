"""Elementwise stages that evaluate a polynomial math function (exp, tanh, sin, ...) are vectorized at twice the
target's vector width, at most `default.MATH_LANES` (`default._math_lanes`): 16 lanes on AVX2 (two interleaved
vectors per iteration), unchanged at 16 lanes on AVX-512, unchanged for stages without such a function (sqrt is
one instruction) and for a short axis that takes no power-of-two vector.  The schedules are compiled at both
widths whatever the host (LLVM splits wide vectors) and their results compared to numpy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hlotune.api import load_model
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.schedule_space import default as D
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.loop_ir import For, ForKind, walk_stmts
from hlotune.schedule_space.lower import lower
from hlotune.target import Target

_TWO = dataclasses.replace(Target.host_cpu(), cores=2)
ISAS = {"avx2": dataclasses.replace(_TWO, vector_bits=256), "avx512": dataclasses.replace(_TWO, vector_bits=512)}
SHAPE = (64, 1024)

UNARY = {"exponential": np.exp, "tanh": np.tanh, "sine": np.sin, "sqrt": lambda x: np.sqrt(np.abs(x)),
         "negate": np.negative}


def _unary_hlo(op: str) -> str:
    m, n = SHAPE
    arg = "%a" if op == "sqrt" else "%x"
    return f"""HloModule u_{op}
ENTRY %main (x: f32[{m},{n}]) -> f32[{m},{n}] {{
  %x = f32[{m},{n}]{{1,0}} parameter(0)
  %a = f32[{m},{n}]{{1,0}} abs(%x)
  ROOT %r = f32[{m},{n}]{{1,0}} {op}({arg})
}}
"""


SOFTMAX = f"""HloModule softmax
%mx (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] maximum(%a, %b)
}}
%ad (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}}
ENTRY %main (x: f32[{SHAPE[0]},{SHAPE[1]}]) -> f32[{SHAPE[0]},{SHAPE[1]}] {{
  %x = f32[{SHAPE[0]},{SHAPE[1]}]{{1,0}} parameter(0)
  %ninf = f32[] constant(-inf)
  %m = f32[{SHAPE[0]}]{{0}} reduce(%x, %ninf), dimensions={{1}}, to_apply=%mx
  %mb = f32[{SHAPE[0]},{SHAPE[1]}]{{1,0}} broadcast(%m), dimensions={{0}}
  %d = f32[{SHAPE[0]},{SHAPE[1]}]{{1,0}} subtract(%x, %mb)
  %e = f32[{SHAPE[0]},{SHAPE[1]}]{{1,0}} exponential(%d)
  %z = f32[] constant(0)
  %s = f32[{SHAPE[0]}]{{0}} reduce(%e, %z), dimensions={{1}}, to_apply=%ad
  %sb = f32[{SHAPE[0]},{SHAPE[1]}]{{1,0}} broadcast(%s), dimensions={{0}}
  ROOT %r = f32[{SHAPE[0]},{SHAPE[1]}]{{1,0}} divide(%e, %sb)
}}
"""


def _compute(text: str):
    (sg,) = load_model(text).frontend.subgraphs
    return sg.workload.compute


def _vector_loops(func) -> list[int]:
    return [s.const_extent for s in walk_stmts(func.body) if isinstance(s, For) and s.kind is ForKind.VECTORIZED]


def _run(cd, tgt, x: np.ndarray) -> tuple:
    func = lower(cd, default_schedule(cd, tgt))
    out = np.full(SHAPE, np.nan, dtype=np.float32)
    build_cpu(func, tgt)(x, out)
    return func, out


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("isa", sorted(ISAS))
def test_unary_lanes_and_results(op, isa):
    tgt = ISAS[isa]
    x = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32) * 3
    func, out = _run(_compute(_unary_hlo(op)), tgt, x)
    native = tgt.vector_bits // 32
    want = min(2 * native, D.MATH_LANES) if op in ("exponential", "tanh", "sine") else native
    assert _vector_loops(func) == [want], (op, isa, _vector_loops(func))
    np.testing.assert_allclose(out, UNARY[op](x), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("isa", sorted(ISAS))
def test_softmax_row_plan_exp_stage_takes_double_lanes(isa):
    """In the row plan only the stage computing exp widens; the reductions and the division keep their lanes."""
    tgt = ISAS[isa]
    x = np.random.default_rng(1).standard_normal(SHAPE, dtype=np.float32) * 4
    cd = _compute(SOFTMAX)
    func, out = _run(cd, tgt, x)
    native = tgt.vector_bits // 32
    assert max(_vector_loops(func)) == min(2 * native, D.MATH_LANES)
    exp_loops = [s.const_extent for s in walk_stmts(func.body) if isinstance(s, For)
                 and s.kind is ForKind.VECTORIZED and "exponential" in repr(s.body)]
    assert exp_loops == [min(2 * native, D.MATH_LANES)], exp_loops
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_short_axis_keeps_its_own_width():
    """A short last axis that takes no power-of-two vector (10 logits, log-softmax's final stage) keeps the widest
    divisor of the native width (5 at 8 lanes): the rule doubles power-of-two vectors only."""
    tgt = ISAS["avx2"]
    text = """HloModule short
ENTRY %main (x: f32[256,10], b: f32[10]) -> f32[256,10] {
  %x = f32[256,10]{1,0} parameter(0)
  %b = f32[10]{0} parameter(1)
  %bb = f32[256,10]{1,0} broadcast(%b), dimensions={1}
  %s = f32[256,10]{1,0} add(%x, %bb)
  ROOT %r = f32[256,10]{1,0} exponential(%s)
}
"""
    cd = _compute(text)
    func = lower(cd, default_schedule(cd, tgt))
    assert _vector_loops(func) == [5], _vector_loops(func)
    rng = np.random.default_rng(2)
    x, b = rng.standard_normal((256, 10), dtype=np.float32), rng.standard_normal(10, dtype=np.float32)
    out = np.full((256, 10), np.nan, dtype=np.float32)
    args = {(10,): b, (256, 10): x}   # the fused kernel orders its parameters its own way
    build_cpu(func, tgt)(*[args[tuple(p.shape)] for p in cd.inputs], out)
    np.testing.assert_allclose(out, np.exp(x + b), rtol=2e-6, atol=1e-6)


def test_rule_off_keeps_native_lanes(monkeypatch):
    """MATH_LANES at the native width switches the rule off (the schedule before it)."""
    tgt = ISAS["avx2"]
    monkeypatch.setattr(D, "MATH_LANES", 8)
    func, _ = _run(_compute(_unary_hlo("exponential")), tgt, np.zeros(SHAPE, np.float32))
    assert _vector_loops(func) == [8]
