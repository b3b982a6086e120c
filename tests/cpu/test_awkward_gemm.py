"""Dense layers with awkward extents (prime rows, columns that take no full micro-tile), compiled with their
default schedules and compared to numpy: the GEMM plan keeps its full register tile (8 rows, over rows padded to
a multiple of 8) and pads the columns to a multiple of two vectors out of a padded packed B, whose clamped vector
loads take one contiguous load where the clamp does not bite (`llvm_emit._clamped_vector_load`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import hlotune
from hlotune.api import load_model
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.steps import Pad, Split
from hlotune.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from awkward_gemm import hlo  # noqa: E402   (the benchmark's HLO text of relu(x @ w + b))

TARGET = Target.host_cpu()
LANES = max(1, TARGET.vector_bits // 32)
#: the plan depends on the vector width and the core count: every test runs at both widths with 2 cores whatever
#: the host (LLVM splits 512-bit vectors on an AVX2 host, so both build and run everywhere)
_TWO = dataclasses.replace(TARGET, cores=2)
ISAS = {"avx2": dataclasses.replace(_TWO, vector_bits=256), "avx512": dataclasses.replace(_TWO, vector_bits=512)}
#: micro-tile rows of the full register tile: 32 vector registers hold 8 x 2 accumulators, 16 hold 6 x 2
MR = {"avx2": 6, "avx512": 8}


def _inputs(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32),
            rng.standard_normal(n, dtype=np.float32))


@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("m, k, rest", [(61, 40, 3), (67, 33, 1), (72, 1100, 2)])  # rows not a multiple of 16 (or
def test_awkward_dense_matches_numpy(m, k, rest, isa):     # of the micro-tile, or K over 1024): the padded plan, packed
    tgt = ISAS[isa]
    lanes = tgt.vector_bits // 32
    n = 2 * lanes * (2 + m % 3) - rest                    # just short of a multiple of the micro-tile width
    model = load_model(hlo(m, k, n))
    (sg,) = model.frontend.subgraphs
    steps = default_schedule(sg.workload.compute, tgt)
    pads = {s.iter: s.extent for s in steps if isinstance(s, Pad)}
    rows = [s.factors for s in steps if isinstance(s, Split) and s.iter == "i0" and s.factors[0] is not None]
    want = {"i1": -(-n // (2 * lanes)) * 2 * lanes}
    mr = MR[isa]
    if 2 * max(d for d in range(1, mr + 1) if m % d == 0) <= mr:   # no good divisor (61, 67): a full micro-tile
        assert (mr,) in rows, rows                                # (not 1 row) over rows padded to a multiple
        want["i0"] = -(-m // mr) * mr
    assert pads == want
    kern = build_cpu(lower(sg.workload.compute, steps), tgt)
    assert "vclamp.in" in kern.llvm_ir                    # the padded pack's contiguous loads
    x, w, b = _inputs(m, k, n)
    out = np.full((m, n), np.nan, dtype=np.float32)
    kern(x, w, b, out)
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)
    if isa == "avx512" and LANES == 16:                  # the whole model, with the host's own plan
        got = hlotune.compile(hlo(m, k, n))(x, w, b)
        got = got[0] if isinstance(got, tuple | list) else got
        np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_clamped_loads_at_every_offset():
    """A padded pack whose blocks straddle the clamp at every lane offset: the compiled copy equals numpy's
    clamped gather (the fast path may only be taken where no lane is clamped)."""
    from hlotune.ir.expr import Buffer, ComputeDef
    from hlotune.ir.hlo import DType
    from hlotune.schedule_space.loop_ir import ForKind
    from hlotune.schedule_space.state import replay
    from hlotune.schedule_space.steps import Annotate, Pack
    from tests.null.test_pad import _dense

    for n in range(LANES + 1, 3 * LANES):
        cd = _dense(20, n, 3)
        st = replay(cd, [Pack("B", ("C",), 1, LANES, 0)])
        pk = st.stage("B.pack").op
        one = ComputeDef("p", (Buffer("B", (3, n), DType.F32),), (pk,), (pk.name,))
        f = lower(one, [Annotate(pk.name, pk.axes[-1].name, ForKind.VECTORIZED)])
        kern = build_cpu(f, TARGET)
        b = np.arange(3 * n, dtype=np.float32).reshape(3, n)
        out = np.full(pk.shape, np.nan, dtype=np.float32)
        kern(b, out)
        nb = -(-n // LANES)
        want = np.stack([b[:, np.minimum(np.arange(LANES * p, LANES * (p + 1)), n - 1)] for p in range(nb)])
        np.testing.assert_array_equal(out, want)
        if LANES >= 4 and n % LANES:
            assert "vclamp.in" in kern.llvm_ir


@pytest.mark.parametrize("isa", sorted(ISAS))
def test_gemm_panel_sketch_of_padded_rows_samples_compute_the_layer(isa):
    """The search's packed-GEMM sketch of a padded GEMM: its row hole ranges over tiles of the padded rows, at most
    the real rows (a larger one would shrink in bound inference and leave a guard in the micro-kernel); sampled
    points compile and match numpy."""
    from hlotune.schedule_space.annotate import sample_schedules
    from hlotune.schedule_space.sketch import generate_sketches

    tgt = ISAS[isa]
    m, k, n = 61, 48, 509                                # 8 column panels of 64 for the 2 cores: the panel plan
    (sg,) = load_model(hlo(m, k, n)).frontend.subgraphs
    cd = sg.workload.compute
    (sk,) = [s for s in generate_sketches(cd, tgt) if s.rules == ("gemm_panel",)]
    rows = next(h for h in sk.tiles if h.iter == "i0")
    assert (rows.extent, rows.max_innermost) == (-(-m // MR[isa]) * MR[isa], m)
    x, w, b = _inputs(m, k, n, seed=1)
    samples = sample_schedules(sk, None, 5, 4)
    assert len(samples) >= 2
    for s in samples:
        (tm,) = next(st.factors for st in s.steps if isinstance(st, Split) and st.iter == "i0" and st.stage == "r")
        assert tm <= m
        kern = build_cpu(lower(cd, s.steps), tgt)
        out = np.full((m, n), np.nan, dtype=np.float32)
        kern(x, w, b, out)
        np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("m, k, n, t", [(1, 512, 1000, False), (1, 384, 509, False), (1, 499, 300, False),
                                        (1, 512, 509, True),
                                        (8, 256, 130, True), (3, 320, 64, True), (11, 256, 131, True)])
def test_few_row_dots_match_numpy(m, k, n, t, isa):
    """A single row (batch-1 inference) with w stored [K, N] streams W's rows into partial rows of accumulators
    (`_gemv`: k split into parts, rfactor, parallel over the parts); a few rows with w stored [N, K] take a
    register tile of dot products along k (`_dot_tile`: rfactor over the lanes, parallel over the columns; rows and
    columns with no good divisor padded).  Both compiled and in the loop-IR interpreter, against numpy."""
    from hlotune.schedule_space.loop_eval import evaluate_loop_func
    from hlotune.schedule_space.loop_ir import ForKind
    from hlotune.schedule_space.steps import Annotate, ComputeAt, RFactor

    tgt = ISAS[isa]
    (sg,) = load_model(hlo(m, k, n, t)).frontend.subgraphs
    cd = sg.workload.compute
    steps = default_schedule(cd, tgt)
    rf = [s for s in steps if isinstance(s, RFactor)]
    assert len(rf) == 1, steps
    par = [s.iter for s in steps if isinstance(s, Annotate) and s.kind is ForKind.PARALLEL and s.stage == "d.rf"]
    if t:      # the dot-product tile: the rf stage at the column tile, vectorized along k
        assert any(isinstance(s, ComputeAt) and s.stage == "d.rf" for s in steps) and not par
        pads = {s.iter: s.extent for s in steps if isinstance(s, Pad)}
        want_pads = {(1, 509): {"i1": 512},                   # 1 x 16 accumulators: 509 columns padded
                     (8, 130): {"i1": 132},                   # 4 x 4: 130 columns padded
                     (11, 131): {"i0": 12, "i1": 132}}.get((m, n), {})   # 4 x 4: 11 rows and 131 columns padded
        assert pads == want_pads
    else:      # the row streaming: parallel over the parts of k
        assert par == ["r0.0"], steps
    f = lower(cd, steps)
    rng = np.random.default_rng(m + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k) if t else (k, n), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    want = np.maximum(x @ (w.T if t else w) + b, 0)
    out = np.full((m, n), np.nan, dtype=np.float32)
    build_cpu(f, tgt)(x, w, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    if m * n <= 1024:
        (got,) = evaluate_loop_func(f, [x, w, b])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pad", [0, 1])
def test_conv_with_prime_output_width_matches_the_interpreter(pad):
    """A convolution whose output width (the GEMM's rows) is prime (29, 31): the rows are padded to the micro-tile
    and the padded rows read clamped (and, with padding, masked) input columns; the whole model matches the
    reference interpreter."""
    from hlotune.api import reference_run

    size = 31
    out = size if pad else size - 2
    window = f"window={{size=3x3 pad={pad}_{pad}x{pad}_{pad}}}, dim_labels=b01f_01io->b01f"
    text = f"""HloModule conv_odd

ENTRY main {{
  x = f32[1,{size},{size},16] parameter(0)
  w = f32[3,3,16,64] parameter(1)
  ROOT c = f32[1,{out},{out},64] convolution(x, w), {window}
}}
"""
    (sg,) = load_model(text).frontend.subgraphs
    steps = default_schedule(sg.workload.compute, TARGET)
    assert any(isinstance(s, Pad) for s in steps), steps
    rng = np.random.default_rng(pad)
    x = rng.standard_normal((1, size, size, 16), dtype=np.float32)
    w = rng.standard_normal((3, 3, 16, 64), dtype=np.float32)
    got = hlotune.compile(text)(x, w)
    got = got[0] if isinstance(got, tuple | list) else got
    (want,) = reference_run(text, [x, w])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_fuzzed_dense_shapes_match_numpy():
    """`benchmarks/fuzz_dense_shapes.py` at a small count: random extents (both weight layouts) compiled with the
    default schedules agree with numpy, and the new plans are among those taken."""
    from fuzz_dense_shapes import fuzz

    n, failures, plans = fuzz(24, 7, (40, 200, 300))
    assert failures == [], failures
    assert n == sum(plans.values()) == 24
    assert any(p.startswith("GEMM padded") for p in plans), plans
