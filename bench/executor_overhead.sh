#!/usr/bin/env bash
# Per-instruction dispatch overhead of the Piper executor on plans of
# thousands of tiny kernels (4-element adds), beside PyTorch eager's per-op
# overhead on the same tiny tensors, measured in the same run. A benchmark,
# not a test. Goal: under 1 us per instruction. See docs/runtime.md.
#
# Usage: bench/executor_overhead.sh [STEPS]
# Environment:
#   THREADS   kernel and torch threads (default 1: overhead, not throughput)
#   BAZEL     bazel command (default: bazel)
#   PYTHON    python with torch (default: /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS="${1:-20}"
THREADS="${THREADS:-1}"
BAZEL="${BAZEL:-bazel}"
PYTHON="${PYTHON:-/usr/bin/python3}"
export OPENBLAS_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS"

"$BAZEL" build -c opt //bench:executor_overhead >&2
BIN="$("$BAZEL" info -c opt bazel-bin 2>/dev/null)/bench/executor_overhead"
piper="$("$BIN" "$STEPS")"

torch="$("$PYTHON" - "$THREADS" <<'PY'
import sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
a, b, out = torch.ones(4), torch.ones(4), torch.empty(4)
def per_op(fn, n=200000):
    for _ in range(2000):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) * 1e6 / n
print("torch_add_out_us %.3f" % per_op(lambda: torch.add(a, b, out=out)))
print("torch_add_us %.3f" % per_op(lambda: a + b))
PY
)"

value() { awk -v k="$1" '$1 == k { print $2 }' <<<"$piper
$torch"; }
echo "per-op dispatch overhead, 4-element f32 adds, $THREADS thread(s), $(nproc --all) cores:"
printf '  %-44s %8s us\n' \
  "piper: kernel inside a 4000-kernel CALL" "$(value piper_kernel_in_call_us)" \
  "piper: CALL instruction (1-kernel segment)" "$(value piper_call_instruction_us)" \
  "pytorch eager: torch.add(a, b, out=c)" "$(value torch_add_out_us)" \
  "pytorch eager: a + b (allocating)" "$(value torch_add_us)"
