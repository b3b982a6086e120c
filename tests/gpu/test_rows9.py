"""GPU tier, session 7b: layernorm's division by the row's sqrt(var / n + eps) and softmax's division by the row's
sum through one reciprocal per row + Markstein's correction (`codegen.cuda.ROW_DIV_EXPR`, `ROW_DIV_RCP`, also one
guard per float4: `ROW_DIV_GROUPED`): bit for bit the session-7 kernel's output (flags off) at bench size, on rows
that reach every branch of the range guard (constant rows: a zero dividend, -0 rows, rows scaled 1e-30 .. 1e30, rows
with inf / NaN), and close to the algorithm (numpy's `evaluate_compute`) on ordinary rows."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute_eval import evaluate_compute
from tests.gpu.test_rows6 import _build
from tests.gpu.test_rows8 import _subgraph

_RDIV = {"ROW_DIV_RCP": True, "ROW_DIV_EXPR": True}
#: (schedule options, codegen.cuda flags): among gpu_session.py's ROW_S7B_VARIANTS (precompiled there)
CASES = [({"row_regs": True, "row_lanes": 64, "rows": 8}, _RDIV),
         ({"row_regs": True, "row_lanes": 64, "rows": 8}, {**_RDIV, "ROW_DIV_GROUPED": True}),
         ({"row_regs": True, "row_lanes": 128, "rows": 4}, _RDIV),
         ({"row_regs": True, "row_lanes": 32, "rows": 16}, _RDIV)]
BASE = {"ROW_DIV_RCP": False, "ROW_DIV_EXPR": False, "ROW_DIV_GROUPED": False}


def _hard(cd, seed: int) -> list[np.ndarray]:
    """Inputs whose row input has per-row scales 1e-30 .. 1e30, constant rows, a row of -0, rows with an inf / a NaN,
    -inf entries, tiny and huge single entries; the other inputs (scale, bias) N(0, 2)."""
    rng = np.random.default_rng(seed)
    args = [(rng.standard_normal(b.shape) * 2).astype(np.float32) for b in cd.inputs]
    x = max(args, key=lambda a: a.size)    # the row input (layernorm's scale and bias are rows of 1024)
    x *= (10.0 ** rng.uniform(-30, 30, (x.shape[0], 1))).astype(np.float32)
    x[0, :] = 3.0
    x[1, :] = -0.0
    x[2, :] = 0.0
    x[3, 5] = np.inf
    x[4, 9] = np.nan
    x[5, :] = 1.0
    x[5, 17] = 1.0 + 2.0 ** -23
    x[6, 3] = -np.inf
    x[7, :] = 2.0 ** -140
    x[8, :] *= 1e-30
    x[9, :] = 1e35
    x[9, 1] = -1e35
    x[10:40:3, rng.integers(0, x.shape[1], 10)] = 0.0
    return args


def _run(cd, name, opts, flags, args, monkeypatch):
    kern = _build(cd, f"row9_{name}", opts, {**BASE, **flags}, monkeypatch)
    out = np.full(tuple(cd.stage(cd.outputs[0]).shape), np.nan, np.float32)
    kern(*args, out)
    return out, kern


def _bitwise(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize("name", ["layernorm", "softmax"])
def test_row_division_is_bitwise_the_default(name, monkeypatch):
    """Every 7b form against the same schedule with the flags off (session 7's kernel text), bitwise, on ordinary
    and on hard rows; the layernorm kernels actually take the helper (its text in the source)."""
    cd = _subgraph(name)
    rng = np.random.default_rng(5)
    plain = [(rng.standard_normal(b.shape) * 2).astype(np.float32) for b in cd.inputs]
    for args in (plain, _hard(cd, 6)):
        for opts, flags in CASES:
            want, _ = _run(cd, name, opts, {}, args, monkeypatch)
            got, kern = _run(cd, name, opts, flags, args, monkeypatch)
            assert "hl_fdiv_row(" in kern.source.text or "hl_fdiv_fast(" in kern.source.text
            bad = ~_bitwise(got, want)
            assert not bad.any(), (opts, flags, int(bad.sum()), np.argwhere(bad)[:5].tolist())
    want = evaluate_compute(cd, plain)[0]
    got, _ = _run(cd, name, *CASES[0], plain, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
