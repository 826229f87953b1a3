#!/usr/bin/env bash
# One configuration of a quality-at-speed study (benchmarks/RESULTS.md), from the repository root:
#   bash benchmarks/quality/study.sh STUDY SCHEDULE [LEVER ...]
#   e.g. bash benchmarks/quality/study.sh e2e skipdecode2x curriculum
# STUDY is a folder here with study.env (training base config, dev and test data, scoring options): e2e, xsum or cnndm.
# SCHEDULE names benchmarks/quality/schedules/SCHEDULE.yaml (shared by every study), each LEVER
# benchmarks/quality/levers/LEVER.yaml (runs/STUDY/ in a lever means this study's runs, RUN/ this run's folder),
# stacked on the study's base config. The run is named SCHEDULE+LEVER+... (plus _sN for SEED=N, default 0); its
# checkpoint lands in runs/STUDY/NAME/last.ckpt, its wall time in wall_seconds, its peak memory in max_rss_kb and its user
# and system CPU seconds in cpu_seconds (one line an attempt that ended), its precision and machine in trained_on.json
# (benchmarks/quality/trained_on.py), and all three, with its final validation losses, in
# benchmarks/results/STUDY/study/NAME.train.json once it has trained. A lever that starts from another run
# (runs/STUDY/OTHER/last.ckpt) trains OTHER first when it is missing. Then the model is scored
# (benchmarks/quality/score.py: the study's base config plus the decoded schedule, read by skiptrain's CLI parser) under
# its own schedule (or DECODE=SCHEDULE, e.g. plug-and-play skipping of a dense run), with greedy decoding (or
# DECODING=OPTION: benchmarks/quality/decoding/OPTION.yaml, e.g. no_repeat3) on the dev splits, used to choose
# settings, and on the test split: benchmarks/results/STUDY/study/NAME[@DECODE[+OPTION]].{dev,devmatch,test}.json
# (SPLITS=dev: the dev split alone; EPOCH=E: an epoch's checkpoint, below). One core and one thread per job (CORE,
# THREADS).
set -euo pipefail
study=$1 schedule=$2; shift 2
here=benchmarks/quality/$study
# shellcheck source=/dev/null
source "$here/study.env"
seed=${SEED:-0}
configuration=$(IFS=+; echo "$schedule${*:++$*}")
seeded=""; [ "$seed" = 0 ] || seeded="_s$seed"
name=$configuration$seeded
run=runs/$study/$name
mkdir -p "$run/levers"
# Under a lock: rows started side by side would otherwise write the same data files at once.
[ -z "${PREPARE:-}" ] || flock "runs/$study/.prepare.lock" bash -c "$PREPARE"
configs=(--config "$TRAIN_BASE" --config "benchmarks/quality/schedules/${schedule}.yaml")
for lever in "$@"; do
  sed "s|runs/STUDY/|runs/$study/|g; s|RUN/|$run/|g" "benchmarks/quality/levers/${lever}.yaml" > "$run/levers/${lever}.yaml"
  configs+=(--config "$run/levers/${lever}.yaml")
  for needed in $(grep -o "runs/$study/[^/ ]*/last.ckpt" "$run/levers/${lever}.yaml" | sort -u); do
    other=$(basename "$(dirname "$needed")")
    [ -e "$needed" ] || SEED=0 DECODE='' bash benchmarks/quality/study.sh "$study" ${other//+/ }
  done
done
export OMP_NUM_THREADS=${THREADS:-1}
# One process trains a run: another that needs it (a lane of queue.sh, a lever's teacher) waits for it here.
exec 9> "$run/.training.lock"
[ -n "${EPOCH:-}" ] || flock 9
# (Not with EPOCH, which scores a checkpoint of a run that may still be training.)
if [ -z "${EPOCH:-}" ] && [ ! -e "$run/last.ckpt" ]; then
  # A run that was stopped resumes from its newest last.ckpt (the study bases save one every 25 steps), named in
  # resumed_from; its wall_seconds is then the last attempt's (study_report.py adds the stopped attempts' from their logs).
  resume=$(ls -t "$run"/lightning_logs/version_*/checkpoints/last.ckpt 2>/dev/null | head -n 1 || true)
  [ -z "$resume" ] || echo "$resume" >> "$run/resumed_from"
  # What this attempt trains in and on ($run/trained_on.json); a run never resumes in another precision (exit 2).
  taskset -c "${CORE:-1}" python -m benchmarks.quality.trained_on "$run" "${configs[@]}"
  started=$(date +%s)
  /usr/bin/time --append -f %M -o "$run/max_rss_kb" /usr/bin/time --append -f "%U %S" -o "$run/cpu_seconds" \
    taskset -c "${CORE:-1}" python -m skiptrain fit "${configs[@]}" --seed_everything "$seed" \
    --trainer.default_root_dir "$run" --trainer.logger CSVLogger --trainer.logger.save_dir "$run" \
    ${resume:+--ckpt_path "$resume"}
  echo $(( $(date +%s) - started )) > "$run/wall_seconds"
  ln -sf "$(ls -t "$run"/lightning_logs/version_*/checkpoints/last.ckpt | head -n 1 | sed "s|^$run/||")" "$run/last.ckpt"
  # The training record (times, losses, precision) beside the scores too, where it outlives runs/.
  python -m benchmarks.quality.study_report "$study" --record-run "$name"
fi
decode=${DECODE:-$schedule}
# EPOCH=E scores the checkpoint a lever kept at the end of epoch E (five_epochs: RUN/epochs) as the row
# SCHEDULE+LEVER+...+epochE[_sN]; without it, the trained run's last.ckpt is scored as NAME.
checkpoint=$run/last.ckpt scored=$name
if [ -n "${EPOCH:-}" ]; then
  checkpoint=$run/epochs/epoch$((EPOCH - 1)).ckpt  # Lightning counts epochs from 0
  [ -e "$checkpoint" ] || { echo "study.sh: EPOCH=$EPOCH: $checkpoint is missing (has the run trained that far?)" >&2; exit 2; }
  scored=$configuration+epoch$EPOCH$seeded
fi
[ "$decode" = "$schedule" ] && [ -z "${DECODING:-}" ] || scored="$scored@$decode${DECODING:++$DECODING}"
decoding=(); [ -z "${DECODING:-}" ] || decoding=(--config "benchmarks/quality/decoding/${DECODING}.yaml")
out=benchmarks/results/$study/study
mkdir -p "$out"
# dev: the split the first study chose on; devmatch (where the study has one): the dev split whose attribute-count
# histogram matches the test split's, on which choices are made from the second round on.
# SPLITS (default: all three) limits the scoring, e.g. SPLITS=dev until a configuration is chosen for the test split.
for split in ${SPLITS:-dev devmatch test}; do
  case $split in dev) data=$DEV_DATA ;; devmatch) data=${MATCHED_DEV_DATA:-} ;; test) data=$TEST_DATA ;; esac
  [ -n "$data" ] || continue
  # shellcheck disable=SC2086
  [ -e "$out/$scored.$split.json" ] || taskset -c "${CORE:-1}" python -m benchmarks.quality.score --name "$scored" \
    --checkpoint "$checkpoint" --config "$TRAIN_BASE" --config "benchmarks/quality/schedules/${decode}.yaml" \
    "${decoding[@]}" --data "$data" --threads "${THREADS:-1}" $SCORE_ARGS --out "$out/$scored.$split.json"
done
