#!/usr/bin/env bash
# One configuration of the E2E study: bash benchmarks/quality/e2e/run.sh SCHEDULE [LEVER ...] (see benchmarks/quality/study.sh).
exec bash benchmarks/quality/study.sh e2e "$@"
