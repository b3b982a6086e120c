"""CUDA C generation without a GPU: default (and random) GPU schedules of every fixture subgraph lower to loop
nests that compute what the algorithm says (loop-IR interpreter against numpy), their CUDA C compiles with the
local nvcc for sm_90 (skipped, with the reason, when nvcc is missing), and the text has the structure the
GPU needs (launch bounds, barriers around cooperative shared-memory fetches, none without shared memory)."""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hlotune.codegen.cuda import generate_cuda
from hlotune.codegen.cuda_runtime import compile_cubin
from hlotune.errors import CompileError
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.ir.expr import Binary, Const, Load, Var
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import Allocate, BufferDecl, For, ForKind, LoopFunc, Seq, Store
from hlotune.schedule_space.lower import lower
from tests.conftest import distinct_subgraphs

NVCC = shutil.which("nvcc")
F32 = DType.F32
def _subgraphs():
    return distinct_subgraphs()


def _work(cd):
    return max(int(np.prod(s.shape)) * int(np.prod([a.extent for a in s.reduce_axes] or [1])) for s in cd.stages)


def _check_against_algorithm(sg, steps, label):
    cd = sg.workload.compute
    f = lower(cd, steps, name=sg.name)
    rng = np.random.default_rng(1)
    n = len(sg.computation.parameters)
    args = [(np.abs(rng.standard_normal(b.shape)) + 0.5).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    want = evaluate_compute(cd, args)
    got = evaluate_loop_func(f, args + [consts[b.name] for b in cd.inputs[n:]])
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5, err_msg=label)
    return f


@pytest.fixture(scope="module")
def sources():
    out = []
    for name, sg in _subgraphs():
        cd = sg.workload.compute
        f = _check_against_algorithm(sg, default_gpu_schedule(cd), f"{name}/{sg.name} default")
        out.append((f"{name}/{sg.name}", f, generate_cuda(f)))
    return out


def test_default_schedules_match_algorithm_and_generate(sources):
    assert len(sources) >= 40
    for label, _f, src in sources:
        assert src.launches, label
        for ln in src.launches:
            assert f"__launch_bounds__({ln.threads}) {ln.name}(" in src.text, label
            assert 1 <= ln.threads <= 1024, label


def test_random_gpu_schedules_match_algorithm():
    rng = np.random.default_rng(7)
    for name, sg in _subgraphs():
        if _work(sg.workload.compute) > 60000:
            continue  # the loop-IR interpreter is slow; the GPU tier runs these compiled
        for _ in range(1):
            steps = default_gpu_schedule(sg.workload.compute, rng=rng)
            f = _check_against_algorithm(sg, steps, f"{name}/{sg.name} random")
            generate_cuda(f)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA C is generated but not compiled")
def test_generated_cuda_compiles_with_nvcc(sources, tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTUNE_CACHE_DIR", str(tmp_path))

    def build(item):
        label, _, src = item
        cubin = label in CUBIN  # machine code for a few (ptxas is slow), PTX for the rest
        return label, cubin, compile_cubin(src.text, "sm_90", context=label, ptx=not cubin)

    with ThreadPoolExecutor(4) as pool:
        for label, cubin, out in pool.map(build, sources):
            assert out[:4] == b"\x7fELF" if cubin else b".entry" in out, label
    assert len(list((tmp_path / "cuda").glob("*.*"))) == len({s.text for _, _, s in sources})


CUBIN = {"matmul/dot_general.1", "row_sum/reduce_sum.7", "sum_reduce/reduce_sum.7", "softmax/input_fusion"}


def test_shared_memory_fetches_are_fenced(sources):
    by = {label: src for label, _, src in sources}
    src = by["matmul/dot_general.1"]
    text = src.text
    assert "__shared__" in text and src.launches[0].shared_bytes > 0
    # inside the reduction loop: a barrier before the fetch (the previous step's readers) and after it
    body = text[text.index("for (hl_idx r0_0"):]
    first_fetch = body.index("param_0_shared[")
    compute = body.index("dot_general_1_local[", first_fetch)
    assert body[:first_fetch].count("__syncthreads()") == 1
    assert body[first_fetch:compute].count("__syncthreads()") == 1
    assert text.count("__syncthreads()") == 2
    # no barrier in kernels without shared memory
    for label, s in by.items():
        if "__shared__" not in s.text and "hl_smem" not in s.text:
            assert "__syncthreads" not in s.text, label


def test_row_reduction_partials_go_to_shared_and_thread0_combines(sources):
    src = {label: s for label, _, s in sources}["row_sum/reduce_sum.7"]
    t = src.text
    assert "__shared__" in t and "reduce_sum_7_rf" in t
    assert "__syncthreads();" in t and "if (threadIdx.x == 0)" in t
    assert src.launches[0].grid == (64, 1, 1) and src.launches[0].block == (128, 1, 1)


def _loop(name, n, body, kind=ForKind.SERIAL):
    return For(Var(name), Const(0, DType.S64), Const(n, DType.S64), kind, body)


def _func(body, n=64):
    return LoopFunc("k", (BufferDecl("x", (n,), F32),), (BufferDecl("y", (n,), F32),), body)


def test_thread_extent_mismatch_is_guarded():
    i = Var("i")
    a = _loop("i", 64, Store("y", (i,), Load("x", (i,), F32)), ForKind.THREAD_X)
    b = _loop("j", 32, Store("y", (Var("j"),), Load("x", (Var("j"),), F32)), ForKind.THREAD_X)
    src = generate_cuda(_func(Seq((a,)), 64))
    assert src.launches[0].block == (64, 1, 1)
    # two nests in one kernel (under one block loop): the shorter thread loop is guarded
    k = _loop("b", 2, Seq((a, b)), ForKind.BLOCK_X)
    src = generate_cuda(_func(k))
    assert src.launches[0].block == (64, 1, 1) and "if (j < 32)" in src.text


def test_nested_block_bindings_are_rejected():
    i, j = Var("i"), Var("j")
    k = _loop("i", 4, _loop("j", 16, Store("y", (i * 16 + j,), Load("x", (i * 16 + j,), F32)), ForKind.BLOCK_X),
              ForKind.BLOCK_X)
    with pytest.raises(CompileError, match="inside another loop bound"):
        generate_cuda(_func(k))


def test_local_written_by_threads_is_promoted_and_fenced():
    t, r = Var("t"), Var("r")
    fill = _loop("t", 64, Store("s", (t,), Load("x", (t,), F32)), ForKind.THREAD_X)
    rev = _loop("t2", 64, Store("y", (Var("t2"),), Load("s", (Binary(Op.SUBTRACT, Const(63, DType.S64), Var("t2"),
                                                                       DType.S64),), F32)), ForKind.THREAD_X)
    body = _loop("b", 2, Allocate("s", F32, (64,), "local", Seq((fill, rev))), ForKind.BLOCK_X)
    src = generate_cuda(_func(body))
    assert "__shared__ __align__(16) float s[64];" in src.text
    assert src.text.count("__syncthreads();") == 1
    assert src.text.index("__syncthreads();") < src.text.index("y[")
    del r


def test_sync_is_not_placed_under_thread_dependent_control():
    # a barrier needed inside a guarded (shorter) thread loop cannot be placed: CompileError
    t = Var("t")
    inner = Allocate("s", F32, (32,), "shared", Seq((
        _loop("u", 32, Store("s", (Var("u"),), Load("x", (Var("u"),), F32)), ForKind.THREAD_X),
        Store("y", (t,), Load("s", (Const(0, DType.S64),), F32)))))
    k = Seq((_loop("t", 32, inner, ForKind.THREAD_X), _loop("w", 64, Store("y", (Var("w"),), Const(0.0, F32)),
                                                             ForKind.THREAD_X)))
    with pytest.raises(CompileError, match="barrier"):
        generate_cuda(_func(_loop("b", 1 + 1, k, ForKind.BLOCK_X)))


def test_float_constants_are_exact_and_math_is_double_where_needed():
    from hlotune.codegen.cuda import const_text

    assert const_text(Const(0.1, F32)) == float(np.float32(0.1)).hex() + "f"
    assert const_text(Const(float("-inf"), F32)).startswith("__int_as_float(")
    assert const_text(Const(float("nan"), F32)) == "__int_as_float(0x7fc00000)"
    assert re.search(r"hl_exp\(float x\) \{ return \(float\)exp\(\(double\)x\)", generate_cuda(
        _func(Store("y", (Const(0, DType.S64),), Const(1.0, F32)))).text)
