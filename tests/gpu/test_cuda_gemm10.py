"""GPU tier: the big-tile FFMA GEMM template (`codegen.cuda_simt`, session 10) against numpy float64 on N(0, 1) inputs:
the 4096^3 FFMA default (tensor cores off; tile rule default_gpu.FFMA_SIMT_TILES) takes it (2 or 3 stages, with and
without the grouped rasterization) and gives the same outputs, bit for bit, as the 8x4
cp.async FFMA template (the same k-ordered FFMA chains), with a max |C - C64| / max |C64| below 1e-5 (2.5e-6
measured); batched dots with grouped rasterization; sizes it does not take (K not a multiple of 16, small grids) fall
back to the other FFMA templates and stay correct."""

from __future__ import annotations

import numpy as np

from tests.gpu.test_cuda_mma import _build, _dot_hlo, _err


def simt_cases() -> list:
    """(label, HLO text, schedule options, takes cuda_simt, codegen.cuda flags)."""
    big = _dot_hlo(4096, 4096, 4096)
    out = [("4096^3 8x4", big, {"tensor_core": 0, "tiles": (8, 4, 8, 32, 16)}, False, {})]
    for st, grp in ((3, 8), (2, 8), (2, 0), (3, 0)):
        out.append((f"4096^3 default s{st} g{grp}", big, {"tensor_core": 0}, True,
                    {"GEMM_SIMT_STAGES": st, "GEMM_SIMT_GROUP": grp}))
    b2 = _dot_hlo(1024, 256, 512, 2)
    out += [("b2 1024x256x512 8x16", b2, {"tensor_core": 0, "tiles": (8, 16, 16, 16, 16)}, True, {}),
            ("b2 1024x256x512 16x8 bk8", b2, {"tensor_core": 0, "tiles": (16, 8, 16, 16, 8)}, True, {}),
            ("4096x4104x4096 default", _dot_hlo(4096, 4104, 4096), {"tensor_core": 0}, False, {}),
            ("1024^3 default", _dot_hlo(1024, 1024, 1024), {"tensor_core": 0}, False, {})]
    return out


def _run(kern, cd, seed: int):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(x.shape).astype(np.float32) for x in cd.inputs[:2])
    out = np.full(a.shape[:-1] + (b.shape[-1],), np.nan, np.float32)
    kern(a, b, out)
    return a, b, out


def test_simt_dots_against_float64(monkeypatch):
    from hlotune.codegen import cuda
    from hlotune.codegen import cuda_runtime as rt
    from hlotune.schedule_space import default_gpu as dg

    monkeypatch.setattr(dg, "FFMA_SIMT_TILES", True)
    outs = {}
    for label, hlo, opts, simt, flags in simt_cases():
        monkeypatch.setattr(rt, "_KCACHE", {})     # keyed by the loop function, not by the flags
        with monkeypatch.context() as mp:
            for k, v in flags.items():
                mp.setattr(cuda, k, v)
            sg, kern = _build(hlo, opts, label)
        assert ("cuda_simt" in kern.text) == simt, label
        a, b, got = _run(kern, sg.workload.compute, 7)
        outs[label] = got
        if a.shape[-2] * b.shape[-1] > 1024 * 1024:     # sampled rows of the big dots
            rows = np.arange(0, a.shape[-2], 61)
            want = a[..., rows, :].astype(np.float64) @ b.astype(np.float64)
            got = got[..., rows, :]
        else:
            want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        assert np.isfinite(got).all(), label
        assert _err(got, want) < 1e-5, (label, _err(got, want))
    for label in outs:
        if label.startswith("4096^3 default"):
            np.testing.assert_array_equal(outs[label], outs["4096^3 8x4"], err_msg=label)
