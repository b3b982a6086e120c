"""Measurement: building in worker processes, running isolated, checking against the reference, timing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import hlotune
from hlotune.ir.compute_eval import evaluate_compute
from hlotune.ir.expr import Binary, Const, Load, Var
from hlotune.ir.hlo import DType, Op
from hlotune.measure.builder import LocalBuilder, compile_object
from hlotune.measure.measurer import ProgramMeasurer
from hlotune.measure.records import ErrorKind, MeasureInput, MeasureResult
from hlotune.measure.reference import compare, draw_inputs, make_task_data, poison, task_data
from hlotune.measure.runner import LocalRunner, TimingConfig, load_kernel, measure_kernel
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.loop_ir import BufferDecl, For, ForKind, LoopFunc, Store
from hlotune.schedule_space.steps import Annotate, Reorder, Schedule, Split
from hlotune.schedule_space.task import Task, tasks_from_subgraphs
from hlotune.target import Target
from tests.conftest import model_path

TARGET = Target.host_cpu()
FAST = TimingConfig(warmup_ms=1.0, repeats=3, min_repeat_ms=2.0)


def _tasks(name: str = "mlp2") -> dict[str, Task]:
    m = hlotune.load_model(model_path(name))
    return {t.name: t for t in tasks_from_subgraphs(m.frontend.subgraphs, TARGET)}


TASKS = _tasks()


@pytest.fixture(scope="module")
def measurer():
    with ProgramMeasurer(LocalBuilder(n_workers=2, timeout=20), LocalRunner(FAST, timeout=10)) as m:
        yield m


def _inp(task: Task, steps=()) -> MeasureInput:
    return MeasureInput(task, Schedule(task.key, tuple(steps)))


def test_valid_candidates_are_checked_and_timed(measurer):
    dot = TASKS["dot_general.3"]
    splits = [_inp(dot, [Split("dot_general_3", "i0", (f,))]) for f in (1, 2, 4, 8)]
    vec = _inp(dot, [Split("dot_general_3", "i1", (2,)), Reorder("dot_general_3", ("i0", "r0", "i1.0", "i1.1")),
                     Annotate("dot_general_3", "i1.1", ForKind.VECTORIZED)])
    inputs = [_inp(t, default_schedule(t.compute, TARGET)) for t in TASKS.values()] + splits + [vec]
    res = measurer.measure_batch(inputs)
    assert len(res) == len(inputs)
    for inp, r in zip(inputs, res):
        assert r.valid, (inp.task.name, str(r))
        assert r.error_kind is ErrorKind.NONE and len(r.costs) == FAST.repeats
        assert all(0 < c < 0.01 for c in r.costs) and r.median == sorted(r.costs)[1]
        assert 0 <= r.spread < 10 and r.build_s > 0 and r.run_s > 0
    # the runner survives across batches and reuses its processes
    again = measurer.measure_batch(splits[:2])
    assert all(r.valid for r in again)


def test_slower_schedule_measures_slower(measurer):
    """A naive (no steps) matmul-relu against the default tiled one at a size where it matters."""
    m = hlotune.load_model(model_path("mlp2", "bench.hlo"))
    big = next(t for t in tasks_from_subgraphs(m.frontend.subgraphs, TARGET) if t.name == "max.3")
    naive, tuned = measurer.measure_batch([_inp(big), _inp(big, default_schedule(big.compute, TARGET))])
    assert naive.valid and tuned.valid
    assert naive.median > 3 * tuned.median


def test_bad_schedule_is_an_instantiation_error(measurer):
    dot = TASKS["dot_general.3"]
    bad = _inp(dot, [Split("no_such_stage", "i0", (2,))])
    other = MeasureInput(dot, Schedule("w1-not-this-workload", ()))
    r1, r2, ok = measurer.measure_batch([bad, other, _inp(dot)])
    assert r1.error_kind is ErrorKind.INSTANTIATION and "no_such_stage" in r1.error_msg
    assert not r1.valid and r1.costs == () and math.isinf(r1.median)
    assert r2.error_kind is ErrorKind.INSTANTIATION
    assert ok.valid


def test_overlap_mode_gives_the_same_outcomes():
    dot, red = TASKS["dot_general.3"], TASKS["sub.15"]   # the log-softmax row subgraph (two reductions)
    inputs = [_inp(dot), _inp(red), _inp(dot, [Split("no_such_stage", "i0", (2,))]),
              _inp(red, default_schedule(red.compute, TARGET))]
    with ProgramMeasurer(LocalBuilder(n_workers=2), LocalRunner(FAST), overlap=True) as m:
        res = m.measure_batch(inputs)
    assert [r.error_kind for r in res] == [ErrorKind.NONE, ErrorKind.NONE, ErrorKind.INSTANTIATION, ErrorKind.NONE]


# ----------------------------------------------------------------------------- the check, in process

def _half_writer(n: int, write: int) -> LoopFunc:
    """y[i] = x[i] * 2 for i < write (a wrong kernel when write < n)."""
    i = Var("i")
    body = Store("y", (i,), Binary(Op.MULTIPLY, Load("x", (i,), DType.F32), Const(2.0, DType.F32), DType.F32))
    return LoopFunc("half", (BufferDecl("x", (n,), DType.F32),), (BufferDecl("y", (n,), DType.F32),),
                    For(i, Const(0, DType.S64), Const(write, DType.S64), ForKind.SERIAL, body))


def _double_task(n: int) -> Task:
    from hlotune.ir.expr import Axis, Buffer, ComputeDef, Stage
    from hlotune.ir.workload import workload_key
    i = Var("i0")
    st = Stage("y", (Axis("i0", n),), Binary(Op.MULTIPLY, Load("x", (i,), DType.F32), Const(2.0, DType.F32),
                                                DType.F32), DType.F32)
    cd = ComputeDef("double", (Buffer("x", (n,), DType.F32),), (st,), ("y",))
    return Task(workload_key(cd), cd, TARGET, name="double")


def test_unwritten_output_elements_are_a_wrong_answer():
    task = _double_task(64)
    data = make_task_data(task)
    np.testing.assert_array_equal(data.expected[0], data.inputs[0] * 2)
    good = load_kernel(compile_object(_half_writer(64, 64), TARGET), TARGET)
    kind, msg, costs = measure_kernel(good, data, FAST)
    assert kind is ErrorKind.NONE and len(costs) == 3, msg
    bad = load_kernel(compile_object(_half_writer(64, 63), TARGET), TARGET)
    kind, msg, costs = measure_kernel(bad, data, FAST)
    assert kind is ErrorKind.WRONG_ANSWER and costs == () and "1 of 64" in msg


def test_flush_cache_times_single_calls():
    task = _double_task(4096)
    data = make_task_data(task)
    k = load_kernel(compile_object(_half_writer(4096, 4096), TARGET), TARGET)
    from hlotune.measure.runner import _Flusher
    kind, msg, costs = measure_kernel(k, data, TimingConfig(1.0, 4, 1.0, flush_cache=True), flusher=_Flusher(TARGET))
    assert kind is ErrorKind.NONE and len(costs) == 4


def test_compare_rules():
    ref = np.array([1.0, np.nan, np.inf, -np.inf, 1e-9, 100.0], np.float32)
    assert compare(ref.copy(), ref, 1e-4, 1e-5) is None
    near = ref.copy()
    near[[0, 5]] *= 1 + 5e-5
    assert compare(near, ref, 1e-4, 1e-5) is None
    for k, v in [(0, 1.01), (1, 0.0), (2, 1e30), (3, np.inf), (4, np.nan)]:
        bad = ref.copy()
        bad[k] = v
        assert compare(bad, ref, 1e-4, 1e-5) is not None, k
    ints = np.arange(6, dtype=np.int32)
    assert compare(ints.copy(), ints, 0, 0) is None
    assert "1 of 6" in compare(ints + (ints == 3), ints, 0, 0)
    for r in (ref, ints, ints > 2):
        p = poison(r)
        assert p.dtype == r.dtype and p.shape == r.shape
        assert compare(p, r, 1e-4, 1e-5) is not None
        assert not np.any(p == r)


def test_inputs_are_seeded_and_safe():
    sub = TASKS["sub.15"]            # has log(): positive inputs
    a, b = draw_inputs(sub.compute, 0, sub.key), draw_inputs(sub.compute, 0, sub.key)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(x.min() >= 0.5 for x in a)
    c = draw_inputs(sub.compute, 1, sub.key)
    assert not np.array_equal(a[1], c[1])
    dot = TASKS["dot_general.3"]
    d = draw_inputs(dot.compute, 0, dot.key)
    assert min(x.min() for x in d) < 0 < max(x.max() for x in d)
    data = task_data(sub)
    assert task_data(sub) is data                      # drawn once per task
    want = evaluate_compute(sub.compute, list(data.inputs))
    np.testing.assert_array_equal(data.expected[0], want[0])
    assert np.isfinite(data.expected[0]).all()


def test_measure_result_properties():
    r = MeasureResult((3.0, 1.0, 2.0))
    assert r.valid and r.median == 2.0 and r.spread == 1.0
    bad = MeasureResult((), ErrorKind.WRONG_ANSWER, "x")
    assert not bad.valid and math.isinf(bad.median) and math.isinf(bad.spread)
    assert not MeasureResult((1.0,), ErrorKind.RUNTIME).valid


def test_to_record_round_trip(measurer):
    from hlotune.database import Record
    from hlotune.ir.workload import workload_from_json
    from hlotune.schedule_space.steps import schedule_from_json
    from hlotune.search.records import to_record

    dot = TASKS["dot_general.3"]
    good = _inp(dot, [Split("dot_general_3", "i0", (4,))])
    bad = _inp(dot, [Split("nope", "i0", (4,))])
    rg, rb = measurer.measure_batch([good, bad])
    rec = to_record(good, rg)
    assert rec.valid and rec.costs == rg.costs and rec.schedule_key == good.schedule.key
    assert rec.target == TARGET.fingerprint and rec.target_family == TARGET.family
    assert schedule_from_json(json.loads(rec.steps)) == good.schedule
    assert workload_from_json(rec.workload) == dot.compute
    assert Record.from_json_line(rec.to_json_line()) == rec
    brec = to_record(bad, rb)
    assert brec.error_kind == "instantiation" and brec.costs == () and not brec.valid


_RT_PROBE = """
import os
from hlotune.measure.runner import LocalRunner
r = LocalRunner()
r.start()
print(os.sched_getscheduler(r._worker.proc.pid))
r.close()
"""


def _may_use_realtime() -> bool:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))"],
                       capture_output=True)
    return p.returncode == 0


@pytest.mark.parametrize("on", ["1", "0"])
def test_runner_takes_real_time_priority_when_asked_and_allowed(on):
    import os
    import subprocess
    import sys

    env = dict(os.environ, HLOTUNE_MEASURE_REALTIME=on)
    p = subprocess.run([sys.executable, "-c", _RT_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-500:]
    policy = int(p.stdout.split()[-1])
    want = os.SCHED_RR if on == "1" and _may_use_realtime() else os.SCHED_OTHER
    assert policy == want
