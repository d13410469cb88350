#!/usr/bin/env bash
# piperc search on the issue's four cases (docs/search.md): for each, the
# search's best strategy and a published configuration of a comparable model
# compiled and simulated on the same machine description, in the format of
# Mist's and Megatron-Bridge's tables: layout, predicted tokens/s and model
# TFLOP/s per device, peak GiB, search seconds. A benchmark, not a test.
#
# Usage: bench/search.sh [CASE...]   (default: every case; names below)
# Environment:
#   PIPERC, PIPER_PLAN  binaries (skip the build); BAZEL, BAZEL_BUILD_FLAGS
#   MAX_COMPILES        the search's compile budget (default: the search's own, 32)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
build_tools
budget=()
if [[ -n "${MAX_COMPILES:-}" ]]; then
  budget=(--max-compiles "$MAX_COMPILES")
fi
machine=bench/h200-cluster.json
work="$(mktemp -d -t piper-search-XXXXXX)"
trap 'rm -rf "$work"' EXIT

# name | preset | devices | global batch | published flags (source in
# docs/search.md)
cases=(
  "llama-1b|llama-1b|8|64|--pp 1 --dp 8 --microbatches 8 --zero 3"
  "llama-70b|llama-70b|64|128|--pp 4 --dp 2 --cp 2 --tp 4 --sp --microbatches 64 --schedule interleaved-1f1b --virtual-stages 5 --zero 1"
  "qwen3-moe-9b|qwen3-moe-9b|32|128|--pp 4 --dp 8 --ep 8 --microbatches 16 --zero 1"
  "qwen3-moe-30b|qwen3-moe-30b|16|64|--pp 1 --dp 16 --ep 8 --microbatches 4 --zero 1"
)
want=("$@")

printf '| model | devices | global/micro batch | seq | layout | tokens/s/device | TFLOP/s/device | peak GiB | search s |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for c in "${cases[@]}"; do
  IFS='|' read -r name preset devices batch published <<<"$c"
  if [[ ${#want[@]} -gt 0 && ! " ${want[*]} " =~ " $name " ]]; then
    continue
  fi
  out="$work/$name"
  start=$(date +%s.%N)
  "$PIPERC" search "$preset" --seq 4096 --micro-batch 1 --devices "$devices" \
    --device-memory 141GiB --global-batch "$batch" --machine "$machine" \
    --dtype bf16 "${budget[@]}" -o "$out" \
    >"$out.txt" 2>&1 || { cat "$out.txt" >&2; continue; }
  seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  # The table's first row: tokens/s, MFU and peak of the best strategy.
  row=$(grep -E '^1 ' "$out.txt")
  read -r tokens mfu peak < <(awk '{ for (i = 1; i <= NF; ++i) if ($i ~ /%$/) { print $(i-1), $i, $(i+2); exit } }' <<<"$row")
  # layout, schedule, microbatches, ZeRO, recompute: the table's columns.
  layout=$(cut -c6-73 <<<"$row" | tr -s ' ' | sed 's/ $//')
  per=$(awk -v t="$tokens" -v d="$devices" 'BEGIN { printf "%.0f", t / d }')
  tflops=$(awk -v m="${mfu%\%}" 'BEGIN { printf "%.0f", m / 100 * 989 }')
  printf '| %s | %s x H200 | %s/1 | 4096 | search: %s | %s | %s | %s | %s |\n' \
    "$name" "$devices" "$batch" "$layout" "$per" "$tflops" "$peak" "$seconds"
  # The published configuration, compiled and simulated on the same machine.
  read -r -a flags <<<"$published"
  model="$work/$name.mlir"
  "$PIPERC" model "$preset" --seq 4096 --batch 1 -o "$model" >/dev/null
  if "$PIPERC" compile "$model" "${flags[@]}" --dtype bf16 \
    --device-memory 141GiB -o "$work/$name-published" >"$work/$name-pub.txt" 2>&1; then
    step=$("$PIPER_PLAN" "$work/$name-published" --simulate --machine "$machine" |
      awk '/^step:/ { print $2, $3 }')
    ppeak=$(grep -oE 'predicted peak [0-9.]+ MiB' "$work/$name-pub.txt" |
      awk '{ if ($3 > m) m = $3 } END { printf "%.2f", m / 1024 }')
    # Tokens/s from the simulated step; TFLOP/s scaled from the search's
    # row (same model, same FLOPs per token).
    read -r ptok ptf < <(awk -v s="$step" -v b="$batch" -v d="$devices" \
      -v t="$tokens" -v m="${mfu%\%}" 'BEGIN {
        split(s, a, " "); sec = a[1] / (a[2] == "ms" ? 1000 : a[2] == "us" ? 1e6 : 1)
        tok = b * 4096 / sec; printf "%.0f %.0f\n", tok / d, m / 100 * 989 * tok / t }')
    printf '| | | | | published: %s | %s (search / published = %s) | %s | %s | |\n' \
      "$published" "$ptok" "$(ratio "$per" "$ptok")" "$ptf" "$ppeak"
  else
    printf '| | | | | published: %s | does not compile or fit: %s | | | |\n' \
      "$published" "$(grep -m1 error "$work/$name-pub.txt" | cut -c1-120)"
  fi
done
