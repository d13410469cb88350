#!/bin/bash
# Regenerates docs/dialect.md, the dialect reference, from the ODS files
# (mlir-tblgen -gen-dialect-doc); //dialects/piper:dialect_doc_test checks
# that the committed file is up to date.
set -euo pipefail
cd "$(dirname "$0")/../.."
LLVM="${LLVM:-/usr/lib/llvm-22}"
"$LLVM/bin/mlir-tblgen" -gen-dialect-doc -dialect=piper \
  -I "$LLVM/include" -I dialects/piper dialects/piper/PiperOps.td \
  -o docs/dialect.md
echo "wrote docs/dialect.md"
