#!/usr/bin/env bash
# Decode speed of every E2E schedule vs dense (one core, one thread; run it with nothing else on the machine).
set -euo pipefail
export OMP_NUM_THREADS=${THREADS:-1}
exec taskset -c "${CORE:-1}" python -m benchmarks.speed.schedules --threads "${THREADS:-1}" --out benchmarks/results/e2e/speed.json
