#!/usr/bin/env bash
# The quality studies' queued rows (the summarisation study: benchmarks/RESULTS.md, CNN/DailyMail and XSum at 2x; and the
# E2E recipe's rows on its own draw) in the order they run, in two lanes, one a core, from the repository root:
#   nohup bash benchmarks/quality/queue.sh 0 > runs/queue_lane0.log 2>&1 &
#   nohup bash benchmarks/quality/queue.sh 1 > runs/queue_lane1.log 2>&1 &
# Each row is one benchmarks/quality/study.sh configuration. A stopped row resumes from its last checkpoint and a
# finished one is skipped, so a stopped lane is simply started again. Every summarisation row trains five epochs in
# float32 with LoRA r=64 on every linear layer, as two micro-batches of 4 a step (accumulate2: about 8 GB a
# CNN/DailyMail training, so the two lanes fit in 24 GiB together), and keeps its checkpoint at the end of each epoch.
# - Curve rows (dense and flat 2x): scored on dev and test at 5 epochs, and at epochs 1 and 3 (EPOCH=E) for the epochs
#   curve (python -m benchmarks.quality.curve STUDY --axis epochs --metric rouge_l).
# - Lever rows: scored on dev only (SPLITS=dev); the test split waits until dev has chosen a configuration.
# - Lossless on summaries: exactness (outputs differing from full depth), acceptance and tokens per verification of
#   generate --speculative K (K = 2 and 4) on the CNN/DailyMail test split, with the joint row as the draft.
# - E2E rows: the E2E recipe's headline configuration (one epoch of 4,000 pairs) retrained on the pairs the recipe
#   itself draws, two seeds each of dense and flat 2x.
# The skip rows that depend on dev's choice of lever (XSum at 2x, the second CNN/DailyMail seed at 2x, the 3x row)
# are queued once the lever rows have been scored on dev; the dense rows do not wait for it. The rule, set before the
# lever rows are scored: a lever replaces plain five-epoch flat 2x when its dev ROUGE-L is higher and its dev cross
# entropy under the schedule (val/loss_skip: thousands of target tokens, far less noisy than 40 articles' ROUGE-L) is
# lower; where the two disagree, the lever wins only if its paired interval against plain flat 2x
# (python -m benchmarks.quality.paired cnndm --skip LEVER_ROW --dense PLAIN_ROW) lies above 100%, else the row with
# fewer levers stays.
set -euo pipefail
lane=${1:?usage: queue.sh LANE (0 or 1: the core it runs on)}
five=(lora_all_r64 fp32 accumulate2 five_epochs)

study() { CORE=$lane nice -n 10 bash benchmarks/quality/study.sh "$@"; }

curve_row() {  # SEED STUDY SCHEDULE [LEVER ...]: the levers after the five-epoch ones
  local seed=$1 name=$2 schedule=$3; shift 3
  SEED=$seed study "$name" "$schedule" "${five[@]}" "$@"
  for epoch in 1 3; do SEED=$seed EPOCH=$epoch study "$name" "$schedule" "${five[@]}" "$@"; done
}

lever_row() {  # SEED STUDY SCHEDULE LEVER ...
  local seed=$1 name=$2 schedule=$3; shift 3
  SEED=$seed SPLITS=dev study "$name" "$schedule" "${five[@]}" "$@"
}

e2e_row() {  # SEED SCHEDULE: the E2E recipe's configuration on the recipe's own draw of 4,000 pairs (sample4k)
  SEED=$1 study e2e "$2" lora_all_r64 sample4k fp32
}

lossless_cnndm() {  # generate --speculative K with the joint-trained 2x draft on CNN/DailyMail's 200 test articles
  local run=runs/cnndm/flat2x+lora_all_r64+fp32+accumulate4+five_epochs+joint
  local out=benchmarks/results/cnndm/lossless/joint_flat2x.test.exactness.b8.json
  [ -e "$out" ] || OMP_NUM_THREADS=1 nice -n 10 taskset -c "$lane" python -m benchmarks.speed.lossless exactness \
    --checkpoint "$run/last.ckpt" --config benchmarks/quality/cnndm/train_base.yaml \
    --data ../shared/data/cnn_dailymail/splits/test_200.csv --draft-schedule benchmarks/quality/schedules/flat2x.yaml \
    --new-tokens 96 --batch 8 --draft-tokens 2 4 --out "$out"
}

case $lane in
  0)
    curve_row 0 cnndm dense
    # the joint objective as four micro-batches of 2 (accumulate4: about 13 GB RSS as two of 4, 7.6 GB so); also the
    # lossless mode's draft on summaries (generate --speculative)
    SPLITS=dev study cnndm flat2x lora_all_r64 fp32 accumulate4 five_epochs joint
    lossless_cnndm
    curve_row 0 xsum dense
    curve_row 1 cnndm dense
    curve_row 1 xsum dense
    ;;
  1)
    curve_row 0 cnndm flat2x
    lever_row 0 cnndm flat2x distill_dense5  # its teacher is lane 0's first row (study.sh waits for it)
    e2e_row 0 dense
    e2e_row 1 dense
    e2e_row 0 flat2x
    e2e_row 1 flat2x
    ;;
  *) echo "queue.sh: LANE=$lane is invalid: allowed 0 or 1" >&2; exit 2 ;;
esac
