"""Reliability checks of the backends: concurrent writers, a writer killed mid-write, corrupt JSONL.

Map:
- `synthetic_record(writer, i)`: a deterministic, distinct record.
- `python -m hlotune.database.stress write SPEC WRITER N [BATCH]`: a writer process; it prints the uid
  of each record after the transaction holding it committed (so its parent knows what was committed).
- `concurrent_write(spec, writers, per_writer)`: start writer processes at once, wait, count what is there.
- `kill_writer(spec, kill_after)`: start a writer, SIGKILL it once `kill_after` records are committed,
  reopen the database and check every committed record is there.
- `write_corrupt_jsonl(path, good)`: a JSONL file mixing good records with every kind of damage;
  returns the number of corrupt lines it wrote.

Used by tests/null/test_database*.py and benchmarks/db_reliability.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ops import open_database
from .record import Record

_ROOT = Path(__file__).resolve().parent.parent.parent  # the folder holding the hlotune package


def synthetic_record(writer: int, i: int, *, workload_key: str = "wk-stress", target: str = "fp-stress",
                     family: str = "fam-stress") -> Record:
    """A distinct record for writer `writer`, index `i` (every tenth one a compile error)."""
    steps = json.dumps([["SP", 0, 0, [writer + 1, i % 7 + 1]], ["AN", 0, 1, "vectorize"]])
    if i % 10 == 9:
        return Record(workload_key, '{"op": "stress"}', target, family, steps, f"s-{writer}-{i}", costs=(),
                      error_kind="compile", error_msg="synthetic failure", timestamp=1e9 + writer * 1e5 + i)
    base = 1e-3 * (1 + ((writer * 7919 + i * 104729) % 1000) / 1000)
    return Record(workload_key, '{"op": "stress"}', target, family, steps, f"s-{writer}-{i}",
                  costs=(base, base * 1.01, base * 0.99), build_s=0.1, run_s=0.01, timestamp=1e9 + writer * 1e5 + i)


def _abs_spec(spec: str) -> str:
    return spec if "://" in spec else str(Path(spec).resolve())


def _writer_cmd(spec: str, writer: int, n: int, batch: int) -> list[str]:
    return [sys.executable, "-m", "hlotune.database.stress", "write", _abs_spec(spec), str(writer), str(n), str(batch)]


def writer_main(spec: str, writer: int, n: int, batch: int = 1) -> None:
    """Add n synthetic records in batches; print each uid once its batch is committed."""
    db = open_database(spec)
    try:
        for start in range(0, n, batch):
            recs = [synthetic_record(writer, i) for i in range(start, min(n, start + batch))]
            db.add_many(recs)
            sys.stdout.write("".join(r.uid + "\n" for r in recs))
            sys.stdout.flush()
    finally:
        db.close()


@dataclass
class ConcurrencyResult:
    """Records committed by the writers, records found afterwards, and which (if any) are missing."""

    spec: str
    writers: int
    written: int
    found: int
    missing: list[str] = field(default_factory=list)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.errors and self.written == self.found


def concurrent_write(spec: str, writers: int = 4, per_writer: int = 50, batch: int = 1,
                     timeout: float = 120.0) -> ConcurrencyResult:
    """Start `writers` processes writing `per_writer` records each to one database at once."""
    t0 = time.monotonic()
    procs = [subprocess.Popen(_writer_cmd(spec, w, per_writer, batch), cwd=_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(writers)]
    written: list[str] = []
    errors: list[str] = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        written += out.split()
        if p.returncode != 0:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
    seconds = time.monotonic() - t0
    db = open_database(spec)
    try:
        found = {r.uid for r in db.records()}
        n = db.count()
    finally:
        db.close()
    return ConcurrencyResult(spec, writers, len(written), n, sorted(set(written) - found), seconds, errors)


@dataclass
class KillResult:
    """A writer killed with SIGKILL: records it had committed, whether the database opened, what was found."""

    spec: str
    committed: int
    found: int
    missing: list[str] = field(default_factory=list)
    opened: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.opened and not self.missing and self.committed > 0


def kill_writer(spec: str, kill_after: int = 30, batch: int = 5, timeout: float = 60.0) -> KillResult:
    """SIGKILL a writer after `kill_after` committed records (it is writing more at that moment).

    `found` counts the committed records present afterwards (it must equal `committed`).
    """
    writer = 1000 + os.getpid() % 1000 * 1000 + int(time.time() * 1000) % 1000
    p = subprocess.Popen(_writer_cmd(spec, writer, 10**7, batch), cwd=_ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    committed: list[str] = []
    deadline = time.monotonic() + timeout
    assert p.stdout is not None
    while len(committed) < kill_after and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        committed.append(line.strip())
    os.kill(p.pid, signal.SIGKILL)
    rest, err = p.communicate(timeout=timeout)
    committed += rest.split()  # printed before the kill, so committed too
    try:
        db = open_database(spec)
    except Exception as e:
        return KillResult(spec, len(committed), 0, committed, False, f"{type(e).__name__}: {e}")
    try:
        found = {r.uid for r in db.records()}
        missing = sorted(set(committed) - found)
        return KillResult(spec, len(committed), len(set(committed)) - len(missing), missing, True,
                          "" if committed else err.strip()[-500:])
    finally:
        db.close()


def write_corrupt_jsonl(path: str | os.PathLike[str], good: int = 20) -> int:
    """Write `good` valid records interleaved with corrupt lines; returns how many lines are corrupt.

    Damage: cut-off JSON, garbage bytes (not UTF-8), a JSON array, a record without schedule key, an
    unknown error kind, negative costs, and a last line cut off mid-record with no newline.
    """
    bad = [b'{"schema":1,"workload_key":"wk","target":"t","sched', b"\xff\xfe garbage \x80", b"[1, 2, 3]",
           json.dumps({"schema": 1, "workload_key": "wk", "target": "t", "steps": "[]"}).encode(),
           synthetic_record(7, 0).to_json_line().replace('"none"', '"exploded"').encode(),
           synthetic_record(7, 1).to_json_line().replace('"costs":[', '"costs":[-1,').encode()]
    lines: list[bytes] = []
    for i in range(good):
        lines.append(synthetic_record(5, i).to_json_line().encode())
        if i < len(bad):
            lines.append(bad[i])
    tail = synthetic_record(6, 0).to_json_line().encode()[:40]
    Path(path).write_bytes(b"\n".join(lines) + b"\n" + tail)
    return min(good, len(bad)) + 1


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "write":
        writer_main(argv[1], int(argv[2]), int(argv[3]), int(argv[4]) if len(argv) > 4 else 1)
        return 0
    print("usage: python -m hlotune.database.stress write SPEC WRITER N [BATCH]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
