"""SIGKILL a tuning run at random moments, resume it each time, and count what survived.

    .venv/bin/python benchmarks/tune_kill_reliability.py [--kills 5] [--trials 48] [--batch 4] [--seed 0]

Each round starts (or resumes) `hlotune tune` on a small fixture model with a SQLite tuning log,
waits a random 3-9 s, and kills it with SIGKILL. After each kill it checks that the database opens,
passes SQLite's integrity check and holds every batch the run had logged as committed (the run log
under --log-dir records `trials_total` after each committed batch); the records lost are those
measured but not committed (at most the batch in flight). Finally it resumes the run to completion
and checks that the budget is reached exactly, with no schedule measured twice, and that
`hlotune db verify` passes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hlotune.database import open_database  # noqa: E402

MODEL = ROOT / "tests" / "data" / "models" / "mlp2" / "mlp2.hlo"


def _cmd(db: str, logs: str, trials: int, batch: int) -> list[str]:
    return [sys.executable, "-m", "hlotune.cli", "tune", str(MODEL), "--tuning-log", db, "--trials", str(trials),
            "--batch-size", str(batch), "--population", "64", "--generations", "1", "--repeats", "1",
            "--min-repeat-ms", "1", "--workers", "1", "--seed", "3", "--log-dir", logs, "-q"]


def _logged_total(logs: str) -> int:
    best = 0
    for p in Path(logs).glob("tune-*.jsonl"):
        for line in p.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by the kill
            best = max(best, int(e.get("trials_total", 0)))
    return best


def _integrity(db: str) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--trials", type=int, default=48)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    env = {k: v for k, v in os.environ.items() if k != "HLOTUNE_DEBUG"}
    tmp = tempfile.mkdtemp(prefix="hlotune-kill-")
    db, logs = os.path.join(tmp, "t.db"), os.path.join(tmp, "logs")
    rows = []
    for k in range(a.kills):
        proc = subprocess.Popen(_cmd(db, logs, a.trials, a.batch), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=ROOT)
        wait = rng.uniform(3.0, 9.0)
        time.sleep(wait)
        finished = proc.poll() is not None
        if not finished:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        logged = _logged_total(logs)
        with open_database(db) as d:
            n = d.count()
        rows.append((k + 1, wait, finished, logged, n, _integrity(db)))
        if finished:
            break
    proc = subprocess.run(_cmd(db, logs, a.trials, a.batch), env=env, capture_output=True, text=True, cwd=ROOT)
    with open_database(db) as d:
        keys = [r.schedule_key for r in d.records()]
    verify = subprocess.run([sys.executable, "-m", "hlotune.cli", "db", "verify", db], env=env,
                            capture_output=True, text=True, cwd=ROOT)
    print("| kill | after s | run had finished | trials logged as committed | records in db | lost vs logged"
          " | integrity |")
    print("|---|---|---|---|---|---|---|")
    for k, wait, fin, logged, n, ok in rows:
        print(f"| {k} | {wait:.1f} | {fin} | {logged} | {n} | {max(0, logged - n)} | {ok} |")
    print(f"\nresumed to completion: exit {proc.returncode}; {len(keys)} records for a budget of {a.trials}, "
          f"{len(keys) - len(set(keys))} schedules measured twice; `hlotune db verify` exit {verify.returncode}")
    bad = any(logged > n or ok != "ok" for _, _, _, logged, n, ok in rows)
    bad = bad or proc.returncode != 0 or len(keys) != len(set(keys)) or verify.returncode != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
