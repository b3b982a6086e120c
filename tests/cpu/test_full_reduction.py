"""The default schedule of reductions to a scalar (`default._full_reduction`): vector accumulators in a local
buffer, parallel parts only when the work pays for threads.  A reduction too small to share (the test-size
sum_reduce, 64 x 128) used to get no schedule at all: a scalar add chain, 7x slower than one vectorized loop.
Compiled results against the compute definition's numpy evaluation; the plan's shape."""

import dataclasses

import numpy as np
import pytest

import hlotune
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default import PARALLEL_MIN_WORK, default_schedule
from hlotune.schedule_space.loop_ir import Allocate, For, ForKind, walk_stmts
from hlotune.schedule_space.lower import lower
from hlotune.target import Target

WIDE = dataclasses.replace(Target.host_cpu(), cores=2, vector_bits=512)


def _sum(shape, dims):
    s = "f32[" + ",".join(map(str, shape)) + "]"
    return ("HloModule m\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}"
            f"\n\nENTRY main {{\n  x = {s} parameter(0)\n  z = f32[] constant(0)\n"
            f"  ROOT r = f32[] reduce(x, z), dimensions={{{dims}}}, to_apply=add\n}}\n")


CASES = {   # name: (HLO, parallel?)
    "test_size_64x128": (_sum((64, 128), "0,1"), False),
    "small_1d": (_sum((4096,), "0"), False),
    "small_3d": (_sum((4, 8, 96), "0,1,2"), False),
    "large_2d": (_sum((512, 256), "0,1"), True),
    "large_prime_rows": (_sum((521, 256), "0,1"), False),   # 521 rows: no parts to share, one loop nest
}


def _compute(text):
    (sg,) = hlotune.load_model(text).frontend.subgraphs
    return sg.workload.compute


@pytest.mark.parametrize("name", sorted(CASES))
def test_full_reduction_default_matches_numpy(name):
    text, parallel = CASES[name]
    cd = _compute(text)
    func = lower(cd, default_schedule(cd, WIDE))
    loops = [s for s in walk_stmts(func.body) if isinstance(s, For)]
    assert any(f.kind == ForKind.VECTORIZED for f in loops), "the accumulators are vectors"
    assert any(s.buffer.endswith(".local") for s in walk_stmts(func.body) if isinstance(s, Allocate))
    assert any(f.kind == ForKind.PARALLEL for f in loops) == parallel
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    out = np.zeros((), np.float32)
    build_cpu(func, WIDE)(*args, out)
    (want,) = evaluate_compute(cd, args)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


def test_small_case_is_below_the_parallel_threshold():
    assert 64 * 128 < PARALLEL_MIN_WORK <= 512 * 256
