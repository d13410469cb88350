#!/bin/bash
# The runtime never includes MLIR or LLVM headers: plan.proto is its only
# contract with the compiler (Bazel visibility of @llvm enforces the deps).
set -euo pipefail
cd "$TEST_SRCDIR/$TEST_WORKSPACE"
bad=$(grep -rlE '#include *[<"](mlir|llvm)/' runtime proto || true)
if [ -n "$bad" ]; then
  echo "runtime/proto files include MLIR or LLVM headers:"
  echo "$bad"
  exit 1
fi
n=$(find runtime proto -name '*.cpp' -o -name '*.h' | wc -l)
if [ "$n" -lt 10 ]; then
  echo "expected the runtime sources in the runfiles, found $n files"
  exit 1
fi
echo "checked $n runtime and proto sources: no MLIR/LLVM includes"
