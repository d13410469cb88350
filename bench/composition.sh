#!/usr/bin/env bash
# The paper's headline composition, simulated: Qwen3-MoE 1B- and 9B-like
# presets at PP 4 x DP 2 x EP 2 (8 GPUs: one H200 node), bf16, under 1F1B,
# interleaved 1F1B, ZB-V, DualPipeV and DualPipe, each with ZeRO 0, 1 and 3
# and the expert all-to-alls on their own stream, on the gradient
# reductions' stream or on the compute stream: predicted step time (on one
# NVLink node, bench/h200-node.json, and one GPU per node over InfiniBand,
# bench/h200-ib.json) and bubble (piper-plan --simulate), exact per-rank
# peak (the memory plan), and the
# largest microbatch that fits in an H200's 141 GB. Then the ratios the
# paper reports. Machine and sources: docs/composition.md. A benchmark, not
# a test: it is not part of `bazel test`.
#
# Usage: bench/composition.sh [PRESET...]   (default qwen3-moe-1b qwen3-moe-9b)
# Environment:
#   PIPERC, PIPER_PLAN  binaries: skip the build (PIPER_PLAN: default beside
#                       PIPERC)
#   BAZEL, BAZEL_BUILD_FLAGS  as bench/schedules.sh
#   PP, DP, EP, MICROBATCHES  the shape (default 4, 2, 2, 8)
#   DEVICE_MEMORY       per device (default 143771MiB, nvidia-smi's H200)
#   MACHINES            machine descriptions, comma-separated (default
#                       bench/h200-node.json,bench/h200-ib.json)
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
build_piperc
PIPER_PLAN="${PIPER_PLAN:-$(dirname "$PIPERC")/piper-plan}"
if [[ ! -x "$PIPER_PLAN" ]]; then
  echo "no piper-plan beside $PIPERC; set PIPER_PLAN" >&2
  exit 1
fi
work="$(mktemp -d -t piper-composition-XXXXXX)"
python3 bench/composition.py "$PIPERC" "$PIPER_PLAN" \
  "${MACHINES:-bench/h200-node.json,bench/h200-ib.json}" "$work" "$@"
echo "(work files in $work)"
