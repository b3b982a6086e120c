"""GPU tier, session 6: the row-register schedules of softmax / layernorm at bench size (row and exp in registers,
K rows per warp with the next row prefetched) against the algorithm, and the sin / cos variants without the quadrant
branch within the documented ulp bound (and bitwise equal to the branch version: the same arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower

#: (schedule options, codegen.cuda flags) of the row-register variants run here (precompiled by gpu_session.py)
ROW_CASES = [({"row_regs": True}, {}), ({"row_regs": True, "row_pipe": 2}, {}),
             ({"row_regs": True, "row_pipe": 4, "rows": 4}, {}),
             ({"row_regs": True, "row_pipe": 2}, {"ROW_PREFETCH_UNROLL": False})]
#: sin / cos flag sets checked against float64 (SIN_FLOAT_REDUCTION, SIN_SELECT)
SIN_CASES = [(False, True), (True, True), (True, False)]


def base_flags(flags: tuple) -> dict:
    """The quadrant-branch version (session 5) of a SIN_CASES entry, for the bitwise comparison."""
    return {"SIN_FLOAT_REDUCTION": flags[0], "SIN_SELECT": False}


def _build(cd, name: str, opts: dict, flags: dict, monkeypatch):
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.codegen.cuda_runtime import build_cuda

    for k, v in flags.items():
        monkeypatch.setattr(cuda_gen, k, v)
    rt._KCACHE.clear()
    try:
        return build_cuda(lower(cd, default_gpu_schedule(cd, options=dict(opts)), name=name))
    finally:
        monkeypatch.undo()
        rt._KCACHE.clear()


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_row_register_variants_agree_with_algorithm(name, monkeypatch):
    import hlotune
    from tests.conftest import model_path

    (sg,) = hlotune.load_model(str(model_path(name, "bench.gpu.opt.hlo"))).frontend.subgraphs
    cd = sg.workload.compute
    rng = np.random.default_rng(4)
    args = [(rng.standard_normal(b.shape) * 2).astype(np.float32) for b in cd.inputs]
    want = evaluate_compute(cd, args)[0]
    for opts, flags in ROW_CASES:
        kern = _build(cd, f"row_{name}", opts, flags, monkeypatch)
        assert len(kern.source.launches) == 1
        out = np.full(want.shape, np.nan, np.float32)
        kern(*args, out)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6, err_msg=str((opts, flags)))


def _unary(op: str, n: int) -> str:
    return f"HloModule u\nENTRY m {{\n  x = f32[{n}] parameter(0)\n  ROOT y = f32[{n}] {op}(x)\n}}\n"


def sin_inputs() -> np.ndarray:
    rng = np.random.default_rng(8)
    mags = 10.0 ** rng.uniform(-30, 38, 1 << 18) * rng.choice([-1, 1], 1 << 18)
    near = np.arange(1, 1 << 16) * (np.pi / 2)
    xs = np.concatenate([mags, rng.uniform(-20, 20, 1 << 18), near, rng.uniform(-131072, 131072, 1 << 16),
                         np.float32(2.0 ** 30) * np.arange(1, 64)]).astype(np.float32)
    xs = np.concatenate([xs, np.nextafter(xs[-(1 << 16) - 63 - len(near):], np.float32(np.inf))])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38], np.float32)
    x = np.concatenate([specials, xs])
    return np.concatenate([x, np.zeros((-len(x)) % 1024, np.float32)])


@pytest.mark.parametrize("op", ["sine", "cosine"])
@pytest.mark.parametrize("flags", SIN_CASES, ids=str)
def test_sin_variants_within_documented_ulp(op, flags, monkeypatch):
    import hlotune
    from hlotune.codegen.cuda import FLOAT_MATH_ULP
    from hlotune.ir.hlo import Op

    x = sin_inputs()
    (sg,) = hlotune.load_model(_unary(op, len(x))).frontend.subgraphs
    cd = sg.workload.compute
    names = ("SIN_FLOAT_REDUCTION", "SIN_SELECT")
    kern = _build(cd, f"math_{op}", {}, dict(zip(names, flags)), monkeypatch)
    out = np.full_like(x, np.nan)
    kern(x, out)
    with np.errstate(all="ignore"):
        ref = (np.sin if op == "sine" else np.cos)(x.astype(np.float64))
        ref32 = ref.astype(np.float32)
    fin = np.isfinite(ref32) & np.isfinite(x)
    ulp = np.abs(out[fin].astype(np.float64) - ref[fin]) / np.spacing(np.abs(ref32[fin])).astype(np.float64)
    assert ulp.max() <= FLOAT_MATH_ULP[Op.SINE], (op, flags, float(ulp.max()), float(x[fin][np.argmax(ulp)]))
    np.testing.assert_array_equal(out[~fin], ref32[~fin])
    assert np.signbit(out[1]) == (op == "sine")            # sin(-0) = -0
    base = _build(cd, f"math_{op}", {}, base_flags(flags), monkeypatch)   # the select computes what the branch did
    out0 = np.full_like(x, np.nan)
    base(x, out0)
    np.testing.assert_array_equal(out.view(np.int32), out0.view(np.int32))
