#!/bin/bash
# Runs a Python test script with Debian's python3 (Bazel's strict action
# environment puts /usr/bin first); arguments are runfiles-relative paths.
set -euo pipefail
exec python3 "$@"
