#!/usr/bin/env bash
# Lossless mode rows (benchmarks/RESULTS.md, "Lossless mode"; docs/lossless.md), one command per row, from the
# repository root. CKPT= a fit run's last.ckpt (default: the base SmolLM2-135M-Instruct, zero-shot); NAME= its label in
# the file names. The rows of RESULTS are the joint-trained flat 2x model:
#   bash benchmarks/quality/study.sh e2e flat2x lora_all_r64 joint fp32
#   CKPT=runs/e2e/flat2x+lora_all_r64+joint+fp32/last.ckpt NAME=joint_flat2x bash benchmarks/speed/lossless.sh
# One pinned core and one thread per command; fp32 (the exactness count is defined in fp32). Every timing is the
# protocol's (benchmarks/common/timing.py): 5 rotated rounds of every arm after a warm-up round, the median pair
# ratio over full depth with its range, equal work in every arm.
set -euo pipefail
ckpt=${CKPT:+--checkpoint $CKPT}
name=${NAME:-base}
out=benchmarks/results/e2e/lossless
dev=../shared/data/e2e/subsets/devset_50mr.csv
vocab=$out/draft_vocab_1024.json  # = skiptrain export --draft_vocab_size 1024 of the study's training data
run() { OMP_NUM_THREADS=1 taskset -c "${CORE:-1}" python -m benchmarks.speed.lossless "$@" $ckpt; }
flat2x=(--draft-schedule benchmarks/quality/schedules/flat2x.yaml --new-tokens 64 --rounds 5)
mkdir -p "$out/dev"
# exactness and acceptance on the dev split
run exactness "${flat2x[@]}" --data $dev --batch 8 --draft-tokens 4 --out "$out/dev/$name.exact.b8.json"
# dev: one lever at a time (choices are made here)
run timing "${flat2x[@]}" --data $dev --batch 8 1 --mrs 16 --draft-tokens 2 4 6 --out "$out/dev/$name.timing.base.json"
for n in 1024 256 512; do  # files written by the same count as the export's (skiptrain.data.draft_vocab)
  run timing "${flat2x[@]}" --data $dev --batch 1 8 --mrs 8 --draft-tokens 2 4 --draft-vocab "$out/draft_vocab_$n.json" \
    --out "$out/dev/$name.timing.vocab$n.json"
done
for t in 0.5 0.8; do
  run timing "${flat2x[@]}" --data $dev --batch 1 8 --mrs 8 --draft-tokens 4 6 --draft-vocab $vocab \
    --draft-confidence $t --out "$out/dev/$name.timing.vocab1024.conf$t.json"
done
run timing --draft-schedule benchmarks/quality/schedules/flat3x.yaml --new-tokens 64 --rounds 5 --data $dev \
  --batch 1 8 --mrs 8 --draft-tokens 2 4 --draft-vocab $vocab --out "$out/dev/$name.timing.flat3x.vocab1024.json"
# test, once per configuration: the dev choice per batch size through both front-ends, then no lever
run timing "${flat2x[@]}" --batch 1 --mrs 12 --draft-tokens 4 6 --draft-vocab $vocab --draft-confidence 0.5 \
  --frontend both --out "$out/$name.test.b1.vocab1024.conf0.5.json"
run timing "${flat2x[@]}" --batch 8 --mrs 32 --draft-tokens 2 --draft-vocab $vocab --frontend both \
  --out "$out/$name.test.b8.vocab1024.json"
run timing "${flat2x[@]}" --batch 1 8 --mrs 16 --draft-tokens 2 4 --out "$out/$name.test.nolevers.json"
# exactness on the whole test split
run exactness "${flat2x[@]}" --batch 8 --draft-tokens 4 --draft-vocab $vocab --out "$out/$name.test.exactness.b8.vocab1024.json"
