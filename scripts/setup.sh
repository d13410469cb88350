#!/bin/bash
# Installs every Debian package Piper needs to build, test and run (idempotent:
# a second run installs nothing and takes about a second). Needs root.
set -euo pipefail

PACKAGES=(
  # Build: Bazel 4.2.3 and the rules it needs offline.
  bazel-bootstrap bazel-rules-java bazel-rules-proto bazel-skylib
  # MLIR 22 / LLVM 22: dialect, passes, mlir-tblgen, FileCheck, lit.
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  # Plans, command lines, formatting, JSON, CRC-32, unit tests.
  protobuf-compiler libprotobuf-dev libcli11-dev libfmt-dev nlohmann-json3-dev
  zlib1g-dev catch2
  # Runtime: Gloo collectives over TCP, OpenBLAS GEMMs.
  libgloo-dev libopenblas-dev
  # Tests: piper-run under a real cluster launcher (mpirun).
  openmpi-bin
  # scripts/fuzz.sh: libFuzzer targets of the file readers, built with clang
  # 22 (the compiler, its ASan/UBSan/libFuzzer runtimes, libFuzzer itself).
  clang-22 libclang-rt-22-dev libfuzzer-22-dev
  # scripts/install.sh: RUNPATHs of installed binaries.
  patchelf
  # Tests run Python scripts with Debian's interpreter; PyTorch (CPU) is the
  # numerical oracle of the model tests and the reference of the benchmarks.
  python3 python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages are installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
