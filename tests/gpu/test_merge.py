"""GPU tier: small kernels joined into one (`codegen.cuda.MERGE_SMALL_KERNELS`): every subgraph of mlp_train_step,
sum_reduce and transformer_block at bench size whose kernels were joined computes what the algorithm computes
(numpy's `evaluate_compute`), and so does its unjoined build."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute_eval import evaluate_compute
from tests.null.test_cuda_rows6 import _args


def _build(cd, name: str, merge: bool, monkeypatch):
    import hlotune.codegen.cuda as cuda_gen
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower

    monkeypatch.setattr(cuda_gen, "MERGE_SMALL_KERNELS", merge)
    rt._KCACHE.clear()
    try:
        return build_cuda(lower(cd, default_gpu_schedule(cd), name=name))
    finally:
        monkeypatch.undo()
        rt._KCACHE.clear()


def _count(cd, merge: bool, monkeypatch) -> int:
    import hlotune.codegen.cuda as cuda_gen
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower

    monkeypatch.setattr(cuda_gen, "MERGE_SMALL_KERNELS", merge)
    try:
        return len(cuda_gen.generate_cuda(lower(cd, default_gpu_schedule(cd), name="k")).launches)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("model", ["mlp_train_step", "sum_reduce", "transformer_block"])
def test_joined_kernels_compute_the_algorithm(model, monkeypatch):
    import hlotune
    from tests.conftest import model_path

    joined = 0
    for k, sg in enumerate(hlotune.load_model(str(model_path(model, "bench.hlo"))).frontend.subgraphs):
        cd = sg.workload.compute
        args, full = _args(sg, seed=k)     # the subgraph's parameters; and its constants after them
        want = evaluate_compute(cd, args)
        if _count(cd, True, monkeypatch) == _count(cd, False, monkeypatch):   # nothing joined: not built
            continue
        on = _build(cd, f"merge_{model}_{k}", True, monkeypatch)
        off = _build(cd, f"merge_{model}_{k}", False, monkeypatch)
        assert len(on.source.launches) < len(off.source.launches)
        joined += 1
        for kern in (on, off):
            outs = [np.full(w.shape, np.nan, w.dtype) for w in want]
            kern(*full, *outs)
            for o, w in zip(outs, want):
                np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-5, err_msg=f"{model}/{sg.name}")
    if model == "mlp_train_step":
        assert joined >= 5


@pytest.mark.parametrize("model,name", [("mlp_train_step", "dot_general.6"), ("mlp_train_step", "dot_general.7"),
                                        ("mlp_train_step", "reduce_sum.70"), ("mlp2", "dot_general.3")])
def test_small_reductions_compute_the_algorithm(model, name, monkeypatch):
    """One warp per output of a skinny dot, a column sum split over threadIdx.y (`default_gpu._skinny_dot`,
    `_column_reduction`; tests/null/test_gpu_small_reductions.py) on the GPU against the algorithm."""
    import hlotune
    from tests.conftest import model_path

    sg = {s.name: s for s in hlotune.load_model(str(model_path(model, "bench.hlo"))).frontend.subgraphs}[name]
    cd = sg.workload.compute
    args, full = _args(sg, seed=5)
    want = evaluate_compute(cd, args)
    kern = _build(cd, f"small_{model}_{name}", True, monkeypatch)
    outs = [np.full(w.shape, np.nan, w.dtype) for w in want]
    kern(*full, *outs)
    for o, w in zip(outs, want):
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-4, err_msg=f"{model}/{name}")
