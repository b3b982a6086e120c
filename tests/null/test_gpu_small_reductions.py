"""GPU default schedules for small reductions, without a GPU: a dot with few rows or columns and few outputs (mlp's
last layer and its gradients) takes one warp per output (`default_gpu._skinny_dot`), a column sum with few outputs
splits its rows over threadIdx.y (`_column_reduction`); both compute the algorithm (loop-IR interpreter against
`evaluate_compute`) and compile for sm_90 (nvcc, skipped when missing).  tests/gpu/test_merge.py runs them."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import hlotune
from hlotune.codegen.cuda import generate_cuda
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.lower import lower
from tests.conftest import model_path
from tests.null.test_cuda_rows6 import _args

NVCC = shutil.which("nvcc")
CASES = [("mlp_train_step", "dot_general.6", (320, 1, 1), (32, 8, 1)),
         ("mlp_train_step", "dot_general.7", (8, 1, 1), (32, 16, 1)),   # _column_dot (session 11)
         ("mlp_train_step", "reduce_sum.70", (8, 1, 1), (32, 16, 1))]


def _sg(model: str, name: str):
    return {s.name: s for s in hlotune.load_model(str(model_path(model, "bench.hlo"))).frontend.subgraphs}[name]


@pytest.mark.parametrize("model,name,grid,block", CASES)
def test_small_reduction_schedules(model, name, grid, block):
    sg = _sg(model, name)
    cd = sg.workload.compute
    f = lower(cd, default_gpu_schedule(cd), name="k")
    (ln,) = generate_cuda(f).launches
    assert (ln.grid, ln.block) == (grid, block)
    # the options turn them off: the register-tile / one-thread-per-output schedules of before
    (old,) = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"skinny_dot": False, "column_split": False}),
                                 name="k")).launches
    assert old.grid[0] * old.block[0] * old.block[1] < ln.grid[0] * ln.block[0] * ln.block[1]
    args, full = _args(sg, seed=2)
    for w, g in zip(evaluate_compute(cd, args), evaluate_loop_func(f, full)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_small_reductions_compile(tmp_path):
    for model, name, _, _ in CASES:
        cd = _sg(model, name).workload.compute
        cu = tmp_path / "k.cu"
        cu.write_text(generate_cuda(lower(cd, default_gpu_schedule(cd), name="k")).text)
        r = subprocess.run([NVCC, "-arch=sm_90", "-cubin", str(cu), "-o", str(tmp_path / "k.cubin")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]


def test_short_k_dots_take_128_thread_gemm_tiles(monkeypatch):
    """Dots of K <= SHORT_K (transformer_block's projections, K 512) take 8x4 tiles on 4x32 threads: twice the blocks
    of the general first tiling, still the GEMM template; longer dots keep it.  The schedule computes the algorithm
    (the loop-IR interpreter on a small dot with that tiling)."""
    import hlotune.schedule_space.default_gpu as dg

    monkeypatch.setattr(dg, "TENSOR_CORE_WGMMA", False)   # since session 9 these dots take wgmma on Hopper
    short = dg._SHORT_K_TILES
    sg = _sg("transformer_block", "dot_general.6")
    cd = sg.workload.compute
    text = generate_cuda(lower(cd, default_gpu_schedule(cd), name="k"))
    (ln,) = text.launches
    assert (ln.grid, ln.block) == ((512, 1, 1), (128, 1, 1)) and "GEMM template" in text.text
    monkeypatch.setattr(dg, "_SHORT_K_TILES", ())
    (old,) = generate_cuda(lower(cd, default_gpu_schedule(cd), name="k")).launches
    assert (old.grid, old.block) == ((256, 1, 1), (256, 1, 1))
    monkeypatch.setattr(dg, "_SHORT_K_TILES", short)
    assert dg._tile_sizes(4096, 4096, 4096, 1024)[:4] == (dg._SIMT_TILES + dg._WARP_ROW_TILES)[0][:4]   # K 4096
    assert dg._tile_sizes(4096, 512, 512, 1024)[:4] == dg._SHORT_K_TILES[0][:4]
    hlo = """HloModule d
ENTRY e {
  a = f32[64,96]{1,0} parameter(0)
  b = f32[96,256]{1,0} parameter(1)
  ROOT d = f32[64,256]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    (small,) = hlotune.load_model(hlo).frontend.subgraphs
    scd = small.workload.compute
    f = lower(scd, default_gpu_schedule(scd, options={"tensor_core": 0, "tiles": dg._SHORT_K_TILES[0][:5]}), name="k")
    src = generate_cuda(f)
    assert src.launches[0].block == (128, 1, 1) and "GEMM template" in src.text
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 256)).astype(np.float32)
    (got,) = evaluate_loop_func(f, [a, b])
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
