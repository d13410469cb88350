#!/bin/bash
# Builds everything and runs every test (unit, lit, end-to-end), checks that
# //:tests gathers them all, then runs the install check
# (scripts/install_test.sh) and the fuzz targets' replay (scripts/fuzz.sh
# --replay), and prints one summary line: "N passed, N failed" (N counts
# Bazel test targets, plus the suite check, the install check and the replay),
# followed by ", N skipped (...)" when tests tagged gpu were left out because
# this machine has no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

log="$(mktemp -t piper-test-XXXXXX.log)"

# Tests tagged gpu need a GPU (docs/gpu.md): run them only where nvidia-smi
# works; elsewhere leave them out and count them as skipped.
gpuFlags=()
skipped=0
if ! nvidia-smi >/dev/null 2>&1; then
  gpuFlags=(--test_tag_filters=-gpu)
  skipped=$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null | grep -c '^//' || true)
fi

bazel test //... "${gpuFlags[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# //:tests (the root BUILD.bazel) gathers every package's tests: a package
# with tests but no line there fails here, so the suite cannot go stale.
if missing=$(bazel query 'tests(//...) except tests(//:tests)' 2>/dev/null); then
  if [ -z "$missing" ]; then
    echo "suite_check PASSED"
  else
    echo "suite_check FAILED: tests not in //:tests (add their package's" \
      "':tests' to the root BUILD.bazel):"
    echo "$missing"
  fi
else
  echo "suite_check FAILED: bazel query failed"
fi | tee -a "$log"

# Outside Bazel: it installs into a temporary prefix and runs the tools from
# another folder, which a sandboxed Bazel test cannot do.
bash scripts/install_test.sh 2>&1 | tee -a "$log"
installRc=${PIPESTATUS[0]}

# Also outside Bazel: every libFuzzer target, built with clang and the
# sanitizers, once over its seeds and crash reproducers (docs/fuzzing.md), so
# that the targets keep linking and no reproducer crashes again.
bash scripts/fuzz.sh --replay 2>&1 | tee -a "$log"
fuzzRc=${PIPESTATUS[0]}
if [ "$fuzzRc" -eq 0 ]; then
  echo "fuzz_replay PASSED"
else
  echo "fuzz_replay FAILED"
fi | tee -a "$log"

passed=$(grep -cE '^(//[^ ]+ +(\(cached\) )?|install_test |fuzz_replay |suite_check )PASSED' "$log" || true)
failed=$(grep -cE '^(//[^ ]+ +(\(cached\) )?|install_test |fuzz_replay |suite_check )(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log" || true)
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  # The build itself failed before any test ran.
  failed=1
fi
if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped (tagged gpu; no GPU here)"
else
  echo "$passed passed, $failed failed"
fi
[ "$rc" -eq 0 ] && [ "$installRc" -eq 0 ] && [ "$fuzzRc" -eq 0 ] &&
  [ "$failed" -eq 0 ]
