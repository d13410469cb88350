#!/usr/bin/env bash
# Builds, on the development machine, everything scripts/gpu_check.sh needs on
# a GPU machine that has CUDA 13, a driver, PyTorch and Python 3, and none of
# our Debian packages: piper-run (optimized) with the shared libraries it
# needs beside it (rpath $ORIGIN/lib; glibc, libstdc++, libgcc_s and the CUDA
# libraries come from the GPU machine: cuBLASLt and NCCL are loaded at run
# time), the GPU test binaries, the compiled plans, and the scripts. One
# folder, under 50 MB (the libraries as lib.tar.xz).
#
#   scripts/gpu_bundle.sh [DIR]      (default: gpu-bundle, git-ignored)
#
# Then, on the GPU machine: DIR/gpu_check.sh, or DIR/gpu_perf.sh for the
# performance rows (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-gpu-bundle}
LIMIT_MB=50

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
bazel build "${FLAGS[@]}" //tools:piper-run //bench:attention_bench "${TESTS[@]}"
BIN=$(bazel info "${FLAGS[@]}" bazel-bin 2>/dev/null)
bazel build //tools:piperc
PIPERC=$(bazel info bazel-bin 2>/dev/null)/tools/piperc

rm -rf "$DIR"
mkdir -p "$DIR/lib" "$DIR/tests" "$DIR/plans"
install -m 755 "$BIN/tools/piper-run" "$DIR/"
install -m 755 "$BIN/bench/attention_bench" "$DIR/"
for t in "${TESTS[@]}"; do
  name=${t##*:}
  install -m 755 "$BIN/runtime/hal/$name" "$DIR/tests/"
done
strip "$DIR/piper-run" "$DIR/attention_bench" "$DIR"/tests/*

# The shared libraries of the binaries, but not glibc's own, libstdc++ and
# libgcc_s, nor the CUDA driver: the GPU machine's are used. This machine's
# libstdc++ (Debian 12) imports arc4random@GLIBC_2.36, so bundled it would
# stop every binary on a glibc 2.35 machine (Ubuntu 22.04), where the
# system's libstdc++ has the GLIBCXX_3.4.30 piper-run needs.
for f in "$DIR/piper-run" "$DIR/attention_bench" "$DIR"/tests/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    ld-linux*|libc.so*|libm.so*|libmvec.so*|libdl.so*|librt.so*|libpthread.so*|\
    libresolv.so*|libutil.so*|libanl.so*|libnss_*|libthread_db.so*|\
    libBrokenLocale.so*|libc_malloc_debug.so*) ;;  # glibc
    libstdc++.so*|libgcc_s.so*) ;;  # the compiler's runtime, tied to glibc
    libcuda.so*|libnvidia-*) ;;  # the driver
    *) install -m 644 "$(readlink -f "$lib")" "$DIR/lib/$(basename "$lib")" ;;
  esac
done
# What the GPU machine's glibc and libstdc++ must provide at least (the
# highest version each file refers to; gpu_check.sh's preflight checks that
# the binaries load there).
needs=$(for f in "$DIR/piper-run" "$DIR/attention_bench" "$DIR"/tests/* "$DIR"/lib/*; do
  objdump -p "$f" 2>/dev/null | sed -n '/^Version References/,$p' |
    grep -oE '\b(GLIBC|GLIBCXX|CXXABI)_[0-9.]+\b' || true  # none: no error
done | sort -t_ -k1,1 -k2,2V -u | awk -F_ '{last[$1] = $0} END {for (k in last) printf "%s ", last[k]}')
echo "gpu_bundle.sh: the bundle needs at least ${needs:-(objdump found nothing)}"

python3 scripts/compare_backends.py compile "$PIPERC" "$DIR/plans"
# The timed step: GPT-2 small in bf16, 8 sequences of 1024 tokens.
"$PIPERC" model gpt2-small --seq 1024 --batch 8 -o "$DIR/plans/gpt2-small.mlir"
"$PIPERC" compile "$DIR/plans/gpt2-small.mlir" --microbatches 1 --dtype bf16 \
  -o "$DIR/plans/gpt2-small-bf16" >/dev/null
# gpu_perf.sh's reference for the compiler's GEMM epilogue fusions.
"$PIPERC" compile "$DIR/plans/gpt2-small.mlir" --microbatches 1 --dtype bf16 \
  --no-fused-epilogues -o "$DIR/plans/gpt2-small-bf16-unfused" >/dev/null
rm "$DIR/plans/gpt2-small.mlir"
# gpu_perf.sh's P4: Llama-1B in bf16 at 8192 tokens per step, two ways.
for cfg in 2048x4 4096x2; do
  "$PIPERC" model llama-1b --seq "${cfg%x*}" --batch "${cfg#*x}" -o "$DIR/plans/llama-1b.mlir"
  "$PIPERC" compile "$DIR/plans/llama-1b.mlir" --microbatches 1 --dtype bf16 \
    -o "$DIR/plans/llama-1b-$cfg-bf16" >/dev/null
  rm "$DIR/plans/llama-1b.mlir"
done

# The Hugging Face models transformers wrote, with its loss and gradients
# (test/oracle/transformers), and their plans (Debian's python3, which has
# torch, the oracle's dependency).
cp -r test/oracle/transformers "$DIR/transformers"
/usr/bin/python3 test/oracle/hf_transformers_parity.py "$PIPERC" - test/oracle/transformers \
  --compile-to "$DIR/plans/hf"

install -m 755 scripts/gpu_check.sh scripts/compare_backends.py scripts/gpu_vs_torch.py \
  scripts/gpu_perf.sh scripts/gpu_perf.py test/oracle/hf_transformers_parity.py "$DIR/"
install -m 644 test/oracle/torch_models.py test/oracle/hf_models.py "$DIR/"
# The commit the bundle was built from, and whether the tree had changes
# beyond it (gpu_perf.sh puts both in every row of perf.jsonl).
{
  git rev-parse HEAD
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then echo dirty; else echo clean; fi
} >"$DIR/COMMIT"

# The libraries travel compressed (OpenBLAS alone is 36 MB, 4 MB as xz):
# the device tool carries at most 64 MiB with the repository's own files.
# gpu_check.sh and gpu_perf.sh unpack them where lib/ is missing.
LIBS=$(ls "$DIR/lib" | wc -l)
tar -C "$DIR" -cJf "$DIR/lib.tar.xz" lib
rm -rf "$DIR/lib"

MB=$(du -sm "$DIR" | cut -f1)
echo "gpu_bundle.sh: $DIR is $MB MB ($LIBS libraries in lib.tar.xz, ${#TESTS[@]} test binary, $(ls "$DIR/plans" | wc -l) plans)"
if [ "$MB" -ge "$LIMIT_MB" ]; then
  echo "gpu_bundle.sh: over the $LIMIT_MB MB limit" >&2
  exit 1
fi
