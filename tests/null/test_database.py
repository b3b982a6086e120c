"""Tuning database: records, the SQLite and JSONL backends, import/export/merge, the `db` command,
concurrent writers, a killed writer and corrupt input.

The backend contract (`check_contract`) compares every query with a plain-Python reference computed
from the same records; tests/null/test_database_postgres.py runs it against PostgreSQL too.
"""

from __future__ import annotations

import io
import json
import random
import sqlite3
import statistics

import pytest

from hlotune.database import (
    ERROR_KINDS,
    SCHEMA_VERSION,
    Database,
    JSONLDatabase,
    Record,
    SQLiteDatabase,
    export_jsonl,
    import_jsonl,
    merge,
    open_database,
    read_jsonl,
    verify,
)
from hlotune.database import cli as dbcli
from hlotune.database.stress import concurrent_write, kill_writer, synthetic_record, write_corrupt_jsonl
from hlotune.errors import DatabaseError, HlotuneError

# -- reference data and the contract every backend must meet ---------------------------------------


def random_records(seed: int = 0, n: int = 120) -> list[Record]:
    """Records over 3 workloads x 3 targets (two of one family), with errors and repeated schedules."""
    rng = random.Random(seed)
    targets = [("fp-a1", "fam-a"), ("fp-a2", "fam-a"), ("fp-b", "fam-b")]
    out = []
    for i in range(n):
        wk = f"wk{rng.randrange(3)}"
        if wk == "wk2" and rng.random() < 0.8:
            t, fam = targets[0]  # wk2 is mostly measured on fp-a1, rarely elsewhere
        else:
            t, fam = targets[rng.randrange(3)]
        kind = rng.choice(["none"] * 6 + list(ERROR_KINDS[1:]))
        costs = tuple(rng.uniform(1e-4, 1e-2) for _ in range(rng.randrange(1, 5)))
        if kind not in ("none", "wrong_answer"):
            costs = ()
        elif kind == "wrong_answer":
            costs = tuple(c / 100 for c in costs)  # fast but wrong: must never be best
        out.append(Record(wk, json.dumps({"workload": wk}), t, fam, json.dumps([["SP", i % 5]]),
                          f"s{rng.randrange(40)}", costs=costs, error_kind=kind,
                          error_msg="" if kind == "none" else f"failed {i}", build_s=rng.random(),
                          run_s=rng.random(), timestamp=1.7e9 + i * 0.25))
    return out


def ref_best(records, wk, t=None, fam=None):
    cands = [(r.median, i, r) for i, r in enumerate(records) if r.workload_key == wk and r.error_kind == "none"
             and (t is None or r.target == t) and (fam is None or r.target_family == fam)]
    return min(cands, key=lambda c: (c[0], c[1]))[2] if cands else None


def check_contract(db: Database, seed: int = 0) -> None:
    """Every query of `db` (empty at the start) agrees with the reference on random records."""
    recs = random_records(seed)
    assert db.count() == 0 and db.best("wk0", "fp-a1") is None
    assert db.add_many(recs[:60]) == 60
    assert all(db.add(r) for r in recs[60:])
    assert db.add_many(recs) == 0 and not db.add(recs[0])  # exact duplicates are stored once
    assert list(db.records()) == recs
    assert len(db) == db.count() == len(recs)
    for wk in ("wk0", "wk1", "wk2", "wk9"):
        assert db.workload(wk) == (None if wk == "wk9" else json.dumps({"workload": wk}))
        for t, fam in (("fp-a1", "fam-a"), ("fp-a2", "fam-a"), ("fp-b", "fam-b"), ("fp-new", "fam-a")):
            exact = ref_best(recs, wk, t)
            m = db.best(wk, t, family=fam)
            if exact is not None:
                assert m is not None and m.matched == "exact" and m.record == exact
            elif ref_best(recs, wk, fam=fam) is not None:
                assert m is not None and m.matched == "family"
                assert m.record.median == ref_best(recs, wk, fam=fam).median
                assert db.best(wk, t) is None  # no fallback without a family
            else:
                assert m is None
            assert list(db.records(wk, t)) == [r for r in recs if r.workload_key == wk and r.target == t]
            assert db.count(wk, t) == sum(r.workload_key == wk and r.target == t for r in recs)
            assert db.count(wk, t, valid_only=True) == sum(r.workload_key == wk and r.target == t and r.valid
                                                          for r in recs)
            top = db.top_k(wk, t, 5)
            meds = sorted({r.schedule_key: min(q.median for q in recs if q.schedule_key == r.schedule_key and
                                               q.workload_key == wk and q.target == t and q.valid)
                           for r in recs if r.workload_key == wk and r.target == t and r.valid}.values())[:5]
            assert [r.median for r in top] == meds
            assert len({r.schedule_key for r in top}) == len(top)
            assert db.schedule_keys(wk, t) == {r.schedule_key for r in recs if r.workload_key == wk and r.target == t}
    for r in recs[:30]:
        assert db.has(r.schedule_key, r.target)
    assert not db.has("s-never", "fp-a1") and not db.has(recs[0].schedule_key, "fp-other")
    rows = {(s.workload_key, s.target): s for s in db.summary()}
    assert set(rows) == {(r.workload_key, r.target) for r in recs}
    for (wk, t), s in rows.items():
        mine = [r for r in recs if r.workload_key == wk and r.target == t]
        assert s.records == len(mine) and s.valid == sum(r.valid for r in mine)
        best = ref_best(recs, wk, t)
        assert s.best_median_s == (best.median if best else None)
        assert dict(s.errors) == {k: sum(r.error_kind == k for r in mine) for k in ERROR_KINDS[1:]
                                  if any(r.error_kind == k for r in mine)}
    assert all(m.record == ref_best(recs, m.record.workload_key, m.record.target) for m in db.bests())


@pytest.fixture(params=["sqlite", "jsonl", "sqlite-url"])
def backend_spec(request, tmp_path):
    return {"sqlite": str(tmp_path / "t.db"), "jsonl": str(tmp_path / "t.jsonl"),
            "sqlite-url": f"sqlite:///{tmp_path}/u.sqlite"}[request.param]


def test_contract(backend_spec):
    with open_database(backend_spec) as db:
        check_contract(db)
    with open_database(backend_spec) as db:  # everything survives reopening
        assert list(db.records()) == random_records(0)


# -- records --------------------------------------------------------------------------------------


def test_record_validation_and_identity():
    r = synthetic_record(1, 2)
    assert Record.from_json_line(r.to_json_line()) == r
    assert r.median == statistics.median(r.costs) and r.valid
    same = Record(**{**r.__dict__})
    assert same.uid == r.uid
    assert Record(**{**r.__dict__, "costs": (1.0,)}).uid != r.uid
    assert Record(**{**r.__dict__, "timestamp": r.timestamp + 1}).uid != r.uid
    assert Record(**{**r.__dict__, "error_msg": "other"}).uid == r.uid  # identity ignores the message
    for bad in ({"error_kind": "exploded"}, {"costs": ()}, {"costs": (-1.0,)}, {"costs": (float("nan"),)},
                {"schedule_key": ""}, {"workload_key": 3}):
        with pytest.raises(DatabaseError):
            Record(**{**r.__dict__, **bad})
    with pytest.raises(DatabaseError, match="schema version 2"):
        Record.from_dict({**r.to_dict(), "schema": SCHEMA_VERSION + 1})


# -- opening, versions, not-a-database ------------------------------------------------------------


def test_open_database_dispatch(tmp_path):
    assert isinstance(open_database(tmp_path / "a.db"), SQLiteDatabase)
    assert isinstance(open_database(str(tmp_path / "a.sqlite")), SQLiteDatabase)
    assert isinstance(open_database(tmp_path / "sub" / "a.jsonl"), JSONLDatabase)
    db = open_database(f"sqlite:///{tmp_path}/b.db")
    assert isinstance(db, SQLiteDatabase) and (tmp_path / "b.db").exists()
    assert open_database(db) is db
    with pytest.raises(DatabaseError, match="unknown kind"):
        open_database(tmp_path / "a.txt")
    with pytest.raises(DatabaseError):
        open_database(42)
    with pytest.raises(DatabaseError, match="unsupported database kind"):
        open_database("mysql://u@h/db")


def test_newer_schema_is_a_clear_error(tmp_path):
    path = tmp_path / "new.db"
    with open_database(path) as db:
        db.add(synthetic_record(0, 0))
        assert db.schema_version() == SCHEMA_VERSION
    con = sqlite3.connect(path)
    con.execute("UPDATE hlotune_meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(DatabaseError) as e:
        open_database(path)
    assert str(path) in str(e.value) and "99" in str(e.value) and f"1 to {SCHEMA_VERSION}" in str(e.value)
    jl = tmp_path / "new.jsonl"
    jl.write_text(synthetic_record(0, 0).to_json_line() + "\n"
                  + json.dumps({**synthetic_record(0, 1).to_dict(), "schema": 99}) + "\n")
    with pytest.raises(DatabaseError) as e:
        open_database(jl)
    assert str(jl) in str(e.value) and "line 2" in str(e.value) and "99" in str(e.value)


@pytest.mark.parametrize("name,content", [("x.db", b"this is plain text, not SQLite\n" * 10),
                                          ("y.db", bytes(range(256)) * 8),
                                          ("z.jsonl", b"SQLite format 3\x00" + bytes(100)),
                                          ("w.jsonl", b"hello\nworld\n")])
def test_not_a_database(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DatabaseError) as e:
        open_database(path)
    assert str(path) in str(e.value)
    assert path.read_bytes() == content  # never touched


def test_sqlite_file_corrupted_after_header(tmp_path):
    path = tmp_path / "c.db"
    with open_database(path) as db:
        db.add_many([synthetic_record(0, i) for i in range(50)])
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # smash the schema page
    path.write_bytes(bytes(data))
    with pytest.raises(DatabaseError) as e:
        with open_database(path) as db:
            list(db.records())
    assert str(path) in str(e.value)


def test_read_only_sqlite_file(tmp_path):
    path = tmp_path / "ro.db"
    with open_database(path) as db:
        db.add_many([synthetic_record(0, i) for i in range(5)])
    path.chmod(0o444)
    try:
        with open_database(path) as db:
            if not db.read_only:  # root ignores file modes
                pytest.skip("running as root: the file stays writable")
            assert db.count() == 5
            with pytest.raises(DatabaseError, match="read-only"):
                db.add(synthetic_record(0, 9))
    finally:
        path.chmod(0o644)


# -- JSONL: corrupt lines, cut-off writes ------------------------------------------------------------


def test_import_corrupt_jsonl_skips_counts_reports(tmp_path):
    src = tmp_path / "in.jsonl"
    n_bad = write_corrupt_jsonl(src, good=20)
    good = [synthetic_record(5, i) for i in range(20)]
    rep = import_jsonl(tmp_path / "out.db", src)
    assert (rep.read, rep.added, rep.duplicates, len(rep.skipped)) == (20, 20, 0, n_bad)
    assert [ln for ln, _ in rep.skipped] == [2, 4, 6, 8, 10, 12, 27]
    assert "cut-off" in rep.skipped[-1][1] and any("line 4" in s for s in rep.lines())
    with open_database(tmp_path / "out.db") as db:
        assert list(db.records()) == good
    rep2 = import_jsonl(tmp_path / "out.db", src)  # importing again adds nothing
    assert (rep2.added, rep2.duplicates) == (0, 20)


def test_jsonl_append_after_cut_off_line_loses_nothing(tmp_path):
    path = tmp_path / "log.jsonl"
    first = [synthetic_record(1, i) for i in range(3)]
    path.write_bytes(b"".join(r.to_json_line().encode() + b"\n" for r in first)
                     + synthetic_record(1, 3).to_json_line().encode()[:50])  # a writer killed mid-line
    with open_database(path) as db:
        assert list(db.records()) == first
        assert db.add(synthetic_record(1, 4))
        assert db.problems == [(4, db.problems[0][1])]  # the cut-off line is now one corrupt line
    records, problems = read_jsonl(path)
    assert records == first + [synthetic_record(1, 4)] and [ln for ln, _ in problems] == [4]


def test_jsonl_two_handles_see_each_other(tmp_path):
    a, b = JSONLDatabase(tmp_path / "s.jsonl"), JSONLDatabase(tmp_path / "s.jsonl")
    assert a.add(synthetic_record(0, 0))
    assert not b.add(synthetic_record(0, 0))  # b catches up under the lock: stored once
    assert b.add(synthetic_record(0, 1)) and a.count() == 2 and a.has("s-0-1", "fp-stress")
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 2


# -- export / import / merge -----------------------------------------------------------------------


def test_export_import_roundtrip(tmp_path):
    recs = random_records(3, 60)
    with open_database(tmp_path / "a.db") as db:
        db.add_many(recs)
    assert export_jsonl(tmp_path / "a.db", tmp_path / "a.jsonl") == 60
    rep = import_jsonl(tmp_path / "b.db", tmp_path / "a.jsonl")
    assert (rep.added, rep.skipped) == (60, [])
    with open_database(tmp_path / "b.db") as db:
        assert list(db.records()) == recs


def test_merge_is_idempotent_and_keeps_conflicts(tmp_path):
    a_recs = random_records(1, 50)
    b_recs = random_records(2, 50)
    # the same schedule measured again (different costs and time): a conflict, both kept
    conflict = Record(**{**a_recs[0].__dict__, "costs": (5e-3,), "error_kind": "none", "timestamp": 2e9})
    with open_database(tmp_path / "a.db") as db:
        db.add_many(a_recs)
    with open_database(tmp_path / "b.jsonl") as db:
        db.add_many(b_recs + a_recs[:10] + [conflict])  # 10 exact duplicates of A's records
    rep = merge([tmp_path / "a.db", tmp_path / "b.jsonl"], tmp_path / "c.db")
    assert rep.total == 101 and [s.added for s in rep.sources] == [50, 51]
    before = export_jsonl(tmp_path / "c.db", tmp_path / "c1.jsonl")
    rep2 = merge([tmp_path / "a.db", tmp_path / "b.jsonl"], tmp_path / "c.db")
    assert rep2.total == 101 and [s.added for s in rep2.sources] == [0, 0]
    export_jsonl(tmp_path / "c.db", tmp_path / "c2.jsonl")
    assert before == 101 and (tmp_path / "c1.jsonl").read_bytes() == (tmp_path / "c2.jsonl").read_bytes()
    merge([tmp_path / "c.db"], tmp_path / "d.jsonl")
    merge([tmp_path / "c.db", tmp_path / "d.jsonl"], tmp_path / "d.jsonl")
    with open_database(tmp_path / "d.jsonl") as db:
        assert db.count() == 101
        assert sum(r.schedule_key == a_recs[0].schedule_key and r.target == a_recs[0].target
                   and r.workload_key == a_recs[0].workload_key for r in db.records()) >= 2


def test_verify_reports_drift_and_failures(tmp_path):
    recs = random_records(4, 80)
    with open_database(tmp_path / "v.db") as db:
        db.add_many(recs)
        bests = db.bests()

    def recheck(r):
        if r.workload_key == "wk1":
            raise RuntimeError("no longer compiles")
        return True, [c * (2.0 if r.workload_key == "wk0" else 1.0) for c in r.costs]

    rows = verify(tmp_path / "v.db", recheck)
    assert [(r.workload_key, r.target) for r in rows] == [(m.record.workload_key, m.record.target) for m in bests]
    for row in rows:
        if row.workload_key == "wk1":
            assert not row.ok and "no longer compiles" in row.message
        elif row.workload_key == "wk0":
            assert row.ok and row.drift == pytest.approx(1.0) and row.message == "drift"
        else:
            assert row.ok and row.drift == pytest.approx(0.0) and row.message == ""


# -- the `db` command -------------------------------------------------------------------------------


def run_cli(argv, recheck=None):
    import argparse
    parser = argparse.ArgumentParser(prog="hlotune")
    dbcli.add_db_parser(parser.add_subparsers(dest="command"))
    out = io.StringIO()
    code = dbcli.run_db(parser.parse_args(["db", *argv]), recheck=recheck, out=out)
    return code, out.getvalue()


def test_cli_show_best_export_import_merge(tmp_path):
    recs = random_records(5, 60)
    db_path = str(tmp_path / "x.db")
    with open_database(db_path) as db:
        db.add_many(recs)
        summary = db.summary()
    code, text = run_cli(["show", db_path, "--json"])
    assert code == 0 and json.loads(text) == [s.to_dict() for s in summary]
    code, text = run_cli(["show", db_path])
    assert code == 0 and "best ms" in text and f"{summary[0].best_median_s * 1e3:.4f}" in text
    assert f"{len(recs)} records" in text
    code, text = run_cli(["best", db_path, "--json", "--workload", "wk2"])
    got = json.loads(text)
    assert [(g["target"], g["median_s"]) for g in got] == [
        (s.target, s.best_median_s) for s in summary if s.workload_key == "wk2" and s.valid]
    code, text = run_cli(["best", db_path, "--workload", "wk2", "--target", "fp-zz", "--family", "fam-a", "--json"])
    assert json.loads(text)[0]["matched"] == "family"
    code, text = run_cli(["export", db_path, "--jsonl", str(tmp_path / "x.jsonl")])
    assert code == 0 and "60 records" in text
    code, text = run_cli(["import", str(tmp_path / "y.db"), str(tmp_path / "x.jsonl"), "--json"])
    assert json.loads(text)["added"] == 60
    code, text = run_cli(["merge", db_path, str(tmp_path / "y.db"), "-o", str(tmp_path / "z.jsonl")])
    assert code == 0 and "z.jsonl: 60 records" in text
    code, text = run_cli(["verify", db_path, "--json"], recheck=lambda r: (True, r.costs))
    assert code == 0 and all(row["ok"] and row["drift"] == 0 for row in json.loads(text))
    code, text = run_cli(["verify", db_path], recheck=lambda r: (False, []))
    assert code == 1 and "failed" in text


def test_cli_user_errors(tmp_path, capsys):
    with pytest.raises(HlotuneError, match="no such tuning database"):
        run_cli(["show", str(tmp_path / "missing.db")])
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(HlotuneError, match="needs the compiler"):
        run_cli(["verify", str(tmp_path / "missing.db")])
    (tmp_path / "bad.db").write_text("not a database")
    assert dbcli.main(["show", str(tmp_path / "bad.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.db" in err


# -- reliability: concurrent writers, a killed writer ---------------------------------------------------


@pytest.mark.parametrize("name", ["c.db", "c.jsonl"])
def test_concurrent_writers_lose_nothing(tmp_path, name):
    res = concurrent_write(str(tmp_path / name), writers=4, per_writer=40, batch=1)
    assert res.errors == [] and res.written == 160 and res.found == 160 and res.missing == []


@pytest.mark.parametrize("name", ["k.db", "k.jsonl"])
def test_killed_writer_keeps_committed_records(tmp_path, name):
    spec = str(tmp_path / name)
    with open_database(spec) as db:
        db.add_many([synthetic_record(0, i) for i in range(10)])
    res = kill_writer(spec, kill_after=25, batch=5)
    assert res.opened and res.committed >= 25 and res.missing == [] and res.found == res.committed
    with open_database(spec) as db:
        assert db.count() >= 10 + res.committed
        assert db.add(synthetic_record(0, 99))  # still writable
