"""Session 7 (two / four warps per row), no GPU: the row-register schedule with 64 or 128 lanes per row
(`default_gpu` option "row_lanes"): the loop nests compute the algorithm (loop-IR interpreter against
`evaluate_compute`), the generated CUDA keeps the row in N / lanes registers per lane (`_lane_private` for wide rows),
combines the reductions' per-lane partials through shared memory in every warp of the row (the same order in each, so
the row's warps get the same total), synchronizes the row's warps with a named barrier per row, and compiles for
sm_90 without spills (nvcc, skipped when missing)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import hlotune
import hlotune.codegen.cuda as cuda_gen
import hlotune.schedule_space.default_gpu as dg
from hlotune.codegen.cuda import _lane_private, _plan, generate_cuda
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import Allocate, walk_stmts
from hlotune.schedule_space.lower import lower
from tests.conftest import model_path
from tests.null.test_cuda_rows6 import _args, _subgraph


@pytest.fixture(autouse=True)
def _plain_loads(monkeypatch):
    """These tests read the plain vector load / store forms; the streaming hints have their own test
    (test_cuda_codegen.test_stream_hints_only_on_inputs_read_once)."""
    monkeypatch.setattr(cuda_gen, "STREAM_HINTS", False)

NVCC = shutil.which("nvcc")

WIDE = [{"row_lanes": 64}, {"row_lanes": 64, "rows": 4}, {"row_lanes": 128}, {"row_lanes": 128, "rows": 2},
        {"row_lanes": 64, "row_pipe": 2, "rows": 4}]


def _cuda(cd, opts: dict, flags: dict | None = None, monkeypatch=None):
    for k, v in (flags or {}).items():
        monkeypatch.setattr(cuda_gen, k, v)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options={"row_regs": True, **opts}), name="row"))


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
@pytest.mark.parametrize("opts", WIDE, ids=str)
def test_wide_row_schedules_compute_the_algorithm(name, opts):
    """64 / 128 lanes per row (each lane its float4 columns 4 lane + 4 L j + v, the reductions over the same columns):
    the loop-IR interpreter against evaluate_compute."""
    sg = _subgraph(name)
    cd = sg.workload.compute
    args, full = _args(sg, seed=3)
    want = evaluate_compute(cd, args)
    got = evaluate_loop_func(lower(cd, default_gpu_schedule(cd, options={"row_regs": True, **opts}), name="row"), full)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("lanes", [64, 128])
def test_wide_rows_text(lanes):
    """softmax (1024 columns) with L lanes per row: the row and its exp are 1024 / L registers per lane, filled by one
    float4 load per 4 L columns; every warp of a row reads all L partials of each reduction from shared memory (lane
    & 31, step 32) and butterflies them; barriers are one named barrier per row over its L threads."""
    cd = _subgraph("softmax", 4096).workload.compute
    src = _cuda(cd, {"row_lanes": lanes})
    (ln,) = src.launches
    t = src.text[src.text.index("__global__"):]
    rows = 16 * 32 // lanes
    assert ln.block == (lanes, rows, 1) and ln.grid == (4096 // rows, 1, 1)
    assert ln.shared_bytes == 2 * rows * lanes * 4     # two reductions' per-lane slots, one copy per row
    r = 1024 // lanes
    assert f"float param_0_1_local[{r}];" in t and f"float exp_1_1[{r}];" in t
    assert t.count("*(const float4*)&param_0_1[") == 1 and "__shared__ __align__(16) float exp_1_1" not in t
    assert t.count(f"< {lanes}; reduce_") == 2 and t.count("(hl_idx)(threadIdx.x & 31);") == 2
    bar = f'asm volatile("bar.sync %0, {lanes};" :: "r"((int)threadIdx.y) : "memory");'
    assert t.count(bar) == 2 and "__syncthreads" not in t and "__syncwarp" not in t


def test_row_barriers_off_and_the_default_rule(monkeypatch):
    """ROW_BARRIERS off: __syncthreads in place of the named barriers.  The default (`ROW_LANES`): rows of 1024 from
    1024 rows take two warps per row, 8 rows per block (the "row_lanes" 64 text); fewer rows keep the session-5
    schedule, other row lengths one warp per row; with ROW_LANES empty the default is the one-warp text (32 lanes);
    a row that 4 L does not divide keeps 32 lanes whatever is asked."""
    cd = _subgraph("layernorm", 1024).workload.compute
    t = _cuda(cd, {"row_lanes": 64}, {"ROW_BARRIERS": False}, monkeypatch).text
    assert t.count("__syncthreads();") == 2 and "bar.sync" not in t
    monkeypatch.undo()
    assert dg.ROW_LANES == ((1024, 1024, 64),)
    src = generate_cuda(lower(cd, default_gpu_schedule(cd), name="row"))
    assert src.text == _cuda(cd, {"row_lanes": 64}).text and src.launches[0].block == (64, 8, 1)
    monkeypatch.setattr(dg, "ROW_LANES", ())
    base = generate_cuda(lower(cd, default_gpu_schedule(cd), name="row"))
    assert base.text == _cuda(cd, {"row_lanes": 32}).text and base.launches[0].block == (32, 16, 1)
    assert "__syncwarp();" in base.text and "bar.sync" not in base.text and "threadIdx.x & 31" not in base.text
    monkeypatch.undo()
    small = _subgraph("layernorm", 512).workload.compute    # below ROW_REGISTERS_MIN_ROWS
    assert generate_cuda(lower(small, default_gpu_schedule(small), name="row")).launches[0].block == (32, 8, 1)
    for cols, lanes in ((512, 32), (96, 32)):
        hlo = model_path("softmax", "bench.gpu.opt.hlo").read_text().replace("1024]", f"{cols}]")
        (sg,) = hlotune.load_model(hlo.replace("1024,", f"{cols},")).frontend.subgraphs
        c = sg.workload.compute
        assert generate_cuda(lower(c, default_gpu_schedule(c), name="r")).launches[0].block[0] == lanes
        assert generate_cuda(lower(c, default_gpu_schedule(c, options={"row_lanes": 128}),
                                   name="r")).launches[0].block[0] == (128 if cols % 512 == 0 else 32)


def test_lane_private_wide_analysis():
    """With 64 / 128 lanes the row buffers are lane-private with stride 4 (registers), the reductions' per-lane
    partials are shared (one copy per row), and the plan takes named row barriers."""
    cd = _subgraph("softmax").workload.compute
    for lanes in (64, 128):
        f = lower(cd, default_gpu_schedule(cd, options={"row_regs": True, "row_lanes": lanes}), name="row")
        plan = _plan(f.body, "row")
        allocs = {a.buffer: a for a in walk_stmts(f.body) if isinstance(a, Allocate)}
        for buf in ("param_0_1.local", "exp_1_1"):
            assert _lane_private(allocs[buf], plan)[0] == 4 and buf in plan.lane_regs
        assert plan.lanes == lanes and plan.row_barrier and not plan.warp_private
        assert all(plan.replicas[b] == (1,) for b in plan.shared) and len(plan.shared) == 2


@pytest.mark.parametrize("lanes", [32, 64, 128])
def test_register_index_is_a_bijection_per_lane(lanes):
    """Element f = 4 lane + 4 L j + v of an N = 1024 row is register 4 j + v of its lane: each lane's N / L elements
    map onto 0 .. N / L - 1 (the offset `_Emitter.offset` emits for lane-private buffers)."""
    n, st = 1024, 4
    seen: dict[int, set] = {}
    for f in range(n):
        lane = (f % (lanes * st)) // st
        f0 = f - st * lane
        seen.setdefault(lane, set()).add((f0 // (lanes * st)) * st + f0 % st)
    assert len(seen) == lanes and all(sorted(v) == list(range(n // lanes)) for v in seen.values())


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_wide_row_kernels_compile_without_spills(name, tmp_path):
    """nvcc -Xptxas -v at bench size: 64 and 128 lanes per row keep every register and take fewer registers than
    one warp per row (softmax 51, layernorm 64 with an 8-byte frame for the division's slow path)."""
    (sg,) = hlotune.load_model(str(model_path(name, "bench.gpu.opt.hlo"))).frontend.subgraphs
    regs = {}
    for lanes in (32, 64, 128):
        src = _cuda(sg.workload.compute, {"row_lanes": lanes})
        cu = tmp_path / f"k{lanes}.cu"
        cu.write_text(src.text)
        r = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"),
                            str(cu)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        regs[lanes] = int(re.findall(r"Used (\d+) registers", r.stderr)[0])
        if lanes > 32:
            assert "0 bytes spill stores" in r.stderr, r.stderr
    assert regs[128] < regs[64] < regs[32], regs
