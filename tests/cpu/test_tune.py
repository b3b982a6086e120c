"""A real end-to-end tune on the CPU: default schedules first, candidates built and timed by the measurer,
records in the tuning log, and the tuned model compiled from the log gives JAX's outputs."""

from __future__ import annotations

import json

import numpy as np

import hlotune
from hlotune.database import open_database
from hlotune.measure.runner import TimingConfig
from hlotune.search.report import build_report
from hlotune.search.space import DEFAULT_SKETCH
from tests.conftest import model_io, model_path

FAST = TimingConfig(warmup_ms=1.0, repeats=2, min_repeat_ms=1.0)


def test_tune_small_model_end_to_end(tmp_path):
    name = "mlp2"
    db_path = str(tmp_path / "tune.db")
    rep = hlotune.tune(str(model_path(name)), db_path, trials=16, seed=3, batch_size=6, population=64,
                       generations=1, timing=FAST, workers=2, progress=False, log_dir=str(tmp_path / "logs"))
    assert isinstance(rep, hlotune.TuneReport)
    assert rep.trials == rep.total_trials == 16 and rep.stop_reason.startswith("trial budget")
    n_tasks = len(rep.subgraphs)
    assert n_tasks >= 2 and sum(s.trials for s in rep.subgraphs) == 16
    db = open_database(db_path)
    recs = list(db.records())
    assert len({r.schedule_key for r in recs}) == 16   # 16 trials (plus the confirmation timings of new bests)
    # trial 0: the default schedule of every subgraph, measured first
    assert all(json.loads(r.steps).get("sketch") == DEFAULT_SKETCH for r in recs[:n_tasks])
    for s in rep.subgraphs:
        assert s.default_s is not None and s.best_s is not None and s.best_s <= s.default_s
        best = db.best(s.key, rep.target)
        assert best is not None and best.record.median == s.best_s
    valid = [r for r in recs if r.valid]
    assert len(valid) >= 12   # a few candidates may fail, but they are recorded with their error kind
    assert rep.model_latency_s <= rep.default_latency_s
    # the run log has one line per batch and the report reads the same numbers back
    log = [json.loads(line) for line in open(rep.log_file)]
    assert log[0]["event"] == "start" and log[-1]["event"] == "end" and log[-1]["trials_total"] == 16
    dbr = build_report(db, model=hlotune.load_model(str(model_path(name))))
    assert dbr.model_latency_s == rep.model_latency_s
    # the tuned model gives JAX's outputs
    exe = hlotune.compile(str(model_path(name)), tuning_log=db_path)
    # every subgraph from the log: its best record, or today's default where that record is a default schedule
    for sg_name, cs in exe._subgraphs.items():
        rec = db.best(cs.key, rep.target).record
        is_default = json.loads(rec.steps).get("sketch") == DEFAULT_SKETCH
        assert cs.choice.source == ("default (the log's best)" if is_default else "tuned (exact target)"), sg_name
        assert cs.choice.median_s == rec.median
    args, want = model_io(name)
    for g, w in zip(exe(*args), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
