#!/usr/bin/env bash
# Builds, on the development machine, everything scripts/gpu_check.sh needs on
# a GPU machine that has CUDA 13, a driver, PyTorch and Python 3, and none of
# our Debian packages: piper-run (optimized) with the shared libraries it
# needs beside it (rpath $ORIGIN/lib; glibc and the CUDA libraries come from
# the GPU machine: cuBLASLt and NCCL are loaded at run time), the GPU test
# binaries, the compiled plans, and the scripts. One folder, under 60 MB.
#
#   scripts/gpu_bundle.sh [DIR]      (default: gpu-bundle, git-ignored)
#
# Then, on the GPU machine: DIR/gpu_check.sh (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-gpu-bundle}
LIMIT_MB=60

if ! grep -q "CUDA_AVAILABLE = True" "$(bazel info output_base)/external/cuda/defs.bzl" 2>/dev/null; then
  bazel build //runtime/hal:cuda >/dev/null 2>&1 || true
  grep -q "CUDA_AVAILABLE = True" "$(bazel info output_base)/external/cuda/defs.bzl" || {
    echo "gpu_bundle.sh: this build has no CUDA toolkit (/usr/local/cuda); see docs/gpu.md" >&2
    exit 1
  }
fi

# Optimized, every library linked into the binaries, looking for the rest in
# $ORIGIN/lib (the bundle's lib/).
FLAGS=(-c opt --dynamic_mode=off '--linkopt=-Wl,-rpath,$ORIGIN/lib:$ORIGIN/../lib')
# The GPU tests (cuda_device_gpu_test, gpu_kernels_gpu_test, nccl_gpu_test)
# as one binary: one copy of the CUDA runtime and the executor.
TESTS=(//runtime/hal:gpu_tests)
bazel build "${FLAGS[@]}" //tools:piper-run "${TESTS[@]}"
BIN=$(bazel info "${FLAGS[@]}" bazel-bin 2>/dev/null)
bazel build //tools:piperc
PIPERC=$(bazel info bazel-bin 2>/dev/null)/tools/piperc

rm -rf "$DIR"
mkdir -p "$DIR/lib" "$DIR/tests" "$DIR/plans"
install -m 755 "$BIN/tools/piper-run" "$DIR/"
for t in "${TESTS[@]}"; do
  name=${t##*:}
  install -m 755 "$BIN/runtime/hal/$name" "$DIR/tests/"
done
strip "$DIR/piper-run" "$DIR"/tests/*

# The shared libraries of the binaries, but glibc's own (the GPU machine's
# are used) and the CUDA driver.
for f in "$DIR/piper-run" "$DIR"/tests/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libcuda.so*|libresolv.so*) ;;
    *) install -m 644 "$(readlink -f "$lib")" "$DIR/lib/$(basename "$lib")" ;;
  esac
done

python3 scripts/compare_backends.py compile "$PIPERC" "$DIR/plans"
# The timed step: GPT-2 small in bf16, 8 sequences of 1024 tokens.
"$PIPERC" model gpt2-small --seq 1024 --batch 8 -o "$DIR/plans/gpt2-small.mlir"
"$PIPERC" compile "$DIR/plans/gpt2-small.mlir" --microbatches 1 --dtype bf16 \
  -o "$DIR/plans/gpt2-small-bf16" >/dev/null
rm "$DIR/plans/gpt2-small.mlir"

install -m 755 scripts/gpu_check.sh scripts/compare_backends.py scripts/gpu_vs_torch.py "$DIR/"
install -m 644 test/oracle/torch_models.py "$DIR/"

MB=$(du -sm "$DIR" | cut -f1)
echo "gpu_bundle.sh: $DIR is $MB MB ($(ls "$DIR/lib" | wc -l) libraries, ${#TESTS[@]} test binary, $(ls "$DIR/plans" | wc -l) plans)"
if [ "$MB" -ge "$LIMIT_MB" ]; then
  echo "gpu_bundle.sh: over the $LIMIT_MB MB limit" >&2
  exit 1
fi
