"""The interpreter on real HLO written by JAX: test-size outputs against JAX's, bench-size texts
(pre-optimization, XLA CPU optimized, XLA GPU optimized with cuBLAS/cuDNN custom-calls) against
each other on the same random inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hlotune.ir.interp import evaluate
from hlotune.ir.parser import load_hlo

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
NAMES = sorted(json.loads((MODELS / "manifest.json").read_text())["models"])
#: bench-size models whose three texts evaluate in well under a second each
BENCH_FAST = ["batch_matmul", "conv2d_bias_relu", "dense_bias_relu", "matmul", "mlp2", "mlp_train_step",
              "row_sum", "softmax", "sum_reduce", "transformer_block"]
#: bench-size models that take about 0.5-1 s per text
BENCH_SLOW = ["layernorm", "rmsnorm_swiglu"]


def _npz(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    z = np.load(MODELS / name / f"{name}.npz")
    args = [z[f"arg{i}"] for i in range(sum(k.startswith("arg") for k in z.files))]
    outs = [z[f"out{i}"] for i in range(sum(k.startswith("out") for k in z.files))]
    return args, outs


def test_every_model_is_listed():
    assert set(NAMES) == {p.name for p in MODELS.iterdir() if p.is_dir()}


@pytest.mark.parametrize("suffix", ["hlo", "opt.hlo"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_jax_outputs(name, suffix):
    args, want = _npz(name)
    got = evaluate(load_hlo(MODELS / name / f"{name}.{suffix}"), args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _bench_inputs(module, seed: int = 0) -> list[np.ndarray]:
    """Standard normal activations; weights (rank >= 2, after the first argument) scaled by
    1/sqrt(fan-in) so that values stay O(1), as in a trained model."""
    rng = np.random.default_rng(seed)
    out = []
    for i, p in enumerate(module.entry_computation.parameters):
        dims = p.shape.dims
        scale = 1.0 if i == 0 or len(dims) < 2 else 1.0 / np.sqrt(np.prod(dims[:-1]))
        out.append((rng.standard_normal(dims) * scale).astype(p.shape.dtype.np))
    return out


def _check_bench(name: str) -> None:
    base = MODELS / name / name
    ref_mod = load_hlo(f"{base}.bench.hlo")
    args = _bench_inputs(ref_mod)
    ref = evaluate(ref_mod, args)
    del ref_mod
    for suffix in ("bench.opt.hlo", "bench.gpu.opt.hlo"):
        got = evaluate(load_hlo(f"{base}.{suffix}"), args)
        assert len(got) == len(ref), suffix
        for g, r in zip(got, ref):
            assert g.shape == r.shape, suffix
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, err_msg=suffix)


@pytest.mark.parametrize("name", BENCH_FAST)
def test_bench_texts_agree(name):
    _check_bench(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCH_SLOW)
def test_bench_texts_agree_slow(name):
    _check_bench(name)
