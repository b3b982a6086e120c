"""The loop pragma `prefetch_rows` (codegen.llvm_emit `_prefetch_plan`) and the row plan's use of it
(`default._row_prefetch`): a full-row stage evaluating a polynomial math function (softmax's exp) prefetches the
next row of the input it reads and of the output the row loop stores, spread over its loop; results equal those of
the same schedule without the pragma, bit for bit, and numpy's softmax."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.api import load_model
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.schedule_space import default as D
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.steps import Pragma

#: the scalar reducers: name -> HLO op
REDUCERS = {"max_f": "maximum", "add_f": "add"}


def module(name: str, body: str) -> str:
    """An HLO module with the scalar reducers of REDUCERS and `body` as its entry."""
    regions = "".join(f"{r} {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] {op}(a, b)\n}}\n\n"
                      for r, op in REDUCERS.items())
    return f"HloModule {name}\n\n{regions}ENTRY main {{\n{body}}}\n"


def softmax_hlo(r: int, c: int) -> str:
    return module("softmax", f"""\
  x = f32[{r},{c}]{{1,0}} parameter(0)
  ninf = f32[] constant(-inf)
  mx = f32[{r}]{{0}} reduce(x, ninf), dimensions={{1}}, to_apply=max_f
  mb = f32[{r},{c}]{{1,0}} broadcast(mx), dimensions={{0}}
  d = f32[{r},{c}]{{1,0}} subtract(x, mb)
  e = f32[{r},{c}]{{1,0}} exponential(d)
  zero = f32[] constant(0)
  s = f32[{r}]{{0}} reduce(e, zero), dimensions={{1}}, to_apply=add_f
  sb = f32[{r},{c}]{{1,0}} broadcast(s), dimensions={{0}}
  ROOT y = f32[{r},{c}]{{1,0}} divide(e, sb)
""")


def centre_hlo(r: int, c: int) -> str:
    """x minus its row sums (a row plan without a math function)."""
    return module("centre", f"""\
  x = f32[{r},{c}]{{1,0}} parameter(0)
  zero = f32[] constant(0)
  s = f32[{r}]{{0}} reduce(x, zero), dimensions={{1}}, to_apply=add_f
  sb = f32[{r},{c}]{{1,0}} broadcast(s), dimensions={{0}}
  ROOT y = f32[{r},{c}]{{1,0}} subtract(x, sb)
""")


def compute_of(text: str):
    (sg,) = load_model(text).frontend.subgraphs
    return sg.workload.compute


def softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def run(cd, steps, x: np.ndarray):
    kern = build_cpu(lower(cd, steps))
    out = np.full(x.shape, np.nan, np.float32)
    kern(x, out)
    return kern, out


def prefetches(ir_text: str) -> list[str]:
    return [ln for ln in ir_text.splitlines() if "call void @\"llvm.prefetch" in ln or "call void @llvm.prefetch" in ln]


@pytest.mark.parametrize("rows, cols", [(64, 256), (5, 200), (3, 40)])   # parallel rows; serial; a row of < 4 lines
def test_softmax_row_plan_prefetches_and_matches(rows, cols):
    cd = compute_of(softmax_hlo(rows, cols))
    steps = default_schedule(cd)
    pragmas = [s for s in steps if isinstance(s, Pragma) and s.name == "prefetch_rows"]
    assert len(pragmas) == 1 and pragmas[0].value == D.ROW_PREFETCH_AHEAD
    assert "@prefetch_rows=1" in str(lower(cd, steps))
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32) * 4
    kern, got = run(cd, steps, x)
    calls = prefetches(kern.llvm_ir)
    assert any("i32 0, i32 3" in c for c in calls), calls   # the input x, for reading
    assert any("i32 1, i32 3" in c for c in calls), calls   # the output, for writing
    _, plain = run(cd, [s for s in steps if s not in pragmas], x)
    np.testing.assert_array_equal(got, plain)
    np.testing.assert_allclose(got, softmax_ref(x), rtol=2e-6, atol=1e-12)


def test_no_pragma_without_math_or_when_off(monkeypatch):
    cd = compute_of(centre_hlo(64, 256))
    assert not [s for s in default_schedule(cd) if isinstance(s, Pragma) and s.name == "prefetch_rows"]
    monkeypatch.setattr(D, "ROW_PREFETCH_AHEAD", 0)
    cd = compute_of(softmax_hlo(64, 256))
    assert not [s for s in default_schedule(cd) if isinstance(s, Pragma) and s.name == "prefetch_rows"]


def test_pragma_on_an_outermost_loop_prefetches_nothing():
    """With no enclosing serial loop there is no row to run ahead of: the kernel is built as without it."""
    cd = compute_of(centre_hlo(4, 64))
    steps = default_schedule(cd)
    out = next(s.name for s in cd.stages if s.name in cd.outputs)
    outer = cd.stage_by_name[out].axes[0].name
    with_pragma = steps + [Pragma(out, outer, "prefetch_rows", 2)]
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    kern, got = run(cd, with_pragma, x)
    assert not prefetches(kern.llvm_ir)
    np.testing.assert_allclose(got, x - x.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
