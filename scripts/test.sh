#!/bin/bash
# Builds everything and runs every test (unit, lit, end-to-end), then the
# install check (scripts/install_test.sh), and prints one summary line:
# "N passed, N failed" (N counts Bazel test targets, plus the install check).
set -uo pipefail
cd "$(dirname "$0")/.."

log="$(mktemp -t piper-test-XXXXXX.log)"
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# Outside Bazel: it installs into a temporary prefix and runs the tools from
# another folder, which a sandboxed Bazel test cannot do.
bash scripts/install_test.sh 2>&1 | tee -a "$log"
installRc=${PIPESTATUS[0]}

passed=$(grep -cE '^(//[^ ]+ +(\(cached\) )?|install_test )PASSED' "$log" || true)
failed=$(grep -cE '^(//[^ ]+ +(\(cached\) )?|install_test )(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log" || true)
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  # The build itself failed before any test ran.
  failed=1
fi
echo "$passed passed, $failed failed"
[ "$rc" -eq 0 ] && [ "$installRc" -eq 0 ] && [ "$failed" -eq 0 ]
