"""GPU tier: split-K dots (`default_gpu.SPLIT_K`: partial dots over K slices on the GEMM or implicit-GEMM template,
then their sum with the elementwise consumer) compute what the algorithm computes (numpy's `evaluate_compute`):
mlp_train_step's forward dot (an output of its fusion too) and weight gradient, mlp2's first layer at bench size, and
split-K variants of one dot; so do mlp_train_step's skinny TN dot on columns (`_column_dot`) and its loss, a small full
reduction in one block."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.ir.compute_eval import evaluate_compute
from tests.null.test_cuda_rows6 import _args
from tests.null.test_split_k import SPLIT_CASES, split_subgraph


def _check(sg, opts: dict, name: str, seed: int = 3, template: bool = True):
    import hlotune.codegen.cuda_runtime as rt
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.schedule_space.default_gpu import default_gpu_schedule
    from hlotune.schedule_space.lower import lower

    cd = sg.workload.compute
    args, full = _args(sg, seed=seed)
    want = evaluate_compute(cd, args)
    rt._KCACHE.clear()
    kern = build_cuda(lower(cd, default_gpu_schedule(cd, options=dict(opts)), name=name))
    assert not template or "template" in kern.text and len(kern.source.launches) >= 2
    outs = [np.full(w.shape, np.nan, w.dtype) for w in want]
    kern(*full, *outs)
    for o, w in zip(outs, want):
        scale = max(float(np.abs(w).max()), 1.0)
        np.testing.assert_allclose(o, w, rtol=2e-4, atol=2e-5 * scale, err_msg=f"{name} {opts}")


@pytest.mark.parametrize("model,name", [("mlp_train_step", "output_fusion"), ("mlp2", "max.3"),
                                        ("mlp_train_step", "sub.20")])
def test_split_k_default_computes_the_algorithm(model, name):
    _check(split_subgraph(model, name), {}, f"splitk_{model}_{name}")


@pytest.mark.parametrize("name", ["dot_general.7", "neg.3"])
def test_column_dot_and_small_reduction_compute_the_algorithm(name):
    _check(split_subgraph("mlp_train_step", name), {}, f"splitk_mlp_train_step_{name}", template=False)


@pytest.mark.parametrize("opts", SPLIT_CASES, ids=str)
def test_split_k_variants_compute_the_algorithm(opts):
    _check(split_subgraph("mlp_train_step", "output_fusion"), opts, "splitk_variant")
