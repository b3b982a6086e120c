"""Tuning builds skip code too large to be worth building (setting `build_max_ir_lines`): the candidate is a
compile error naming the size and the setting, unbuilt; under the limit, or with the limit off, the same schedule
builds and runs correctly."""

from __future__ import annotations

import pytest

import hlotune
from hlotune.measure.builder import BuildJob, build_one
from hlotune.measure.records import ErrorKind
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.target import Target
from tests.conftest import model_path

TARGET = Target.host_cpu()


@pytest.fixture(scope="module")
def job():
    m = hlotune.load_model(model_path("mlp2", "bench.hlo"))
    task = next(t for t in tasks_from_subgraphs(m.frontend.subgraphs, TARGET) if t.name == "max.3")
    return BuildJob(task.compute, tuple(default_schedule(task.compute, TARGET)), TARGET)


@pytest.mark.parametrize("limit", ["60", "0", "1000000"])
def test_size_limit(job, monkeypatch, limit):
    monkeypatch.setenv("HLOTUNE_BUILD_MAX_IR_LINES", limit)
    res = build_one(job)
    if limit == "60":   # the kernel's IR is a few hundred lines
        assert res.error_kind is ErrorKind.COMPILE and not res.obj
        assert "too large" in res.error_msg and "build_max_ir_lines" in res.error_msg and "limit 60" in res.error_msg
    else:
        assert res.error_kind is ErrorKind.NONE and res.obj and len(res.obj) > 100


def test_default_limit_keeps_every_default_schedule():
    """No fixture's default schedule comes near the default limit (they must all stay tunable from their default)."""
    from hlotune import config
    from hlotune.codegen.llvm_emit import emit_module
    from hlotune.schedule_space.lower import lower

    limit = int(config.get("build_max_ir_lines"))
    most = 0
    for name in ("matmul", "transformer_block", "conv2d_bias_relu", "mlp_train_step"):
        m = hlotune.load_model(model_path(name, "bench.hlo"))
        for t in tasks_from_subgraphs(m.frontend.subgraphs, TARGET):
            f = lower(t.compute, tuple(default_schedule(t.compute, TARGET)), name="k")
            most = max(most, str(emit_module(f, "x86_64-unknown-linux-gnu")[0]).count("\n"))
    assert 100 < most < limit / 3, most
