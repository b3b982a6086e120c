"""Whole-database operations: open by spec, export, import, merge, verify.

Map:
- `open_database(spec)`: a path (`.db`/`.sqlite`/`.sqlite3` -> SQLite, `.jsonl` -> JSONL), a URL
  (`postgresql://...` -> SQLAlchemy, `sqlite:///FILE` -> SQLite), or a Database (returned as is).
- `export_jsonl(db, out)`: every record to a JSONL file, written to a temporary file then renamed.
- `import_jsonl(db, path)`: parse the whole file first (corrupt lines skipped, counted, reported),
  then add the records; duplicates are stored once. -> `ImportReport`.
- `merge(sources, out)`: add every record of every source to `out`; idempotent. -> `MergeReport`.
- `verify(db, recheck, ...)`: re-measure each stored best record with the caller's `recheck(record)`
  -> (ok, new_costs) and report drift. -> list of `VerifyRow`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DatabaseError
from .base import Database
from .record import Record

DatabaseSpec = Any  # str | os.PathLike | Database

_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def open_database(spec: DatabaseSpec) -> Database:
    """Open (creating when missing) the tuning database that `spec` names."""
    if isinstance(spec, Database):
        return spec
    if not isinstance(spec, str | os.PathLike):
        raise DatabaseError(f"a tuning log is a path, a URL or a Database, got {type(spec).__name__}")
    text = os.fspath(spec)
    if not text:
        raise DatabaseError("empty tuning log path")
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme == "sqlite" or scheme.startswith("sqlite+"):
            path = text.split("://", 1)[1]
            if not path.startswith("/") or path == "/":
                raise DatabaseError("a SQLite URL is sqlite:///relative.db or sqlite:////absolute.db", file=text)
            from .sqlite import SQLiteDatabase
            return SQLiteDatabase(path[1:] or ":memory:")
        from .sql import SQLAlchemyDatabase
        return SQLAlchemyDatabase(text)
    suffix = Path(text).suffix.lower()
    if suffix in _SQLITE_SUFFIXES:
        from .sqlite import SQLiteDatabase
        return SQLiteDatabase(text)
    if suffix == ".jsonl":
        from .jsonl import JSONLDatabase
        return JSONLDatabase(text)
    if Path(text).is_file():
        with open(text, "rb") as f:
            if f.read(16) == b"SQLite format 3\x00":
                from .sqlite import SQLiteDatabase
                return SQLiteDatabase(text)
    raise DatabaseError("unknown kind of tuning log: use a .db / .sqlite file, a .jsonl file or a database URL",
                        file=text)


@dataclass
class ImportReport:
    """What an import did: lines read, records added, duplicates skipped, corrupt lines skipped."""

    source: str
    read: int = 0
    added: int = 0
    duplicates: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"source": self.source, "read": self.read, "added": self.added, "duplicates": self.duplicates,
                "skipped": len(self.skipped), "problems": [{"line": ln, "reason": r} for ln, r in self.skipped]}

    def lines(self) -> list[str]:
        """Human-readable report."""
        out = [f"{self.source}: {self.read} records read, {self.added} added, {self.duplicates} already present, "
               f"{len(self.skipped)} corrupt lines skipped"]
        out += [f"  {self.source}, line {ln}: {reason}" for ln, reason in self.skipped[:20]]
        if len(self.skipped) > 20:
            out.append(f"  ... and {len(self.skipped) - 20} more")
        return out


def export_jsonl(db: DatabaseSpec, out: str | os.PathLike[str]) -> int:
    """Write every record of `db` to the JSONL file `out` (replaced atomically); returns the count."""
    src = open_database(db)
    out_path = Path(out)
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=out_path.name + ".", suffix=".tmp", dir=out_path.parent)
    except OSError as e:
        raise DatabaseError(f"cannot write: {e.strerror}", file=str(out)) from None
    n = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for r in src.records():
                f.write(r.to_json_line().encode() + b"\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        if src is not db:
            src.close()
    return n


def import_jsonl(db: DatabaseSpec, path: str | os.PathLike[str]) -> ImportReport:
    """Add the records of a JSONL file to `db`; corrupt lines are skipped and reported, the rest kept."""
    from .jsonl import read_jsonl
    records, problems = read_jsonl(path)
    dst = open_database(db)
    try:
        added = dst.add_many(records)
    finally:
        if dst is not db:
            dst.close()
    return ImportReport(str(path), read=len(records), added=added, duplicates=len(records) - added, skipped=problems)


@dataclass
class MergeReport:
    """Per source: records read, records new to the output, corrupt lines skipped; the output's total."""

    output: str
    sources: list[ImportReport] = field(default_factory=list)
    total: int = 0

    def lines(self) -> list[str]:
        out = [line for s in self.sources for line in s.lines()]
        return out + [f"{self.output}: {self.total} records"]

    def to_dict(self) -> dict:
        return {"output": self.output, "total": self.total, "sources": [s.to_dict() for s in self.sources]}


def merge(sources: Sequence[DatabaseSpec], out: DatabaseSpec) -> MergeReport:
    """Add every record of every source to `out` (created when missing). Merging again changes nothing."""
    from .jsonl import JSONLDatabase, read_jsonl
    dst = open_database(out)
    report = MergeReport(dst.location)
    try:
        for spec in sources:
            src = open_database(spec)
            try:
                if isinstance(src, JSONLDatabase):  # a one-shot read also reports a cut-off last line
                    recs, problems = read_jsonl(src.path)
                else:
                    recs, problems = list(src.records()), []
                added = dst.add_many(recs)
                report.sources.append(ImportReport(src.location, len(recs), added, len(recs) - added, problems))
            finally:
                if src is not spec:
                    src.close()
        report.total = dst.count()
    finally:
        if dst is not out:
            dst.close()
    return report


@dataclass(frozen=True)
class VerifyRow:
    """One re-checked best record: stored and new median, drift (new/old - 1), and whether it still passes."""

    workload_key: str
    target: str
    schedule_key: str
    ok: bool
    old_median_s: float
    new_median_s: float | None
    drift: float | None
    message: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


Recheck = Callable[[Record], tuple[bool, Iterable[float]]]


def verify(db: DatabaseSpec, recheck: Recheck, workload_key: str | None = None, target: str | None = None,
           tolerance: float = 0.25) -> list[VerifyRow]:
    """Recheck the best record of each (workload, target): `recheck(record) -> (ok, new_costs)`.

    A row is flagged (message "drift") when |new median / old median - 1| > tolerance; `ok` is what
    the recheck said (it compiles, runs and gives the right answer). Errors raised by `recheck` make
    the row not ok, with the error as message.
    """
    src = open_database(db)
    rows = []
    try:
        for m in src.bests(workload_key, target):
            r = m.record
            try:
                ok, costs = recheck(r)
                costs = [float(c) for c in costs]
                msg = ""
            except Exception as e:  # the candidate may fail to build or run now: that is the finding
                ok, costs, msg = False, [], f"{type(e).__name__}: {e}"
            new = statistics.median(costs) if costs else None
            drift = None if new is None or not r.median else new / r.median - 1.0
            if not ok and not msg:
                msg = "recheck failed"
            elif drift is not None and abs(drift) > tolerance:
                msg = "drift"
            rows.append(VerifyRow(r.workload_key, r.target, r.schedule_key, bool(ok), r.median, new, drift, msg))
    finally:
        if src is not db:
            src.close()
    return rows
