"""The CPU call plan (executable._CpuPlan): one native call runs a model's kernels, intermediates live in one
arena.  Checked against the reference interpreter and the old Python glue path; returned arrays are never
overwritten by later calls, never alias the arena, the arguments or each other."""

import threading

import numpy as np
import pytest

import hlotune
from hlotune import config
from hlotune.executable import ARENA_ALIGN, _arena_offsets
from tests.conftest import model_io, model_path

PLAN_MODELS = ("mlp_train_step", "transformer_block", "softmax", "dense_bias_relu", "layernorm", "conv2d_bias_relu")


def _compile(path, plan: bool):
    saved = config.get("cpu_call_plan")
    config.replace_default("cpu_call_plan", plan)
    try:
        return hlotune.compile(hlotune.load_model(str(path)))
    finally:
        config.replace_default("cpu_call_plan", saved)


def _close(got, want, what):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, what
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(w).max())), err_msg=what)


@pytest.fixture(scope="module")
def bench_mlp():
    """mlp_train_step at bench size: serial and parallel kernels (the test-size fixtures have no parallel loop)."""
    m = hlotune.load_model(str(model_path("mlp_train_step", "bench.hlo")))
    exe = hlotune.compile(m)
    assert any(k.parallel for k in exe._cpu_plan.kernels) and not all(k.parallel for k in exe._cpu_plan.kernels)
    return m, exe


def _random_args(exe, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(dims).astype(dt) for _, dims, dt, _ in exe._param_specs]


@pytest.mark.parametrize("name", PLAN_MODELS)
def test_plan_is_used_and_equals_the_python_glue(name):
    args, outs = model_io(name)
    new, old = _compile(model_path(name), True), _compile(model_path(name), False)
    assert new._cpu_plan is not None and old._cpu_plan is None
    assert "cpu call plan" in new.report()
    got = new(*args)
    _close(got, outs, name)
    for g, w in zip(got, old(*args)):   # same kernels, same order: bit for bit
        np.testing.assert_array_equal(g, w)


def test_repeated_calls_fresh_outputs_never_overwritten(bench_mlp):
    """Different inputs each call: each result matches the interpreter, and results kept from earlier calls
    are unchanged afterwards (no output is a view of the arena or of another call's buffers)."""
    m, exe = bench_mlp
    plan = exe._cpu_plan
    kept = []
    for seed in range(4):
        args = _random_args(exe, seed)
        got = exe(*args)
        want = hlotune.reference_run(m, args)
        _close(got, want, f"call {seed}")
        kept.append((got, [w.copy() for w in want]))
        for y in got:
            assert y.flags.owndata or y.base is not None
            assert not np.shares_memory(y, plan._arena)
            assert not any(np.shares_memory(y, a) for a in args)
    for k, (got, want) in enumerate(kept):
        _close(got, want, f"call {k} kept")
    flat = [y for got, _ in kept for y in got]
    for i, a in enumerate(flat):
        for b in flat[i + 1:]:
            assert not np.shares_memory(a, b)


PASS_THROUGH = """HloModule pass_through

ENTRY main {
  x = f32[8,16]{1,0} parameter(0)
  w = f32[16,4]{1,0} parameter(1)
  c = f32[4]{0} constant({1, 2, 3, 4})
  d = f32[8,4]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  cb = f32[8,4]{1,0} broadcast(c), dimensions={1}
  e = f32[8,4]{1,0} add(d, cb)
  r = f32[32]{0} reshape(e)
  xr = f32[128]{0} reshape(x)
  ROOT t = (f32[8,4]{1,0}, f32[8,4]{1,0}, f32[8,16]{1,0}, f32[32]{0}, f32[128]{0}, f32[4]{0}) tuple(e, e, x, r, xr, c)
}
"""


def test_outputs_that_are_arguments_constants_or_repeats_are_copies():
    m = hlotune.load_model(PASS_THROUGH)
    exe = hlotune.compile(m)
    assert exe._cpu_plan is not None
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    got = exe(x, w)
    want = hlotune.reference_run(m, [x, w])
    _close(got, want, "pass-through")
    assert not np.shares_memory(got[0], got[1])
    assert not np.shares_memory(got[2], x) and not np.shares_memory(got[4], x)
    got[5][:] = 0   # a returned constant is the caller's: the next call still returns the constant
    x[:] = 1
    _close(exe(x, w), hlotune.reference_run(m, [x, w]), "second call")
    np.testing.assert_array_equal(exe(x, w)[5], [1, 2, 3, 4])


def test_non_contiguous_arguments():
    m = hlotune.load_model(str(model_path("dense_bias_relu")))
    exe = hlotune.compile(m)
    args = [np.asfortranarray(a) if a.ndim == 2 else a for a in _random_args(exe, 5)]
    assert any(not a.flags.c_contiguous for a in args)
    _close(exe(*args), hlotune.reference_run(m, [np.ascontiguousarray(a) for a in args]), "fortran-order args")


def test_threads_share_one_executable(bench_mlp):
    m, exe = bench_mlp
    inputs = [_random_args(exe, 10 + k) for k in range(4)]
    wants = [hlotune.reference_run(m, a) for a in inputs]
    results: dict[int, list] = {}

    def work(k):
        results[k] = [exe(*inputs[k]) for _ in range(3)]

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in range(4):
        for got in results[k]:
            _close(got, wants[k], f"thread {k}")


def test_arena_offsets_never_overlap_live_buffers():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        sizes = [int(rng.integers(1, 5000)) for _ in range(n)]
        lives = []
        for _ in range(n):
            a = int(rng.integers(0, 10))
            lives.append((a, a + int(rng.integers(0, 4))))
        offs, total = _arena_offsets(sizes, lives)
        for i in range(n):
            assert offs[i] % ARENA_ALIGN == 0 and offs[i] + sizes[i] <= total
            for j in range(i + 1, n):
                if lives[i][0] <= lives[j][1] and lives[j][0] <= lives[i][1]:
                    assert offs[i] + sizes[i] <= offs[j] or offs[j] + sizes[j] <= offs[i], (sizes, lives, offs)
    # buffers that are never live together share memory
    offs, total = _arena_offsets([1000, 1000, 1000], [(0, 1), (2, 3), (4, 5)])
    assert offs == [0, 0, 0] and total == 1024


def test_plan_setting_off_runs_the_python_glue():
    exe = _compile(model_path("softmax"), False)
    args, outs = model_io("softmax")
    assert exe._cpu_plan is None and "cpu call plan" not in exe.report()
    _close(exe(*args), outs, "softmax, plan off")


def test_profile_times_every_kernel_in_order(bench_mlp):
    m, exe = bench_mlp
    args = _random_args(exe, 7)
    prof = exe.profile(*args, repeats=3)
    assert [p[0] for p in prof] == [s.name for s in m.frontend.subgraphs]
    assert all(t > 0 for _, _, t in prof)
    _close(exe(*args), hlotune.reference_run(m, args), "after profile")
    with pytest.raises(hlotune.errors.UnsupportedError):
        _compile(model_path("softmax"), False).profile(*model_io("softmax")[0])


@pytest.mark.parametrize("plan", [True, False])
def test_fresh_outputs_start_on_a_cache_line(plan):
    """Outputs the kernels write (the call plan's fresh buffers, or each subgraph's own) are 64-byte aligned on
    every call, and the results stay right (a kernel's speed must not depend on where malloc put them)."""
    args, outs = model_io("relu_chain")
    exe = _compile(model_path("relu_chain"), plan)
    for _ in range(5):
        got = exe(*args)
        _close(got, outs, "relu_chain")
        assert all(g.ctypes.data % 64 == 0 for g in got)
