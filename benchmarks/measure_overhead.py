"""Per-candidate overhead of the measurement pipeline (a benchmark, not a test).

Measures batches of a trivial kernel (an 8x10 reduction of mlp2, distinct schedules) through
ProgramMeasurer and reports wall seconds per candidate: with the default timing (about 100 ms of
timed calls per candidate, the figure the issue bounds at well under 0.2 s) and with minimal timing
(1 repeat of 0 ms: pure pipeline overhead: pickling, building, loading, checking), each with and
without overlap of building and running.

    .venv/bin/python benchmarks/measure_overhead.py [--batch 32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from hlotune.measure.builder import LocalBuilder  # noqa: E402
from hlotune.measure.measurer import ProgramMeasurer  # noqa: E402
from hlotune.measure.records import MeasureInput  # noqa: E402
from hlotune.measure.runner import LocalRunner, TimingConfig  # noqa: E402
from hlotune.schedule_space.steps import Schedule, Split  # noqa: E402
from hlotune.schedule_space.task import tasks_from_subgraphs  # noqa: E402
from hlotune.target import Target  # noqa: E402

MODEL = Path(__file__).resolve().parent.parent / "tests" / "data" / "models" / "mlp2" / "mlp2.hlo"


def candidates(n: int) -> list[MeasureInput]:
    target = Target.host_cpu()
    m = hlotune.load_model(str(MODEL))
    dot = next(t for t in tasks_from_subgraphs(m.frontend.subgraphs, target) if t.name == "dot_general.3")
    scheds = [()]
    for a, ext in (("i0", 8), ("i1", 10), ("r0", 32)):
        scheds += [(Split("dot_general_3", a, (f,)),) for f in range(1, ext + 1)]
    scheds += [(Split("dot_general_3", "i0", (f,)), Split("dot_general_3", "i1", (g,)))
               for f in range(1, 9) for g in range(1, 11)]
    return [MeasureInput(dot, Schedule(dot.key, s)) for s in scheds[:n]]


def bench(inputs, timing: TimingConfig, overlap: bool, rounds: int = 2) -> dict:
    with ProgramMeasurer(LocalBuilder(), LocalRunner(timing), overlap=overlap) as m:
        m.measure_batch(inputs[:2])      # start the processes, compute the reference
        best = None
        for _ in range(rounds):
            t0 = time.perf_counter()
            res = m.measure_batch(inputs)
            wall = time.perf_counter() - t0
            best = wall if best is None else min(best, wall)
        assert all(r.valid for r in res), [str(r) for r in res if not r.valid]
        timed = sum(r.run_s for r in res) / len(res)
        build = sum(r.build_s for r in res) / len(res)
    return {"wall_per_candidate_s": best / len(inputs), "runner_s_per_candidate": timed, "build_s_per_candidate": build}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    inputs = candidates(args.batch)
    print(f"{len(inputs)} candidates of a trivial kernel (8x32 @ 32x10), {LocalBuilder().n_workers} builders")
    minimal = TimingConfig(warmup_ms=0.0, repeats=1, min_repeat_ms=0.0)
    for label, timing in (("default timing (~100 ms)", TimingConfig()), ("minimal timing (overhead only)", minimal)):
        for overlap in (False, True):
            r = bench(inputs, timing, overlap)
            print(f"{label:32s} overlap={overlap!s:5s}  wall/candidate {r['wall_per_candidate_s'] * 1e3:7.1f} ms"
                  f"  (runner {r['runner_s_per_candidate'] * 1e3:6.1f} ms,"
                  f" build {r['build_s_per_candidate'] * 1e3:5.1f} ms)")


if __name__ == "__main__":
    main()
