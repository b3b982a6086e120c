"""GPU tier: `hlotune.tune(target="cuda")` measures GPU sketch candidates through the GpuRunner, writes valid
records, and `hlotune.compile(model, tuning_log=db, target="cuda")` uses them (outputs against JAX's)."""

from __future__ import annotations

import numpy as np

import hlotune
from hlotune.database import open_database
from tests.conftest import model_io, model_path


def test_tune_cuda_writes_records_that_compile_uses(tmp_path):
    db = tmp_path / "t.db"
    rep = hlotune.tune(str(model_path("softmax")), tuning_log=str(db), target="cuda", trials=12, population=64,
                       batch_size=8, progress=False, log_dir=str(tmp_path))
    assert rep.trials == 12 and rep.target.startswith("cuda-")
    d = open_database(str(db))
    recs = list(d.records())
    d.close()
    # 12 trials, plus one record per re-measured incumbent (the tuner's confirmation step: not a new trial)
    assert 12 <= len(recs) <= 12 + 4 and sum(r.valid for r in recs) >= 8, \
        [r.error_msg[:200] for r in recs if not r.valid]
    assert len({r.steps for r in recs}) >= 12 - 1
    assert {r.target for r in recs} == {rep.target}
    exe = hlotune.compile(str(model_path("softmax")), tuning_log=str(db), target="cuda")
    assert any(src.startswith("tuned") for src in exe.sources().values()), exe.sources()
    args, outs = model_io("softmax")
    for g, w in zip(exe(*args), outs):
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5)
