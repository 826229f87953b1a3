#!/usr/bin/env bash
# One configuration of the E2E quality-at-speed study (benchmarks/RESULTS.md), from the repository root:
#   bash benchmarks/e2e/run.sh SCHEDULE [LEVER ...]          e.g. skipdecode2x two_stage distill_dense
# SCHEDULE names benchmarks/e2e/schedule_SCHEDULE.yaml, each LEVER benchmarks/e2e/levers/LEVER.yaml, stacked
# on train_base.yaml. The run is named SCHEDULE+LEVER+... (plus _sN for SEED=N, default 0); its checkpoint
# lands in runs/e2e/NAME/last.ckpt. A lever that starts from another run (runs/e2e/OTHER/last.ckpt) trains
# OTHER first when it is missing. Then the model is scored under its own schedule on the 50-MR dev subset (used
# to choose settings) and on the 100-MR test subset: benchmarks/results/e2e/study/NAME.{dev,test}.json.
# One core and one thread per job (CORE, THREADS); wall time in runs/e2e/NAME/wall_seconds.
set -euo pipefail
schedule=$1; shift
seed=${SEED:-0}
name=$(IFS=+; echo "$schedule${*:++$*}")
[ "$seed" = 0 ] || name="${name}_s$seed"
configs=(--config benchmarks/e2e/train_base.yaml --config "benchmarks/e2e/schedule_${schedule}.yaml")
for lever in "$@"; do
  configs+=(--config "benchmarks/e2e/levers/${lever}.yaml")
  for needed in $(grep -o 'runs/e2e/[^/ ]*/last.ckpt' "benchmarks/e2e/levers/${lever}.yaml" | sort -u); do
    other=$(basename "$(dirname "$needed")")
    [ -e "$needed" ] || SEED=0 bash benchmarks/e2e/run.sh ${other//+/ }
  done
done
export OMP_NUM_THREADS=${THREADS:-1}
run=runs/e2e/$name
if [ ! -e "$run/last.ckpt" ]; then
  started=$(date +%s)
  taskset -c "${CORE:-1}" python -m skiptrain fit "${configs[@]}" --seed_everything "$seed" \
    --trainer.default_root_dir "$run" --trainer.logger CSVLogger --trainer.logger.save_dir "$run"
  echo $(( $(date +%s) - started )) > "$run/wall_seconds"
  ln -sf "$(ls -t "$run"/lightning_logs/version_*/checkpoints/last.ckpt | head -n 1 | sed "s|^$run/||")" "$run/last.ckpt"
fi
out=benchmarks/results/e2e/study
mkdir -p "$out"
for split in dev test; do
  case $split in
    dev) data=../shared/data/e2e/subsets/devset_50mr.csv ;;
    test) data=../shared/data/e2e/subsets/testset_w_refs_100mr.csv ;;
  esac
  [ -e "$out/$name.$split.json" ] || taskset -c "${CORE:-1}" python benchmarks/e2e/score.py --name "$name" \
    --checkpoint "$run/last.ckpt" --decode-schedule "benchmarks/e2e/schedule_${schedule}.yaml" --data "$data" \
    --threads "${THREADS:-1}" --out "$out/$name.$split.json"
done
