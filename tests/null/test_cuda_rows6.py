"""Session 6 (memory-bound kernels), no GPU: the row-register schedule of row-fused subgraphs (the row and softmax's
exp in lane-private registers, K rows per warp with the next row prefetched) and the sin / cos variants without the
quadrant branch (both polynomials and a select).

Loop nests are checked with the loop-IR interpreter against `evaluate_compute`; the generated CUDA text for its
structure (registers instead of shared memory, the prefetch), and with nvcc where installed (no spills); the sin /
cos variants keep the constants that tests/null/test_cuda_fast_paths.py's exact emulation checks."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import hlotune
import hlotune.codegen.cuda as cuda_gen
from hlotune.codegen.cuda import _lane_private, _plan, generate_cuda
from hlotune.ir.compute import constant_values
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import Allocate, walk_stmts
from hlotune.schedule_space.lower import lower
from tests.conftest import model_path
from tests.null.test_cuda_fast_paths import _consts


@pytest.fixture(autouse=True)
def _plain_loads(monkeypatch):
    """These tests read the plain vector load / store forms; the streaming hints have their own test
    (test_cuda_codegen.test_stream_hints_only_on_inputs_read_once)."""
    monkeypatch.setattr(cuda_gen, "STREAM_HINTS", False)

NVCC = shutil.which("nvcc")
F = np.float32

#: row-register variants: schedule options and codegen flags
VARIANTS = [({"row_regs": True}, {}), ({"row_regs": True, "rows": 4}, {}),
            ({"row_regs": True, "row_pipe": 2}, {}), ({"row_regs": True, "row_pipe": 4, "rows": 2}, {}),
            ({"row_regs": True, "row_pipe": 2}, {"ROW_PREFETCH_UNROLL": False}),
            ({"row_regs": True, "row_pipe": 2}, {"ROW_PREFETCH": False})]


def _small(name: str, rows: int) -> str:
    text = model_path(name, "bench.gpu.opt.hlo").read_text()
    big = {"softmax": "4096", "layernorm": "8192"}[name]
    return text.replace(f"[{big},", f"[{rows},").replace(f"[{big}]", f"[{rows}]")


def _subgraph(name: str, rows: int = 16):
    (sg,) = hlotune.load_model(_small(name, rows)).frontend.subgraphs
    return sg


def _args(sg, seed: int = 0):
    cd = sg.workload.compute
    rng = np.random.default_rng(seed)
    n = len(sg.computation.parameters)
    args = [(rng.standard_normal(b.shape) * 2).astype(b.dtype.np) for b in cd.inputs[:n]]
    consts = constant_values(cd)
    return args, args + [consts[b.name] for b in cd.inputs[n:]]


def _source(cd, opts: dict, flags: dict, monkeypatch):
    for k, v in flags.items():
        monkeypatch.setattr(cuda_gen, k, v)
    return generate_cuda(lower(cd, default_gpu_schedule(cd, options=opts), name="row"))


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
@pytest.mark.parametrize("opts", [v[0] for v in VARIANTS[:4]], ids=str)
def test_row_register_schedules_compute_the_algorithm(name, opts):
    """The row-register schedules (lane columns in float4 groups, the reductions over each lane's own columns,
    K rows per warp) are the same algorithm: the loop-IR interpreter against evaluate_compute."""
    sg = _subgraph(name)
    cd = sg.workload.compute
    args, full = _args(sg)
    want = evaluate_compute(cd, args)
    got = evaluate_loop_func(lower(cd, default_gpu_schedule(cd, options=opts), name="row"), full)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_row_registers_replace_shared_rows(monkeypatch):
    """softmax under the row-register schedule (the default): the row and its exp are per-lane register arrays
    (N / 32 floats), filled by float4 loads, 16 rows per block; shared memory only holds the reductions' per-lane
    slots (2 x 512 floats)."""
    sg = _subgraph("softmax", 4096)
    cd = sg.workload.compute
    src = _source(cd, {"row_lanes": 32}, {}, monkeypatch)   # one warp per row (the default is two: test_cuda_rows8)
    (ln,) = src.launches
    t = src.text[src.text.index("__global__"):]
    assert ln.block == (32, 16, 1) and ln.shared_bytes == 2 * 512 * 4
    assert "float param_0_1_local[32];" in t and "float exp_1_1[32];" in t
    assert "__shared__ __align__(16) float exp_1_1" not in t
    assert t.count("*(const float4*)&param_0_1[") == 1 and t.count("hl_exp(") == 4
    old = generate_cuda(lower(cd, default_gpu_schedule(cd, options={"row_regs": False}), name="row"))
    assert old.launches[0].shared_bytes > 32 * 1024   # the session-5 schedule: exp rows in shared memory
    small = _subgraph("softmax", 512).workload.compute   # below ROW_REGISTERS_MIN_ROWS: the session-5 schedule
    (ln,) = generate_cuda(lower(small, default_gpu_schedule(small), name="row")).launches
    assert ln.block == (32, 8, 1) and ln.shared_bytes > 32 * 1024


def test_lane_private_analysis():
    """A row buffer written as float4 lane groups and read at the same columns is lane-private (stride 4); the
    session-5 schedule's exp row (written in float4 groups, read by the reduction at lane + 32 j) is not."""
    cd = _subgraph("softmax").workload.compute
    for opts, want in (({"row_regs": True}, {"param_0_1.local": 4, "exp_1_1": 4}),
                       ({"row_regs": False}, {"exp_1_1": None})):
        f = lower(cd, default_gpu_schedule(cd, options=opts), name="row")
        plan = _plan(f.body, "row")
        allocs = {a.buffer: a for a in walk_stmts(f.body) if isinstance(a, Allocate)}
        for buf, stride in want.items():
            got = _lane_private(allocs[buf], plan)
            assert (got and got[0]) == stride, (opts, buf, got)
            assert (buf in plan.lane_regs) == (stride is not None) and (buf in plan.shared) == (stride is None)


def test_register_index_is_a_bijection_per_lane():
    """The register of element f = 4 * lane + 128 j + v is 4 j + v: each lane's 32 elements map onto 0..31."""
    n, st = 1024, 4
    seen = {}
    for f in range(n):
        lane = (f % (32 * st)) // st
        f0 = f - st * lane
        reg = (f0 // (32 * st)) * st + f0 % st
        seen.setdefault(lane, set()).add(reg)
    assert all(sorted(v) == list(range(n // 32)) for v in seen.values()) and len(seen) == 32


@pytest.mark.parametrize("opts,flags", VARIANTS[2:], ids=str)
def test_row_prefetch_text(opts, flags, monkeypatch):
    """K rows per warp: row 0's fill into the prefetch registers before the row loop, the next row's fill inside
    it (guarded by k + 1 < K)."""
    cd = _subgraph("layernorm", 64).workload.compute
    src = _source(cd, opts, flags, monkeypatch)
    t = src.text[src.text.index("__global__"):]
    k = opts["row_pipe"]
    rows = opts.get("rows", 16)
    assert src.launches[0].grid == (64 // (k * rows), 1, 1)
    prefetch = flags.get("ROW_PREFETCH", True)
    assert ("rows in sequence" in t) == prefetch
    if prefetch:
        assert re.search(r"float param_\w+_local_pf\[32\];", t) and f"+ 1 < {k})" in t
        assert t.count("*(const float4*)&param_1_12[") == 2   # row 0's fill, the next row's fill
        assert ("#pragma unroll 1\n" in t) == (not flags.get("ROW_PREFETCH_UNROLL", True))


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_row_register_kernels_compile_without_spills(name, tmp_path, monkeypatch):
    """nvcc -Xptxas -v: the row-register kernels at bench size keep every register (softmax: no stack at all;
    layernorm: the IEEE division's slow-path call may use a small frame, but nothing of the row spills)."""
    (sg,) = hlotune.load_model(str(model_path(name, "bench.gpu.opt.hlo"))).frontend.subgraphs
    for i, (opts, flags) in enumerate(VARIANTS[:1] + VARIANTS[2:3]):
        src = _source(sg.workload.compute, opts, flags, monkeypatch)
        (tmp_path / f"k{i}.cu").write_text(src.text)
        r = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(tmp_path / f"k{i}.cubin"),
                            str(tmp_path / f"k{i}.cu")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        spill = [int(x) for x in re.findall(r"(\d+) bytes spill stores", r.stderr)]
        assert spill and max(spill) <= 8, r.stderr
        if name == "softmax":
            assert "0 bytes spill stores" in r.stderr, r.stderr


def test_sin_select_is_the_default_and_keeps_the_constants():
    """The default sin / cos selects between both polynomials (no quadrant branch); the session-5 text (branch,
    rintf in the float reduction) is `_float_math(select=False)`, and every variant has the same constants in the same
    order (what tests/null/test_cuda_fast_paths.py's emulation parses)."""
    base = cuda_gen._float_math(False, False, False)
    assert cuda_gen._float_math() == cuda_gen._float_math(False, False, True)
    sel = cuda_gen._float_math(False, False, True)
    assert "if (q & 1) v =" in base and "(q & 1) ? vc : vs" in sel and "if (q & 1)" not in sel
    assert cuda_gen.SIN_SELECT and sel in cuda_gen.PRELUDE and cuda_gen._prelude() == cuda_gen.PRELUDE
    assert _consts("hl_sincosf", sel) == _consts("hl_sincosf", base)
    fsel = cuda_gen._float_math(True, False, True)
    assert _consts("hl_sincosf", fsel) == _consts("hl_sincosf", cuda_gen._float_math(True, False, False))


def test_sin_kernels_take_128_threads():
    """Elementwise kernels that evaluate sin / cos get SINCOS_THREADS (128) threads per block by default (the
    kernel measured as the "per1/t128" variant); others keep 256; an explicit "threads" option wins."""
    from hlotune.schedule_space.default_gpu import SINCOS_THREADS
    for name, block in (("sin_mul_add", SINCOS_THREADS), ("gelu_tanh", 256)):
        (sg,) = hlotune.load_model(str(model_path(name, "hlo"))).frontend.subgraphs
        cd = sg.workload.compute
        src = generate_cuda(lower(cd, default_gpu_schedule(cd), name="k"))
        assert src.launches[0].block == (block, 1, 1)
        assert generate_cuda(lower(cd, default_gpu_schedule(cd, options={"threads": 64}), name="k")
                             ).launches[0].block == (64, 1, 1)
