"""Default schedules: every fused subgraph of every fixture gets one, it lowers, and the loop
nest computes what the algorithm says (loop-IR interpreter against the numpy evaluation)."""

import numpy as np
import pytest

import hlotune
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import For, ForKind, walk_stmts
from hlotune.schedule_space.lower import lower
from hlotune.target import Target
from tests.conftest import MODEL_NAMES, model_path

AVX2 = Target.host_cpu()


def _targets():
    """The host, and the same host with 256-bit vectors (AVX2 machines such as CI's)."""
    import dataclasses

    return [AVX2, dataclasses.replace(AVX2, vector_bits=256)]


def _subgraphs(name):
    return load(name).frontend.subgraphs


_MODELS = {}


def load(name):
    if name not in _MODELS:
        _MODELS[name] = hlotune.load_model(model_path(name))
    return _MODELS[name]


def _work(cd):
    return max(int(np.prod(s.shape)) * int(np.prod([a.extent for a in s.reduce_axes] or [1])) for s in cd.stages)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("vbits", [512, 256])
def test_default_schedule_matches_algorithm(name, vbits):
    import dataclasses

    target = dataclasses.replace(AVX2, vector_bits=vbits)
    rng = np.random.default_rng(0)
    for sg in _subgraphs(name):
        cd = sg.workload.compute
        steps = default_schedule(cd, target)
        f = lower(cd, steps)
        if _work(cd) > 60000:
            continue  # the loop-IR interpreter is slow; the CPU tier runs these compiled
        n = len(sg.computation.parameters)
        args = [np.abs(rng.standard_normal(b.shape)).astype(b.dtype.np) + 0.5 for b in cd.inputs[:n]]
        consts = constant_values(cd)
        want = evaluate_compute(cd, args)
        got = evaluate_loop_func(f, args + [consts[b.name] for b in cd.inputs[n:]])
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5, err_msg=f"{name}/{sg.name}")


def test_dense_default_is_tiled_parallel_and_vectorized():
    m = hlotune.load_model(model_path("dense_bias_relu", "bench.hlo"))
    (sg,) = m.frontend.subgraphs
    f = lower(sg.workload.compute, default_schedule(sg.workload.compute, AVX2))
    kinds = [s.kind for s in walk_stmts(f.body) if isinstance(s, For)]
    assert kinds[0] is ForKind.PARALLEL
    assert ForKind.VECTORIZED in kinds and ForKind.UNROLLED in kinds
    # the accumulator tile is local (registers), not a global temporary
    assert "in local" in str(f)
