"""The `hlotune` command.

Map:
  main()            argparse dispatch; hlotune errors -> one line on stderr, exit 2
  cmd_inspect       fused subgraphs: key, weight, opcodes, shapes, FLOPs, bytes, compute definition
  cmd_run           run a whole model (compiled, or --reference with the numpy interpreter)
  cmd_db            tuning database commands (show, best, export, import, merge, verify)
  cmd_tune          tune a model's subgraphs into a tuning database (resumable)
  cmd_report        best latency against trials / time, error kinds, speedup over the default schedule
  cost-model        train / evaluate the cost model (search/cost_model_cli.py)
  cmd_config        the settings table

Exit codes: 0 success, 2 user error (one line, no traceback unless HLOTUNE_DEBUG is set),
1 internal error (a bug: traceback shown).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from . import config
from .errors import HlotuneError, InputError


def _load_inputs(path: str) -> list[np.ndarray]:
    try:
        data = np.load(path)
    except FileNotFoundError:
        raise InputError(f"input file not found: {path}") from None
    except Exception as e:  # numpy raises several kinds for a file that is not an npz
        raise InputError(f"cannot read inputs from {path}: {e}") from None
    names = sorted((k for k in data.files if k.startswith("arg")), key=lambda k: int(k[3:]) if k[3:].isdigit() else -1)
    if not names:
        raise InputError(f"{path} has no arrays named arg0, arg1, ...")
    for want, got in enumerate(names):
        if got != f"arg{want}":
            raise InputError(f"{path}: expected arrays arg0..arg{len(names) - 1}, found {got}")
    return [data[n] for n in names]


def _save_outputs(path: str, outs: Sequence[np.ndarray]) -> None:
    try:
        np.savez(path, **{f"out{i}": np.asarray(o) for i, o in enumerate(outs)})
    except OSError as e:
        raise InputError(f"cannot write outputs to {path}: {e}") from None


def cmd_inspect(args: argparse.Namespace) -> int:
    from .api import inspect_model

    report = inspect_model(args.model, schedule=args.schedule, tuning_log=args.tuning_log, target=args.target)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.text())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .api import compile as hl_compile
    from .api import load_model, reference_run

    inputs = _load_inputs(args.inputs)
    if args.reference:
        outs = reference_run(load_model(args.model), inputs)
    else:
        exe = hl_compile(args.model, tuning_log=args.tuning_log, target=args.target)
        outs = exe(*inputs)
    _save_outputs(args.out, outs)
    print(f"wrote {len(outs)} output(s) to {args.out}")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from .database.cli import run_db

    if args.db_command == "verify":  # re-measure with the real compiler (builder + isolated runner)
        from .measure.recheck import make_recheck

        with make_recheck() as recheck:
            return run_db(args, recheck=recheck)
    return run_db(args)


def cmd_tune(args: argparse.Namespace) -> int:
    from .api import tune

    timing = None
    if args.repeats is not None or args.min_repeat_ms is not None:
        from .measure.runner import TimingConfig

        d = TimingConfig()
        rep_ms = d.min_repeat_ms if args.min_repeat_ms is None else args.min_repeat_ms
        timing = TimingConfig(warmup_ms=min(d.warmup_ms, rep_ms), repeats=args.repeats or d.repeats,
                              min_repeat_ms=rep_ms)
    for name in ("trials", "batch_size", "population", "workers"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "trials" else 1):
            raise InputError(f"--{name.replace('_', '-')} must be at least {0 if name == 'trials' else 1}, got {v}")
    targets = args.target or ["cpu"]
    extra = {"ray": args.ray} if args.ray else {}
    report = tune(args.model, tuning_log=args.tuning_log, target=targets[0] if len(targets) == 1 else targets,
                  trials=args.trials, **extra,
                  time_budget=args.time_budget, seed=args.seed, workers=args.workers, cost_model=args.cost_model,
                  policy=args.policy, batch_size=args.batch_size, population=args.population,
                  generations=args.generations, early_stopping=args.early_stopping or None, timing=timing,
                  progress=not args.quiet, log_dir=args.log_dir, confirm=max(0, args.confirm))
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.text())
    if report.interrupted:
        print("hlotune: interrupted (run the same command again to continue)", file=sys.stderr)
        return 130
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .api import load_model
    from .database import open_database
    from .search.report import build_report

    model = load_model(args.model) if args.model else None
    db = open_database(args.db)
    try:
        rep = build_report(db, model=model, target=args.target)
    finally:
        db.close()
    if args.json:
        print(json.dumps(rep.to_json(), indent=1))
    else:
        print(rep.text())
    if args.plot:
        rep.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0


def _add_tune_parser(sub) -> None:
    from .search.tuner import DEFAULT_EARLY_STOPPING, DEFAULT_TRIALS, POLICIES

    p = sub.add_parser("tune", help="tune a model's subgraphs (resumable: run it again to continue)",
                       description="Tune every fused subgraph of MODEL, recording every measurement in the tuning "
                                   "log. Running the same command again continues: measured schedules are not "
                                   "measured again and the budgets count what is already done.")
    _add_model(p)
    p.add_argument("--target", action="append", default=None, choices=["cpu", "cuda"],
                   help="target kind (default cpu); repeat it to tune several at once (--target cpu --target cuda)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="measure on a Ray cluster: its address, 'auto' (the running one) or 'local'; each target kind "
                        "is tuned for every machine kind the cluster announces (docs/distributed.md)")
    p.add_argument("--tuning-log", default=None, metavar="DB",
                   help="tuning database (.db, .jsonl, postgresql://...; default <log dir>/<model>.db)")
    p.add_argument("--trials", type=int, default=None,
                   help=f"total measurements for this model in DB (default {DEFAULT_TRIALS} without --time-budget)")
    p.add_argument("--time-budget", default=None, metavar="DURATION", help="e.g. 90s, 15m, 8h (all runs together)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="builder processes (default: one per core)")
    p.add_argument("--cost-model", default=None, metavar="PATH",
                   help="the cost model to start from: a file from `hlotune cost-model train`, 'none' (a fresh model) "
                        "or 'auto' (default: the model shipped for the CPU; setting HLOTUNE_COST_MODEL)")
    p.add_argument("--policy", choices=POLICIES, default="evolutionary", help="search policy (default evolutionary)")
    p.add_argument("--batch-size", type=int, default=64, help="candidates measured per round (default 64)")
    p.add_argument("--population", type=int, default=2048, help="evolutionary population (default 2048)")
    p.add_argument("--generations", type=int, default=4, help="evolutionary generations per round (default 4)")
    p.add_argument("--early-stopping", type=int, default=DEFAULT_EARLY_STOPPING, metavar="N",
                   help=f"stop a subgraph after N trials without improvement (0: never; default "
                        f"{DEFAULT_EARLY_STOPPING})")
    p.add_argument("--confirm", type=int, default=2, metavar="PASSES",
                   help="candidates that beat a subgraph's best are measured PASSES more times beside it before "
                        "they count (0: accept one timing; default 2)")
    p.add_argument("--repeats", type=int, default=None, help="timing repeats per candidate (default 3)")
    p.add_argument("--min-repeat-ms", type=float, default=None, help="minimum time per repeat (default 34 ms)")
    p.add_argument("--log-dir", default=None, help="where run logs go (default: HLOTUNE_LOG_DIR or logs/)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("report", help="tuning progress and results stored in a tuning database")
    p.add_argument("db", metavar="DB", help="tuning database")
    p.add_argument("--model", default=None, help="only this model's subgraphs, named and weighted as in it")
    p.add_argument("--target", default=None, help="target fingerprint (default: the one with most records)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="plot best latency against trials and time "
                                                                   "(needs matplotlib)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)


def cmd_config(args: argparse.Namespace) -> int:
    print(config.describe())
    print()
    print("HLOTUNE_DEBUG levels: " + "; ".join(f"{k} {v}" for k, v in config.DEBUG_LEVELS.items()))
    return 0


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="HLO text file (.hlo/.txt) or HLO text")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hlotune", description="Auto-scheduling tensor compiler for XLA HLO.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("inspect", help="show the fused subgraphs of a model")
    _add_model(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--schedule", action="store_true", help="also print each subgraph's loop nest")
    p.add_argument("--tuning-log", default=None, help="use the best schedules in this database")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("run", help="run a whole model on inputs from an npz file")
    _add_model(p)
    p.add_argument("--inputs", required=True, help="npz with arg0, arg1, ...")
    p.add_argument("--out", required=True, help="npz to write out0, out1, ...")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tuning-log", default=None, help="tuning database with best schedules")
    p.add_argument("--reference", action="store_true", help="use the numpy HLO interpreter")
    p.set_defaults(func=cmd_run)

    try:
        from .database.cli import add_db_parser
    except ImportError:  # pragma: no cover - database extra missing
        add_db_parser = None
    if add_db_parser is not None:
        add_db_parser(sub).set_defaults(func=cmd_db)

    _add_tune_parser(sub)
    try:
        from .search.cost_model_cli import add_cost_model_parser
    except ImportError:  # pragma: no cover - not there yet
        add_cost_model_parser = None
    if add_cost_model_parser is not None:
        add_cost_model_parser(sub)

    p = sub.add_parser("config", help="list settings (environment variables) and debug levels")
    p.set_defaults(func=cmd_config)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HlotuneError as e:
        if config.debug_level() > 0:
            raise
        print(f"hlotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hlotune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
