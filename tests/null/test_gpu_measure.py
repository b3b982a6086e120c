"""GPU measurement and backends without a GPU: the target-kind tables (builder, runner, executable), the
builder side of a CUDA candidate (nvcc -> cubin + launch JSON; skipped without nvcc), and the codegen forms
that make reductions fast (register partials, warp-shuffle cross-thread combine) checked in the text."""

from __future__ import annotations

import json
import shutil

import pytest

import hlotune
from hlotune.codegen.cuda import generate_cuda
from hlotune.errors import UnsupportedError
from hlotune.measure.builder import BuildJob, build_one
from hlotune.measure.gpu_runner import GpuRunner
from hlotune.measure.measurer import make_runner
from hlotune.measure.records import BuildResult, ErrorKind
from hlotune.measure.runner import LocalRunner
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.lower import lower
from hlotune.target import Target
from tests.conftest import model_path

NVCC = shutil.which("nvcc")
GPU = Target(kind="cuda", name="NVIDIA H200", cores=132, arch="sm_90", max_threads_per_block=1024,
             toolchain="cuda13.0-drv13.0")


def _subgraph(model, name=None):
    subs = hlotune.load_model(model_path(model)).frontend.subgraphs
    return subs[0] if name is None else next(s for s in subs if s.name == name)


def test_backend_tables_pick_by_target_kind():
    from hlotune.codegen.cuda_runtime import build_cuda
    from hlotune.codegen.llvm_cpu import build_cpu
    from hlotune.executable import CompiledSubgraph, GpuSubgraph, backend
    from hlotune.schedule_space.default import default_schedule

    assert backend("cpu") == (build_cpu, default_schedule, CompiledSubgraph)
    assert backend("cuda") == (build_cuda, default_gpu_schedule, GpuSubgraph)
    with pytest.raises(UnsupportedError):
        backend("tpu")
    assert isinstance(make_runner(GPU), GpuRunner)
    assert isinstance(make_runner(Target.host_cpu()), LocalRunner)


def test_gpu_runner_reports_a_failed_build_without_a_device():
    r = GpuRunner(target=GPU)
    res = r.run_one(None, BuildResult(error_kind=ErrorKind.COMPILE, error_msg="nvcc failed: x"))
    assert res.error_kind is ErrorKind.COMPILE and not res.valid and r._worker is None


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_builder_compiles_cuda_candidates_to_cubin_and_launch_json(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOTUNE_CACHE_DIR", str(tmp_path))
    sg = _subgraph("row_sum")
    cd = sg.workload.compute
    steps = tuple(default_gpu_schedule(cd, GPU))
    res = build_one(BuildJob(cd, steps, GPU, "m_row_sum"))
    assert res.ok, res.error_msg
    assert res.obj[:4] == b"\x7fELF" and res.func.inputs[0].shape == cd.inputs[0].shape
    src = generate_cuda(lower(cd, steps, name="m_row_sum"))
    art = json.loads(res.symbol)
    assert [ln[0] for ln in art["launches"]] == [ln.name for ln in src.launches]
    assert [tuple(ln[1]) for ln in art["launches"]] == [ln.grid for ln in src.launches]
    # a schedule that does not apply is an instantiation error, not a crash
    bad = build_one(BuildJob(cd, steps[:1] + steps, GPU, "m_bad"))
    assert bad.error_kind in (ErrorKind.INSTANTIATION, ErrorKind.NONE)


def test_row_reduction_partials_live_in_registers_and_combine_by_shuffle():
    cd = _subgraph("row_sum").workload.compute
    text = generate_cuda(lower(cd, default_gpu_schedule(cd), name="rs")).text
    assert "__shfl_down_sync" in text and "cross-thread reduction" in text
    acc = text[text.index("_rf_reg[1];"):text.index("cross-thread reduction")]
    assert "__syncthreads" not in acc.split("_rf[")[0]   # no barrier inside the accumulation loop
    assert text.count("__syncthreads();") == 3             # before the combine, between warps, after


def test_cross_thread_combine_is_not_used_under_an_if():
    from hlotune.ir.expr import Binary, Compare, Const, Load, Var
    from hlotune.ir.hlo import DType, Op
    from hlotune.schedule_space.loop_ir import Allocate, BufferDecl, For, ForKind, If, LoopFunc, Seq, Store

    F32, IX = DType.F32, DType.S64
    t, r, b = Var("t"), Var("r"), Var("b")
    fill = For(t, Const(0, IX), Const(64, IX), ForKind.THREAD_X, Store("s", (t,), Load("x", (b, t), F32)))
    comb = For(r, Const(0, IX), Const(64, IX), ForKind.SERIAL,
               Store("y", (b,), Binary(Op.ADD, Load("y", (b,), F32), Load("s", (r,), F32), F32)))
    init = Store("y", (b,), Const(0.0, F32))
    guarded = If(Compare("LT", b, Const(1, IX)), comb)
    for body, want in ((Seq((fill, init, comb)), True), (Seq((fill, init, guarded)), False)):
        k = For(b, Const(0, IX), Const(4, IX), ForKind.BLOCK_X, Allocate("s", F32, (64,), "shared", body))
        f = LoopFunc("k", (BufferDecl("x", (4, 64), F32),), (BufferDecl("y", (4,), F32),), k)
        assert ("__shfl_down_sync" in generate_cuda(f).text) is want


def test_scalar_buffers_stay_zero_dimensional():
    """A 0-d output (mlp_train_step's loss) or input keeps its shape through the measurement's poison, drawn inputs
    and expected outputs: `np.ascontiguousarray` made them 1-d and every GPU candidate of such a subgraph was a wrong
    answer ("shape (1,), expected ()"; session 11, found by a tune on the H200)."""
    import numpy as np

    from hlotune.measure.reference import compare, draw_inputs, make_task_data, poison
    from hlotune.schedule_space.task import tasks_from_subgraphs

    for ref in (np.array(2.5, np.float32), np.array(True), np.array(3, np.int32)):
        p = poison(ref)
        assert p.shape == () and p.dtype == ref.dtype and compare(p, ref, 0, 0) is not None
    hlo = """HloModule s
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
ENTRY main {
  a = f32[256] parameter(0)
  b = f32[] parameter(1)
  zero = f32[] constant(0)
  r = f32[] reduce(a, zero), dimensions={0}, to_apply=add
  ROOT n = f32[] multiply(r, b)
}
"""
    (task,) = tasks_from_subgraphs(hlotune.load_model(hlo).frontend.subgraphs, GPU)
    assert [x.shape for x in draw_inputs(task.compute)] == [(256,), ()]
    data = make_task_data(task)
    assert [x.shape for x in data.expected] == [()] and poison(data.expected[0]).shape == ()
