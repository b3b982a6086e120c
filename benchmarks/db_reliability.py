"""Reliability figures of the tuning database backends (docs/reliability.md).

    .venv/bin/python benchmarks/db_reliability.py [--writers 4] [--per-writer 250] [--postgres URL] [--json]

For SQLite, JSONL and (when a URL is given, or HLOTUNE_POSTGRES_URL is set) PostgreSQL:
- concurrent writers: N processes each commit M records, one per transaction, into one fresh database
  at once; records committed vs records found afterwards (must be equal);
- a writer killed with SIGKILL while writing batches: the database still opens, and every record
  committed before the kill is there;
- corrupt JSONL on import: lines skipped, counted and reported; the good records imported.
Start a PostgreSQL server for it with `eval "$(bash scripts/ci_postgres.sh)"`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

from hlotune import config
from hlotune.database import import_jsonl
from hlotune.database.stress import concurrent_write, kill_writer, write_corrupt_jsonl


def fresh_pg_url(url: str) -> tuple[str, object, str]:
    """A URL pointing at a fresh schema of the server (dropped at the end)."""
    import sqlalchemy

    from hlotune.database.sql import make_engine
    schema = f"hlotune_bench_{uuid.uuid4().hex[:10]}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}", admin, schema


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--per-writer", type=int, default=250)
    ap.add_argument("--kill-after", type=int, default=100)
    ap.add_argument("--postgres", default=config.get("postgres_url"),
                    help="PostgreSQL URL (default: $HLOTUNE_POSTGRES_URL)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results: dict[str, dict] = {}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        specs = {"sqlite": str(Path(tmp) / "c.db"), "jsonl": str(Path(tmp) / "c.jsonl")}
        cleanup = []
        if args.postgres:
            specs["postgresql"], admin, schema = fresh_pg_url(args.postgres)
            cleanup.append((admin, schema))
        for name, spec in specs.items():
            c = concurrent_write(spec, args.writers, args.per_writer)
            k = kill_writer(spec, kill_after=args.kill_after, batch=10)
            results[name] = {"writers": c.writers, "committed": c.written, "found": c.found,
                             "missing": len(c.missing), "errors": c.errors, "seconds": round(c.seconds, 2),
                             "records_per_s": round(c.written / c.seconds, 1) if c.seconds else None,
                             "kill_committed": k.committed, "kill_found": k.found, "kill_missing": len(k.missing),
                             "kill_reopened": k.opened}
            ok &= c.ok and k.ok
        src = Path(tmp) / "corrupt.jsonl"
        n_bad = write_corrupt_jsonl(src, good=1000)
        rep = import_jsonl(Path(tmp) / "imported.db", src)
        results["corrupt_jsonl"] = {"good_lines": 1000, "corrupt_lines": n_bad, "imported": rep.added,
                                    "skipped": len(rep.skipped),
                                    "reported": [f"line {ln}: {r}" for ln, r in rep.skipped]}
        ok &= rep.added == 1000 and len(rep.skipped) == n_bad
        for admin, schema in cleanup:
            import sqlalchemy
            with admin.begin() as conn:
                conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
    if args.json:
        print(json.dumps(results, indent=1))
        return 0 if ok else 1
    print(f"{'backend':10s} {'writers':>7s} {'committed':>9s} {'found':>6s} {'missing':>7s} {'rec/s':>7s}   "
          f"{'killed: committed':>17s} {'found':>6s} {'reopened':>8s}")
    for name in specs:
        r = results[name]
        print(f"{name:10s} {r['writers']:7d} {r['committed']:9d} {r['found']:6d} {r['missing']:7d} "
              f"{r['records_per_s']:7.0f}   {r['kill_committed']:17d} {r['kill_found']:6d} "
              f"{str(r['kill_reopened']):>8s}")
    if not args.postgres:
        print("postgresql: skipped (no --postgres URL and HLOTUNE_POSTGRES_URL is empty)")
    c = results["corrupt_jsonl"]
    print(f"corrupt JSONL import: {c['good_lines']} good + {c['corrupt_lines']} corrupt lines -> "
          f"{c['imported']} imported, {c['skipped']} skipped and reported:")
    for line in c["reported"]:
        print(f"  {line}")
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
