"""`hlotune db ...`: look at, exchange and check tuning databases.

Map:
- `add_db_parser(subparsers)`: adds the `db` command and its subcommands to an argparse
  subparsers object (what hlotune/cli.py calls); `run_db(args, recheck=None, out=None)` runs the parsed
  command and returns the exit code. User errors are raised as `hlotune.errors.HlotuneError`
  (the top-level CLI prints them on one line and exits 2).
- Subcommands: `show DB`, `best DB [--workload K] [--target FP] [--family F]`, `export DB --jsonl OUT`,
  `import DB IN.jsonl`, `merge A B ... -o C`, `verify DB` (needs a `recheck` callback: the compiler).
  `--json` prints machine-readable output instead of tables.
- `main(argv)`: run `db` alone (`python -m hlotune.database.cli show logs/x.db`), with the same
  one-line error handling.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ..errors import HlotuneError, InputError
from .ops import Recheck, export_jsonl, import_jsonl, merge, open_database, verify


def add_db_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `db` and its subcommands to `subparsers` (from ArgumentParser.add_subparsers())."""
    p = subparsers.add_parser("db", help="look at, exchange and check tuning databases",
                              description="Look at, exchange and check tuning databases (a .db SQLite file, "
                                          "a .jsonl file or a postgresql:// URL).")
    sub = p.add_subparsers(dest="db_command", metavar="{show,best,export,import,merge,verify}")
    sub.required = True
    s = sub.add_parser("show", help="records, valid records, best median and errors per workload and target")
    s.add_argument("db", metavar="DB")
    s.add_argument("--json", action="store_true", help="print JSON")
    s = sub.add_parser("best", help="the best record per workload and target")
    s.add_argument("db", metavar="DB")
    s.add_argument("--workload", metavar="KEY", help="only this workload key")
    s.add_argument("--target", metavar="FP", help="only this target fingerprint")
    s.add_argument("--family", metavar="FAMILY",
                   help="with --target and --workload: fall back to this target family when the exact target has none")
    s.add_argument("--json", action="store_true", help="print the records as JSON")
    s = sub.add_parser("export", help="write every record to a JSONL file")
    s.add_argument("db", metavar="DB")
    s.add_argument("--jsonl", metavar="OUT", required=True, help="the JSONL file to write (replaced)")
    s = sub.add_parser("import", help="add the records of a JSONL file (corrupt lines are skipped and reported)")
    s.add_argument("db", metavar="DB")
    s.add_argument("input", metavar="IN.jsonl")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s = sub.add_parser("merge", help="merge databases into one (idempotent; duplicates stored once)")
    s.add_argument("sources", metavar="SRC", nargs="+")
    s.add_argument("-o", "--output", metavar="OUT", required=True, help="the database to merge into (created)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s = sub.add_parser("verify", help="recompile and re-run the stored best schedules; report drift")
    s.add_argument("db", metavar="DB")
    s.add_argument("--workload", metavar="KEY")
    s.add_argument("--target", metavar="FP")
    s.add_argument("--tolerance", type=float, default=0.25, help="flag a median drift above this fraction")
    s.add_argument("--json", action="store_true", help="print JSON")
    return p


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, columns padded; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_num(row[i]) for row in rows) and bool(rows) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(row, widths, numeric)).rstrip()

    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) or v is None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4f}"


def _existing(spec: str) -> str:
    """Commands that read a database must not create one on a typo."""
    if "://" not in spec and not Path(spec).exists():
        raise InputError("no such tuning database", file=spec)
    return spec


def _show(args: argparse.Namespace, out: TextIO) -> int:
    with open_database(_existing(args.db)) as db:
        rows = db.summary()
    if args.json:
        json.dump([r.to_dict() for r in rows], out, indent=1)
        out.write("\n")
        return 0
    if not rows:
        out.write(f"{args.db}: no records\n")
        return 0
    out.write(table(["workload", "target", "records", "valid", "best ms", "errors"],
                    [[r.workload_key, r.target, r.records, r.valid, _ms(r.best_median_s),
                      " ".join(f"{k}={n}" for k, n in r.errors) or "-"] for r in rows]) + "\n")
    out.write(f"{len(rows)} workload/target pairs, {sum(r.records for r in rows)} records\n")
    return 0


def _best(args: argparse.Namespace, out: TextIO) -> int:
    with open_database(_existing(args.db)) as db:
        if args.family and not (args.workload and args.target):
            raise InputError("--family needs --workload and --target")
        if args.workload and args.target:
            m = db.best(args.workload, args.target, family=args.family)
            matches = [m] if m is not None else []
        else:
            matches = db.bests(args.workload, args.target)
    if args.json:
        json.dump([{**m.record.to_dict(), "matched": m.matched, "median_s": m.record.median} for m in matches],
                  out, indent=1)
        out.write("\n")
        return 0
    if not matches:
        out.write("no valid record" + (f" for workload {args.workload}" if args.workload else "")
                  + (f" on target {args.target}" if args.target else "") + "\n")
        return 0
    out.write(table(["workload", "target", "matched", "median ms", "repeats", "schedule key"],
                    [[m.record.workload_key, m.record.target, m.matched, _ms(m.record.median), len(m.record.costs),
                      m.record.schedule_key] for m in matches]) + "\n")
    return 0


def _export(args: argparse.Namespace, out: TextIO) -> int:
    n = export_jsonl(_existing(args.db), args.jsonl)
    out.write(f"{n} records written to {args.jsonl}\n")
    return 0


def _import(args: argparse.Namespace, out: TextIO) -> int:
    rep = import_jsonl(args.db, _existing(args.input))
    if args.json:
        json.dump(rep.to_dict(), out, indent=1)
        out.write("\n")
    else:
        out.write("\n".join(rep.lines()) + "\n")
    return 0


def _merge(args: argparse.Namespace, out: TextIO) -> int:
    rep = merge([_existing(s) for s in args.sources], args.output)
    if args.json:
        json.dump(rep.to_dict(), out, indent=1)
        out.write("\n")
    else:
        out.write("\n".join(rep.lines()) + "\n")
    return 0


def _verify(args: argparse.Namespace, out: TextIO, recheck: Recheck | None) -> int:
    if recheck is None:
        raise HlotuneError("`db verify` needs the compiler, which this build of the command does not have")
    rows = verify(_existing(args.db), recheck, args.workload, args.target, args.tolerance)
    if args.json:
        json.dump([r.to_dict() for r in rows], out, indent=1)
        out.write("\n")
    else:
        out.write(table(["workload", "target", "ok", "stored ms", "now ms", "drift", "note"],
                        [[r.workload_key, r.target, "yes" if r.ok else "NO", _ms(r.old_median_s), _ms(r.new_median_s),
                          "-" if r.drift is None else f"{r.drift:+.1%}", r.message] for r in rows]) + "\n")
        bad = sum(not r.ok for r in rows)
        drift = sum(r.message == "drift" for r in rows)
        out.write(f"{len(rows)} best records checked, {bad} failed, {drift} drifted more than {args.tolerance:.0%}\n")
    return 1 if any(not r.ok for r in rows) else 0


def run_db(args: argparse.Namespace, recheck: Recheck | None = None, out: TextIO | None = None) -> int:
    """Run a parsed `db` command; returns the exit code (1 when verify finds a failing record)."""
    out = sys.stdout if out is None else out
    cmd = args.db_command
    if cmd == "verify":
        return _verify(args, out, recheck)
    return {"show": _show, "best": _best, "export": _export, "import": _import, "merge": _merge}[cmd](args, out)


def main(argv: Sequence[str] | None = None, recheck: Recheck | None = None) -> int:
    """`db` as a command of its own: errors print on one line, exit code 2."""
    parser = argparse.ArgumentParser(prog="hlotune")
    add_db_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["db", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_db(args, recheck)
    except HlotuneError as e:
        print(f"hlotune: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
