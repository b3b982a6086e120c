"""The implicit-GEMM template of the CUDA code generator (no GPU needed): which loops it takes, the text it
writes, and what it computes, checked by running the loop nest the template computes (`igemm_loop_nest`: the
operand expressions it fetches, at the rows and columns each thread reads, in the same order) through the
loop-IR interpreter against `evaluate_compute`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import hlotune
from hlotune.codegen.cuda import generate_cuda, igemm_loop_nest
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.ir.expr import Binary, Var, rebuild
from hlotune.ir.hlo import Op
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import For, ForKind, Seq, Store, walk_stmts
from hlotune.schedule_space.lower import lower
from hlotune.target import Target
from tests.conftest import model_path

H200 = Target(kind="cuda", name="NVIDIA H200", cores=132, arch="sm_90", max_threads_per_block=1024)
EXTRA = Path(__file__).resolve().parent.parent / "data" / "extra"

NT = ("HloModule nt\nENTRY main {\n  a = f32[2,64,32] parameter(0)\n  b = f32[2,64,32] parameter(1)\n"
      "  ROOT d = f32[2,64,64] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, "
      "rhs_contracting_dims={2}\n}\n")
TN = """HloModule tn
ENTRY main {
  a = f32[32,64] parameter(0)
  b = f32[32,48] parameter(1)
  ROOT d = f32[64,48] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}
"""
STRIDED = """HloModule strided
ENTRY main {
  x = f32[2,9,9,8] parameter(0)
  w = f32[3,3,8,16] parameter(1)
  b = f32[16] parameter(2)
  c = f32[2,5,5,16] convolution(x, w), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  bb = f32[2,5,5,16] broadcast(b), dimensions={3}
  s = f32[2,5,5,16] add(c, bb)
  z = f32[] constant(0)
  zb = f32[2,5,5,16] broadcast(z), dimensions={}
  ROOT r = f32[2,5,5,16] maximum(s, zb)
}
"""
ODD_CHANNELS = """HloModule odd
ENTRY main {
  x = f32[1,6,6,3] parameter(0)
  w = f32[3,3,3,8] parameter(1)
  ROOT c = f32[1,6,6,8] convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""


def _subgraphs(src):
    m = hlotune.load_model(str(src) if isinstance(src, Path) else src)
    return m.frontend.subgraphs


def _template_subgraph(src):
    for sg in _subgraphs(src):
        f = lower(sg.workload.compute, default_gpu_schedule(sg.workload.compute, options={"sms": 1}), name="k")
        if igemm_loop_nest(f)[1]:
            return sg, f
    raise AssertionError("no subgraph took the implicit-GEMM template")


CASES = {"conv2d_bias_relu": model_path("conv2d_bias_relu"),
         "conv_dilated": EXTRA / "conv_dilated" / "conv_dilated.hlo", "strided_conv_bias_relu": STRIDED,
         "odd_channels": ODD_CHANNELS, "nt_batched_dot": NT, "tn_dot": TN}


@pytest.mark.parametrize("case", sorted(CASES))
def test_template_loop_nest_computes_the_algorithm(case):
    sg, f = _template_subgraph(CASES[case])
    cd = sg.workload.compute
    nest, n = igemm_loop_nest(f)
    assert n == 1
    assert "implicit-GEMM template" in generate_cuda(f).text
    rng = np.random.default_rng(1)
    k = len(sg.computation.parameters)
    args = [rng.standard_normal(b.shape).astype(b.dtype.np) for b in cd.inputs[:k]]
    consts = constant_values(cd)
    want = evaluate_compute(cd, args)
    got = evaluate_loop_func(nest, [*args, *[consts[b.name] for b in cd.inputs[k:]]])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=case)


def test_bench_conv_is_one_implicit_gemm_kernel_with_float4_fetches():
    (sg,) = _subgraphs(model_path("conv2d_bias_relu", "bench.hlo"))
    cd = sg.workload.compute
    src = generate_cuda(lower(cd, default_gpu_schedule(cd, H200), name="conv"))
    text = src.text
    assert "implicit-GEMM template: 64x64x32 tile, 8x4 per thread" in text   # 8x8 output pixels, 64 channels
    (launch,) = src.launches
    assert launch.grid == (392, 1, 1) and launch.block == (128, 1, 1)   # 392 = 2.97 blocks per SM of 132
    assert "__launch_bounds__(128, 2)" in text
    # the input through the pad's guard and the filter: one float4 load each per thread and K tile
    assert "? __ldg((const float4*)(param_0 + " in text and "make_float4(0.0f, 0.0f, 0.0f, 0.0f)" in text
    assert "__ldg((const float4*)(param_1 + " in text
    # the bias + ReLU epilogue stays fused in the same kernel
    assert "hl_fmax<float>((conv_general_dilated_1[" in text and "param_2[" in text


def test_transposed_operands_are_fetched_as_float4():
    _, f = _template_subgraph(NT)   # B is (N, K): float4 along k, stored to four shared rows
    text = generate_cuda(f).text
    assert "hl_Bs[0][hl_q + 3][hl_c] = hl_rb[0].w;" in text
    _, f = _template_subgraph(TN)   # A is (K, M): float4 along the rows, one float4 shared store
    text = generate_cuda(f).text
    assert "*(float4*)&hl_As[0][hl_q][hl_p] = hl_ra[0];" in text


def test_odd_channels_fetch_scalars():
    _, f = _template_subgraph(ODD_CHANNELS)   # 3 input channels: k runs are not float4-aligned
    text = generate_cuda(f).text
    assert "implicit-GEMM template" in text and "float hl_ra[" in text


def _thread_var(f) -> str:
    return next(x.var.name for x in walk_stmts(f.body) if isinstance(x, For) and x.kind is ForKind.THREAD_X)


def _map_stores(s, fn):
    if isinstance(s, Store):
        return fn(s)
    if isinstance(s, Seq):
        return Seq(tuple(_map_stores(c, fn) for c in s.body))
    if hasattr(s, "body"):
        return dataclasses.replace(s, body=_map_stores(s.body, fn))
    return s


def test_other_mappings_keep_the_generic_code(monkeypatch):
    sg, f = _template_subgraph(CASES["conv2d_bias_relu"])
    tid = _thread_var(f)

    def col_by_row(e):   # the filter read at the thread's row block instead of its column block
        if isinstance(e, Binary) and e.op is Op.REMAINDER and isinstance(e.a, Var) and e.a.name == tid:
            return Binary(Op.DIVIDE, e.a, e.b, e.dtype)
        return e

    def acc_only(s):
        if isinstance(s.value, Binary) and s.value.op is Op.ADD:
            return dataclasses.replace(s, value=rebuild(s.value, col_by_row))
        return s

    bad = dataclasses.replace(f, body=_map_stores(f.body, acc_only))
    assert igemm_loop_nest(bad)[1] == 0 and "implicit-GEMM" not in generate_cuda(bad).text

    import hlotune.codegen.cuda as cuda
    monkeypatch.setattr(cuda, "IGEMM_TEMPLATE", False)
    assert igemm_loop_nest(f)[1] == 0 and "implicit-GEMM" not in generate_cuda(f).text


def test_random_schedules_and_matmul_keep_their_paths():
    # the GEMM template still takes the dot in its layout (no implicit GEMM there)
    hlo = ("HloModule mm\nENTRY main {\n  a = f32[256,256] parameter(0)\n  b = f32[256,256] parameter(1)\n"
           "  ROOT d = f32[256,256] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
    (sg,) = _subgraphs(hlo)
    text = generate_cuda(lower(sg.workload.compute, default_gpu_schedule(sg.workload.compute), name="mm")).text
    assert "// GEMM template" in text and "implicit-GEMM" not in text
