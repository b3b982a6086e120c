"""Dense layers with awkward extents (prime rows, columns that take no full micro-tile), compiled with their
default schedules and compared to numpy: the GEMM plan keeps its full register tile (8 rows, a shifted last row
tile) and pads the columns to a multiple of two vectors out of a padded packed B, whose clamped vector loads take
one contiguous load where the clamp does not bite (`llvm_emit._clamped_vector_load`)."""

from __future__ import annotations

import numpy as np
import pytest

import hlotune
from hlotune.api import load_model
from hlotune.codegen.llvm_cpu import build_cpu
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.steps import Pad, Split
from hlotune.target import Target

TARGET = Target.host_cpu()
LANES = max(1, TARGET.vector_bits // 32)


def _hlo(m: int, k: int, n: int) -> str:
    return f"""HloModule awkward_dense

ENTRY %main (x: f32[{m},{k}], w: f32[{k},{n}], b: f32[{n}]) -> f32[{m},{n}] {{
  %x = f32[{m},{k}]{{1,0}} parameter(0)
  %w = f32[{k},{n}]{{1,0}} parameter(1)
  %d = f32[{m},{n}]{{1,0}} dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %b = f32[{n}]{{0}} parameter(2)
  %bb = f32[{m},{n}]{{1,0}} broadcast(%b), dimensions={{1}}
  %a = f32[{m},{n}]{{1,0}} add(%d, %bb)
  %z = f32[] constant(0)
  %zb = f32[{m},{n}]{{1,0}} broadcast(%z), dimensions={{}}
  ROOT %r = f32[{m},{n}]{{1,0}} maximum(%a, %zb)
}}
"""


def _inputs(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32),
            rng.standard_normal(n, dtype=np.float32))


@pytest.mark.skipif(LANES < 8, reason="the padded plan needs a vector target")
@pytest.mark.parametrize("m, k, n", [(61, 40, 6 * LANES - 3), (67, 33, 10 * LANES - 1), (64, 20, 4 * LANES - 2)])
def test_awkward_dense_matches_numpy(m, k, n):
    model = load_model(_hlo(m, k, n))
    (sg,) = model.frontend.subgraphs
    steps = default_schedule(sg.workload.compute, TARGET)
    pads = [s for s in steps if isinstance(s, Pad)]
    assert [p.extent for p in pads] == [-(-n // (2 * LANES)) * 2 * LANES]
    rows = [s.factors for s in steps if isinstance(s, Split) and s.iter == "i0" and s.factors[0] is not None]
    if m % 8:                                             # prime-ish rows: a full 8-row micro-tile, not 1
        assert (8,) in rows, rows
    kern = build_cpu(lower(sg.workload.compute, steps), TARGET)
    assert "vclamp.in" in kern.llvm_ir                    # the padded pack's contiguous loads
    x, w, b = _inputs(m, k, n)
    out = np.full((m, n), np.nan, dtype=np.float32)
    kern(x, w, b, out)
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)
    got = hlotune.compile(_hlo(m, k, n))(x, w, b)
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
