"""hlotune's tuning database: SQLite (embedded default), PostgreSQL (shared, SQLAlchemy URL), JSONL (exchange).

Map:
- `record.py`: `Record` (one measurement), `ERROR_KINDS`, `SCHEMA_VERSION`.
- `base.py`: the `Database` interface and its generic queries; `BestMatch`, `SummaryRow`.
- `sqlbase.py`: the SQL tables and queries shared by `sqlite.py` (`SQLiteDatabase`) and
  `sql.py` (`SQLAlchemyDatabase`, PostgreSQL).
- `jsonl.py`: `JSONLDatabase`, `read_jsonl`.
- `ops.py`: `open_database(spec)`, `export_jsonl`, `import_jsonl`, `merge`, `verify`.
- `cli.py`: the `hlotune db ...` subcommands.
- `stress.py`: concurrent writers and kill tests (used by tests and `benchmarks/db_reliability.py`).

Usage::

    db = open_database("logs/tune.db")          # or "x.jsonl", "postgresql://user@host/db"
    db.add(Record(workload_key=..., workload=..., target=fp, target_family=fam, steps=..., schedule_key=...,
                  costs=(1.2e-3, 1.1e-3, 1.2e-3)))
    m = db.best(workload_key, fp, family=fam)   # BestMatch(record, "exact" | "family") or None
"""

from .base import BestMatch, Database, SummaryRow
from .jsonl import JSONLDatabase, read_jsonl
from .ops import ImportReport, MergeReport, VerifyRow, export_jsonl, import_jsonl, merge, open_database, verify
from .record import ERROR_KINDS, SCHEMA_VERSION, Record, hlotune_version
from .sqlite import SQLiteDatabase

__all__ = [
    "BestMatch", "Database", "SummaryRow", "JSONLDatabase", "read_jsonl", "ImportReport", "MergeReport",
    "VerifyRow", "export_jsonl", "import_jsonl", "merge", "open_database", "verify", "ERROR_KINDS",
    "SCHEMA_VERSION", "Record", "hlotune_version", "SQLiteDatabase",
]
