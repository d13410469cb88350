#!/bin/bash
# Trains gpt-tiny on real text with nothing downloaded: the license texts
# Debian ships (about 300 KB), tokenized to bytes (vocab 256). Prints the loss
# curve; the numbers in docs/learning.md come from this script.
#   STEPS=300 RANKS=1 ./scripts/train_text.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-300}"
WORK="${WORK:-$(mktemp -d -t piper-text-XXXXXX)}"
mkdir -p "$WORK"

bazel build //tools:piperc //tools:piper-run //tools:piper-tokenize
BIN="$(bazel info bazel-bin 2>/dev/null)/tools"

# Regular files only: the folder also holds symlinks to the same texts.
find /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat > "$WORK/licenses.txt"
"$BIN/piper-tokenize" "$WORK/licenses.txt" -o "$WORK/licenses.bin"
"$BIN/piperc" model gpt-tiny --seq 64 --batch 8 -o "$WORK/gpt-tiny.mlir"
"$BIN/piperc" compile "$WORK/gpt-tiny.mlir" --microbatches 2 --lr 3e-3 \
  --min-lr 3e-4 --warmup-steps 20 --decay-steps "$STEPS" -o "$WORK/out"
"$BIN/piper-run" "$WORK/out" --nproc 1 --steps "$STEPS" --seed 1 \
  --data "$WORK/licenses.bin" --metrics "$WORK/metrics.jsonl"
echo "metrics: $WORK/metrics.jsonl"
