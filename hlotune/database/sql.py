"""The shared backend: PostgreSQL through a SQLAlchemy URL (a team tunes into one database).

Map:
- `SQLAlchemyDatabase(url)`: `postgresql://user:pass@host:port/db` (any SQLAlchemy PostgreSQL
  driver: psycopg2, psycopg 3). Tables are created on first use under a transaction-scoped advisory
  lock, so many tuners may open a fresh database at once. Inserts use `ON CONFLICT DO NOTHING` on the
  record uid (exact duplicates stored once). Serialization failures, deadlocks and dropped connections
  are retried; other driver errors become DatabaseError naming the URL (password hidden).
- `sqlite:///` URLs are served by `SQLiteDatabase` (see `open_database`), not here.

SQLAlchemy and the driver are imported only when a URL is opened (the `db` extra).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import DatabaseError
from .sqlbase import Execute, SqlDatabase

_SCHEMA_LOCK_KEY = 0x686C6F74  # "hlot": the advisory lock id that serializes schema creation
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57P01", "08000", "08003", "08006"}


def hide_password(url: str) -> str:
    """The URL with its password replaced by ***."""
    try:
        from sqlalchemy.engine import make_url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


def make_engine(url: Any, location: str | None = None, **engine_kwargs: Any) -> Any:
    """A SQLAlchemy engine for a PostgreSQL URL; a plain postgresql:// takes whichever driver is installed.

    (SQLAlchemy 2.0 defaults to psycopg2, 2.1 to psycopg 3; either serves, and so does pg8000.)
    """
    import sqlalchemy
    from sqlalchemy.engine import make_url
    u = make_url(url)
    names = [u.drivername]
    if "+" not in u.drivername:
        names += ["postgresql+psycopg2", "postgresql+psycopg", "postgresql+pg8000"]
    err: Exception | None = None
    for name in dict.fromkeys(names):
        try:
            return sqlalchemy.create_engine(u.set(drivername=name), pool_pre_ping=True, **engine_kwargs)
        except ImportError as e:
            err = e
    raise DatabaseError(f"no PostgreSQL driver is installed ({err}): pip install 'hlotune[db]'",
                        file=location or hide_password(str(url))) from None


class SQLAlchemyDatabase(SqlDatabase):
    """A tuning database in a PostgreSQL server, reached through a SQLAlchemy URL."""

    id_column = "BIGSERIAL PRIMARY KEY"

    def __init__(self, url: str, **engine_kwargs: Any):
        self.location = hide_password(url)
        try:
            import sqlalchemy
            from sqlalchemy.engine import make_url
        except ImportError:
            raise DatabaseError("a database URL needs SQLAlchemy: pip install 'hlotune[db]'",
                                file=self.location) from None
        self._sa = sqlalchemy
        try:
            u = make_url(url)
        except Exception as e:
            raise DatabaseError(f"not a valid database URL: {e}", file=self.location) from None
        if u.get_backend_name() != "postgresql":
            raise DatabaseError(f"unsupported database kind {u.get_backend_name()!r} "
                                "(use postgresql://..., sqlite:///FILE, a .db or a .jsonl path)", file=self.location)
        self._engine = make_engine(u, location=self.location, **engine_kwargs)
        try:
            self._init_schema()
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Execute]:
        if self._engine is None:
            raise DatabaseError("the database is closed", file=self.location)
        text = self._sa.text
        with self._engine.begin() as conn:
            yield lambda sql, params: conn.execute(text(sql), params)

    def _lock_schema(self, execute: Execute) -> None:
        execute("SELECT pg_advisory_xact_lock(:k)", {"k": _SCHEMA_LOCK_KEY})

    def _is_transient(self, exc: BaseException) -> bool:
        exc_mod = self._sa.exc
        if isinstance(exc, exc_mod.DBAPIError) and exc.connection_invalidated:
            return True
        orig = getattr(exc, "orig", None)
        code = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)
        if code in _TRANSIENT_SQLSTATES:
            return True
        # a concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog
        return code == "23505" and "pg_type" in str(orig)

    def _table_exists(self, execute: Execute, name: str) -> bool:
        return execute("SELECT to_regclass(:n) IS NOT NULL", {"n": name}).fetchone()[0]

    def _wrap(self, exc: BaseException, doing: str) -> DatabaseError:
        orig = getattr(exc, "orig", None) or exc
        msg = " ".join(str(orig).split())
        return DatabaseError(f"{doing} failed: {msg}", file=self.location)

    def close(self) -> None:
        engine, self._engine = getattr(self, "_engine", None), None
        if engine is not None:
            engine.dispose()
