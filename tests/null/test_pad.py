"""The Pad step (a stage computed over a larger domain) and Pack with a factor that does not divide (a padded
copy): illegal uses raising ScheduleError, the clamps Pad adds (only where an index could leave its buffer), and
loop nests with padded stages computing what the algorithm says (loop-IR interpreter against numpy; a stage
padded without its clamps reads out of bounds and the interpreter fails)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from hlotune.errors import ScheduleError
from hlotune.ir.expr import Axis, Binary, Buffer, ComputeDef, Const, Load, Reducer, Stage, walk
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.loop_eval import evaluate_loop_func
from hlotune.schedule_space.loop_ir import ForKind
from hlotune.schedule_space.lower import lower
from hlotune.schedule_space.state import replay
from hlotune.schedule_space.steps import Annotate, ComputeAt, ComputeInline, Pack, Pad, Reorder, Split
from hlotune.target import Target

F = DType.F32


def _dense(m: int, n: int, k: int) -> ComputeDef:
    """C = A @ B (not an output); E = C + bias[j]; D = max(E, 0), the output."""
    i, j, r = Axis("i", m), Axis("j", n), Axis("r", k)
    c = Stage("C", (i, j), Binary(Op.MULTIPLY, Load("A", (i.var, r.var), F), Load("B", (r.var, j.var), F), F), F,
              (r,), Reducer(Const(0.0, F), Op.ADD))
    e = Stage("E", (i, j), Binary(Op.ADD, Load("C", (i.var, j.var), F), Load("bias", (j.var,), F), F), F)
    d = Stage("D", (i, j), Binary(Op.MAXIMUM, Load("E", (i.var, j.var), F), Const(0.0, F), F), F)
    return ComputeDef("dense", (Buffer("A", (m, k), F), Buffer("B", (k, n), F), Buffer("bias", (n,), F)),
                      (c, e, d), ("D",))


def _check(cd: ComputeDef, steps, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    a, b, bias = (rng.standard_normal(x.shape).astype(np.float32) for x in cd.inputs)
    (got,) = evaluate_loop_func(lower(cd, steps), [a, b, bias])
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("step, why", [
    (Pad("D", "j", 16), "output"),
    (Pad("C", "q", 16), "no space axis"),
    (Pad("C", "r", 16), "no space axis"),          # a reduce axis
    (Pad("C", "j", 8), "less than"),
    (Pad("C", "j", 12.5), "integer"),
    (Pad("nope", "j", 16), "no stage"),
])
def test_illegal_pad_raises(step, why):
    with pytest.raises(ScheduleError, match=why):
        replay(_dense(6, 10, 4), [step])


def test_pad_after_split_or_inline_raises():
    cd = _dense(6, 10, 4)
    with pytest.raises(ScheduleError, match="already split"):
        replay(cd, [Split("C", "j", (4,)), Pad("C", "j", 12)])
    with pytest.raises(ScheduleError, match="inlined"):
        replay(cd, [ComputeInline("E"), Pad("E", "j", 12)])


def test_pad_clamps_only_what_can_leave_its_buffer():
    st = replay(_dense(6, 10, 4), [Pad("E", "j", 16)])
    e = st.stage("E")
    assert e.op.shape == (6, 16) and [it.extent for it in e.iters] == [6, 16]
    loads = {x.buffer: x for x in walk(e.op.body) if isinstance(x, Load)}
    for name in ("C", "bias"):                       # indexed by j: clamped to 9
        j = loads[name].indices[-1]
        assert isinstance(j, Binary) and j.op is Op.MINIMUM and j.b == Const(9, j.b.dtype), name
    assert loads["C"].indices[0] == Axis("i", 6).var  # i is not padded: untouched
    # padding to the same extent changes nothing
    same = replay(_dense(6, 10, 4), [Pad("E", "j", 10)]).stage("E").op
    assert same == _dense(6, 10, 4).stages[1]


def test_padded_pack_layout():
    cd = _dense(6, 10, 4)
    st = replay(cd, [Pack("B", ("C",), 1, 4, 0)])
    pk = st.stage("B.pack")
    assert pk.op.shape == (3, 4, 4)                   # ceil(10 / 4) blocks of 4 columns
    b = np.arange(40, dtype=np.float32).reshape(4, 10)
    f = lower(ComputeDef("p", cd.inputs[1:2], (pk.op,), ("B.pack",)))
    (got,) = evaluate_loop_func(f, [b])
    want = np.stack([b[:, np.minimum(np.arange(4 * p, 4 * p + 4), 9)] for p in range(3)])
    np.testing.assert_array_equal(got, want)


def test_padded_stages_compute_the_dense_layer():
    """Pad the dot (and the bias add) past the columns, read a padded packed B, tile with shifted regions."""
    m, n, k = 13, 10, 7
    cd = _dense(m, n, k)
    _check(cd, [Pad("C", "j", 16)])
    _check(cd, [Pad("E", "j", 12), Pad("C", "j", 16)])
    _check(cd, [Pack("B", ("C",), 1, 4, 0), Pad("C", "j", 12)])
    tiled = [Pack("B", ("C",), 1, 8, 0), Pad("C", "j", 16), ComputeInline("E"),
             Split("D", "i", (4,)), Split("D", "j", (8,)), Reorder("D", ("i.0", "j.0", "i.1", "j.1")),
             ComputeAt("C", "D", "j.0"), Split("C", "j", (4,)), Reorder("C", ("r", "i", "j.0", "j.1")),
             Annotate("C", "j.1", ForKind.VECTORIZED)]
    _check(cd, tiled)


def test_default_schedule_pads_an_awkward_dot_and_computes_it():
    """Columns just short of two micro-tiles (61-63 with 16 lanes, padded to 64) get a Pad step in the default
    GEMM plan; the loop nest matches numpy.  The plan is made for a fixed target (AVX-512, 2 cores: an 8-row
    micro-tile) whatever the host; the loop-IR interpreter runs it anywhere."""
    target = dataclasses.replace(Target.host_cpu(), vector_bits=512, cores=2)
    lanes = 16
    rnd = random.Random(3)
    for _ in range(3):
        n = 4 * lanes - rnd.randint(1, 3)             # just under two micro-tiles
        m, k = rnd.choice([17, 29, 31, 37, 40]), rnd.randint(3, 9)
        cd = _dense(m, n, k)
        steps = default_schedule(cd, target)
        pads = {(p.stage, p.iter): p.extent for p in steps if isinstance(p, Pad)}
        assert pads.pop(("C", "j")) == 4 * lanes, steps
        assert pads in ({}, {("C", "i"): -(-m // 8) * 8}), steps     # rows with no good divisor: padded to 8s
        _check(cd, steps, seed=m)
