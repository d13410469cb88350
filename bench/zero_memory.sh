#!/usr/bin/env bash
# ZeRO's memory, planned and measured (docs/zero.md). Part 1: llama-1b and
# qwen3-moe-9b compiled for DP 8 and PP 4 x DP 8 under ZeRO 0/1/2/3; per
# rank of the first and last stage, the planned persistent state beside
# Piper's formula (fp32 parameters, gradients and moments: 16Ψ, 8Ψ + 8Ψ/N,
# 4Ψ + 12Ψ/N, 16Ψ/N) and DeepSpeed's (bf16 + fp32 master: 16Ψ, 4Ψ + 12Ψ/N,
# 2Ψ + 14Ψ/N, 16Ψ/N), Ψ the stage's parameters, and the whole arena (state
# plus step memory). Part 2: gpt-tiny trained on CPU for 2 steps under DP 2
# with each ZeRO stage: the arena peak piper-run measures beside the plan's.
# A benchmark, not a test: it is not part of `bazel test`.
#
# Usage: bench/zero_memory.sh
# Environment:
#   PIPERC, PIPER_RUN  binaries: skip the builds
#   BAZEL              bazel command (default: bazel)
#   BAZEL_BUILD_FLAGS  flags of the build (default: -c opt; the binaries go
#                      to a separate symlink prefix so bazel-bin stays
#                      untouched)
#   MODELS             presets of part 1 (default: "llama-1b qwen3-moe-9b")
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
MODELS="${MODELS:-llama-1b qwen3-moe-9b}"

build_tools

work="$(mktemp -d -t piper-zero-memory-XXXXXX)"
trap 'rm -rf "$work"' EXIT

# Prints one row per (class of interest, ZeRO stage) of a compiled folder.
report() { # model strategy zero dp folder
  python3 - "$@" "$PIPER_PLAN" <<'EOF'
import re, subprocess, sys
model, strategy, zero, dp, folder, piper_plan = sys.argv[1:7]
zero, n = int(zero), int(dp)
manifest = open(folder + "/manifest.textproto").read()
files = re.findall(r'plan_file: "([^"]+)"', manifest)
keep = [files[0]] if len(files) == 1 else [files[0], files[-1]]
ours = [lambda p: 16 * p, lambda p: 8 * p + 8 * p / n,
        lambda p: 4 * p + 12 * p / n, lambda p: 16 * p / n][zero]
deepspeed = [lambda p: 16 * p, lambda p: 4 * p + 12 * p / n,
             lambda p: 2 * p + 14 * p / n, lambda p: 16 * p / n][zero]
gib = 2.0 ** 30
for name in keep:
    dump = subprocess.run([piper_plan, folder + "/" + name], check=True,
                          capture_output=True, text=True).stdout
    psi = 0
    for shape in re.findall(r'^param p\d+ "[^"]*" f32\[([0-9, ]*)\]', dump, re.M):
        count = 1
        for d in shape.split(","):
            count *= int(d)
        psi += count
    m = re.search(r"^memory arena (\d+) state (\d+)", dump, re.M)
    arena, state = int(m.group(1)), int(m.group(2))
    stage = re.search(r"^plan class (\d+)", dump, re.M).group(1)
    print("%-13s %-9s %4d %5s %8.2fB %9.3f %9.3f %6.3f %9.3f %9.3f" % (
        model, strategy, zero, stage, psi / 1e9, state / gib,
        ours(psi) / gib, state / ours(psi), deepspeed(psi) / gib, arena / gib))
EOF
}

echo "== planned state per rank (GiB); class = pipeline stage (first, last)"
printf '%-13s %-9s %4s %5s %9s %9s %9s %6s %9s %9s\n' model strategy zero class \
  params planned "16Ψ.." ratio DeepSpeed arena
for model in $MODELS; do
  "$PIPERC" model "$model" -o "$work/$model.mlir"
  for strategy in dp8 pp4xdp8; do
    for zero in 0 1 2 3; do
      flags=(--dp 8)
      [[ "$strategy" == pp4xdp8 ]] && flags=(--pp 4 --dp 8 --microbatches 8)
      zflags=()
      [[ "$zero" -gt 0 ]] && zflags=(--zero "$zero")
      "$PIPERC" compile "$work/$model.mlir" "${flags[@]}" "${zflags[@]}" \
        -o "$work/out" >/dev/null
      report "$model" "$strategy" "$zero" 8 "$work/out"
      rm -rf "$work/out"
    done
  done
done

echo
echo "== gpt-tiny, DP 2, 2 steps on CPU: measured arena peak vs the plan (bytes)"
printf '%-5s %12s %12s %12s %6s\n' zero state planned measured equal
"$PIPERC" model gpt-tiny -o "$work/tiny.mlir"
for zero in 0 1 2 3; do
  zflags=()
  [[ "$zero" -gt 0 ]] && zflags=(--zero "$zero")
  "$PIPERC" compile "$work/tiny.mlir" --dp 2 --microbatches 2 "${zflags[@]}" \
    -o "$work/tiny" >/dev/null
  out=$("$PIPER_RUN" "$work/tiny" --nproc 2 --steps 2 2>&1)
  line=$(grep -m1 "rank 0: peak memory" <<<"$out")
  measured=$(sed -n 's/.*peak memory: \([0-9]*\) bytes.*/\1/p' <<<"$line")
  planned=$(sed -n 's/.*memory plan arena \([0-9]*\) bytes.*/\1/p' <<<"$line")
  state=$(sed -n 's/.*memory plan state \([0-9]*\) bytes.*/\1/p' <<<"$line")
  printf '%-5s %12s %12s %12s %6s\n' "$zero" "$state" "$planned" "$measured" \
    "$([[ "$planned" == "$measured" ]] && echo yes || echo NO)"
  rm -rf "$work/tiny"
done
