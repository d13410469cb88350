#!/bin/bash
# Runs the lit suite under `bazel test`.
# Usage: run_lit.sh <lit> <piper-opt> <piperc> <FileCheck> <not> <lit.cfg.py>
#                   [<piper-plan>]
# Paths are runfiles-relative ($(location ...)); the test runs in the runfiles
# root. The tools are linked into one directory that lit.cfg.py puts on PATH.
set -euo pipefail
lit=$1 opt=$2 piperc=$3 filecheck=$4 not=$5 cfg=$6 plan=${7:-}
tools="${TEST_TMPDIR:-$(mktemp -d)}/tools"
mkdir -p "$tools"
ln -sf "$PWD/$opt" "$tools/piper-opt"
ln -sf "$PWD/$piperc" "$tools/piperc"
ln -sf "$(readlink -f "$filecheck")" "$tools/FileCheck"
ln -sf "$(readlink -f "$not")" "$tools/not"
if [ -n "$plan" ]; then ln -sf "$PWD/$plan" "$tools/piper-plan"; fi
exec "$(readlink -f "$lit")" -v --param tools_dir="$tools" "$(dirname "$cfg")"
