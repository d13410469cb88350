#!/usr/bin/env bash
# Compile time against the world size under tensor and context parallelism
# (issue 42 item 3: --tp 2 and --cp 2 were quadratic in the world, 51 s and
# 28 s at 65,536 devices, where plain data parallelism took 0.14 s). gpt-tiny
# at WORLDS devices as plain DP, TP2 x DP and CP2 x DP; prints wall time and
# each parallel layout's ratio to plain DP at the same world. Linear
# compilation keeps the ratios flat as the world grows. A benchmark, not a
# test: it is not part of `bazel test`.
#
# Usage: bench/world_scale.sh
# Environment:
#   PIPERC  a piperc binary: skip the build
#   WORLDS  world sizes (default: "4096 16384 65536 262144")
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
WORLDS="${WORLDS:-4096 16384 65536 262144}"

build_piperc

work="$(mktemp -d -t piper-world-scale-XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$PIPERC" model gpt-tiny --seq 16 --batch 2 -o "$work/m.mlir"

seconds() { # FLAGS...: wall seconds of one compile
  /usr/bin/time -f '%e' -o "$work/t" "$PIPERC" compile "$work/m.mlir" "$@" \
    -o "$work/out" >/dev/null
  cat "$work/t"
}

printf '%-9s %10s %12s %12s %10s %10s\n' "devices" "DP (s)" "TP2xDP (s)" \
  "CP2xDP (s)" "TP / DP" "CP / DP"
for n in $WORLDS; do
  dp=$(seconds --dp "$n")
  tp=$(seconds --tp 2 --dp $((n / 2)))
  cp=$(seconds --cp 2 --dp $((n / 2)))
  awk -v n="$n" -v dp="$dp" -v tp="$tp" -v cp="$cp" 'BEGIN {
    printf "%-9s %10s %12s %12s %10.1f %10.1f\n", n, dp, tp, cp,
      tp / (dp + 0.01), cp / (dp + 0.01) }'
done
