#!/usr/bin/env bash
# Plug-and-play evidence of skiptrain calibrate (benchmarks/RESULTS.md), from the repository root:
#   bash benchmarks/quality/e2e/calibrate.sh
# 1. Calibrate the dense fine-tuned E2E model (LoRA r=64 on every linear layer, runs/e2e/dense+lora_all_r64) on the
#    first 32 MRs of the dev split: layer importance, and SkipDecode, Ranked and Hierarchical schedules searched at
#    ideal speedups 1.25x to 3x (benchmarks/results/e2e/calibrate/sweep/).
# 2. Decode the test split plug-and-play (no skip-aware training) under the lowest-loss schedule of each family at
#    1.5x, 2x and 3x (benchmarks/results/e2e/calibrate/<family>_<T>x.test.json).
# One core and one thread (CORE, THREADS); the sweep is forward passes only, the scoring greedy decoding.
set -euo pipefail
# shellcheck source=/dev/null
source benchmarks/quality/e2e/study.env
out=benchmarks/results/e2e/calibrate
checkpoint=runs/e2e/dense+lora_all_r64/last.ckpt
export OMP_NUM_THREADS=${THREADS:-1}
run() { nice -n 5 taskset -c "${CORE:-0}" "$@"; }
[ -e "$out/sweep/summary.json" ] || run python -m skiptrain calibrate --config "$TRAIN_BASE" \
  --config benchmarks/quality/levers/lora_all_r64.yaml --config benchmarks/quality/schedules/dense.yaml --ckpt_path "$checkpoint" \
  --output_dir "$out/sweep" --targets '[1.25, 1.5, 2.0, 2.5, 3.0]' --families '[skipdecode, ranked, hierarchical]' \
  --per_target 2 --num_batches 2
for target in 2x 1.5x 3x; do
  for family in skipdecode ranked hierarchical; do
    [ -e "$out/${family}_$target.test.json" ] || run python -m benchmarks.quality.score \
      --name "dense+lora_all_r64@${family}_$target" --checkpoint "$checkpoint" --config "$TRAIN_BASE" \
      --config "$out/sweep/schedule_${target}_$family.yaml" --data "$TEST_DATA" --threads "${THREADS:-1}" \
      --out "$out/${family}_$target.test.json"
  done
done
