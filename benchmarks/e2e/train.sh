#!/usr/bin/env bash
# Train one E2E evidence model:
#   bash benchmarks/e2e/train.sh {dense|skipdecode2x|skipdecode3x|hsd2x|skipdecode2x_distill|dense_full}
# Run from the repository root; the checkpoint lands in runs/e2e/<name>/, metrics in its metrics.csv.
# Pinned to one core and one thread so every run has the same compute (THREADS/CORE override it).
set -euo pipefail
name=$1
schedule=${name%_distill}
schedule=${schedule%_full}
extra=()
case $name in
  *_distill) extra=(--config benchmarks/e2e/distill.yaml) ;;
  *_full) extra=(--config benchmarks/e2e/full_finetune.yaml) ;;
esac
export OMP_NUM_THREADS=${THREADS:-1}
exec taskset -c "${CORE:-1}" python -m skiptrain fit \
  --config benchmarks/e2e/train_base.yaml \
  --config "benchmarks/e2e/schedule_${schedule}.yaml" "${extra[@]}" \
  --trainer.default_root_dir "runs/e2e/$name" \
  --trainer.logger CSVLogger --trainer.logger.save_dir "runs/e2e/$name"
