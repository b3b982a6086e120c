"""The Pack step (blocked copy of an operand, GEMM's packed B): JSON/text round trip, illegal uses raising
ScheduleError, the packed layout, and loop nests that read the packed copy computing what the algorithm
says (loop-IR interpreter against numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from hlotune.errors import ScheduleError
from hlotune.ir.expr import Axis, Binary, Buffer, ComputeDef, Const, Load, Reducer, Stage, walk
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import ForKind
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.state import replay
from hlotune.schedule_space.steps import (
    Annotate,
    CacheWrite,
    ComputeAt,
    ComputeInline,
    Pack,
    Reorder,
    RFactor,
    Split,
    parse_step,
    step_from_json,
    step_str,
    step_to_json,
)

F = DType.F32


def _dot(m: int, n: int, k: int, b_transposed: bool = False, batch: int = 0) -> ComputeDef:
    """C[(b,) i, j] = sum_r A[(b,) i, r] * B[(b,) r, j]  (or B[(b,) j, r] when transposed)."""
    i, j, r = Axis("i", m), Axis("j", n), Axis("r", k)
    bx = (Axis("b", batch),) if batch else ()
    pre = tuple(a.var for a in bx)
    b_idx = pre + ((j.var, r.var) if b_transposed else (r.var, j.var))
    b_shape = tuple(a.extent for a in bx) + ((n, k) if b_transposed else (k, n))
    body = Binary(Op.MULTIPLY, Load("A", pre + (i.var, r.var), F), Load("B", b_idx, F), F)
    c = Stage("C", bx + (i, j), body, F, (r,), Reducer(Const(0.0, F), Op.ADD))
    a_shape = tuple(a.extent for a in bx) + (m, k)
    return ComputeDef("dot", (Buffer("A", a_shape, F), Buffer("B", b_shape, F)), (c,), ("C",))


def _relu_of(cd: ComputeDef) -> ComputeDef:
    """D = max(C, 0) with C no longer an output (B is read by C only)."""
    (c,) = cd.stages
    d = Stage("D", c.axes, Binary(Op.MAXIMUM, Load("C", tuple(a.var for a in c.axes), F), Const(0.0, F), F), F)
    return ComputeDef("dot_relu", cd.inputs, (c, d), ("D",))


def _ref(cd: ComputeDef, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A @ B, with B read as transposed when the dot indexes it [.., j, r] (`_dot(b_transposed=True)`)."""
    load_b = next(e for e in walk(cd.stages[0].body) if isinstance(e, Load) and e.buffer == "B")
    transposed = getattr(load_b.indices[-1], "name", None) == "r"
    return a @ (np.swapaxes(b, -1, -2) if transposed else b)


def _run(cd: ComputeDef, steps, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(x.shape).astype(np.float32) for x in cd.inputs)
    f = lower(cd, steps)
    (got,) = evaluate_loop_func(f, [a, b])
    want = _ref(cd, a, b)
    if cd.outputs == ("D",):
        want = np.maximum(want, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_json_and_text_round_trip():
    for s in (Pack("B", ("C",), 1, 4), Pack("B", ("C", "D"), 1, 16, 1), Pack("x", ("C.local",), 0, 1, 0)):
        d = step_to_json(s)
        assert d["step"] == "pack"
        assert step_from_json(d) == s
        assert parse_step(step_str(s)) == s
    # outer_pos defaults to 0 when absent
    assert step_from_json({"step": "pack", "stage": "B", "readers": ["C"], "axis": 1, "factor": 4}).outer_pos == 0


def test_packed_layout_and_loads():
    cd = _dot(6, 8, 5)
    st = replay(cd, [Pack("B", ("C",), 1, 4, 0)])
    pk = st.stage("B.pack")
    assert pk.op.shape == (2, 5, 4)                      # [N/f, K, f]
    assert pk.attach.kind == "root" and st.by_name["B.pack"] < st.by_name["C"]
    loads = {x.buffer for x in _loads(st.stage("C").op.body)}
    assert loads == {"A", "B.pack"}
    # batched, transposed B[b, N, K] -> [b, N/f, K, f]
    st = replay(_dot(4, 8, 3, b_transposed=True, batch=2), [Pack("B", ("C",), 1, 4, 1)])
    assert st.stage("B.pack").op.shape == (2, 2, 3, 4)
    # a factor that does not divide pads: [ceil(N/f), K, f], the last block repeating B's last column
    st = replay(cd, [Pack("B", ("C",), 1, 3, 0)])
    assert st.stage("B.pack").op.shape == (3, 5, 3)
    # factor 1 is a transpose: B[K, N] -> [N, K, 1]
    assert replay(cd, [Pack("B", ("C",), 1, 1, 0)]).stage("B.pack").op.shape == (8, 5, 1)


def _loads(e):
    from hlotune.ir.expr import walk
    return [x for x in walk(e) if isinstance(x, Load)]


@pytest.mark.parametrize("step, why", [
    (Pack("B", ("C",), 2, 4), "out of range"),
    (Pack("B", ("C",), 1, 4, 2), "outer_pos"),
    (Pack("B", (), 1, 4), "no readers"),
    (Pack("B", ("C",), 1, 0), "at least 1"),
    (Pack("A", ("D",), 1, 1), "does not read"),
    (Pack("nope", ("C",), 0, 1), "no stage"),
    (Pack("B", ("C",), 1.5, 4), "integer"),
])
def test_illegal_pack_raises(step, why):
    cd = _relu_of(_dot(6, 8, 5))
    with pytest.raises(ScheduleError, match=why):
        replay(cd, [step])


def test_pack_of_inlined_stage_raises():
    i = Axis("i", 8)
    e = Stage("E", (i,), Binary(Op.ADD, Load("x", (i.var,), F), Const(1.0, F), F), F)
    o = Stage("O", (i,), Binary(Op.MULTIPLY, Load("E", (i.var,), F), Const(2.0, F), F), F)
    cd = ComputeDef("chain", (Buffer("x", (8,), F),), (e, o), ("O",))
    with pytest.raises(ScheduleError, match="inlined"):
        replay(cd, [ComputeInline("E"), Pack("E", ("O",), 0, 4)])


def test_plain_pack_computes_the_dot():
    _run(_dot(6, 8, 5), [Pack("B", ("C",), 1, 4, 0)])


def test_pack_transposed_and_batched():
    cd = _dot(4, 8, 3, b_transposed=True, batch=2)
    _run(cd, [Pack("B", ("C",), 1, 4, 1)])
    _run(_dot(5, 6, 7, b_transposed=True), [Pack("B", ("C",), 0, 2, 1)])


def test_pack_as_transpose_for_a_row_reduction():
    """factor 1: B[k, j] -> B.pack[j, k, 0]; the reduction vectorized along k through rfactor."""
    cd = _dot(3, 5, 8)
    steps = [Pack("B", ("C",), 1, 1, 0), Split("C", "r", (4,)), RFactor("C", "r.1"),
             Reorder("C.rf", ("i", "j", "r.0", "r.1")), Annotate("C.rf", "r.1", ForKind.VECTORIZED),
             ComputeAt("C.rf", "C", "j")]
    _run(cd, steps)


def test_gemm_blocking_with_pack_and_k_blocks():
    """The default GEMM structure by hand: packed panels of nr=4 columns, k blocked by 2, a 2x4 micro-tile
    computed at a 4x8 cache tile of the relu consumer."""
    cd = _relu_of(_dot(8, 16, 6))
    steps = [Pack("B", ("C",), 1, 4, 0),
             Split("D", "i", (4,)), Split("D", "j", (8,)), Reorder("D", ("i.0", "j.0", "i.1", "j.1")),
             Annotate("D", "i.0", ForKind.PARALLEL), ComputeAt("C", "D", "j.0"),
             Split("C", "r", (2,)), Split("C", "i", (2,)), Split("C", "j", (1, 4)),
             Reorder("C", ("r.0", "i.0", "j.0", "r.1", "i.1", "j.1", "j.2")),
             Annotate("C", "i.1", ForKind.UNROLLED), Annotate("C", "j.2", ForKind.VECTORIZED)]
    _run(cd, steps)
    f = lower(cd, steps)
    assert "B.pack: f32[4,6,4] in global" in str(f)


def test_pack_then_cache_write():
    cd = _dot(4, 8, 5)
    steps = [Pack("B", ("C",), 1, 4, 0), CacheWrite("C", "local"), Split("C", "i", (2,)),
             ComputeAt("C.local", "C", "i.0")]
    _run(cd, steps)


def _host512():
    import dataclasses

    from hlotune.target import Target

    return dataclasses.replace(Target.host_cpu(), vector_bits=512)


def test_default_packs_a_transposed_b_in_k_blocks():
    """B contiguous along k (as K in Q K^T): the default's packed copy reads k in blocks of PACK_KB, written
    [j/nr, k, j%nr] one block of k rows at a time, and the nest computes the dot."""
    from hlotune.schedule_space.default import PACK_KB, default_schedule

    cd = _dot(16, 32, 48, b_transposed=True, batch=2)
    steps = default_schedule(cd, _host512())
    (pack,) = [s for s in steps if isinstance(s, Pack)]
    name = f"{pack.stage}.pack"
    (split,) = [s for s in steps if isinstance(s, Split) and s.stage == name]
    assert split.factors == (PACK_KB,)
    (order,) = [s for s in steps if isinstance(s, Reorder) and s.stage == name]
    assert order.order[-3:] == (f"{split.iter}.0", "ax3", f"{split.iter}.1")
    _run(cd, steps)


@pytest.mark.parametrize("k, blocked", [(48, True), (7, False), (34, False), (16, False)])
def test_transposed_pack_blocks_only_by_a_divisor_of_four_or_more(k, blocked):
    from hlotune.schedule_space.default import transposed_pack

    axes = ["ax0", "ax1", "ax2", "ax3"]
    steps, outer = transposed_pack("B.pack", axes, "ax2", k)
    assert outer == ["ax0", "ax1"]
    assert isinstance(steps[0], Split) == blocked
    assert steps[-1].order[-1] == ("ax2.1" if blocked else "ax2")
