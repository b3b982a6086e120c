#!/bin/bash
# Issue 9 on a machine with several GPUs, without Ray (no Ray wheel fits the GPU machine: ray 2.60 for cp312 is
# 79 MB, above the 64 MiB that travels there): one `hlotune tune` process per GPU (CUDA_VISIBLE_DEVICES), all
# writing into ONE SQLite database, against one process on one GPU; prints candidates/s, records and latency.
# Run on the GPU machine from the repository root with $OUT set (see docs/distributed.md for the call).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD HLOTUNE_CACHE_DIR=$PWD/.gpu-cache HLOTUNE_LOG_DIR=$OUT/logs
nvidia-smi -L
M=tests/data/models/transformer_block/transformer_block.bench.hlo
T() { python3 -m hlotune.cli tune $M --target cuda --time-budget 50s -q --json --tuning-log "$@"; }
CUDA_VISIBLE_DEVICES=0 T $OUT/one.db --seed 1 > $OUT/one.json 2> $OUT/one.err
CUDA_VISIBLE_DEVICES=0 T $OUT/two.db --seed 2 > $OUT/two_a.json 2> $OUT/two_a.err &
CUDA_VISIBLE_DEVICES=1 T $OUT/two.db --seed 3 > $OUT/two_b.json 2> $OUT/two_b.err &
wait
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for name, files in (("one", ["one.json"]), ("two", ["two_a.json", "two_b.json"])):
    reps = [json.load(open(f"{out}/{f}")) for f in files]
    n = sum(r["trials"] for r in reps)
    wall = max(r["elapsed_s"] for r in reps)
    from hlotune.database import open_database
    recs = list(open_database(f"{out}/{name}.db").records())
    cnt = (len(recs), len({r.schedule_key for r in recs}), sum(r.valid for r in recs))
    print(name, "gpus", len(files), "trials", n, "wall", round(wall, 1), "cand/s", round(n / wall, 2),
          "records/distinct/valid", cnt,
          "model_latency_us", [round((r["model_latency_s"] or 0) * 1e6, 1) for r in reps],
          "default_us", [round((r["default_latency_s"] or 0) * 1e6, 1) for r in reps])
PY
tail -n 3 $OUT/*.err
