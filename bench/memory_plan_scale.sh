#!/usr/bin/env bash
# Compile time of the memory planner as microbatches grow: gpt-tiny on 2
# pipeline stages (1F1B), one buffer set per microbatch, so the planner sees
# about 15 blocks per microbatch per rank. Prints, per microbatch count, the
# wall time of piperc compile, its lower-to-plans phase (which runs the
# memory planner, assignArena) and every class's arena. A benchmark, not a
# test: it is not part of `bazel test` (docs/memory-plan.md has numbers).
#
# Usage: bench/memory_plan_scale.sh
# Environment:
#   PIPERC        a piperc binary: skip the build
#   BAZEL         bazel command (default: bazel)
#   BAZEL_BUILD_FLAGS  flags of the build (default: -c opt; the binary goes
#                 to a separate symlink prefix so bazel-bin stays untouched)
#   MICROBATCHES  microbatch counts (default: "1000 4000")
#   SCHEDULE      pipeline schedule (default: 1f1b)
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
MICROBATCHES="${MICROBATCHES:-1000 4000}"
SCHEDULE="${SCHEDULE:-1f1b}"

build_piperc

work="$(mktemp -d -t piper-memory-plan-XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$PIPERC" model gpt-tiny -o "$work/gpt-tiny.mlir"

printf '%-13s %9s %16s  %s\n' "microbatches" "wall (s)" "lower-to-plans" \
  "arena bytes per class"
lowers=()
for mb in $MICROBATCHES; do
  /usr/bin/time -f '%e' -o "$work/time" "$PIPERC" compile \
    "$work/gpt-tiny.mlir" --pp 2 --microbatches "$mb" --schedule "$SCHEDULE" \
    -o "$work/out" --mlir-timing 2>"$work/timing" >/dev/null
  lower=$(awk '/lower-to-plans/ {print $1}' "$work/timing")
  arenas=$(sed -n 's/.*memory plan: arena \([0-9]*\) bytes.*/\1/p' \
    "$work/out/report.txt" | tr '\n' ' ')
  printf '%-13s %9s %14s s  %s\n' "$mb" "$(cat "$work/time")" "$lower" \
    "$arenas"
  lowers+=("$lower")
done
first="${MICROBATCHES%% *}" last="${MICROBATCHES##* }"
if [[ "$first" != "$last" ]]; then
  n=$(ratio "$last" "$first")
  echo "lower-to-plans, $last / $first microbatches:" \
    "$(ratio "${lowers[-1]}" "${lowers[0]}") (linear: $n," \
    "quadratic: $(ratio $((last * last)) $((first * first))))"
fi
