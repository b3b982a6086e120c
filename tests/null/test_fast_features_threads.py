"""The fast feature path from several threads at once (distributed.tune_targets tunes targets in threads of one
process, and templates are shared): every thread gets exactly the features a single thread computes."""

from __future__ import annotations

import random
import threading

import numpy as np

import hlotune
from hlotune.cost_model import fast_features
from hlotune.schedule_space.task import tasks_from_subgraphs
from hlotune.search.space import TaskSpace, sample_random
from hlotune.target import Target
from tests.conftest import model_path


def test_threads_share_templates_safely():
    m = hlotune.load_model(model_path("mlp2", "bench.hlo"))
    task = next(t for t in tasks_from_subgraphs(m.frontend.subgraphs, Target.host_cpu()) if t.name == "max.3")
    space = TaskSpace(task)
    rng = random.Random(0)
    scheds = sample_random(space, rng, 200)
    fast_features._TEMPLATES.clear()
    want = fast_features.batch_features(task.compute, scheds, task.key)
    fast_features._TEMPLATES.clear()   # the threads build and share the templates themselves
    got: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(4):
                got[k] = fast_features.batch_features(task.compute, scheds, task.key)
        except BaseException as e:   # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert sum(w is not None for w in want) > 100
    for k in range(4):
        for a, b in zip(got[k], want):
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b))
