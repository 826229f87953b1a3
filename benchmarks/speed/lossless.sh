#!/usr/bin/env bash
# Lossless mode rows (benchmarks/RESULTS.md, "Lossless mode"), one command per row, from the repository root.
# CKPT= a fit run's last.ckpt (default: the base SmolLM2-135M-Instruct, zero-shot); NAME= its label in the file names.
# One pinned core and one thread per command; fp32 (the exactness count is defined in fp32).
set -euo pipefail
ckpt=${CKPT:+--checkpoint $CKPT}
name=${NAME:-base}
out=benchmarks/results/e2e/lossless
run() { OMP_NUM_THREADS=1 taskset -c "${CORE:-0}" python -m benchmarks.speed.lossless "$@" $ckpt; }
mkdir -p "$out"
# exactness on the 100 test MRs (batch 8, then 32), then the 50 dev MRs at batch 1
run exactness --draft-schedule benchmarks/quality/schedules/flat2x.yaml --batch 8 --new-tokens 32 --draft-tokens 4 \
  --out "$out/$name.flat2x.exactness.b8.json"
# speed: the timing protocol (benchmarks/common/timing.py): 5 rotated rounds of full depth, each K and the plain
# schedule after a warm-up round; the median pair ratio with its spread; equal work in every arm
run timing --draft-schedule benchmarks/quality/schedules/flat2x.yaml --batch 1 --mrs 2 --new-tokens 32 --draft-tokens 2 4 \
  --out "$out/$name.flat2x.timing.b1.json"
run timing --draft-schedule benchmarks/quality/schedules/flat2x.yaml --batch 8 --mrs 16 --new-tokens 32 --draft-tokens 2 4 \
  --out "$out/$name.flat2x.timing.b8.json"
run timing --draft-schedule benchmarks/quality/schedules/flat3x.yaml --batch 1 --mrs 4 --new-tokens 32 --draft-tokens 2 4 \
  --out "$out/$name.flat3x.timing.b1.json"
run exactness --draft-schedule benchmarks/quality/schedules/flat2x.yaml --batch 32 --new-tokens 32 --draft-tokens 4 \
  --out "$out/$name.flat2x.exactness.b32.json"
run timing --draft-schedule benchmarks/quality/schedules/flat2x.yaml --batch 32 --mrs 32 --new-tokens 32 --draft-tokens 2 4 \
  --out "$out/$name.flat2x.timing.b32.json"
run exactness --draft-schedule benchmarks/quality/schedules/flat2x.yaml --batch 1 --mrs 20 --new-tokens 32 --draft-tokens 4 \
  --out "$out/$name.flat2x.exactness.b1.json"
