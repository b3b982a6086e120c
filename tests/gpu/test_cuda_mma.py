"""GPU tier: the GEMM template on tensor cores (3xTF32 mma.sync, `codegen.cuda._gemm_mma_text`) against numpy
float64 on random N(0, 1) inputs.  Error measure: max |C - C64| / max |C64| (the largest error relative to the
largest output).  Documented tolerance: 3xTF32 within 2x of the FFMA template's error on the same inputs (plus
1e-7 of slack for tiny errors) and below 1e-5; plain TF32 (1 pass) is checked to be the coarser one (so a 3xTF32
kernel that silently ran 1 pass would fail).  Also fused epilogues (bias + ReLU, residual add, the SwiGLU product)
of the fixtures' GEMM subgraphs at bench size (against `evaluate_compute`, float32 numpy, same measure, 1e-5), a
non-square and a batched dot; every case must take the mma template."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower

TOL_3X = 1e-5


def _dot_hlo(m: int, k: int, n: int, batch: int = 0) -> str:
    if batch:
        return (f"HloModule b\nENTRY m {{\n  a = f32[{batch},{m},{k}] parameter(0)\n  b = f32[{batch},{k},{n}] "
                f"parameter(1)\n  ROOT d = f32[{batch},{m},{n}] dot(a, b), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, "
                "lhs_contracting_dims={2}, rhs_contracting_dims={1}\n}\n")
    return (f"HloModule mm\nENTRY m {{\n  a = f32[{m},{k}] parameter(0)\n  b = f32[{k},{n}] parameter(1)\n"
            f"  ROOT d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")


def mma_cases() -> list:
    """(label, HLO text, schedule options) of the dot checks (also compiled ahead by gpu_session --precompile)."""
    out = []
    for m, k, n, b in ((256, 1024, 256, 0), (256, 4096, 128, 0), (384, 1536, 192, 0), (128, 512, 128, 4)):
        hlo = _dot_hlo(m, k, n, b)
        out.append((f"{m}x{k}x{n} b{b} ffma", hlo, {"tensor_core": 0}))
        out.append((f"{m}x{k}x{n} b{b} 3xtf32", hlo, {"tensor_core": 3}))
        out.append((f"{m}x{k}x{n} b{b} 1xtf32", hlo, {"tensor_core": 1}))
    hlo = _dot_hlo(256, 512, 128)
    # session 8: BK 32 and 256 threads, rings in dynamic shared memory (67.6 / 73.7 KB)
    for tiles in ((4, 16, 32, 4, 16), (2, 8, 64, 4, 16), (4, 8, 16, 4, 32), (4, 8, 32, 4, 32), (4, 16, 64, 4, 16)):
        out.append((f"256x512x128 {tiles} 3xtf32", hlo, {"tensor_core": 3, "tiles": tiles}))
    return out


@pytest.fixture(autouse=True)
def _mma_not_wgmma(monkeypatch):
    """These tests are about the mma.sync template: the wgmma template (session 9, tests/gpu/test_cuda_wgmma.py) off."""
    from hlotune.codegen import cuda
    from hlotune.schedule_space import default_gpu as dg

    monkeypatch.setattr(cuda, "GEMM_WGMMA", False)
    monkeypatch.setattr(dg, "TENSOR_CORE_WGMMA", False)


def _build(hlo_or_sg, opts: dict, label: str):
    import hlotune
    from hlotune.codegen.cuda_runtime import build_cuda

    sg = hlo_or_sg
    if isinstance(hlo_or_sg, str):
        (sg,) = hlotune.load_model(hlo_or_sg).frontend.subgraphs
    cd = sg.workload.compute
    return sg, build_cuda(lower(cd, default_gpu_schedule(cd, options=dict(opts)), name=sg.name), context=label)


def _err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


def _dot_err(kern, sg, seed: int) -> float:
    """`_err` of `kern` (a dot of subgraph `sg`) on seeded N(0, 1) inputs, against numpy's float64 product."""
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(x.shape).astype(np.float32) for x in sg.workload.compute.inputs[:2])
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = np.full(want.shape, np.nan, np.float32)
    kern(a, b, out)
    return _err(out, want)


@pytest.mark.parametrize("pair", [False, True])
def test_mma_dots_against_float64(pair, monkeypatch):
    """The dots under the default and with `GEMM_MMA_PAIR_STEPS` (two 8-k steps per zeroed fragment)."""
    from hlotune.codegen import cuda
    from hlotune.codegen import cuda_runtime as rt

    monkeypatch.setattr(cuda, "GEMM_MMA_PAIR_STEPS", pair)
    monkeypatch.setattr(rt, "_KCACHE", {})     # keyed by the loop function, not by the flags
    errs: dict = {}
    for label, hlo, opts in mma_cases():
        sg, kern = _build(hlo, opts, label)
        assert ("tensor cores" in kern.text) == bool(opts.get("tensor_core")), label
        errs[label] = _dot_err(kern, sg, len(label))
    print(f"pair {pair}:", {k: f"{v:.2e}" for k, v in errs.items()})
    for label, e in errs.items():
        if label.endswith("3xtf32") and not label.startswith("256x512x128 ("):
            ffma = errs[label.replace("3xtf32", "ffma")]
            one = errs[label.replace("3xtf32", "1xtf32")]
            assert e <= min(2 * ffma + 1e-7, TOL_3X), (label, e, ffma)
            assert one > 4 * e, (label, one, e)
        elif label.endswith("3xtf32"):
            assert e <= TOL_3X, (label, e)


#: GEMM subgraphs of the fixtures at bench size with fused epilogues (model, subgraph)
FUSED = (("dense_bias_relu", "max.3"), ("transformer_block", "add.1"), ("rmsnorm_swiglu", "mul.19"),
         ("matmul", "dot_general.1"))


@pytest.mark.parametrize("pair", [False, True])
@pytest.mark.parametrize("model,name", FUSED)
def test_mma_fused_epilogues_agree_with_algorithm(model, name, pair, monkeypatch):
    import hlotune
    from hlotune.codegen import cuda
    from hlotune.codegen import cuda_runtime as rt
    from tests.conftest import model_path

    monkeypatch.setattr(cuda, "GEMM_MMA_PAIR_STEPS", pair)
    monkeypatch.setattr(rt, "_KCACHE", {})     # keyed by the loop function, not by the flags
    sg = next(s for s in hlotune.load_model(model_path(model, "bench.hlo")).frontend.subgraphs if s.name == name)
    sg, kern = _build(sg, {"tensor_core": 3}, f"{model}/{name} 3xtf32")
    assert "3xTF32 tensor cores" in kern.text, (model, name)
    cd = sg.workload.compute
    rng = np.random.default_rng(5)
    k = len(sg.computation.parameters)
    args = [rng.standard_normal(b.shape).astype(b.dtype.np) for b in cd.inputs[:k]]
    consts = constant_values(cd)
    want = evaluate_compute(cd, args)   # the algorithm (numpy, float32: its own rounding counts against the bound)
    outs = [np.full(w.shape, np.nan, np.float32) for w in want]
    kern(*args, *[consts[b.name] for b in cd.inputs[k:]], *outs)
    for w, g in zip(want, outs):
        assert _err(g, np.asarray(w, np.float64)) <= TOL_3X, (model, name)


def _default_and_flagged(monkeypatch, flags: dict, opts: dict, a, b, label: str):
    """(flags, kernel, output) for the default build of a 256 x K x 256 dot and the build with `flags` set on
    codegen.cuda, each run once on (a, b)."""
    from hlotune.codegen import cuda
    from hlotune.codegen import cuda_runtime as rt

    hlo = _dot_hlo(a.shape[0], a.shape[1], b.shape[1])
    got = []
    for fl in ({}, flags):
        with monkeypatch.context() as mp:
            mp.setattr(rt, "_KCACHE", {})     # keyed by the loop function, not by the flags
            for k, v in fl.items():
                mp.setattr(cuda, k, v)
            _, kern = _build(hlo, opts, f"{label} {fl}")
        out = np.full((a.shape[0], b.shape[1]), np.nan, np.float32)
        kern(a, b, out)
        got.append((fl, kern, out))
    return got


@pytest.mark.parametrize("flags", [{"GEMM_MMA_B_PLANES": True}])
def test_mma_b_planes_give_the_same_bits(flags, monkeypatch):
    """B split once per block (`GEMM_MMA_B_PLANES`) or by every warp (the default): the same TF32 words in the same
    mma order, so the same bits as the default (on N(0, 1) inputs, 3xTF32 and plain TF32)."""
    from hlotune.codegen import cuda

    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((256, 1024)).astype(np.float32), rng.standard_normal((1024, 256)).astype(np.float32)
    for passes in (3, 1):
        outs = []
        for fl, kern, out in _default_and_flagged(monkeypatch, flags, {"tensor_core": passes}, a, b, f"bits {passes}"):
            assert ("hl_Bsm" in kern.text) == (fl.get("GEMM_MMA_B_PLANES", cuda.GEMM_MMA_B_PLANES) and passes == 3)
            outs.append(out)
        np.testing.assert_array_equal(outs[1], outs[0], err_msg=f"{passes} passes, {flags}")
        assert _err(outs[0], a.astype(np.float64) @ b.astype(np.float64)) < (TOL_3X if passes == 3 else 1e-2)


@pytest.mark.parametrize("flags", [{"GEMM_MMA_CHUNK_LOOP": True}, {"GEMM_MMA_SMALL_TRUNC": True}])
def test_mma_session8_flags(flags, monkeypatch):
    """`GEMM_MMA_CHUNK_LOOP` (the 16-k chunks of a BK 32 tile in a loop) gives the same bits as the unrolled chunks;
    `GEMM_MMA_SMALL_TRUNC` (small words read truncated) other bits, within the 3xTF32 tolerance and as accurate as the
    default (the same error bound per operand: tests/null/test_cuda_mma8.py)."""

    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((256, 1024)).astype(np.float32), rng.standard_normal((1024, 256)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    outs = []
    for fl, kern, out in _default_and_flagged(monkeypatch, flags, {"tensor_core": 3, "tiles": (4, 8, 32, 4, 32)},
                                              a, b, "s8"):
        assert "3xTF32 tensor cores" in kern.text and ("hl_kc" in kern.text) == ("GEMM_MMA_CHUNK_LOOP" in fl)
        outs.append(out)
    e0, e1 = _err(outs[0], want), _err(outs[1], want)
    print(flags, f"{e0:.2e} {e1:.2e}")
    if "GEMM_MMA_CHUNK_LOOP" in flags:
        np.testing.assert_array_equal(outs[1], outs[0])
    else:
        assert not np.array_equal(outs[1], outs[0]) and e1 <= min(1.5 * e0 + 1e-7, TOL_3X), (e0, e1)
