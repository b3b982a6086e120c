"""GPU tier: the wgmma 3xTF32 GEMM template (`codegen.cuda_wgmma`, sm_90a: skipped on other GPUs) against numpy
float64 on random N(0, 1) inputs, with the error measure and tolerance of tests/gpu/test_cuda_mma.py (max |C - C64| /
max |C64| within 2x of the FFMA template's error on the same inputs plus 1e-7, and below 1e-5); fused epilogues of the
fixtures' GEMM subgraphs at bench size against `evaluate_compute`; sizes no wgmma tile divides keep the other
templates (and stay correct)."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from tests.gpu.test_cuda_mma import TOL_3X, _build, _dot_err, _dot_hlo, _err


def _hopper() -> bool:
    try:
        from hlotune.codegen.cuda_runtime import detect_cuda_target
        return (detect_cuda_target().arch or "") == "sm_90"
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _hopper(), reason="wgmma needs an sm_90 (Hopper) GPU")


def wgmma_cases() -> list:
    """(label, HLO text, schedule options, takes wgmma) of the dot checks."""
    out = []
    for m, k, n, b, tiles in ((256, 1024, 256, 0, (2, 32, 64, 4, 32)), (256, 4096, 128, 0, (2, 16, 64, 4, 32)),
                              (384, 1536, 192, 0, (2, 16, 64, 4, 32)), (128, 512, 128, 4, (2, 32, 32, 4, 32)),
                              (256, 64, 256, 0, (2, 32, 64, 4, 32))):
        hlo = _dot_hlo(m, k, n, b)
        out.append((f"{m}x{k}x{n} b{b} ffma", hlo, {"tensor_core": 0}, False))
        out.append((f"{m}x{k}x{n} b{b} wgmma", hlo, {"tensor_core": 3, "tiles": tiles}, True))
    out.append(("200x1024x200 default", _dot_hlo(200, 1024, 200), {}, False))    # no wgmma tile divides it
    return out


@pytest.fixture
def wgmma_on(monkeypatch):
    from hlotune.codegen import cuda
    from hlotune.codegen import cuda_runtime as rt
    from hlotune.schedule_space import default_gpu as dg

    monkeypatch.setattr(cuda, "GEMM_WGMMA", True)
    monkeypatch.setattr(dg, "TENSOR_CORE_WGMMA", True)
    monkeypatch.setattr(rt, "_KCACHE", {})     # keyed by the loop function, not by the flags


def test_wgmma_dots_against_float64(wgmma_on):
    errs: dict = {}
    for label, hlo, opts, wg in wgmma_cases():
        sg, kern = _build(hlo, opts, label)
        assert ("wgmma.mma_async" in kern.text) == wg, label
        errs[label] = _dot_err(kern, sg, len(label))
    print({k: f"{v:.2e}" for k, v in errs.items()})
    for label, e in errs.items():
        if label.endswith("wgmma"):
            ffma = errs[label.replace("wgmma", "ffma")]
            assert e <= min(2 * ffma + 1e-7, TOL_3X), (label, e, ffma)
        else:
            assert e <= TOL_3X, (label, e)


FUSED = (("dense_bias_relu", "max.3"), ("transformer_block", "add.1"), ("rmsnorm_swiglu", "mul.19"),
         ("matmul", "dot_general.1"))


@pytest.mark.parametrize("model,name", FUSED)
def test_wgmma_fused_epilogues_agree_with_algorithm(model, name, wgmma_on):
    import hlotune
    from tests.conftest import model_path

    sg = next(s for s in hlotune.load_model(model_path(model, "bench.hlo")).frontend.subgraphs if s.name == name)
    sg, kern = _build(sg, {"tensor_core": 3}, f"{model}/{name} wgmma")
    print(model, name, "wgmma" if "wgmma.mma_async" in kern.text else "other template")
    if model in ("transformer_block", "rmsnorm_swiglu"):    # the others: grids too small for its 128-row tiles
        assert "wgmma.mma_async" in kern.text, (model, name)
    cd = sg.workload.compute
    rng = np.random.default_rng(5)
    k = len(sg.computation.parameters)
    args = [rng.standard_normal(b.shape).astype(b.dtype.np) for b in cd.inputs[:k]]
    consts = constant_values(cd)
    want = evaluate_compute(cd, args)
    outs = [np.full(w.shape, np.nan, np.float32) for w in want]
    kern(*args, *[consts[b.name] for b in cd.inputs[k:]], *outs)
    for w, g in zip(want, outs):
        assert _err(g, np.asarray(w, np.float64)) <= TOL_3X, (model, name)
