"""Schedule steps: JSON / text round trips, structural keys, and illegal steps raising ScheduleError."""

from __future__ import annotations

import json

import pytest

from hlotune.errors import ScheduleError
from hlotune.ir.expr import Axis, Binary, Buffer, ComputeDef, Const, Load, Reducer, Stage
from hlotune.ir.hlo import DType, Op
from hlotune.schedule_space.loop_ir import ForKind
from hlotune.schedule_space.state import apply, init_state, replay
from hlotune.schedule_space.steps import (
    Annotate,
    CacheRead,
    CacheWrite,
    ComputeAt,
    ComputeInline,
    ComputeRoot,
    FollowFusedSplit,
    FollowSplit,
    Fuse,
    Pad,
    Pragma,
    Reorder,
    RFactor,
    Schedule,
    Split,
    StorageAlign,
    parse_schedule,
    parse_step,
    schedule_from_json,
    schedule_to_json,
    step_from_json,
    step_str,
    step_to_json,
)

F = DType.F32

ALL_STEPS = [
    Split("C", "i", (8, 4, 2)), Split("C.local", "k", (None,), inner_to_outer=False),
    FollowSplit("D", "i", 0, 3), FollowFusedSplit("D", "i.0@j.0", (0, 1), 1, False),
    Reorder("C", ("i.0", "j.0", "k")), Fuse("C", ("i.0", "j.0")), ComputeAt("C", "D", "j.1"),
    ComputeInline("E"), ComputeRoot("E"), CacheRead("A", "shared", ("C", "D")), CacheWrite("C", "local"),
    RFactor("S", "k.1"), Annotate("C", "i.0@j.0", ForKind.PARALLEL), Annotate("C", "j", ForKind.THREAD_X),
    Pragma("C", "i.0", "auto_unroll_max_step", 64), Pad("C", "j", 16), StorageAlign("A.shared", 0, 32, 1),
]


def dense_relu(m=8, n=12, k=6) -> ComputeDef:
    i, j, r = Axis("i", m), Axis("j", n), Axis("k", k)
    mm = Stage("C", (i, j), Binary(Op.MULTIPLY, Load("A", (i.var, r.var), F), Load("B", (r.var, j.var), F), F), F,
               (r,), Reducer(Const(0.0, F), Op.ADD))
    d = Stage("D", (i, j), Binary(Op.MAXIMUM, Binary(Op.ADD, Load("C", (i.var, j.var), F),
                                                     Load("bias", (j.var,), F), F), Const(0.0, F), F), F)
    return ComputeDef("dense_relu", (Buffer("A", (m, k), F), Buffer("B", (k, n), F), Buffer("bias", (n,), F)),
                      (mm, d), ("D",))


@pytest.mark.parametrize("step", ALL_STEPS, ids=lambda s: s.tag)
def test_step_json_and_text_round_trip(step):
    d = step_to_json(step)
    assert step_from_json(json.loads(json.dumps(d))) == step
    line = step_str(step)
    assert "\n" not in line and line.startswith(step.tag + " ")
    assert parse_step(line) == step


def test_schedule_round_trip_and_key():
    s = Schedule("wk:abc", tuple(ALL_STEPS))
    assert parse_schedule(str(s)) == s
    assert schedule_from_json(json.loads(json.dumps(schedule_to_json(s)))) == s
    same = Schedule("wk:abc", tuple(ALL_STEPS))
    assert same.key == s.key and hash(same) == hash(s)
    other = Schedule("wk:abc", tuple(ALL_STEPS[:-1]) + (StorageAlign("A.shared", 0, 32, 2),))
    assert other.key != s.key
    assert Schedule("wk:abd", tuple(ALL_STEPS)).key != s.key


def test_bad_json_raises():
    with pytest.raises(ScheduleError):
        step_from_json({"step": "teleport"})
    with pytest.raises(ScheduleError):
        step_from_json({"step": "split", "stage": "C"})
    with pytest.raises(ScheduleError):
        parse_step('split stage="C" iter=')


def test_replay_is_deterministic_and_names_iterators():
    cd = dense_relu()
    steps = [Split("D", "i", (2, 2)), Split("D", "j", (3,)), Reorder("D", ("i.0", "j.0", "i.1", "i.2", "j.1")),
             Fuse("D", ("i.0", "j.0")), ComputeAt("C", "D", "i.1")]
    a, b = replay(cd, steps), replay(cd, steps)
    assert a == b
    d = a.stage("D")
    assert [(i.name, i.extent) for i in d.iters] == [("i.0@j.0", 8), ("i.1", 2), ("i.2", 2), ("j.1", 3)]
    assert str(a.stage("C").attach) == "at D.i.1"


ILLEGAL = [
    ([Split("D", "i", (0,))], "positive"),
    ([Split("D", "i", (None,))], "undetermined"),
    ([Split("D", "q", (2,))], "no iterator"),
    ([Split("X", "i", (2,))], "no stage"),
    ([Reorder("D", ("j", "j"))], "permutation"),
    ([Reorder("C", ("i", "j"))], "permutation"),
    ([Split("D", "i", (2,)), Fuse("D", ("i.0", "j"))], "adjacent"),
    ([Fuse("C", ("j", "k"))], "space and reduction"),
    ([Annotate("C", "k", ForKind.VECTORIZED)], "reduction"),
    ([Annotate("C", "k", ForKind.PARALLEL)], "reduction"),
    ([Annotate("D", "i", ForKind.VECTORIZED)], "innermost"),
    ([ComputeInline("D")], "output"),
    ([ComputeInline("C")], "reduction"),
    ([ComputeAt("D", "C", "i")], "output"),
    ([ComputeAt("C", "C", "i")], "itself"),
    ([CacheWrite("C", "local"), ComputeAt("C.local", "C", "i"), ComputeAt("C", "C.local", "i")], "does not consume"),
    ([Split("D", "i", (2,)), Annotate("D", "i.1", ForKind.UNROLLED), Split("D", "i.1", (2,))], "annotated"),
    ([Split("C", "i", (2,)), CacheWrite("C", "local")], "before"),
    ([RFactor("C", "i")], "not a reduction iterator"),
    ([Split("C", "i", (2,)), RFactor("C", "k")], "before transforming"),
    ([Pragma("C", "i", "bogus", 1)], "unknown"),
    ([StorageAlign("D", 0, 8, 1)], "output"),
    ([CacheRead("A", "texture", ("C",))], "scope"),
    ([CacheRead("A", "local", ("D",))], "does not read"),
    ([FollowSplit("D", "i", 0, 2)], "no step"),
    ([Split("C", "i", (2,)), FollowSplit("D", "i", 0, 5)], "n_split"),
]


@pytest.mark.parametrize("steps,reason", ILLEGAL, ids=[r for _, r in ILLEGAL])
def test_illegal_steps_raise_with_reason(steps, reason):
    cd = dense_relu()
    with pytest.raises(ScheduleError, match=reason):
        replay(cd, steps)


def test_split_and_fuse_move_attach_points():
    cd = dense_relu()
    st = replay(cd, [Split("D", "i", (2,)), ComputeAt("C", "D", "i.0"), Split("D", "i.0", (2,))])
    assert str(st.stage("C").attach) == "at D.i.0.1"
    st = apply(st, Fuse("D", ("i.0.0", "i.0.1")))
    assert str(st.stage("C").attach) == "at D.i.0.0@i.0.1"


def test_apply_is_pure():
    cd = dense_relu()
    s0 = init_state(cd)
    s1 = apply(s0, Split("D", "i", (4,)))
    assert [i.name for i in s0.stage("D").iters] == ["i", "j"]
    assert [i.name for i in s1.stage("D").iters] == ["i.0", "i.1", "j"]
    assert s1.steps == (Split("D", "i", (4,)),) and s0.steps == ()


def test_split_extents_with_tail_and_follow():
    cd = dense_relu(m=10)
    st = replay(cd, [Split("C", "i", (3, 2)), FollowSplit("D", "i", 0, 2), Split("D", "j", (4,), inner_to_outer=False)])
    assert [(i.name, i.extent) for i in st.stage("C").iters[:3]] == [("i.0", 2), ("i.1", 3), ("i.2", 2)]
    assert [(i.name, i.extent) for i in st.stage("D").iters] == [("i.0", 2), ("i.1", 6), ("j.0", 4), ("j.1", 3)]


def test_schedule_sketch_field_round_trip_and_key():
    s = Schedule("wk:abc", tuple(ALL_STEPS[:3]), "sk-0123abcd")
    assert parse_schedule(str(s)) == s and str(s).splitlines()[0] == 'schedule "wk:abc" sketch "sk-0123abcd"'
    assert schedule_from_json(json.loads(json.dumps(schedule_to_json(s)))) == s
    plain = Schedule("wk:abc", tuple(ALL_STEPS[:3]))
    assert "sketch" not in schedule_to_json(plain)   # keys of sketch-less schedules are unchanged
    assert schedule_from_json({"workload_key": "wk:abc", "steps": schedule_to_json(plain)["steps"]}) == plain
    assert plain.key != s.key
    with pytest.raises(ScheduleError):
        parse_schedule('schedule "wk:abc" sketchy "x"\n')
