#!/bin/bash
# The runtime, proto/ and support/ (the ground floor) never include MLIR,
# LLVM or compiler headers: plan.proto is the runtime's only contract with
# the compiler (Bazel visibility of @llvm enforces the deps).
set -euo pipefail
cd "$TEST_SRCDIR/$TEST_WORKSPACE"
bad=$(grep -rlE '#include *[<"](mlir|llvm|dialects|compiler)/' runtime proto support || true)
if [ -n "$bad" ]; then
  echo "runtime/proto/support files include MLIR, LLVM or compiler headers:"
  echo "$bad"
  exit 1
fi
# The ground floor depends on nothing above it: support/ includes no
# proto/ or runtime/ header, proto/ no runtime/ header.
up=$( (grep -rlE '#include *"(proto|runtime)/' support; \
       grep -rlE '#include *"runtime/' proto) || true)
if [ -n "$up" ]; then
  echo "include arrows running back up (support -> proto/runtime, proto -> runtime):"
  echo "$up"
  exit 1
fi
# The lowering to plans reads programs (compiler/analysis), it does not
# rewrite them: no compiler/transforms header (Bazel deps enforce the
# library; this names the file).
lowering=$(grep -lE '#include *"compiler/transforms/' compiler/lowering/*.cpp compiler/lowering/*.h | grep -v '_test.cpp' || true)
if [ -n "$lowering" ]; then
  echo "compiler/lowering includes compiler/transforms headers:"
  echo "$lowering"
  exit 1
fi
n=$(find runtime proto support -name '*.cpp' -o -name '*.h' | wc -l)
if [ "$n" -lt 10 ]; then
  echo "expected the runtime sources in the runfiles, found $n files"
  exit 1
fi
echo "checked $n runtime, proto and support sources: no MLIR/LLVM/compiler includes, no arrow back up; the lowering includes no transform"
