#!/usr/bin/env bash
# Piper vs PyTorch eager on CPU: one training step (forward, backward, AdamW)
# of gpt2-small (seq 256, batch 1), llama-tiny (4 microbatches of 8) and
# gpt-256 (hidden 256, vocab 4096, seq 128, batch 4), same
# model, weights, batch, float32 and thread count; prints tokens/s of both and
# the ratio; with --profile also Piper's per-kernel table and ns per element
# of its elementwise and row kernels. A benchmark, not a test.
# See docs/performance.md.
#
# Usage: bench/cpu_vs_torch.sh [--models gpt2-small,llama-tiny,gpt-256] [--steps N]
#                              [--warmup N] [--profile] [--json FILE]
# Environment:
#   THREADS         threads of both sides (default: nproc)
#   BLAS_CORETYPE   OpenBLAS kernel core for both sides: "auto" (default:
#                   override OpenBLAS's generic Prescott fallback on CPUs it
#                   does not recognize by SkylakeX/Haswell), "default" (keep
#                   OpenBLAS's own detection), or a core name (OPENBLAS_CORETYPE)
#   PIPER_BIN       folder with piperc and piper-run: skip the build
#   BAZEL           bazel command (default: bazel); BAZEL_STARTUP_FLAGS and
#                   BAZEL_BUILD_FLAGS are passed to it (e.g. --output_base=...)
#   PYTHON          python with torch (default: /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS="${THREADS:-$(nproc)}"
PYTHON="${PYTHON:-/usr/bin/python3}"
BAZEL="${BAZEL:-bazel}"
read -r -a STARTUP <<<"${BAZEL_STARTUP_FLAGS:-}"
read -r -a BUILD_FLAGS <<<"${BAZEL_BUILD_FLAGS:-}"

if [[ -z "${PIPER_BIN:-}" ]]; then
  echo "building //tools:piperc //tools:piper-run ..." >&2
  "$BAZEL" "${STARTUP[@]}" build "${BUILD_FLAGS[@]}" //tools:piperc //tools:piper-run >&2
  PIPER_BIN="$("$BAZEL" "${STARTUP[@]}" info "${BUILD_FLAGS[@]}" bazel-bin 2>/dev/null)/tools"
fi
for tool in piperc piper-run; do
  [[ -x "$PIPER_BIN/$tool" ]] || { echo "no $PIPER_BIN/$tool" >&2; exit 1; }
done

# Same BLAS and OpenMP threads on both sides; piper-run passes an explicit
# OPENBLAS_NUM_THREADS through to its rank.
export OPENBLAS_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS"
# PyTorch's OpenMP workers would otherwise spin between parallel regions
# and fight OpenBLAS's threads for the cores (steps 2-20x slower and
# erratic on 2 cores); passive waiting is PyTorch's better setting here.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

# OpenBLAS 0.3.21 does not know recent Xeons (e.g. family 6 model 207) and
# falls back to its generic Prescott (SSE3) kernels. Both sides load the same
# libopenblas, so one OPENBLAS_CORETYPE applies to both.
CORETYPE="${BLAS_CORETYPE:-auto}"
if [[ "$CORETYPE" == auto ]]; then
  unset OPENBLAS_CORETYPE
  detected="$("$PYTHON" -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())' 2>/dev/null || echo unknown)"
  if [[ "$detected" == Prescott ]]; then
    if grep -qw avx512f /proc/cpuinfo; then
      export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then
      export OPENBLAS_CORETYPE=Haswell
    fi
    [[ -n "${OPENBLAS_CORETYPE:-}" ]] &&
      echo "OpenBLAS detected the generic Prescott core on this CPU; using OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE for both sides (BLAS_CORETYPE=default keeps Prescott)" >&2
  fi
elif [[ "$CORETYPE" == default ]]; then
  unset OPENBLAS_CORETYPE
else
  export OPENBLAS_CORETYPE="$CORETYPE"
fi

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$PYTHON" bench/cpu_vs_torch.py --piperc "$PIPER_BIN/piperc" \
  --piper-run "$PIPER_BIN/piper-run" --threads "$THREADS" "$@"
