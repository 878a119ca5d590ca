#!/usr/bin/env bash
# Runs a step of `make test` that is not a pytest run (lint, builds, a cluster's start) and writes
# its seconds and exit status to $TFDATA_TEST_RESULTS/<step>.json, beside the tiers' own
# (tests/fixtures/skips.py), for tests/fixtures/results.py's table and budgets.
#
#   hack/timed.sh <step> <command> [args...]
set -uo pipefail
step="$1"; shift
started=$(date +%s)
"$@"
rc=$?
if [[ -n "${TFDATA_TEST_RESULTS:-}" ]]; then
  mkdir -p "$TFDATA_TEST_RESULTS"
  printf '{"seconds": %d, "exitstatus": %d, "step": true}\n' "$(( $(date +%s) - started ))" "$rc" \
    > "$TFDATA_TEST_RESULTS/$step.json"
fi
exit "$rc"
