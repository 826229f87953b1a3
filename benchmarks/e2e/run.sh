#!/usr/bin/env bash
# One configuration of the E2E study: bash benchmarks/e2e/run.sh SCHEDULE [LEVER ...] (see benchmarks/study.sh).
exec bash benchmarks/study.sh e2e "$@"
