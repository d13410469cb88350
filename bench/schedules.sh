#!/usr/bin/env bash
# Every pipeline schedule (gpipe, 1f1b, zb-h1, zb-h2, interleaved-1f1b, zbv,
# dualpipe, dualpipev) trained on CPU at PP 4 for a small GPT: per schedule,
# the measured bubble fraction (piper-run --trace), the simulated one
# (piper-plan --simulate with the measured mean cost of each pass and free
# links) and the published formula with the same costs
# (docs/schedules.md). A benchmark, not a test: it is not part of
# `bazel test`.
#
# Usage: bench/schedules.sh
# Environment:
#   PIPERC, PIPER_RUN  binaries: skip the builds (PIPER_PLAN: default
#                      beside PIPERC)
#   BAZEL              bazel command (default: bazel)
#   BAZEL_BUILD_FLAGS  flags of the build (default: -c opt; the binaries go
#                      to a separate symlink prefix so bazel-bin stays
#                      untouched)
#   PP, MICROBATCHES, STEPS, MODEL  the run (default 4, 8, 4 and a 6-layer
#                      GPT, hidden 256, 4 sequences of 128 tokens)
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
build_tools
work="$(mktemp -d -t piper-schedules-XXXXXX)"
python3 bench/schedules.py "$PIPERC" "$PIPER_PLAN" "$PIPER_RUN" \
  test/lit/plan/Inputs/free-comm.json "$work"
echo "(work files in $work)"
