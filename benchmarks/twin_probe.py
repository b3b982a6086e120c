"""Would a run's early best, moved outward (or its unroll pragma changed), have reached its final best?  Re-measure.

For one tuning database of `search_compare.py` (one subgraph, records in measured order): the best schedule of
the first 15 % of trials (30 of 200), the final best, and every `outward_moves` schedule of the early best (one
tile level's smallest prime factor moved to the tile's outer loop, parallel loops fused anew), re-measured
together in `--passes` alternating passes (5 repeats of at least 10 ms); `--moves unroll`: every `unroll_moves`
schedule (one stage's unroll pragma set to another value) instead, `both`: both.  Prints each one's speed as a fraction
of the final's, and with `--model` the score a pretrained model gives it after learning the run's first `--n`
records in the tuner's warm-up parts (what `EvolutionarySearch.twins` ranks them by).

    .venv/bin/python benchmarks/twin_probe.py mlp_grad_dot_9 logs/s26/scratch/mlp_grad_dot_9-evolutionary-s0.db \\
        --model logs/s26/scratch/pretrained.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_compare import (  # noqa: E402
    EARLY_FRACTION,
    SUBGRAPHS,
    load_subgraph,
    schedule_of,
    time_together,
    trajectory,
)
from hlotune.schedule_space.mutate import _decode, ladder_moves, outward_moves, unroll_moves  # noqa: E402
from hlotune.schedule_space.steps import Pragma  # noqa: E402
from hlotune.schedule_space.task import Task  # noqa: E402
from hlotune.search.space import TaskSpace  # noqa: E402
from hlotune.target import Target  # noqa: E402


def model_scores(path: str, db: str, n: int, task, schedules) -> list[float]:
    from benchmarks.cost_model_adapt import adapted
    from hlotune.search.cost_model_cli import samples_from_db

    return [float(x) for x in adapted(path, samples_from_db(db), n).predict(task, schedules)]


def _pragmas(s) -> str:
    """The schedule's auto_unroll_max_step values, for its row label."""
    return "unroll " + ",".join(str(st.value) for st in s.steps
                                if isinstance(st, Pragma) and st.name == "auto_unroll_max_step")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("label", help="a subgraph label of search_compare.py")
    ap.add_argument("db", help="one run's tuning database")
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--model", help="a pretrained model (never trained on this workload) to score the moves")
    ap.add_argument("--n", type=int, default=16, help="records the model learns first")
    ap.add_argument("--moves", choices=("outward", "unroll", "both", "ladder"), default="outward")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    row = next((r for r in SUBGRAPHS if r[0] == a.label), None)
    if row is None:
        raise SystemExit(f"unknown subgraph {a.label!r}")
    sg = load_subgraph(row[1], row[2], row[3])
    target = Target.host_cpu()
    task = Task(sg.workload.key, sg.workload.compute, target, 1, a.label, float(sg.workload.flops))
    space = TaskSpace(task)
    costs, recs = trajectory(a.db, target)
    valid = [i for i, c in enumerate(costs) if math.isfinite(c)]
    cut = max(1, int(len(costs) * EARLY_FRACTION))
    e = min((i for i in valid if i < cut), key=lambda i: costs[i])
    f = min(valid, key=lambda i: costs[i])
    early, final = schedule_of(recs[e]), schedule_of(recs[f])
    sk = space.sketch_of(early)
    kinds = {"outward": (outward_moves,), "unroll": (unroll_moves,), "both": (outward_moves, unroll_moves),
             "ladder": (ladder_moves,)}
    moves = [(fn.__name__.split("_")[0], m) for fn in kinds[a.moves] for m in fn(sk, early)] if sk is not None else []
    measured = {schedule_of(r).key for r in recs}

    def tag(s) -> str:
        d = _decode(sk, s) if sk is not None else None
        return _pragmas(s) + (f" tiles {d.tiles}" if d is not None and a.moves == "ladder" else "")

    fin = f"final {tag(final)}"
    cands = {f"early {tag(early)}": early, fin: final}
    for k, (kind, m) in enumerate(moves):
        cands[f"{kind} move {k} {tag(m)}" + (" (measured in the run)" if m.key in measured else "")] = m
    scores = dict(zip(cands, model_scores(a.model, a.db, a.n, task, list(cands.values())))) if a.model else {}
    print(f"{a.label}: early best = trial {e + 1}, final = trial {f + 1}, {len(moves)} {a.moves} moves", flush=True)
    per, _ = time_together(task, cands, a.passes)
    med = {k: statistics.median(v) for k, v in per.items() if v}
    if fin not in med:
        raise SystemExit("the final best did not measure")
    print("speed / final's" + ("   model score" if scores else "") + "   schedule")
    for k in sorted(med, key=med.get):
        sc = f"   {scores[k]:11.4f}" if scores else ""
        print(f"  {med[fin] / med[k]:13.3f}{sc}   {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
