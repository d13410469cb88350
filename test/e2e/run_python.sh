#!/bin/bash
# Runs a Python test script with Debian's python3 (Bazel's strict action
# environment puts /usr/bin first); arguments are runfiles-relative paths.
#
# Every run of a test gets the same number of OpenBLAS threads, whatever its
# rank count (the launcher would otherwise give each of N ranks cores / N).
# OpenBLAS's Haswell and Zen SGEMM kernels round differently with 1 and 2
# threads; with equal thread counts a strategy and one device run the same
# GEMMs, so they differ only where a reduction order differs
# (docs/user-guide.md §5). OPENBLAS_NUM_THREADS, when set (.bazelrc forwards it),
# is kept: OPENBLAS_NUM_THREADS=2 scripts/test.sh runs every
# comparison at 2 threads.
set -euo pipefail
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
exec python3 "$@"
