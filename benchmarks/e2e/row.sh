#!/usr/bin/env bash
# Reproduce one row of the E2E evidence table (benchmarks/RESULTS.md) from a clean checkout, from the repo root:
#   bash benchmarks/e2e/row.sh N        (N = 1..9)
# Trains the model the row needs when its checkpoint is missing (benchmarks/e2e/train.sh), then scores it
# with benchmarks/e2e/score.py into benchmarks/results/e2e/rowN.json. One core, one thread (CORE, THREADS).
# Decode speed is per schedule, not per row: bash benchmarks/e2e/speed.sh on a quiet machine.
set -euo pipefail
row=$1
case $row in
  1) trained="";                     decode=dense ;;
  2) trained=dense;                  decode=dense ;;
  3) trained=dense;                  decode=skipdecode2x ;;
  4) trained=dense;                  decode=hsd2x ;;
  5) trained=skipdecode2x;           decode=skipdecode2x ;;
  6) trained=skipdecode3x;           decode=skipdecode3x ;;
  7) trained=hsd2x;                  decode=hsd2x ;;
  8) trained=skipdecode2x_distill;   decode=skipdecode2x ;;
  9) trained=dense_full;             decode=dense ;;   # full fine-tuning instead of LoRA, to compare with row 2
  *) echo "row must be 1..9, got $row" >&2; exit 2 ;;
esac
checkpoint=()
if [ -n "$trained" ]; then
  last() { ls -t runs/e2e/"$trained"/lightning_logs/version_*/checkpoints/last.ckpt 2>/dev/null | head -n 1; }
  [ -n "$(last)" ] || bash benchmarks/e2e/train.sh "$trained"
  checkpoint=(--checkpoint "$(last)")
fi
export OMP_NUM_THREADS=${THREADS:-1}
taskset -c "${CORE:-1}" python benchmarks/e2e/score.py --name "row$row" "${checkpoint[@]}" \
  --decode-schedule "benchmarks/e2e/schedule_${decode}.yaml" --threads "${THREADS:-1}" \
  --out "benchmarks/results/e2e/row$row.json"
