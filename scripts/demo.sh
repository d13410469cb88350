#!/bin/bash
# The demo: builds Piper, emits a small GPT, compiles it for 2 pipeline stages
# x 2 data-parallel replicas (1F1B, 4 microbatches) and trains it on 4 CPU
# ranks for a few steps, printing the loss.
set -euo pipefail
cd "$(dirname "$0")/.."

bazel build //tools:piperc //tools:piper-run
BIN="$(bazel info bazel-bin 2>/dev/null)/tools"
WORK="${PIPER_DEMO_DIR:-$(mktemp -d -t piper-demo-XXXXXX)}"
mkdir -p "$WORK"

set -x
"$BIN/piperc" model gpt --layers 4 --hidden 128 --heads 4 --vocab 256 --seq 64 \
  --batch 4 -o "$WORK/gpt.mlir"
"$BIN/piperc" compile "$WORK/gpt.mlir" --pp 2 --dp 2 --microbatches 4 \
  --schedule 1f1b -o "$WORK/out"
"$BIN/piper-run" "$WORK/out" --nproc 4 --backend cpu --steps "${PIPER_DEMO_STEPS:-10}" \
  --seed 1 --metrics "$WORK/metrics.jsonl"
