#!/bin/bash
# Fails when docs/dialect.md is not what mlir-tblgen generates from the ODS
# files; dialects/piper/gen_doc.sh regenerates it.
set -euo pipefail
generated="$1"
committed="$2"
if ! diff -u "$committed" "$generated"; then
  echo "docs/dialect.md is out of date: run dialects/piper/gen_doc.sh" >&2
  exit 1
fi
