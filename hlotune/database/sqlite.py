"""The embedded default backend: one SQLite file (stdlib sqlite3).

Map:
- `SQLiteDatabase(path)`: opens (creating it and its folder when missing) a database file in WAL mode
  with `synchronous=FULL`, so several processes may read and write at once and a committed record
  survives a crash of the writer. Writes take `BEGIN IMMEDIATE` (no lock upgrades, so no deadlocks);
  lock waits use SQLite's busy timeout and then `SqlDatabase._run`'s retries with backoff.
- A file that is not SQLite, or not readable, is a DatabaseError naming the file.
- A read-only file (or folder) is opened read-only: queries work, writes raise DatabaseError.

One object per process: open the database again in a child process rather than sharing it across fork.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import DatabaseError
from .sqlbase import RETRY_SECONDS, Execute, SqlDatabase

BUSY_TIMEOUT_MS = 10_000


class SQLiteDatabase(SqlDatabase):
    """A tuning database in one SQLite file."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.location = str(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self.read_only = False
        if self.path.is_dir():
            raise DatabaseError("is a folder, not a database file", file=self.location)
        exists = self.path.exists()
        if exists and self.path.stat().st_size > 0:
            self._check_header()
        if not exists:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise DatabaseError(f"cannot create the folder: {e.strerror}", file=self.location) from None
        self.read_only = exists and not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK))
        self._connect()
        try:
            self._init_schema()
        except BaseException:
            self.close()
            raise

    def _check_header(self) -> None:
        try:
            with open(self.path, "rb") as f:
                head = f.read(16)
        except OSError as e:
            raise DatabaseError(f"cannot read: {e.strerror}", file=self.location) from None
        if head != b"SQLite format 3\x00":
            raise DatabaseError("is not an SQLite database (expected an hlotune .db file)", file=self.location)

    def _connect(self) -> None:
        try:
            if self.read_only:
                uri = self.path.resolve().as_uri() + "?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                             check_same_thread=False)
            else:
                self._conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                             check_same_thread=False)
            self._pragmas()
        except sqlite3.Error as e:
            self.close()
            raise self._wrap(e, "opening") from e

    def _pragmas(self) -> None:
        """Busy timeout, WAL mode and full sync; switching to WAL is retried while another process holds a lock."""
        conn = self._conn
        assert conn is not None
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = FULL")
        if self.read_only:
            return
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() == "wal":
                    return
                err: sqlite3.Error = sqlite3.OperationalError(f"journal mode stayed {mode!r}")
            except sqlite3.OperationalError as e:
                err = e
            if not self._is_transient(err) or time.monotonic() > deadline:
                raise err
            time.sleep(0.01 + 0.02 * random.random())

    # -- SqlDatabase hooks ---------------------------------------------------------------------
    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Execute]:
        if self._conn is None:
            raise DatabaseError("the database is closed", file=self.location)
        if write and self.read_only:
            raise DatabaseError("is read-only; cannot write records", file=self.location)
        conn = self._conn
        with self._lock:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield lambda sql, params: conn.execute(sql, params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _is_transient(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        msg = str(exc).lower()
        return "locked" in msg or "busy" in msg

    def _table_exists(self, execute: Execute, name: str) -> bool:
        return execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :n", {"n": name}).fetchone() \
            is not None

    def _wrap(self, exc: BaseException, doing: str) -> DatabaseError:
        msg = str(exc)
        if "file is not a database" in msg or "malformed" in msg:
            return DatabaseError(f"is not a valid SQLite database ({msg})", file=self.location)
        return DatabaseError(f"{doing} failed: {msg}", file=self.location)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
