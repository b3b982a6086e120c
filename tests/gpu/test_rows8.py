"""GPU tier, session 7: the row-register schedule with two / four warps per row ("row_lanes" 64 / 128: a named
barrier per row, each warp combining all of the row's per-lane partials) on softmax / layernorm at bench size against
the algorithm (numpy's `evaluate_compute`), including rows with -inf entries and large magnitudes (softmax), where a
wrong cross-warp combine (the row's warps with different totals, a lost partial) would show."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute_eval import evaluate_compute
from tests.gpu.test_rows6 import _build

#: (schedule options, codegen.cuda flags): the same kernels as gpu_session.py's ROW_LANE_VARIANTS (precompiled there)
WIDE_CASES = [({"row_regs": True, "row_lanes": 64, "rows": 8}, {}),
              ({"row_regs": True, "row_lanes": 64, "rows": 4}, {}),
              ({"row_regs": True, "row_lanes": 128, "rows": 4}, {}),
              ({"row_regs": True, "row_lanes": 64, "rows": 8}, {"ROW_BARRIERS": False})]


def _subgraph(name: str):
    import hlotune
    from tests.conftest import model_path

    (sg,) = hlotune.load_model(str(model_path(name, "bench.gpu.opt.hlo"))).frontend.subgraphs
    return sg.workload.compute


def _inputs(cd, seed: int, hard: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    args = [(rng.standard_normal(b.shape) * 2).astype(np.float32) for b in cd.inputs]
    if hard:   # the row input: per-row scales 1e-3 .. 1e3, about 5 % -inf, one row all -inf but one element
        x = args[0]
        x *= (10.0 ** rng.uniform(-3, 3, (x.shape[0], 1))).astype(np.float32)
        x[rng.random(x.shape) < 0.05] = -np.inf
        x[1, :] = -np.inf
        x[1, 777] = 3.0
    return args


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_wide_row_variants_agree_with_algorithm(name, monkeypatch):
    cd = _subgraph(name)
    for hard in ((False, True) if name == "softmax" else (False,)):
        args = _inputs(cd, 7, hard)
        want = evaluate_compute(cd, args)[0]
        for opts, flags in WIDE_CASES:
            kern = _build(cd, f"row_{name}", opts, flags, monkeypatch)
            (ln,) = kern.source.launches
            assert ln.block[0] == opts["row_lanes"]
            out = np.full(want.shape, np.nan, np.float32)
            kern(*args, out)
            np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6, err_msg=str((opts, flags, hard)))
            if name == "softmax":
                np.testing.assert_allclose(out.sum(axis=1, dtype=np.float64), 1.0, rtol=1e-5)
