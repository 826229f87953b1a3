#!/usr/bin/env bash
# The quality studies' queued rows (the summarisation study: benchmarks/RESULTS.md, CNN/DailyMail and XSum at 2x; and the
# E2E recipe's rows on its own draw) in the order they run, in two lanes, one a core, from the repository root:
#   nohup bash benchmarks/quality/queue.sh 0 > runs/queue_lane0.log 2>&1 &
#   nohup bash benchmarks/quality/queue.sh 1 > runs/queue_lane1.log 2>&1 &
# Each row is one benchmarks/quality/study.sh configuration. A stopped row resumes from its last checkpoint and a
# finished one is skipped, so a stopped lane is simply started again. Every summarisation row trains in float32 with
# LoRA r=64 on every linear layer, as two micro-batches of 4 a step (accumulate2: about 8 GB a CNN/DailyMail training,
# so the two lanes fit in 24 GiB together; the joint objective as four of 2, accumulate4).
# - Curve rows (dense and flat 2x): five epochs, keeping the checkpoint at the end of each; scored on dev and test at
#   5 epochs and at epochs 1 and 3 (EPOCH=E) for the epochs curve
#   (python -m benchmarks.quality.curve STUDY --axis epochs --metric rouge_l).
# - Length and lever rows: scored on dev only (SPLITS=dev); the test split waits until dev has chosen.
# Why the lever rows train one or two epochs, not five: on dev, epoch 3 of the five-epoch runs left flat 2x where it
# was (ROUGE-L 21.5 at epoch 1, 21.0 at epoch 3; cross entropy under the schedule lowest at epoch 2, 2.94) while the
# dense run collapsed (23.9 to 19.7; cross entropy 2.01, 2.13, 2.50): the 760 articles are overfitted after one or two
# epochs at this learning rate, and a share of an overfitted ceiling would flatter the skip rows. So the lengths are
# one and two epochs, annealed over them, dense and flat 2x, and the levers train at two epochs: the joint objective,
# and distillation from the one-epoch dense run (distill_dense1).
# The rule, set before the length and lever rows are scored: the headline's ceiling is the dense row with the best
# dev ROUGE-L among those trained no longer than the skip row (so a skip row never meets a ceiling weakened by more
# training, nor gets more budget than its ceiling could use). A lever replaces plain flat 2x of the same length when
# its dev ROUGE-L is higher and its dev cross entropy under the schedule (val/loss_skip: thousands of target tokens,
# far less noisy than 40 articles' ROUGE-L) is lower; where the two disagree, the lever wins only if its paired
# interval against plain flat 2x (python -m benchmarks.quality.paired cnndm --skip LEVER_ROW --dense PLAIN_ROW) lies
# above 100%, else the row with fewer levers stays. Among the rows left, the headline is the one with the highest dev
# share of its ceiling, a tie going to the shorter (this last step written down, still before any length or lever row
# was scored, with benchmarks/quality/choose.py, which applies the whole rule: python -m benchmarks.quality.choose
# cnndm). The rows that follow that choice (XSum, the second seeds, the 3x row) are queued once it is made.
# - Lossless on summaries: exactness (outputs differing from full depth), acceptance and tokens per verification of
#   generate --speculative K (K = 2 and 4) on the CNN/DailyMail test split, with the joint row as the draft.
# - E2E rows: the E2E recipe's headline configuration (one epoch of 4,000 pairs) retrained on the pairs the recipe
#   itself draws, two seeds each of dense and flat 2x.
set -euo pipefail
lane=${1:?usage: queue.sh LANE (0 or 1: the core it runs on)}
five=(lora_all_r64 fp32 accumulate2 five_epochs)
base=(lora_all_r64 fp32 accumulate2)
joint=(lora_all_r64 fp32 accumulate4 two_epochs joint)

study() { CORE=$lane nice -n 10 bash benchmarks/quality/study.sh "$@"; }

curve_row() {  # SEED STUDY SCHEDULE [LEVER ...]: the levers after the five-epoch ones
  local seed=$1 name=$2 schedule=$3; shift 3
  SEED=$seed study "$name" "$schedule" "${five[@]}" "$@"
  for epoch in 1 3; do SEED=$seed EPOCH=$epoch study "$name" "$schedule" "${five[@]}" "$@"; done
}

dev_row() {  # STUDY SCHEDULE [LEVER ...]: seed 0, the levers after the base ones, scored on dev only
  local name=$1 schedule=$2; shift 2
  SPLITS=dev study "$name" "$schedule" "${base[@]}" "$@"
}

e2e_row() {  # SEED SCHEDULE: the E2E recipe's configuration on the recipe's own draw of 4,000 pairs (sample4k)
  SEED=$1 study e2e "$2" lora_all_r64 sample4k fp32
}

lossless_cnndm() {  # generate --speculative K with the joint-trained 2x draft on CNN/DailyMail's 200 test articles
  local run
  run=runs/cnndm/flat2x+$(IFS=+; echo "${joint[*]}")
  local out=benchmarks/results/cnndm/lossless/joint_flat2x.test.exactness.b8.json
  [ -e "$out" ] || OMP_NUM_THREADS=1 nice -n 10 taskset -c "$lane" python -m benchmarks.speed.lossless exactness \
    --checkpoint "$run/last.ckpt" --config benchmarks/quality/cnndm/train_base.yaml \
    --data ../shared/data/cnn_dailymail/splits/test_200.csv --draft-schedule benchmarks/quality/schedules/flat2x.yaml \
    --new-tokens 96 --batch 8 --draft-tokens 2 4 --out "$out"
}

case $lane in
  0)
    curve_row 0 cnndm dense
    dev_row cnndm dense  # one epoch: also distill_dense1's teacher
    dev_row cnndm dense two_epochs
    SPLITS=dev study cnndm flat2x "${joint[@]}"  # also the lossless mode's draft on summaries
    lossless_cnndm
    ;;
  1)
    curve_row 0 cnndm flat2x
    dev_row cnndm flat2x
    dev_row cnndm flat2x two_epochs
    dev_row cnndm flat2x two_epochs distill_dense1  # its teacher is lane 0's one-epoch dense row (study.sh waits)
    e2e_row 0 dense  # after the rows dev chooses among: 67-84 minutes each in float32 on one core
    e2e_row 1 dense
    e2e_row 0 flat2x
    e2e_row 1 flat2x
    ;;
  *) echo "queue.sh: LANE=$lane is invalid: allowed 0 or 1" >&2; exit 2 ;;
esac
