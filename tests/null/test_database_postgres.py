"""The tuning database against a real PostgreSQL server (URL from HLOTUNE_POSTGRES_URL).

Start one with `eval "$(bash scripts/ci_postgres.sh)"`. Each test works in a schema of its own
(`search_path` set through the URL), dropped afterwards, so runs never see each other's records.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest

from hlotune import config
from hlotune.database import SCHEMA_VERSION, export_jsonl, import_jsonl, merge, open_database
from hlotune.database.sql import make_engine
from hlotune.database.stress import concurrent_write, kill_writer, synthetic_record, write_corrupt_jsonl
from hlotune.errors import DatabaseError
from tests.null.test_database import check_contract, random_records

URL = config.get("postgres_url")
pytestmark = pytest.mark.skipif(not URL, reason="no PostgreSQL server: set HLOTUNE_POSTGRES_URL "
                                                "(eval \"$(bash scripts/ci_postgres.sh)\")")


@pytest.fixture
def pg_url():
    """A URL whose tables live in a fresh schema."""
    import sqlalchemy
    schema = f"hlotune_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(URL)
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in URL else "?"
    yield f"{URL}{sep}options={quote(f'-csearch_path={schema}')}"
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


def test_contract_postgres(pg_url):
    with open_database(pg_url) as db:
        assert db.schema_version() == SCHEMA_VERSION
        check_contract(db, seed=7)
    with open_database(pg_url) as db:
        assert list(db.records()) == random_records(7)


def test_newer_schema_postgres(pg_url):
    import sqlalchemy
    with open_database(pg_url) as db:
        db.add(synthetic_record(0, 0))
        with db._engine.begin() as conn:
            conn.execute(sqlalchemy.text("UPDATE hlotune_meta SET value = '42' WHERE key = 'schema_version'"))
    with pytest.raises(DatabaseError) as e:
        open_database(pg_url)
    assert "42" in str(e.value) and "postgresql://" in str(e.value)


def test_postgres_exchange_with_files(pg_url, tmp_path):
    write_corrupt_jsonl(tmp_path / "in.jsonl", good=20)
    rep = import_jsonl(pg_url, tmp_path / "in.jsonl")
    assert (rep.added, len(rep.skipped)) == (20, 7)
    assert export_jsonl(pg_url, tmp_path / "out.jsonl") == 20
    with open_database(tmp_path / "a.db") as db:
        db.add_many(random_records(1, 30))
    r1 = merge([tmp_path / "a.db", tmp_path / "out.jsonl"], pg_url)
    r2 = merge([tmp_path / "a.db", tmp_path / "out.jsonl"], pg_url)
    assert r1.total == r2.total == 50 and [s.added for s in r2.sources] == [0, 0]


def test_postgres_concurrent_writers(pg_url):
    res = concurrent_write(pg_url, writers=4, per_writer=30)
    assert res.errors == [] and res.written == res.found == 120 and res.missing == []


def test_postgres_killed_writer(pg_url):
    res = kill_writer(pg_url, kill_after=20, batch=5)
    assert res.opened and res.committed >= 20 and res.missing == []


def test_unreachable_server_is_a_database_error():
    with pytest.raises(DatabaseError) as e:
        open_database("postgresql://nobody:secret@127.0.0.1:1/none")
    assert "secret" not in str(e.value) and "127.0.0.1:1" in str(e.value)
