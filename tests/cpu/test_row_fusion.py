"""Row (normalization) fusion compiled with the LLVM CPU backend and default schedules: the fixtures that
have a normalization (softmax, layernorm, RMS norm, log-softmax, attention softmax, a training step) match
JAX's outputs with the rule on and off; row subgraphs of many row lengths and ranks (vectorizable or not,
short rows, rows of two reduced dims) match the HLO interpreter; softmax at bench size is one subgraph whose
output matches numpy."""

from __future__ import annotations

import numpy as np
import pytest

import hlotune
from hlotune.ir.hlo import Op
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.steps import ComputeAt
from tests.conftest import model_io, model_path

MODELS = ["softmax", "layernorm", "rmsnorm_swiglu", "mlp2", "transformer_block", "mlp_train_step"]
REGIONS = ("add_f {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
           "max_f {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] maximum(a, b)\n}\n")


def _softmax(shape: tuple[int, ...], nred: int = 1) -> str:
    """softmax over the last `nred` dims of `shape`, then scaled by a row vector and shifted (layernorm-like)."""
    k = len(shape) - nred
    full = f"f32[{','.join(map(str, shape))}]"
    stat = f"f32[{','.join(map(str, shape[:k]))}]"
    vec = f"f32[{','.join(map(str, shape[k:]))}]"
    red = ",".join(str(d) for d in range(k, len(shape)))
    lead = ",".join(str(d) for d in range(k))
    tail = ",".join(str(d) for d in range(k, len(shape)))
    return (f"HloModule t\n\n{REGIONS}\nENTRY main {{\n  x = {full} parameter(0)\n  g = {vec} parameter(1)\n"
            f"  z = f32[] constant(0)\n  ninf = f32[] constant(-inf)\n"
            f"  mx = {stat} reduce(x, ninf), dimensions={{{red}}}, to_apply=max_f\n"
            f"  bm = {full} broadcast(mx), dimensions={{{lead}}}\n  s = {full} subtract(x, bm)\n"
            f"  e = {full} exponential(s)\n  r = {stat} reduce(e, z), dimensions={{{red}}}, to_apply=add_f\n"
            f"  b = {full} broadcast(r), dimensions={{{lead}}}\n  d = {full} divide(e, b)\n"
            f"  gb = {full} broadcast(g), dimensions={{{tail}}}\n  ROOT o = {full} multiply(d, gb)\n}}\n")


def _rmsnorm(shape: tuple[int, ...]) -> str:
    """x * rsqrt(mean(x * x over the last dim) + eps) * g: a row reduction of a product (not a dot)."""
    full = f"f32[{','.join(map(str, shape))}]"
    stat = f"f32[{','.join(map(str, shape[:-1]))}]"
    lead = ",".join(str(d) for d in range(len(shape) - 1))
    return (f"HloModule t\n\n{REGIONS}\nENTRY main {{\n  x = {full} parameter(0)\n  g = f32[{shape[-1]}] parameter(1)\n"
            f"  z = f32[] constant(0)\n  n = f32[] constant({1.0 / shape[-1]})\n  eps = f32[] constant(1e-6)\n"
            f"  sq = {full} multiply(x, x)\n"
            f"  r = {stat} reduce(sq, z), dimensions={{{len(shape) - 1}}}, to_apply=add_f\n"
            f"  nb = {stat} broadcast(n), dimensions={{}}\n  m = {stat} multiply(r, nb)\n"
            f"  eb = {stat} broadcast(eps), dimensions={{}}\n  a = {stat} add(m, eb)\n  q = {stat} rsqrt(a)\n"
            f"  qb = {full} broadcast(q), dimensions={{{lead}}}\n  h = {full} multiply(x, qb)\n"
            f"  gb = {full} broadcast(g), dimensions={{{len(shape) - 1}}}\n  ROOT o = {full} multiply(h, gb)\n}}\n")


@pytest.mark.parametrize("shape", [(6, 5, 128), (3, 64), (40, 20)])
def test_rmsnorm_row_subgraph_matches_interpreter(shape):
    m = hlotune.load_model(_rmsnorm(shape))
    (sg,) = m.frontend.subgraphs
    if shape[-1] % 4 == 0:   # the default's row plan: the statistic is computed at the output's row loop
        assert any(isinstance(s, ComputeAt) and s.target == sg.workload.compute.outputs[0]
                   for s in default_schedule(sg.workload.compute))
    rng = np.random.default_rng(shape[-1])
    args = [rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape[-1:]).astype(np.float32)]
    want = hlotune.reference_run(m, args)
    got = hlotune.compile(m)(*args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("row_fusion", ["1", "0"])
@pytest.mark.parametrize("name", MODELS)
def test_fixture_matches_jax(name, row_fusion, monkeypatch):
    monkeypatch.setenv("HLOTUNE_ROW_FUSION", row_fusion)
    args, outs = model_io(name)
    exe = hlotune.compile(str(model_path(name)))
    assert set(exe.sources().values()) == {"default"}
    got = exe(*args)
    assert len(got) == len(outs)
    for g, w in zip(got, outs):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{name} row_fusion={row_fusion}")


@pytest.mark.parametrize("shape,nred", [((7, 10), 1), ((5, 48), 1), ((3, 100), 1), ((33, 16), 1), ((64, 1024), 1),
                                        ((2, 4096), 1), ((3, 5, 96), 1), ((4, 6, 32), 2), ((2, 3, 4, 64), 1)])
def test_row_subgraph_matches_interpreter(shape, nred):
    m = hlotune.load_model(_softmax(shape, nred))
    (sg,) = m.frontend.subgraphs
    assert sum(i.op is Op.REDUCE for i in sg.computation) == 2
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    args = [(rng.standard_normal(shape) * 3).astype(np.float32),
            rng.standard_normal(shape[len(shape) - nred:]).astype(np.float32)]
    want = hlotune.reference_run(m, args)
    got = hlotune.compile(m)(*args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_bench_softmax_is_one_subgraph_and_right():
    m = hlotune.load_model(str(model_path("softmax", "bench.hlo")))
    assert len(m.frontend.subgraphs) == 1
    x = np.random.default_rng(5).standard_normal((4096, 1024)).astype(np.float32) * 4
    (got,) = hlotune.compile(m)(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
