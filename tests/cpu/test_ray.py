"""Distributed measurement on a real Ray cluster started here: a head and worker nodes as separate processes
(ray.cluster_utils), with custom resources standing in for machines of two kinds of target (fingerprints A and
B: the host CPU under made-up fingerprints, so both build and run here), and Ray-declared GPUs standing in for a
machine with two GPUs.  Compared against: the records in the database (one per trial, each target's records only
from the nodes announcing it), the detected host target, and the number of trials asked for."""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import random
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hlotune[distributed]')")
from ray.cluster_utils import Cluster  # noqa: E402

import hlotune  # noqa: E402
from hlotune import config  # noqa: E402
from hlotune.cli import main as cli_main  # noqa: E402
from hlotune.database import open_database  # noqa: E402
from hlotune.measure.ray_runner import RayPool, build_resource, run_resource  # noqa: E402
from hlotune.measure.runner import TimingConfig  # noqa: E402
from hlotune.search.distributed import MultiTuneReport, tune_targets  # noqa: E402
from hlotune.target import Target  # noqa: E402
from tests.conftest import model_path  # noqa: E402

FAST = TimingConfig(warmup_ms=1.0, repeats=2, min_repeat_ms=1.0)
#: slower timing for the kill test, so that a candidate is in flight on the node most of the time
SLOW = TimingConfig(warmup_ms=1.0, repeats=2, min_repeat_ms=25.0)
STORE = 80 << 20
SEARCH = dict(population=64, generations=1, progress=False, write_log=False)
#: the whole module (cluster start, three tests, shutdown) takes about 25 s; past this, a Ray call is taken to hang
WATCHDOG_S = 300


@pytest.fixture(scope="module", autouse=True)
def _watchdog(request):
    """A hung Ray call must not hold the run for CI's whole limit (seen once in session 29, cause unknown): past
    WATCHDOG_S every thread's stack goes to the real stderr (pytest's capture suspended) and the process ends
    with status 1."""
    capman = request.config.pluginmanager.getplugin("capturemanager")

    def fire():
        if capman is not None:
            capman.suspend_global_capture(in_=True)
        sys.stderr.write(f"\n{__file__}: not done after {WATCHDOG_S} s, a Ray call hangs; every thread's stack:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(1)

    timer = threading.Timer(WATCHDOG_S, fire)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


@pytest.fixture(scope="module")
def cluster():
    """head (builds, and the real host target) + w1 (runner of A) + w2 (two 'GPUs', two runners of B)."""
    host = Target.host_cpu()
    sf = random.Random().randrange(1000, 10**6)   # fresh fingerprints: a shared PostgreSQL may hold old runs
    a = dataclasses.replace(host, schedule_format_version=sf)
    b = dataclasses.replace(host, cores=host.cores + 1, schedule_format_version=sf)
    builds = {build_resource(t.fingerprint): 4 for t in (a, b, host)}
    c = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, object_store_memory=STORE, include_dashboard=False,
        resources={**builds, run_resource(host.fingerprint): 1}))
    w1 = c.add_node(num_cpus=1, object_store_memory=STORE, resources={run_resource(a.fingerprint): 1})
    w2 = c.add_node(num_cpus=1, num_gpus=2, object_store_memory=STORE, resources={run_resource(b.fingerprint): 2})
    ray.init(address=c.address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield {"c": c, "a": a, "b": b, "host": host, "w1": w1.node_id, "w2": w2.node_id}
    finally:
        ray.shutdown()
        c.shutdown()


def _db_spec(tmp_path) -> str:
    return config.get("postgres_url") or str(tmp_path / "tune.db")


def _nodes(by_node: dict) -> set[str]:
    return {k.split(":")[1] for k in by_node}


def test_two_targets_pinned_to_their_nodes(cluster, tmp_path):
    a, b = cluster["a"], cluster["b"]
    db_spec = _db_spec(tmp_path)
    with RayPool([a, b], None, timing=FAST, check_target=False, num_gpus={b.fingerprint: 1}) as pool:
        rep = tune_targets(hlotune.load_model(str(model_path("mlp2"))), db_spec, [a, b], pool=pool, trials=10,
                           seed=1, batch_size=5, timing=FAST, **SEARCH)
        stats, info = pool.stats, pool.actor_info()
    assert isinstance(rep, MultiTuneReport) and [r.target for r in rep.reports] == [a.fingerprint, b.fingerprint]
    # each target measured only on the node announcing it; B's node: one runner per "GPU", each its own GPU
    assert _nodes(stats[a.fingerprint]["by_node"]) == {cluster["w1"][:8]}
    assert _nodes(stats[b.fingerprint]["by_node"]) == {cluster["w2"][:8]}
    assert len(info[b.fingerprint]) == 2
    assert sorted(g for i in info[b.fingerprint] for g in i["gpu_ids"]) == ["0", "1"]
    assert all(i["gpu_ids"] == [] for i in info[a.fingerprint])
    db = open_database(db_spec)
    try:
        for t, r in zip((a, b), rep.reports):
            recs = list(db.records(target=t.fingerprint))
            assert r.trials == r.total_trials == 10 and len(recs) >= 10   # more: confirmation timings of bests
            assert len({x.schedule_key for x in recs}) == 10
            assert sum(x.valid for x in recs) >= 8, [(x.error_kind, x.error_msg[:200], x.run_s) for x in recs]
            assert all(x.target_family == t.family for x in recs)
            assert stats[t.fingerprint]["candidates"] >= len(recs) and stats[t.fingerprint]["lost"] == 0
    finally:
        db.close()


def test_cli_ray_kind_resolves_to_matching_machines(cluster, tmp_path, capsys):
    """`--target cpu --ray ADDRESS`: every cpu fingerprint announced; A and B (made up, not this machine) fail
    the runners' fingerprint check and are left out with a warning; the host's is tuned on the head."""
    db = str(tmp_path / "cli.db")
    with pytest.warns(UserWarning, match="left out"):
        rc = cli_main(["tune", str(model_path("mlp2")), "--target", "cpu", "--ray", cluster["c"].address,
                       "--tuning-log", db, "--trials", "6", "--batch-size", "3", "--population", "32",
                       "--generations", "1", "--repeats", "1", "--min-repeat-ms", "1", "-q",
                       "--log-dir", str(tmp_path / "logs")])
    assert rc == 0
    assert "6 trials" in capsys.readouterr().out
    recs = list(open_database(db).records())
    assert len({r.schedule_key for r in recs}) == 6 and {r.target for r in recs} == {cluster["host"].fingerprint}


def test_node_killed_mid_run_loses_no_record(cluster, tmp_path):
    a, c = cluster["a"], cluster["c"]
    w3 = c.add_node(num_cpus=1, object_store_memory=STORE, resources={run_resource(a.fingerprint): 1})
    db_spec = str(tmp_path / "kill.db")
    out: dict = {}
    with RayPool([a], None, timing=SLOW, check_target=False) as pool:
        g = pool.groups[a.fingerprint]
        deadline = time.monotonic() + 30
        while sum(s.info is not None for s in g.slots) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)   # the pool starts the actors it has capacity for; wait for both to be up
            pool._refresh(g, force=True)
            for s in g.slots:
                if s.ready_ref is not None and ray.wait([s.ready_ref], timeout=0)[0]:
                    pool._on_ready(g, s)
        assert {s.info["node_id"] for s in g.slots} == {cluster["w1"], w3.node_id}

        def run():
            out["rep"] = tune_targets(hlotune.load_model(str(model_path("mlp2"))), db_spec, [a], pool=pool,
                                      trials=24, seed=2, batch_size=8, timing=SLOW, early_stopping=None, **SEARCH)

        th = threading.Thread(target=run)
        th.start()
        killed = False
        deadline = time.monotonic() + 40
        while th.is_alive() and time.monotonic() < deadline and not killed:
            busy = [s for s in list(g.slots) if s.info and s.info["node_id"] == w3.node_id and s.ref is not None]
            if busy and g.stats["candidates"] >= 6:
                c.remove_node(w3)   # the node goes away with a candidate in flight
                killed = True
            time.sleep(0.005)
        th.join(60)
        stats = pool.stats[a.fingerprint]
    assert killed and not th.is_alive()
    rep = out["rep"]
    assert rep.trials == 24 and rep.stop_reason.startswith("trial budget") and not rep.interrupted
    assert stats["actor_deaths"] >= 1 and stats["requeued"] >= 1 and stats["lost"] == 0
    recs = list(open_database(db_spec).records())
    assert len(recs) >= 24 and len({r.schedule_key for r in recs}) == 24
    assert not [r for r in recs if r.error_kind == "unknown"]
    # after the kill, everything went to the surviving node
    assert _nodes(stats["by_node"]) <= {cluster["w1"][:8], w3.node_id[:8]}
