"""Profile one evolutionary round (population 2048, 4 generations, pick 64) on bench dense_bias_relu.

The round-time target of issue 6 is measured by `search_compare.py`; this script shows where a round's time goes.
cProfile sees this process only: the share of each generation that `evolutionary.fanout` gives a forked worker shows
up as the parent's wait on the pipe (`select`), so read the figures as shares of this process' half.
Usage: .venv/bin/python benchmarks/round_profile.py [--model PATH] [--lines N]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_compare import Target, TaskSpace, round_task  # noqa: E402
from hlotune.cost_model.model import load_model_file  # noqa: E402
from hlotune.search.evolutionary import EvolutionarySearch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "hlotune/data/cost_model_cpu.json"))
    ap.add_argument("--lines", type=int, default=30)
    a = ap.parse_args()
    space = TaskSpace(round_task(Target.host_cpu()))
    search = EvolutionarySearch(space, load_model_file(a.model), population=2048, generations=4)
    search.propose(64, set(), random.Random(0))  # warm the caches, as a tuning run's later rounds find them
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    search.propose(64, set(), random.Random(1))
    prof.disable()
    print(f"round: {time.perf_counter() - t0:.2f} s wall, stats {search.stats}")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(a.lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
