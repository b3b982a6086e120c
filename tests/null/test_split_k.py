"""Split-K dots on the GPU (`default_gpu.SPLIT_K`, no GPU needed): which dots take it, the partial dots on the GEMM
template reading K slices of A's rows (`_Gemm.lda`), and the loop nest against the algorithm (the loop-IR
interpreter; a small dot with an elementwise consumer, and one whose dot is also an output)."""

from __future__ import annotations

import numpy as np
import pytest

import hlotune
import hlotune.schedule_space.default_gpu as dg
from hlotune.codegen.cuda import generate_cuda
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.steps import RFactor
from tests.conftest import model_path

#: split-K variants of mlp_train_step's forward dot (also run on the GPU by tests/gpu/test_split_k.py)
SPLIT_CASES = [{"split_k": 7, "tiles": (4, 4, 4, 32, 16)}, {"split_k": 7, "tiles": (8, 4, 8, 32, 16)},
               {"split_k": 7, "tensor_core": 3}]


def split_subgraph(model: str, name: str):
    return {s.name: s for s in hlotune.load_model(str(model_path(model, "bench.hlo"))).frontend.subgraphs}[name]


def _dot(m: int, k: int, n: int, output_dot: bool) -> str:
    root = f"ROOT t = (f32[{m},{n}], f32[{m},{n}]) tuple(d, r)" if output_dot else ""
    return f"""HloModule t
ENTRY main {{
  a = f32[{m},{k}] parameter(0)
  b = f32[{k},{n}] parameter(1)
  c = f32[{n}] parameter(2)
  d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  cb = f32[{m},{n}] broadcast(c), dimensions={{1}}
  s = f32[{m},{n}] add(d, cb)
  zero = f32[] constant(0)
  z = f32[{m},{n}] broadcast(zero), dimensions={{}}
  {'' if output_dot else 'ROOT '}r = f32[{m},{n}] maximum(s, z)
  {root}
}}
"""


def _splits(steps) -> list[str]:
    return [s.stage for s in steps if isinstance(s, RFactor)]


def test_forward_dots_of_the_mlps_take_split_k():
    sg = split_subgraph("mlp_train_step", "output_fusion")
    steps = default_gpu_schedule(sg.workload.compute)
    assert _splits(steps) == ["dot_general_5"]
    src = generate_cuda(lower(sg.workload.compute, steps, name="k"))
    # the partial dots: 7 K slices of 112 x 32 tiles of 16 x 128 = 224 blocks on the GEMM template, A's rows 784 long
    assert src.launches[0].grid == (224, 1, 1) and "GEMM template" in src.text
    assert " * 784 + " in src.text and "hl_bb * 112LL" in src.text and "hl_bb * 28672LL" in src.text
    assert len(src.launches) == 3    # partial dots, their sum (an output), the bias + ReLU consumer
    assert _splits(default_gpu_schedule(split_subgraph("mlp2", "max.3").workload.compute))


def test_split_k_only_where_the_output_is_small_and_k_long():
    big = hlotune.load_model(_dot(1024, 1024, 1024, False)).frontend.subgraphs[0].workload.compute
    short = hlotune.load_model(_dot(256, 128, 256, False)).frontend.subgraphs[0].workload.compute
    assert not _splits(default_gpu_schedule(big)) and not _splits(default_gpu_schedule(short))
    small = hlotune.load_model(_dot(256, 1024, 256, False)).frontend.subgraphs[0].workload.compute
    assert _splits(default_gpu_schedule(small))
    try:
        dg.SPLIT_K = False
        assert not _splits(default_gpu_schedule(small))
    finally:
        dg.SPLIT_K = True
    assert not _splits(default_gpu_schedule(small, options={"split_k": 1}))


@pytest.mark.parametrize("output_dot", [False, True])
@pytest.mark.parametrize("parts", [2, 4])
def test_split_k_loop_nest_computes_the_algorithm(output_dot, parts):
    (sg,) = hlotune.load_model(_dot(32, 256, 128, output_dot)).frontend.subgraphs
    cd = sg.workload.compute
    rng = np.random.default_rng(parts)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    want = evaluate_compute(cd, args)
    f = lower(cd, default_gpu_schedule(cd, options={"split_k": parts}), name="k")
    got = evaluate_loop_func(f, args)
    assert len(got) == len(want) == (2 if output_dot else 1)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)
    src = generate_cuda(f)
    assert src.launches[0].grid == (2 * parts, 1, 1) and "GEMM template" in src.text
    assert f"hl_bb * {256 // parts}LL" in src.text and " * 256 + " in src.text
    assert len(src.launches) == (3 if output_dot else 2)


TN = """HloModule t
ENTRY main {
  a = f32[64,96] parameter(0)
  b = f32[64,128] parameter(1)
  c = f32[96,128] parameter(2)
  d = f32[96,128] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ROOT s = f32[96,128] subtract(c, d)
}
"""


def _check_loop_nest(hlo: str, opts: dict, seed: int = 0):
    (sg,) = hlotune.load_model(hlo).frontend.subgraphs
    cd = sg.workload.compute
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    f = lower(cd, default_gpu_schedule(cd, options=opts), name="k")
    for g, w in zip(evaluate_loop_func(f, args), evaluate_compute(cd, args)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)
    return generate_cuda(f)


def test_split_k_of_a_tn_dot_on_the_implicit_gemm_template():
    """Options "split_k" also split a dot outside the GEMM template's layout (the weight gradient's TN dot): the
    partial dots run the implicit-GEMM template (not a default: measured slower on mlp_train_step, docs/gpu.md)."""
    src = _check_loop_nest(TN, {"split_k": 2, "tiles": (4, 4, 4, 32, 16)})
    assert "implicit-GEMM template" in src.text and src.launches[0].grid == (12, 1, 1) and len(src.launches) == 2
    assert not _splits(default_gpu_schedule(hlotune.load_model(TN).frontend.subgraphs[0].workload.compute))


SKINNY_TN = """HloModule t
ENTRY main {
  a = f32[64,10] parameter(0)
  b = f32[64,96] parameter(1)
  ROOT d = f32[10,96] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}
"""


def test_skinny_tn_dot_reads_along_the_columns():
    """`default_gpu._column_dot`: a skinny dot whose wide operand is contiguous along the output's columns gets threads
    along those columns and K over threadIdx.y (was one warp per output reading down a column)."""
    src = _check_loop_nest(SKINNY_TN, {})
    assert [(ln.grid, ln.block) for ln in src.launches] == [((3, 1, 1), (32, dg.COLUMN_SPLIT, 1))]
    src = _check_loop_nest(SKINNY_TN, {"column_dot": False})
    assert src.launches[0].block == (32, 8, 1)     # one warp per output


def test_small_full_reduction_takes_one_block():
    hlo = """HloModule t
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
ENTRY main {
  a = f32[256] parameter(0)
  zero = f32[] constant(0)
  ROOT r = f32[] reduce(a, zero), dimensions={0}, to_apply=add
}
"""
    src = _check_loop_nest(hlo, {})
    assert [(ln.grid, ln.block) for ln in src.launches] == [((1, 1, 1), (256, 1, 1))]
    assert "cross-thread reduction" in src.text
    try:
        dg.SMALL_REDUCTION_BLOCK = 0
        assert _check_loop_nest(hlo, {}).launches[0].block == (1, 1, 1)
    finally:
        dg.SMALL_REDUCTION_BLOCK = 64


def test_split_k_sketch_points_compute_the_algorithm():
    """The GPU search space has split K too (`sketch_gpu` kernel kind "splitk": parts of K a knob beside the tiles):
    sampled, mutated and crossed-over points match the algorithm, generate CUDA on the templates, and their fast
    features equal the exact path's."""
    import random

    from hlotune.cost_model.fast_features import batch_features
    from hlotune.cost_model.features import features_of_func, ideal_log2
    from hlotune.schedule_space.sketch_gpu import GpuSketch, generate_gpu_sketches
    from hlotune.schedule_space.task import tasks_from_subgraphs
    from hlotune.search.space import crossover, mutate
    from tests.null.test_sketch_gpu import GPU, _check

    small_tn = TN.replace("f32[64,96]", "f32[64,16]").replace("f32[64,128]", "f32[64,32]").replace(
        "f32[96,128]", "f32[16,32]")
    seen = set()
    for hlo in (_dot(16, 64, 32, False), _dot(16, 64, 32, True), small_tn):
        for t in tasks_from_subgraphs(hlotune.load_model(hlo).frontend.subgraphs, GPU):
            for sk in generate_gpu_sketches(t, GPU):
                if not isinstance(sk, GpuSketch) or not any(k.kind == "splitk" for k in sk.kernels):
                    continue
                seen.add(sk.rules[-1].split(":")[1])
                pts = sk.sample(t, random.Random(1), 3)
                assert len(pts) == 3
                kids = [mutate(sk, s, random.Random(k)) for k, s in enumerate(pts)]
                kids.append(crossover(sk, pts[0], pts[1], random.Random(0)))
                for s in pts + [c for c in kids if c is not None]:
                    src = _check(t, s.steps, str(sk.rules))
                    assert any(isinstance(x, RFactor) for x in s.steps) and "template" in src.text
                fast = batch_features(t.compute, pts, t.key)
                for s, f in zip(pts, fast):
                    np.testing.assert_allclose(f, features_of_func(lower(t.compute, s.steps, name="k"),
                                                                   ideal_log2(t.compute)))
    assert seen == {"split_k", "split_k_fuse"}


def test_split_k_is_float32_only():
    """Partial sums of a bf16 dot would be rounded to bf16: no split K there, by default or in the sketches."""
    from hlotune.schedule_space.sketch_gpu import generate_gpu_sketches
    from tests.null.test_sketch_gpu import GPU

    hlo = _dot(256, 1024, 256, False)
    assert _splits(default_gpu_schedule(hlotune.load_model(hlo).frontend.subgraphs[0].workload.compute))
    bf = hlotune.load_model(hlo.replace("f32[", "bf16[")).frontend.subgraphs[0].workload.compute
    assert not _splits(default_gpu_schedule(bf))
    assert not any(k.kind == "splitk" for sk in generate_gpu_sketches(bf, GPU, default=False) for k in sk.kernels)
