#!/usr/bin/env bash
# Train one E2E evidence model: bash benchmarks/e2e/train.sh {dense|skipdecode2x|skipdecode3x|hsd2x|skipdecode2x_distill}
# Run from the repository root; the checkpoint lands in runs/e2e/<name>/, metrics in its metrics.csv.
# Pinned to one core and one thread so every run has the same compute (THREADS/CORE override it).
set -euo pipefail
name=$1
schedule=${name%_distill}
extra=()
[ "$name" != "$schedule" ] && extra=(--config benchmarks/e2e/distill.yaml)
export OMP_NUM_THREADS=${THREADS:-1}
exec taskset -c "${CORE:-1}" python -m skiptrain fit \
  --config benchmarks/e2e/train_base.yaml \
  --config "benchmarks/e2e/schedule_${schedule}.yaml" "${extra[@]}" \
  --trainer.default_root_dir "runs/e2e/$name" \
  --trainer.logger CSVLogger --trainer.logger.save_dir "runs/e2e/$name"
