"""The exchange backend: a JSONL file, one record per line (human-readable, `cat`-able, diff-able).

Map:
- `JSONLDatabase(path)`: the records of the file, kept in memory and refreshed incrementally (only the
  bytes appended since the last read are parsed, and only complete lines).
- Appends take an exclusive `flock` on the file, catch up with what other appenders wrote, skip records
  already present (same uid), write whole lines in one `write`, then `flush` + `fsync`. A line cut short
  by a killed writer is closed with a newline before the next append, so it can never swallow a record;
  it then reads as one corrupt line.
- Corrupt lines are skipped and listed in `problems` as (line number, reason); the records around them
  are kept. A line with a newer schema version is a DatabaseError (upgrade hlotune), and so is a
  non-empty file with no record at all (not a tuning log).
- `read_jsonl(path)`: a one-shot parse of a file for import: (records, problems), counting a cut-off
  last line as a problem too.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import DatabaseError
from .base import Database
from .record import NewerSchemaError, Record


def _parse_lines(data: bytes, first_line: int, location: str) -> tuple[list[Record], list[tuple[int, str]]]:
    """Parse complete lines; returns records and (line number, reason) for each corrupt line."""
    records: list[Record] = []
    problems: list[tuple[int, str]] = []
    for i, raw in enumerate(data.split(b"\n")):
        line_no = first_line + i
        text = raw.strip()
        if not text:
            continue
        try:
            records.append(Record.from_json_line(text.decode("utf-8")))
        except UnicodeDecodeError:
            problems.append((line_no, "not UTF-8 text"))
        except NewerSchemaError as e:
            raise DatabaseError(e.message, file=location, line=line_no) from None
        except DatabaseError as e:
            problems.append((line_no, e.message))
    return records, problems


def read_jsonl(path: str | os.PathLike[str]) -> tuple[list[Record], list[tuple[int, str]]]:
    """All records of a JSONL file and its corrupt lines (a cut-off last line included)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DatabaseError(f"cannot read: {e.strerror}", file=str(path)) from None
    records, problems = _parse_lines(data, 1, str(path))
    last = data.count(b"\n") + 1
    if problems and problems[-1][0] == last and not data.endswith(b"\n"):
        # a last line without newline that does not parse: most likely a writer killed mid-line
        problems[-1] = (last, problems[-1][1] + " (cut-off last line)")
    return records, problems


class JSONLDatabase(Database):
    """A tuning database in a JSONL file (one record per line)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.location = str(path)
        self._lock = threading.RLock()
        self._records: list[Record] = []
        self._uids: set[str] = set()
        self._sched: set[tuple[str, str]] = set()
        self._offset = 0
        self._next_line = 1
        self.problems: list[tuple[int, str]] = []
        self._closed = False
        if self.path.is_dir():
            raise DatabaseError("is a folder, not a JSONL file", file=self.location)
        if self.path.exists():
            self._check_text()
            self._refresh()
            if self.problems and not self._records:
                line, why = self.problems[0]
                raise DatabaseError(f"is not a JSONL tuning log (no record could be read; {why})",
                                    file=self.location, line=line)

    def _check_text(self) -> None:
        try:
            with open(self.path, "rb") as f:
                head = f.read(4096)
        except OSError as e:
            raise DatabaseError(f"cannot read: {e.strerror}", file=self.location) from None
        if b"\x00" in head:
            raise DatabaseError("is a binary file, not a JSONL tuning log", file=self.location)

    def _refresh(self) -> None:
        """Parse the complete lines appended since the last read."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                return
            except OSError as e:
                raise DatabaseError(f"cannot read: {e.strerror}", file=self.location) from None
            end = data.rfind(b"\n")
            if end < 0:
                return
            chunk = data[:end]
            records, problems = _parse_lines(chunk, self._next_line, self.location)
            self._offset += end + 1
            self._next_line += chunk.count(b"\n") + 1
            self.problems.extend(problems)
            for r in records:
                self._keep(r)

    def _keep(self, r: Record) -> bool:
        uid = r.uid
        if uid in self._uids:
            return False
        self._uids.add(uid)
        self._records.append(r)
        self._sched.add((r.schedule_key, r.target))
        return True

    def add_many(self, records: Iterable[Record]) -> int:
        recs = list(records)
        for r in recs:
            if not isinstance(r, Record):
                raise DatabaseError(f"can only store Record objects, got {type(r).__name__}", file=self.location)
        if self._closed:
            raise DatabaseError("the database is closed", file=self.location)
        if not recs:
            return 0
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "ab") as f:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                    try:
                        return self._append_locked(f, recs)
                    finally:
                        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            except OSError as e:
                raise DatabaseError(f"cannot write: {e.strerror}", file=self.location) from None

    def _append_locked(self, f, recs: list[Record]) -> int:
        self._refresh()
        new: list[Record] = []
        uids: set[str] = set()
        for r in recs:
            if r.uid not in self._uids and r.uid not in uids:
                uids.add(r.uid)
                new.append(r)
        if not new:
            return 0
        size = os.fstat(f.fileno()).st_size
        prefix = b""
        if size > 0:
            with open(self.path, "rb") as rf:
                rf.seek(size - 1)
                if rf.read(1) != b"\n":
                    prefix = b"\n"  # close a line cut short by a killed writer
        data = prefix + b"".join(r.to_json_line().encode() + b"\n" for r in new)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        self._refresh()
        return len(new)

    def records(self, workload_key: str | None = None, target: str | None = None,
                target_family: str | None = None) -> Iterator[Record]:
        self._refresh()
        snapshot = list(self._records)
        for r in snapshot:
            if ((workload_key is None or r.workload_key == workload_key) and (target is None or r.target == target)
                    and (target_family is None or r.target_family == target_family)):
                yield r

    def has(self, schedule_key: str, target: str) -> bool:
        self._refresh()
        return (schedule_key, target) in self._sched

    def count(self, workload_key: str | None = None, target: str | None = None, valid_only: bool = False) -> int:
        if workload_key is None and target is None and not valid_only:
            self._refresh()
            return len(self._records)
        return super().count(workload_key, target, valid_only)

    def close(self) -> None:
        self._closed = True
