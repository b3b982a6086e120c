#!/bin/bash
# Issue 6's tuned-model table: tune fixture models at bench size, each into logs/tuned/NAME.db, then
#   python benchmarks/run_all.py --jax-python PY --tuning-logs logs/tuned
# compiles every model with its database.  Candidates are timed at real-time priority where the user may
# (HLOTUNE_MEASURE_REALTIME=1), so other jobs on the machine cannot stretch a parallel kernel.
# The budget counts every run of a model together (`hlotune tune` is resumable): running this again with a
# larger budget continues.
# Usage: benchmarks/tune_fixtures.sh BUDGET MODEL...      e.g. benchmarks/tune_fixtures.sh 10m matmul softmax
set -eu
cd "$(dirname "$0")/.."
BUDGET=$1; shift
mkdir -p logs/tuned
for m in "$@"; do
  echo "== $m ($BUDGET) $(date +%H:%M:%S)"
  HLOTUNE_MEASURE_REALTIME=1 .venv/bin/hlotune tune "tests/data/models/$m/$m.bench.hlo" \
    --tuning-log "logs/tuned/$m.db" --time-budget "$BUDGET" --log-dir logs/tuned/logs -q
done
