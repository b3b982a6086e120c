"""GPU tier: whole models through `hlotune.compile(target="cuda")` against JAX's outputs (numpy in and out,
and device arrays in and out without host copies), and the GPU runner: check, timing, error kinds and the
restart after a device fault."""

from __future__ import annotations

import numpy as np
import pytest

import hlotune
from hlotune.measure.records import BuildResult, ErrorKind, MeasureInput
from hlotune.measure.runner import TimingConfig
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.steps import Schedule
from hlotune.schedule_space.task import Task
from tests.conftest import MODEL_NAMES, model_io, model_path


def _close(got, want, name, tol=2e-5):
    assert len(got) == len(want), name
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_models_on_cuda_match_jax(name):
    args, outs = model_io(name)
    exe = hlotune.compile(str(model_path(name)), target="cuda")
    _close(exe(*args), outs, name)
    assert "every buffer stays on the device" in exe.report(), exe.report()


def test_device_arrays_in_and_out():
    torch = pytest.importorskip("torch")
    from hlotune.codegen.cuda_runtime import DeviceArray

    for name in ("softmax", "mlp2", "mlp_train_step"):
        args, outs = model_io(name)
        exe = hlotune.compile(str(model_path(name)), target="cuda")
        d_args = [torch.from_numpy(a).cuda() for a in args]
        got = exe(*d_args)
        assert all(isinstance(g, DeviceArray) for g in got)
        tens = [torch.as_tensor(g, device="cuda") for g in got]     # zero-copy view
        _close([t.cpu().numpy() for t in tens], outs, name)
        again = exe(*d_args)   # outputs are fresh buffers: the first results are unchanged
        assert all(a.ptr != b.ptr for a, b in zip(got, again))
        _close([t.cpu().numpy() for t in tens], outs, name + " (after a second call)")


def _task(model):
    from hlotune.target import Target
    sg = hlotune.load_model(model_path(model)).frontend.subgraphs[0]
    return Task(sg.workload.key, sg.workload.compute, Target.from_string("cuda"), name=sg.name)


def test_gpu_runner_checks_times_and_survives_faults():
    from hlotune.measure.measurer import FaultHook, ProgramMeasurer, make_runner

    task = _task("row_sum")
    rng = np.random.default_rng(3)
    scheds = [Schedule(task.key, tuple(default_gpu_schedule(task.compute, task.target)))]
    scheds += [Schedule(task.key, tuple(default_gpu_schedule(task.compute, rng=rng))) for _ in range(2)]
    inputs = [MeasureInput(task, s) for s in scheds] + [MeasureInput(task, scheds[0])] * 3
    runner = make_runner(task.target, TimingConfig(warmup_ms=2, repeats=3, min_repeat_ms=5), timeout=20)
    hook = FaultHook.of({3: "wrong", 4: "segfault", 5: "raise"})
    with ProgramMeasurer(runner=runner, fault_hook=hook) as m:
        res = m.measure_batch(inputs)
        assert [r.error_kind for r in res] == [ErrorKind.NONE] * 3 + [ErrorKind.WRONG_ANSWER, ErrorKind.RUNTIME,
                                                                      ErrorKind.RUNTIME], [str(r) for r in res]
        assert all(0 < c < 1e-2 for r in res[:3] for c in r.costs) and len(res[0].costs) == 3
        assert "SIGSEGV" in res[4].error_msg
        # a real device fault (a trap in the kernel): runtime error, the runner is replaced, the next one works
        trap = _trap_build(task)
        before = runner.restarts
        r = runner.run_one(m._data([inputs[0]])[task.key], trap)
        assert r.error_kind is ErrorKind.RUNTIME and "CUDA error" in r.error_msg, str(r)
        assert runner.restarts == before + 1
        assert m.measure_batch(inputs[:1])[0].valid


def _trap_build(task):
    from hlotune.codegen.cuda_runtime import compile_cubin
    from hlotune.measure.builder import BuildJob, build_one

    good = build_one(BuildJob(task.compute, tuple(default_gpu_schedule(task.compute, task.target)), task.target,
                              "m_trap"))
    import json
    art = json.loads(good.symbol)
    name = art["launches"][0][0]
    params = ", ".join(f"float* p{i}" for i in range(len(art["launches"][0][5])))
    cubin = compile_cubin(f'extern "C" __global__ void {name}({params}) {{ __trap(); }}\n', "sm_90")
    art["launches"] = art["launches"][:1]
    return BuildResult(cubin, json.dumps(art), good.func, False, build_s=0.0)


@pytest.mark.parametrize("name", ["mlp_train_step", "transformer_block", "softmax", "sum_reduce"])
def test_launch_program_matches_the_general_path(name):
    """The whole model as one launch program (pointers resolved at build time, driver-API launches) gives the
    same bits as the general glue path (one pycuda launch per kernel), call after call."""
    args, outs = model_io(name)
    exe = hlotune.compile(str(model_path(name)), target="cuda")
    fast = exe._gpu.fast
    assert fast is not None and fast.prog.n_kernels >= 1
    first = exe(*args)
    second = exe(*args)
    exe._gpu.fast = None
    general = exe(*args)
    exe._gpu.fast = fast
    _close(first, outs, name)
    for a, b, c in zip(first, second, general):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_cuda_graph_replay_of_a_repeated_pointer_set():
    """The same device inputs again (outputs dropped, so the pool hands out the same buffers): the launch program
    captures a CUDA graph on the second use of a pointer set and replays it; every result stays exact."""
    torch = pytest.importorskip("torch")
    for name in ("mlp_train_step", "layernorm"):
        args, outs = model_io(name)
        exe = hlotune.compile(str(model_path(name)), target="cuda")
        prog = exe._gpu.fast.prog
        d_args = [torch.from_numpy(a).cuda() for a in args]
        results = [[g.get() for g in exe(*d_args)] for _ in range(4)]
        assert prog.captures >= 1 and prog.graph_launches >= 1, (prog.captures, prog.graph_launches)
        _close(results[0], outs, name)
        for r in results[1:]:
            for a, b in zip(results[0], r):
                np.testing.assert_array_equal(a, b)


def test_device_arguments_at_odd_offsets_are_copied_aligned():
    """Kernels read float4 vectors: a device argument that is a view 4 bytes into a buffer is copied to an
    aligned buffer first (the results match JAX's)."""
    torch = pytest.importorskip("torch")
    for name in ("relu_chain", "dense_bias_relu"):
        args, outs = model_io(name)
        exe = hlotune.compile(str(model_path(name)), target="cuda")
        views = []
        for a in args:
            buf = torch.empty(a.size + 1, dtype=torch.from_numpy(a).dtype, device="cuda")
            buf[1:].copy_(torch.from_numpy(a.ravel()))
            views.append(buf[1:].view(a.shape))
        assert all(v.data_ptr() % 16 for v in views)
        _close([g.get() for g in exe(*views)], outs, name)


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_row_fused_gpu_fusions_compile_to_one_kernel(name):
    """XLA's GPU fusion of the model (one row-fused subgraph) through hlotune.compile: one kernel, numpy's values."""
    m = hlotune.load_model(str(model_path(name, "bench.gpu.opt.hlo")))
    exe = hlotune.compile(m, target="cuda")
    rng = np.random.default_rng(4)
    args = [(rng.standard_normal(p.array_shape.dims) * 0.5).astype(np.float32)
            for p in m.module.entry_computation.parameters]
    res = exe(*args)
    got = np.asarray(res[0] if isinstance(res, (list, tuple)) else res)
    x = args[0].astype(np.float64)
    if name == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    else:
        mu = x.mean(axis=1, keepdims=True)
        want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5) * args[1] + args[2]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if exe._gpu.fast is not None:
        assert exe._gpu.fast.prog.n_kernels == 1
