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

from hlotune.codegen import cuda
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
    assert len(sources) >= 30   # fewer with the front end's row fusion (softmax, layernorm: one subgraph)
    for label, _f, src in sources:
        assert src.launches, label
        for ln in src.launches:
            assert re.search(rf"__launch_bounds__\({ln.threads}(, 2)?\) {ln.name}\(", src.text), label
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


CUBIN = {"matmul/dot_general.1", "row_sum/reduce_sum.7", "sum_reduce/reduce_sum.7", "softmax/input_fusion",
         "softmax/div.7"}


def _generic(f, monkeypatch):
    import hlotune.codegen.cuda as cuda
    monkeypatch.setattr(cuda, "GEMM_TEMPLATE", False)
    return generate_cuda(f)


def test_shared_memory_fetches_are_fenced(sources, monkeypatch):
    src = _generic({label: f for label, f, _ in sources}["matmul/dot_general.1"], monkeypatch)
    text = src.text
    assert "__shared__" in text and src.launches[0].shared_bytes > 0
    # inside the reduction loop: a barrier before the fetch (the previous step's readers) and after it
    body = text[text.index("for (hl_idx r0_0"):]
    first_fetch = body.index("param_0_shared[")
    compute = body.index("dot_general_1_local[", first_fetch)
    assert body[:first_fetch].count("__syncthreads()") == 1
    assert body[first_fetch:compute].count("__syncthreads()") == 1
    assert text.count("__syncthreads()") == 2
    # no barrier in kernels without shared memory (small kernels not joined: a join puts one between them,
    # test_cuda_merge.py)
    import hlotune.codegen.cuda as cuda
    monkeypatch.setattr(cuda, "MERGE_SMALL_KERNELS", False)
    for label, f, _ in sources:
        s = generate_cuda(f)
        if "__shared__" not in s.text and "hl_smem" not in s.text:
            assert "__syncthreads" not in s.text, label


def _map_stores(s, fn):
    import dataclasses
    if isinstance(s, Store):
        return fn(s)
    if isinstance(s, Seq):
        return Seq(tuple(_map_stores(c, fn) for c in s.body))
    if isinstance(s, For | Allocate):
        return dataclasses.replace(s, body=_map_stores(s.body, fn))
    return s


def test_gemm_template_for_default_dots_only_when_the_indexing_matches(sources):
    by = {label: (f, src) for label, f, src in sources}
    for label in ("matmul/dot_general.1", "batch_matmul/dot_general.1", "dense_bias_relu/max.3"):
        f, src = by[label]
        text = src.text
        assert "GEMM template" in text, label
        # one barrier per K tile, one before the loop (register prefetch) or after it (cp.async ring)
        assert text.count("__syncthreads") == 2 and "_shared[" not in text, label
        if "cp.async ring" in text:
            assert "hl_cp16(&hl_As[hl_ns]" in text and "hl_As[3]" in text and "hl_Bs[3]" in text, label
        else:
            assert "__ldg((const float4*)" in text and "hl_As[2]" in text and "hl_Bs[2]" in text, label
    # the same nest with the compute reading B one column off: not the template's mapping -> generic code
    f, _ = by["matmul/dot_general.1"]

    def shift(st):
        if st.buffer.endswith(".local") and isinstance(st.value, Binary):
            mul = st.value.b
            lb = mul.b
            lb2 = Load(lb.buffer, (lb.indices[0], lb.indices[0]), lb.dtype)
            return Store(st.buffer, st.indices, Binary(Op.ADD, st.value.a, Binary(Op.MULTIPLY, mul.a, lb2, mul.dtype),
                                                       st.value.dtype))
        return st
    bad = LoopFunc(f.name, f.inputs, f.outputs, _map_stores(f.body, shift))
    assert "GEMM template" not in generate_cuda(bad).text


_MM256 = ("HloModule mm\nENTRY m {\n  a = f32[256,256] parameter(0)\n  b = f32[256,256] parameter(1)\n"
          "  ROOT d = f32[256,256] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")


@pytest.mark.parametrize("tiles,stages,a_row,want", [((16, 4, 8, 32, 8), 3, True, 3),
                                                     ((16, 4, 8, 32, 8), 2, False, 2),
                                                     ((16, 4, 8, 32, 16), 4, False, 2),
                                                     ((8, 8, 16, 16, 8), 4, True, 4)])
def test_gemm_template_cp_async_ring(monkeypatch, tiles, stages, a_row, want):
    """GEMM_STAGES >= 2: the template's copies are cp.async into a ring of stages (cut to what fits in 48 KB of
    static shared memory), one commit group per tile, a wait for all but the S-2 newest, one barrier per K tile and
    one after the loop, no prefetch registers; A row-major (16-byte copies) or transposed (4-byte copies)."""
    import hlotune
    import hlotune.codegen.cuda as cuda

    monkeypatch.setattr(cuda, "GEMM_STAGES", stages)
    monkeypatch.setattr(cuda, "GEMM_A_ROW", a_row)
    monkeypatch.setattr(cuda, "GEMM_ASYNC_MAX_MR", 16)
    monkeypatch.setattr(cuda, "GEMM_ASYNC_MR8_BLOCKS", 0)
    (sg,) = hlotune.load_model(_MM256).frontend.subgraphs
    cd = sg.workload.compute
    src = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles}), name="mm"))
    text = src.text
    mr, nr, ti, tj, bk = tiles
    assert f"{want}-stage cp.async ring" in text and "cp.async.cg.shared.global" in text
    assert f"hl_As[{want}][{mr * ti}][{bk}]" in text if a_row else f"hl_As[{want}][{bk}][{mr * ti + 4}]" in text
    assert ("hl_cp4(&hl_As" in text) != a_row and "hl_ra" not in text and "__ldg((const float4*)(hl_" not in text
    assert text.count("hl_cp_commit();") == want and f"hl_cp_wait<{want - 2}>();" in text
    assert text.count("__syncthreads()") == 2
    assert src.launches[0].shared_bytes == 4 * want * bk * (mr * ti + 4 + nr * tj)
    assert src.launches[0].shared_bytes <= cuda.STATIC_SHARED_LIMIT
    monkeypatch.setattr(cuda, "GEMM_STAGES", 0)
    plain = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"tiles": tiles}), name="mm")).text
    assert "cp.async" not in plain and "hl_ra" in plain
    if NVCC and stages == 3:
        assert compile_cubin(text, "sm_90")[:4] == b"\x7fELF"


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
    text = generate_cuda(_func(Store("y", (Const(0, DType.S64),), Const(1.0, F32)))).text
    assert re.search(r"hl_rsqrt\(float x\) \{ return \(float\)\(1.0 / sqrt\(\(double\)x\)\)", text)
    assert "HL_INL float hl_exp(float x) {" in text and "hl_sincosf" in text   # float32 exp / sin / cos


def test_warp_per_row_reduction_schedule_and_code():
    """Long enough row counts: one warp per row (threadIdx.x lanes, threadIdx.y rows), partials in one shared
    copy per row of the block, warp shuffles and lane 0's store; the loop nest computes the row sums."""
    import hlotune
    hlo = ("HloModule r\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\n"
           "ENTRY main {\n  x = f32[1024,80] parameter(0)\n  z = f32[] constant(0)\n"
           "  ROOT r = f32[1024] reduce(x, z), dimensions={1}, to_apply=add\n}\n")
    (sg,) = hlotune.load_model(hlo).frontend.subgraphs
    f = _check_against_algorithm(sg, default_gpu_schedule(sg.workload.compute), "warp rows")
    src = generate_cuda(f)
    (ln,) = src.launches
    assert ln.block == (32, 8, 1) and ln.grid == (128, 1, 1)
    t = src.text
    assert "(hl_idx)threadIdx.y * 32 +" in t and "__shfl_down_sync" in t and "hl_rv" not in t
    assert t.count("__syncwarp") == 1 and "__syncthreads" not in t and "if (threadIdx.x == 0)" in t   # warp-private
    if NVCC:
        assert compile_cubin(t, "sm_90")[:4] == b"\x7fELF"


def test_vector_access_analysis():
    """float4 accesses only where every lane reads the next element and lane 0's element is a multiple of 4."""
    from hlotune.codegen.cuda import _lane_invariant_cond, _vector_access
    from hlotune.ir.expr import INDEX, Compare

    i, v = Var("i"), Var("v")

    def c(x):
        return Const(x, INDEX)

    def add(a, b):
        return Binary(Op.ADD, a, b, INDEX)

    def mul(a, b):
        return Binary(Op.MULTIPLY, a, b, INDEX)

    flat = add(mul(i, c(4)), v)                                 # i*4 + v over f32[64]
    assert _vector_access((flat,), (64,), "v", 4)[1] == 1
    assert _vector_access((add(mul(i, c(3)), v),), (64,), "v", 4) is None          # lane 0 not aligned
    assert _vector_access((add(mul(i, c(4)), mul(v, c(2))),), (64,), "v", 4) is None   # stride 2
    assert _vector_access((i,), (64,), "v", 4)[1] == 0                             # broadcast
    # 2-d through division / remainder by the row length (a multiple of 4)
    rows = (Binary(Op.DIVIDE, flat, c(16), INDEX), Binary(Op.REMAINDER, flat, c(16), INDEX))
    assert _vector_access(rows, (4, 16), "v", 4)[1] == 1
    rows6 = (Binary(Op.DIVIDE, flat, c(6), INDEX), Binary(Op.REMAINDER, flat, c(6), INDEX))
    assert _vector_access(rows6, (11, 6), "v", 4) is None
    # a guard true for all lanes or none: i*4 + v < 64 -> i*4 < 64; not with a bound that is not a multiple of 4
    assert "v" not in str(_lane_invariant_cond(Compare("LT", flat, c(64), DType.PRED), "v", 4))
    assert _lane_invariant_cond(Compare("LT", flat, c(63), DType.PRED), "v", 4) is None


def test_elementwise_defaults_store_float4():
    import hlotune
    from tests.conftest import model_path
    (sg,) = hlotune.load_model(str(model_path("relu_chain", "bench.hlo"))).frontend.subgraphs
    cd = sg.workload.compute
    text = generate_cuda(lower(cd, default_gpu_schedule(cd), name="k")).text
    assert "vectorized x4" in text
    if cuda.STREAM_HINTS:   # the streamed input and the output through the evict-first hints
        assert "__stcs((float4*)&mul_7[" in text and "__ldcs((const float4*)&param_0[" in text
    else:
        assert "*(float4*)&mul_7[" in text and "*(const float4*)&param_0[" in text


def test_stream_hints_only_on_inputs_read_once(monkeypatch):
    """`STREAM_HINTS`: layernorm's row input and its output take __ldcs / __stcs, its scale and bias (1024 values
    read by every row) plain loads; with the flag off no hint at all."""
    import hlotune
    from tests.conftest import model_path
    (sg,) = hlotune.load_model(str(model_path("layernorm", "bench.hlo"))).frontend.subgraphs
    cd = sg.workload.compute
    f = lower(cd, default_gpu_schedule(cd), name="k")
    monkeypatch.setattr(cuda, "STREAM_HINTS", True)
    text = generate_cuda(f).text
    assert "__ldcs((const float4*)&param_0[" in text and "__stcs((float4*)&add_11[" in text
    assert "*(const float4*)&param_1[" in text and "*(const float4*)&param_2[" in text
    assert "__ldcs((const float4*)&param_1[" not in text
    monkeypatch.setattr(cuda, "STREAM_HINTS", False)
    plain = generate_cuda(f).text
    assert "__ldcs" not in plain and "__stcs" not in plain and "*(float4*)&add_11[" in plain


def test_vector_access_bases_never_keep_the_lane():
    from hlotune.codegen.cuda import _vector_access
    from hlotune.ir.expr import INDEX, walk

    flat = Binary(Op.ADD, Binary(Op.MULTIPLY, Var("i"), Const(4, INDEX), INDEX), Var("v"), INDEX)
    row = Binary(Op.MULTIPLY, Binary(Op.DIVIDE, flat, Const(8, INDEX), INDEX), Const(8, INDEX), INDEX)
    col = Binary(Op.REMAINDER, flat, Const(8, INDEX), INDEX)
    base, coeff = _vector_access((Binary(Op.ADD, row, col, INDEX),), (64,), "v", 4)
    assert coeff == 1 and not any(isinstance(n, Var) and n.name == "v" for b in base for n in walk(b))
