#!/usr/bin/env bash
# Compile-time scaling of piperc: a 96-layer GPT (hidden 1024, vocab 50257,
# seq 2048) over PP 16 x DP {1, 256} (256 x 16 = 4,096 devices), 64
# microbatches, 1F1B. Prints wall time, user time and peak RSS of both data-
# parallel degrees side by side (the goal: under 3 s, independent of DP), then
# where the time goes at DP 256 (piperc compile --mlir-timing). A benchmark,
# not a test: it is not part of `bazel test`.
#
# Usage: bench/compile_scale.sh
# Environment:
#   PIPERC       a piperc binary: skip the build
#   BAZEL        bazel command (default: bazel)
#   BAZEL_BUILD_FLAGS  flags of the build (default: -c opt; the binary goes
#                to a separate symlink prefix so bazel-bin stays untouched)
#   DPS          data-parallel degrees to compare (default: "1 256")
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
DPS="${DPS:-1 256}"

build_piperc

work="$(mktemp -d -t piper-compile-scale-XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$PIPERC" model gpt --layers 96 --hidden 1024 --heads 16 --vocab 50257 \
  --seq 2048 --batch 1 -o "$work/gpt96.mlir"

compile() { # DP [extra flags...]
  local dp="$1"
  shift
  "$PIPERC" compile "$work/gpt96.mlir" --pp 16 --dp "$dp" --microbatches 64 \
    --schedule 1f1b -o "$work/out$dp" "$@"
}

printf '%-8s %8s %10s %10s %12s\n' "DP" "devices" "wall (s)" "user (s)" "peak RSS"
for dp in $DPS; do
  /usr/bin/time -f '%e %U %M' -o "$work/time$dp" "$PIPERC" compile \
    "$work/gpt96.mlir" --pp 16 --dp "$dp" --microbatches 64 --schedule 1f1b \
    -o "$work/out$dp" >/dev/null
  read -r wall user rss <"$work/time$dp"
  printf '%-8s %8d %10s %10s %9d MB\n' "$dp" $((16 * dp)) "$wall" "$user" \
    $((rss / 1024))
done
first="${DPS%% *}"
read -r _ firstUser _ <"$work/time$first"
read -r _ lastUser _ <"$work/time${DPS##* }"
echo "user time, DP ${DPS##* } / DP $first: $(ratio "$lastUser" "$firstUser")" \
  "(1.00 = independent of the DP degree)"

last="${DPS##* }"
echo
echo "where the time goes at DP $last (piperc compile --mlir-timing):"
compile "$last" --mlir-timing 2>&1 >/dev/null | sed -n '/Wall Time/,$p'
