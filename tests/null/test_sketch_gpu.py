"""GPU sketches (schedule_space/sketch_gpu.py): sampled, mutated and crossed-over schedules lower, match the
algorithm in the loop-IR interpreter, generate CUDA that nvcc compiles; the search picks GPU sketches for cuda
targets; `tune --target cuda` without a GPU fails with one clear line."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hlotune
from hlotune.codegen.cuda import generate_cuda
from hlotune.codegen.cuda_runtime import compile_cubin
from hlotune.errors import UnsupportedError
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.sketch_gpu import GpuSketch, generate_gpu_sketches
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.search.space import DEFAULT_SKETCH, TaskSpace, crossover, mutate, sample_random
from hlotune.target import Target
from tests.conftest import model_path

NVCC = shutil.which("nvcc")
GPU = Target(kind="cuda", name="test-gpu", cores=132, arch="sm_90", shared_mem_bytes=232448, max_threads_per_block=1024)
MODELS = ("softmax", "matmul", "dense_bias_relu", "sum_reduce", "row_sum", "layernorm")


def _tasks(name):
    return tasks_from_subgraphs(hlotune.load_model(str(model_path(name))).frontend.subgraphs, GPU)


def _check(task, steps, label):
    cd = task.compute
    f = lower(cd, steps, name="k")
    rng = np.random.default_rng(0)
    n = len(cd.inputs) - len(constant_values(cd))
    args = [(np.abs(rng.standard_normal(b.shape)) + 0.5).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    want = evaluate_compute(cd, args)
    got = evaluate_loop_func(f, args + [consts[b.name] for b in cd.inputs[n:]])
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5, err_msg=label)
    return generate_cuda(f)


@pytest.fixture(scope="module")
def sampled():
    out = []
    for name in MODELS:
        for t in _tasks(name):
            for sk in generate_gpu_sketches(t, GPU):
                if isinstance(sk, GpuSketch):
                    for s in sk.sample(t, random.Random(5), 2):
                        out.append((f"{name}/{t.name}/{sk.rules}", t, sk, s))
    return out


def test_sketch_families_and_default(sampled):
    rules = {r.split(":", 1)[1] for _, _, sk, _ in sampled for r in sk.rules}
    assert {"tile_cache_write_shared", "tile_cache_write", "tile_fuse_shared", "cross_thread", "serial", "full",
            "elementwise"} <= rules
    t = _tasks("matmul")[0]
    sks = generate_gpu_sketches(t, GPU)
    assert sks[-1].id == DEFAULT_SKETCH and not sks[-1].has_holes
    assert [s.id for s in sks] == [s.id for s in generate_gpu_sketches(t, GPU)]   # deterministic ids


def test_sampled_schedules_match_algorithm_and_generate(sampled):
    assert len(sampled) >= 20
    for label, t, _sk, s in sampled:
        src = _check(t, s.steps, label)
        for ln in src.launches:
            assert 1 <= ln.threads <= 1024, label


def test_mutation_and_crossover_stay_legal(sampled):
    rng = random.Random(3)
    seen_groups = 0
    for label, t, sk, s in sampled[::2]:
        m = mutate(sk, s, rng)
        assert m is not None and m.key != s.key and m.sketch == sk.id, label
        _check(t, m.steps, label + " mutated")
        seen_groups += 1
    assert seen_groups >= 10
    # thread-binding mutation of a tiled kernel changes the thread grid (threads per block)
    t = _tasks("matmul")[0]
    sk = next(s for s in generate_gpu_sketches(t, GPU) if isinstance(s, GpuSketch))
    a, b = sk.sample(t, random.Random(1), 2)
    child = crossover(sk, a, b, random.Random(1))
    assert child is None or child.key not in (a.key, b.key)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA C is generated but not compiled")
def test_sampled_schedules_compile_with_nvcc(sampled, tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTUNE_CACHE_DIR", str(tmp_path))
    picks = [x for x in sampled if "tile" in str(x[2].rules)][:2] + [x for x in sampled if "cross_thread" in
                                                                       str(x[2].rules)][:1]
    for label, t, _sk, s in picks:
        src = generate_cuda(lower(t.compute, s.steps, name="k"))
        assert b".entry" in compile_cubin(src.text, "sm_90", context=label, ptx=True), label


def test_task_space_uses_gpu_sketches_for_cuda():
    t = _tasks("dense_bias_relu")[0]
    sp = TaskSpace(t)
    assert sp.holed and all(isinstance(s, GpuSketch) for s in sp.holed)
    assert sp.default is not None and sp.default.sketch == DEFAULT_SKETCH
    assert sp.seeds and all(s.sketch in sp.by_id for s in sp.seeds)   # the default's tiles as a point
    got = sample_random(sp, random.Random(0), 12)
    assert len({s.key for s in got}) == len(got) >= 10


def test_default_measurer_by_target_kind():
    from hlotune.measure.gpu_runner import GpuRunner
    from hlotune.measure.runner import LocalRunner
    from hlotune.search.tuner import _default_measurer

    m = _default_measurer(1, None, 0, GPU)
    try:
        assert isinstance(m.runner, GpuRunner) and m.runner.target == GPU
    finally:
        m.close()
    m = _default_measurer(1, None, 0, Target.host_cpu())
    try:
        assert isinstance(m.runner, LocalRunner)
    finally:
        m.close()


def _gpu_usable() -> bool:
    try:
        Target.from_string("cuda")
        return True
    except Exception:
        return False


@pytest.mark.skipif(_gpu_usable(), reason="a GPU is present (tests/gpu tunes for cuda)")
def test_tune_cuda_without_gpu_fails_cleanly(tmp_path):
    with pytest.raises(UnsupportedError, match="^no CUDA device: "):
        hlotune.tune(str(model_path("softmax")), tuning_log=str(tmp_path / "t.db"), target="cuda", trials=2)
    r = subprocess.run([sys.executable, "-c", "import sys; from hlotune.cli import main; sys.exit(main(sys.argv[1:]))",
                        "tune", str(model_path("softmax")), "--target", "cuda", "--tuning-log",
                        str(tmp_path / "t.db"), "--trials", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no CUDA device: " in lines[0], r.stderr
