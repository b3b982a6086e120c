"""A tuning log written through the measurer drives `hlotune.compile`, and `hlotune db verify`
re-measures its best records."""

from __future__ import annotations

import json

import numpy as np

import hlotune
from hlotune.cli import main as cli_main
from hlotune.database import Record, open_database
from hlotune.measure.builder import LocalBuilder
from hlotune.measure.measurer import FaultHook, ProgramMeasurer
from hlotune.measure.recheck import Rechecker
from hlotune.measure.records import MeasureInput
from hlotune.measure.runner import LocalRunner, TimingConfig
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.steps import Schedule
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.search.records import to_record
from hlotune.target import Target
from tests.conftest import model_io, model_path

TARGET = Target.host_cpu()
FAST = TimingConfig(warmup_ms=1.0, repeats=2, min_repeat_ms=2.0)


def _tuned_db(tmp_path):
    """mlp2: two workloads get a measured naive schedule (no steps, unlike their default), plus a
    faster-looking wrong-answer record that must never be chosen."""
    model = hlotune.load_model(model_path("mlp2"))
    tasks = [t for t in tasks_from_subgraphs(model.frontend.subgraphs, TARGET) if default_schedule(t.compute, TARGET)]
    chosen = tasks[:2]
    inputs = [MeasureInput(t, Schedule(t.key, ())) for t in chosen]
    wrong = MeasureInput(chosen[0], Schedule(chosen[0].key, tuple(default_schedule(chosen[0].compute, TARGET))))
    with ProgramMeasurer(LocalBuilder(n_workers=2), LocalRunner(FAST), fault_hook=FaultHook.of({2: "wrong"})) as m:
        res = m.measure_batch(inputs + [wrong])
    assert [r.valid for r in res] == [True, True, False]
    path = str(tmp_path / "tune.db")
    db = open_database(path)
    for inp, r in zip(inputs + [wrong], res):
        db.add(to_record(inp, r))
    # a wrong answer is stored without costs, so it can never be the best record
    rec = to_record(wrong, res[2])
    assert rec.error_kind == "wrong_answer" and rec.costs == ()
    db.close()
    return model, chosen, path


def test_compile_uses_tuned_records_and_defaults(tmp_path):
    model, chosen, path = _tuned_db(tmp_path)
    exe = hlotune.compile(model, tuning_log=path)
    keys = {t.key for t in chosen}
    sources = exe.sources()
    by_key = {cs.key: cs for cs in exe._subgraphs.values()}
    for name, src in sources.items():
        key = exe._subgraphs[name].key
        if key in keys:
            assert src == "tuned (exact target)", (name, src)
            assert by_key[key].choice.steps == ()          # the measured schedule, not the default
        else:
            assert src == "default", (name, src)
    assert "tuned (exact target)" in exe.report() and "default" in exe.report()
    args, want = model_io("mlp2")
    got = exe(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_db_verify_end_to_end(tmp_path, capsys):
    model, chosen, path = _tuned_db(tmp_path)
    assert cli_main(["db", "verify", path]) == 0
    out = capsys.readouterr().out
    assert "2 best records checked, 0 failed" in out
    # a best record whose steps no longer apply: verify reports it and fails
    db = open_database(path)
    good = db.best(chosen[1].key, TARGET.fingerprint).record
    bad_steps = json.dumps({"workload_key": good.workload_key,
                            "steps": [{"step": "split", "stage": "nope", "iter": "i0", "factors": [2]}]})
    db.add(Record(good.workload_key, good.workload, good.target, good.target_family, bad_steps, "broken-schedule",
                  costs=(1e-9,)))
    db.close()
    assert cli_main(["db", "verify", path, "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2
    broken = next(r for r in rows if r["schedule_key"] == "broken-schedule")
    assert not broken["ok"] and "instantiation" in broken["message"]
    fine = next(r for r in rows if r["schedule_key"] != "broken-schedule")
    assert fine["ok"] and fine["new_median_s"] > 0


def test_rechecker_returns_costs(tmp_path):
    _, chosen, path = _tuned_db(tmp_path)
    db = open_database(path)
    rec = db.best(chosen[0].key, TARGET.fingerprint).record
    db.close()
    with Rechecker(ProgramMeasurer(LocalBuilder(n_workers=1), LocalRunner(FAST))) as rc:
        ok, costs = rc(rec)
    assert ok and len(costs) == FAST.repeats and all(c > 0 for c in costs)


def test_a_default_record_compiles_with_todays_default(tmp_path):
    """A log whose best record is a default schedule (the search found nothing faster) compiles with the default
    of this version, not the recorded one: an older version's default is stale (here: no steps at all)."""
    from hlotune.search.space import DEFAULT_SKETCH

    model = hlotune.load_model(model_path("mlp2"))
    tasks = tasks_from_subgraphs(model.frontend.subgraphs, TARGET)
    task = next(t for t in tasks if default_schedule(t.compute, TARGET))
    stale = MeasureInput(task, Schedule(task.key, (), DEFAULT_SKETCH))
    with ProgramMeasurer(LocalBuilder(n_workers=1), LocalRunner(FAST)) as m:
        (res,) = m.measure_batch([stale])
    assert res.valid
    path = str(tmp_path / "old.db")
    db = open_database(path)
    db.add(to_record(stale, res))
    db.close()
    exe = hlotune.compile(model, tuning_log=path)
    cs = next(cs for cs in exe._subgraphs.values() if cs.key == task.key)
    assert cs.choice.source == "default (the log's best)"
    assert cs.choice.steps == tuple(default_schedule(task.compute, TARGET)) != ()
    args, want = model_io("mlp2")
    for g, w in zip(exe(*args), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
