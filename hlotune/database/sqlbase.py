"""SQL storage shared by the SQLite and the PostgreSQL (SQLAlchemy) backends.

Map:
- Tables (prefixed `hlotune_` so they can live in a shared database):
  `hlotune_meta(key, value)` holds `schema_version`; `hlotune_workloads(workload_key, workload)`
  stores each serialized workload once; `hlotune_records` one row per record, with the record's
  `uid` UNIQUE (exact duplicates are stored once) and its median cost (NULL when invalid) indexed
  for the best-record query.
- `SqlDatabase`: the queries, written once as SQL text with `:name` parameters (both sqlite3 and
  SQLAlchemy accept them). A backend supplies `_transaction(write)` (a context manager yielding an
  `execute(sql, params)` function), `_is_transient(exc)`, `_table_exists(execute, name)` and the DDL
  of the id column. Every transaction is retried on transient errors (locks, dropped connections).
"""

from __future__ import annotations

import abc
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..errors import DatabaseError
from .base import Database, SummaryRow
from .record import SCHEMA_VERSION, Record

Execute = Callable[[str, dict[str, Any]], Any]

_COLS = ("r.workload_key, w.workload, r.target, r.target_family, r.steps, r.schedule_key, r.costs, r.error_kind, "
         "r.error_msg, r.build_s, r.run_s, r.ts, r.version, r.id")
_FROM = "hlotune_records r LEFT JOIN hlotune_workloads w ON w.workload_key = r.workload_key"
_PAGE = 1000
RETRY_SECONDS = 120.0


def _ddl(id_column: str) -> tuple[str, ...]:
    return (
        "CREATE TABLE IF NOT EXISTS hlotune_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS hlotune_workloads (workload_key TEXT PRIMARY KEY, workload TEXT NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS hlotune_records (
            id {id_column}, uid TEXT NOT NULL UNIQUE,
            workload_key TEXT NOT NULL, target TEXT NOT NULL, target_family TEXT NOT NULL,
            schedule_key TEXT NOT NULL, steps TEXT NOT NULL, costs TEXT NOT NULL, median DOUBLE PRECISION,
            error_kind TEXT NOT NULL, error_msg TEXT NOT NULL, build_s DOUBLE PRECISION NOT NULL,
            run_s DOUBLE PRECISION NOT NULL, ts DOUBLE PRECISION NOT NULL, version TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS hlotune_records_best ON hlotune_records (workload_key, target, median)",
        "CREATE INDEX IF NOT EXISTS hlotune_records_family ON hlotune_records (workload_key, target_family, median)",
        "CREATE INDEX IF NOT EXISTS hlotune_records_sched ON hlotune_records (schedule_key, target)",
    )


_INSERT_WORKLOAD = ("INSERT INTO hlotune_workloads (workload_key, workload) VALUES (:workload_key, :workload) "
                    "ON CONFLICT (workload_key) DO NOTHING")
_INSERT_RECORD = (
    "INSERT INTO hlotune_records (uid, workload_key, target, target_family, schedule_key, steps, costs, median, "
    "error_kind, error_msg, build_s, run_s, ts, version) VALUES (:uid, :workload_key, :target, :target_family, "
    ":schedule_key, :steps, :costs, :median, :error_kind, :error_msg, :build_s, :run_s, :ts, :version) "
    "ON CONFLICT (uid) DO NOTHING")


def _row_params(r: Record) -> dict[str, Any]:
    return {"uid": r.uid, "workload_key": r.workload_key, "target": r.target, "target_family": r.target_family,
            "schedule_key": r.schedule_key, "steps": r.steps, "costs": json.dumps(list(r.costs)),
            "median": r.median if r.valid else None, "error_kind": r.error_kind, "error_msg": r.error_msg,
            "build_s": r.build_s, "run_s": r.run_s, "ts": r.timestamp, "version": r.version}


def _record(row: Any) -> Record:
    return Record(workload_key=row[0], workload=row[1] or "", target=row[2], target_family=row[3], steps=row[4],
                  schedule_key=row[5], costs=tuple(json.loads(row[6])), error_kind=row[7], error_msg=row[8],
                  build_s=row[9], run_s=row[10], timestamp=row[11], version=row[12])


def _where(**filters: str | None) -> tuple[str, dict[str, Any]]:
    conds, params = [], {}
    for col, val in filters.items():
        if val is not None:
            conds.append(f"r.{col} = :{col}")
            params[col] = val
    return (" WHERE " + " AND ".join(conds) if conds else ""), params


class SqlDatabase(Database):
    """Queries over the `hlotune_*` tables; subclasses supply connections and transactions."""

    id_column = "INTEGER PRIMARY KEY AUTOINCREMENT"

    # -- backend hooks -------------------------------------------------------------------------
    @abc.abstractmethod
    def _transaction(self, write: bool) -> AbstractContextManager[Execute]:
        """A transaction (an immediate/exclusive one when `write`); yields execute(sql, params)."""

    @abc.abstractmethod
    def _is_transient(self, exc: BaseException) -> bool:
        """True for errors worth retrying (lock timeouts, serialization failures, lost connections)."""

    @abc.abstractmethod
    def _table_exists(self, execute: Execute, name: str) -> bool:
        """Whether table `name` exists (no error raised inside the transaction)."""

    def _lock_schema(self, execute: Execute) -> None:
        """Serialize schema creation between processes (PostgreSQL: an advisory lock)."""

    @abc.abstractmethod
    def _wrap(self, exc: BaseException, doing: str) -> DatabaseError:
        """The DatabaseError to raise for a driver error."""

    # -- plumbing ------------------------------------------------------------------------------
    def _run(self, fn: Callable[[Execute], Any], write: bool, doing: str) -> Any:
        """Run fn in a transaction, retrying transient errors with backoff for up to RETRY_SECONDS."""
        deadline = time.monotonic() + RETRY_SECONDS
        delay = 0.005
        while True:
            try:
                with self._transaction(write) as execute:
                    return fn(execute)
            except DatabaseError:
                raise
            except Exception as e:
                if not self._is_transient(e) or time.monotonic() > deadline:
                    raise self._wrap(e, doing) from e
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.5)

    def _init_schema(self) -> None:
        def current(execute: Execute) -> int | None:
            if not self._table_exists(execute, "hlotune_meta"):
                return None
            row = execute("SELECT value FROM hlotune_meta WHERE key = 'schema_version'", {}).fetchone()
            return None if row is None else self._check_version(row[0])

        if self._run(current, write=False, doing="reading the schema version") == SCHEMA_VERSION:
            return

        def create(execute: Execute) -> None:
            self._lock_schema(execute)
            if current(execute) is not None:
                return
            for stmt in _ddl(self.id_column):
                execute(stmt, {})
            execute("INSERT INTO hlotune_meta (key, value) VALUES ('schema_version', :v) ON CONFLICT (key) DO NOTHING",
                    {"v": str(SCHEMA_VERSION)})
            execute("INSERT INTO hlotune_meta (key, value) VALUES ('created_at', :v) ON CONFLICT (key) DO NOTHING",
                    {"v": repr(time.time())})

        self._run(create, write=True, doing="creating the tables")

    def _check_version(self, value: str) -> int:
        try:
            v = int(value)
        except ValueError:
            raise DatabaseError(f"schema version {value!r} is not a number", file=self.location) from None
        if v > SCHEMA_VERSION:
            raise DatabaseError(f"the database has schema version {v}, newer than the versions this hlotune "
                                f"reads (1 to {SCHEMA_VERSION}); upgrade hlotune", file=self.location)
        return v

    def schema_version(self) -> int:
        """The schema version stored in the meta table."""
        row = self._run(lambda ex: ex("SELECT value FROM hlotune_meta WHERE key = 'schema_version'", {}).fetchone(),
                        write=False, doing="reading the schema version")
        return int(row[0])

    # -- writes --------------------------------------------------------------------------------
    def add_many(self, records: Iterable[Record]) -> int:
        recs = list(records)
        for r in recs:
            if not isinstance(r, Record):
                raise DatabaseError(f"can only store Record objects, got {type(r).__name__}", file=self.location)
        added = 0
        for start in range(0, len(recs), 500):
            added += self._run(lambda ex, chunk=recs[start:start + 500]: self._insert(ex, chunk), write=True,
                               doing="writing records")
        return added

    def _insert(self, execute: Execute, recs: list[Record]) -> int:
        n = 0
        seen: set[str] = set()
        for r in recs:
            if r.workload and r.workload_key not in seen:
                execute(_INSERT_WORKLOAD, {"workload_key": r.workload_key, "workload": r.workload})
                seen.add(r.workload_key)
            n += max(execute(_INSERT_RECORD, _row_params(r)).rowcount, 0)
        return n

    # -- reads ---------------------------------------------------------------------------------
    def records(self, workload_key: str | None = None, target: str | None = None,
                target_family: str | None = None) -> Iterator[Record]:
        where, params = _where(workload_key=workload_key, target=target, target_family=target_family)
        cond = (where + " AND" if where else " WHERE") + " r.id > :after"
        after = 0
        while True:
            sql = f"SELECT {_COLS} FROM {_FROM}{cond} ORDER BY r.id LIMIT {_PAGE}"
            rows = self._run(lambda ex, q=sql, a=after: ex(q, {**params, "after": a}).fetchall(), write=False,
                             doing="reading records")
            yield from (_record(row) for row in rows)
            if len(rows) < _PAGE:
                return
            after = rows[-1][13]

    def _ordered_valid(self, where: str, params: dict[str, Any], k: int) -> list[Record]:
        limit = max(4 * k + 16, 0)
        while True:
            sql = (f"SELECT {_COLS} FROM {_FROM}{where} AND r.error_kind = 'none' "
                   f"ORDER BY r.median, r.id LIMIT {limit}")
            rows = self._run(lambda ex, q=sql: ex(q, params).fetchall(), write=False, doing="querying best records")
            out: dict[str, Record] = {}
            for row in rows:
                out.setdefault(row[5], _record(row))
            if len(out) >= k or len(rows) < limit:
                return list(out.values())[:k]
            limit *= 4

    def top_k(self, workload_key: str, target: str, k: int, family: str | None = None) -> list[Record]:
        if k <= 0:
            return []
        out = self._ordered_valid(*_where(workload_key=workload_key, target=target), k)
        if not out and family:
            out = self._top_family(workload_key, family, k)
        return out

    def _top_family(self, workload_key: str, family: str, k: int) -> list[Record]:
        return self._ordered_valid(*_where(workload_key=workload_key, target_family=family), k)

    def has(self, schedule_key: str, target: str) -> bool:
        row = self._run(lambda ex: ex("SELECT 1 FROM hlotune_records WHERE schedule_key = :s AND target = :t LIMIT 1",
                                      {"s": schedule_key, "t": target}).fetchone(), write=False, doing="querying")
        return row is not None

    def schedule_keys(self, workload_key: str | None = None, target: str | None = None) -> set[str]:
        where, params = _where(workload_key=workload_key, target=target)
        rows = self._run(lambda ex: ex(f"SELECT DISTINCT r.schedule_key FROM hlotune_records r{where}", params)
                         .fetchall(), write=False, doing="querying")
        return {row[0] for row in rows}

    def count(self, workload_key: str | None = None, target: str | None = None, valid_only: bool = False) -> int:
        where, params = _where(workload_key=workload_key, target=target, error_kind="none" if valid_only else None)
        row = self._run(lambda ex: ex(f"SELECT COUNT(*) FROM hlotune_records r{where}", params).fetchone(),
                        write=False, doing="counting records")
        return int(row[0])

    def workload(self, workload_key: str) -> str | None:
        row = self._run(lambda ex: ex("SELECT workload FROM hlotune_workloads WHERE workload_key = :wk",
                                      {"wk": workload_key}).fetchone(), write=False, doing="querying")
        return None if row is None else row[0]

    def summary(self) -> list[SummaryRow]:
        sql = ("SELECT workload_key, target, error_kind, COUNT(*), MIN(median), MIN(target_family) "
               "FROM hlotune_records GROUP BY workload_key, target, error_kind")
        rows = self._run(lambda ex: ex(sql, {}).fetchall(), write=False, doing="summarizing")
        acc: dict[tuple[str, str], list] = {}
        for wk, t, kind, n, med, fam in rows:
            a = acc.setdefault((wk, t), [fam, 0, 0, None, Counter()])
            a[1] += n
            if kind == "none":
                a[2] += n
                a[3] = med
            else:
                a[4][kind] += n
        return [SummaryRow(wk, t, a[0], a[1], a[2], a[3], tuple(sorted(a[4].items())))
                for (wk, t), a in sorted(acc.items())]
