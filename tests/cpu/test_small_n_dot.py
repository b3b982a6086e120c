"""The default schedule of dots whose last space axis is narrower than a vector and takes no power-of-two vector
(`default._small_n_dot`, `_small_n_tile`: mlp2's logits, N = 10): a local accumulator tile of rows x the whole
j axis, one vector of J lanes per row.  Compiled results against the compute definition's numpy evaluation; the
plan's shape; where it does not apply."""

import dataclasses

import numpy as np
import pytest

import hlotune
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.schedule_space.default import SMALL_N_ROWS, _small_n_dot, default_schedule
from hlotune.schedule_space.loop_ir import Allocate, For, ForKind, walk_stmts
from hlotune.schedule_space.lower import lower
from hlotune.target import Target
from tests.cpu.test_gemm_panel import _dot

#: 16 lanes of float32 whatever the CI host has (wider vectors are split by LLVM there; the results still hold)
WIDE = dataclasses.replace(Target.host_cpu(), cores=2, vector_bits=512)


def _compute(text):
    (sg,) = [s for s in hlotune.load_model(text).frontend.subgraphs if any(st.is_reduction for st in
                                                                              s.workload.compute.stages)]
    return sg.workload.compute


def _run(cd, func, tgt, seed=0):
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(b.shape).astype(np.float32) for b in cd.inputs]
    want = evaluate_compute(cd, args)
    outs = [np.zeros(cd.stage(o).shape, np.float32) for o in cd.outputs]
    build_cpu(func, tgt)(*args, *outs)
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


def _locals(func):
    return [s for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.endswith(".local")]


CONV_N3 = """HloModule m

ENTRY main {
  x = f32[2,16,16,8] parameter(0)
  w = f32[3,3,8,3] parameter(1)
  ROOT c = f32[2,16,16,3] convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""

TILED = {   # name: (HLO, rows of the tile, parallel?)
    "logits_256x512x10": (_dot((256, 512), (512, 10), (256, 10), 1, 0), SMALL_N_ROWS, True),
    "rows_30_n3": (_dot((30, 64), (64, 3), (30, 3), 1, 0), 15, False),
    "batched_n5": (_dot((4, 48, 96), (4, 96, 5), (4, 48, 5), 2, 1, "0", "0"), SMALL_N_ROWS, True),
    "rows_7_n13": (_dot((7, 200), (200, 13), (7, 13), 1, 0), 7, False),
    "padded_conv_3_channels": (CONV_N3, 16, True),     # rows: the 12 output columns; batch: images x rows
}


@pytest.mark.parametrize("case", sorted(TILED))
def test_small_n_dot_gets_a_register_tile_and_computes_the_dot(case):
    text, rows, par = TILED[case]
    cd = _compute(text)
    red = next(s for s in cd.stages if s.is_reduction)
    assert _small_n_dot(red, 16)
    func = lower(cd, default_schedule(cd, WIDE))
    (acc,) = _locals(func)
    assert tuple(acc.shape[-2:]) == (rows, red.axes[-1].extent)     # rows x the whole j axis
    assert np.prod(acc.shape[:-2]) == 1                              # one batch point per tile
    vec = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind is ForKind.VECTORIZED]
    assert vec and all(getattr(s.extent, "value", s.extent) == red.axes[-1].extent for s in vec)
    assert any(isinstance(s, For) and s.kind is ForKind.PARALLEL for s in walk_stmts(func.body)) == par
    _run(cd, func, WIDE)


@pytest.mark.parametrize("text", [
    _dot((256, 512), (10, 512), (256, 10), 1, 1),        # B contiguous along k: the dot-product plan
    _dot((256, 512), (512, 16), (256, 16), 1, 0),        # a whole vector: the GEMM plan
    _dot((256, 512), (512, 12), (256, 12), 1, 0),        # 12 takes 4-lane vectors
])
def test_other_dots_keep_their_plans(text):
    cd = _compute(text)
    red = next(s for s in cd.stages if s.is_reduction)
    assert not _small_n_dot(red, 16)
    func = lower(cd, default_schedule(cd, WIDE))
    assert not any(tuple(a.shape) == (SMALL_N_ROWS, red.axes[-1].extent) for a in _locals(func))
    _run(cd, func, WIDE, seed=1)


def test_small_n_dot_with_a_consumer_and_host_lanes():
    """A bias and relu after the dot (the consumer cannot host the tile: the dot gets its own), and the host's own
    lanes."""
    cd = _compute(_dot((64, 128), (128, 6), (64, 6), 1, 0, epilogue=True))
    func = lower(cd, default_schedule(cd, WIDE))
    assert [tuple(a.shape) for a in _locals(func)] == [(SMALL_N_ROWS, 6)]     # the dot's own tile
    _run(cd, func, WIDE, seed=2)
    host = Target.host_cpu()
    _run(cd, lower(cd, default_schedule(cd, host)), host, seed=3)
