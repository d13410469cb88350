#!/bin/bash
# Checks scripts/install.sh: installs into a fresh prefix, then, from another
# folder and with nothing of this tree on any path, lists the model presets,
# compiles gpt-tiny, tokenizes a text and trains one step on it. Run by
# scripts/test.sh after `bazel test`; prints "install_test PASSED" or
# "install_test FAILED".
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d -t piper-install-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

run() {
  set -e
  bash "$ROOT/scripts/install.sh" "$WORK/prefix" >"$WORK/install.log" 2>&1 ||
    { cat "$WORK/install.log"; return 1; }
  local bin="$WORK/prefix/bin"
  mkdir "$WORK/cwd"
  cd "$WORK/cwd"
  for tool in piperc piper-opt piper-run piper-plan piper-tokenize; do
    # No library may come from Bazel's tree or be missing.
    if ldd "$bin/$tool" | grep -E "not found|bazel|_solib"; then
      echo "$tool: libraries outside the system"
      return 1
    fi
  done
  env -i PATH=/usr/bin:/bin "$bin/piperc" model --list | grep -q gpt-tiny
  env -i PATH=/usr/bin:/bin "$bin/piper-opt" --help >/dev/null
  "$bin/piperc" model gpt-tiny --seq 16 --batch 2 -o gpt-tiny.mlir
  "$bin/piperc" compile gpt-tiny.mlir -o out >/dev/null
  env -i PATH=/usr/bin:/bin "$bin/piper-plan" out --simulate | grep -q 'class 0'
  head -c 4096 "$ROOT/README.md" >text.txt
  "$bin/piper-tokenize" text.txt -o text.bin >/dev/null
  env -i PATH=/usr/bin:/bin "$bin/piper-run" out --nproc 1 --steps 1 \
    --data text.bin --metrics metrics.jsonl >run.log 2>&1 ||
    { cat run.log; return 1; }
  grep -q '^step 1/1 | loss' run.log
  grep -q '^summary: 1 step' run.log
  grep -q '"step": 1' metrics.jsonl
}

if (run); then
  echo "install_test PASSED"
else
  echo "install_test FAILED"
  exit 1
fi
