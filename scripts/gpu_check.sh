#!/usr/bin/env bash
# The GPU check: one command, run inside the folder scripts/gpu_bundle.sh made,
# on a machine with one NVIDIA GPU, CUDA 13 with a driver, PyTorch and
# Python 3 (none of our Debian packages). Under 8 minutes. It runs
#   1. every GPU test binary (the CUDA kernels against the CPU kernels, the
#      device, NCCL at world size 1),
#   2. gpt-tiny, llama-tiny and qwen3-moe-tiny (and bf16, PP2 x DP2, DP2 x EP2,
#      ZeRO-3 plans) for 5 steps on --backend cuda and on --backend cpu,
#      comparing the losses; multi-rank plans share the one GPU through
#      --comm gloo,
#   3. one timed step of GPT-2 small in bf16 beside PyTorch's on the same GPU,
# and prints one summary table (also written to $OUT/gpu_check.md when $OUT
# is set). Exit status 0 when everything passed.
set -uo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
REPORT=$(mktemp)
STATUS=0

# cuBLASLt and NCCL: the toolkit's, else PyTorch's wheels'.
PYLIBS=$(python3 - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for mod in ("nvidia.cublas", "nvidia.nccl", "nvidia.cu13"):
    try:
        m = importlib.import_module(mod)
        for p in getattr(m, "__path__", []):
            dirs += [os.path.join(p, "lib")]
    except Exception:
        pass
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
export LD_LIBRARY_PATH="$HERE/lib:/usr/local/cuda/lib64:${PYLIBS}:${LD_LIBRARY_PATH:-}"

say() { echo "$@" | tee -a "$REPORT"; }

say "# Piper GPU check ($(date -u +%Y-%m-%dT%H:%MZ))"
say ""
say "\`$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)\`"
say ""
say "## GPU tests"
say ""
say "| test | result | time | note |"
say "|---|---|---|---|"
for t in tests/*; do
  start=$SECONDS
  out=$(timeout 300 "$t" 2>&1)
  rc=$?
  secs=$((SECONDS - start))
  note=$(echo "$out" | grep -E "cuda kernels:|test cases:" | tail -2 | tr '\n' ' ')
  if [ $rc -eq 0 ]; then res=ok; else res="FAIL ($rc)"; STATUS=1; echo "$out" | tail -40; fi
  say "| $(basename "$t") | $res | $secs s | $note |"
done
say ""
say "## Training: cuda against cpu (5 steps)"
say ""
if python3 compare_backends.py run ./piper-run plans cuda --comm gloo --steps 5 --table /tmp/piper-compare.md; then :; else STATUS=1; fi
cat /tmp/piper-compare.md >> "$REPORT" 2>/dev/null
say ""
say "## GPT-2 small, bf16, one GPU: Piper beside PyTorch"
say ""
if python3 gpu_vs_torch.py ./piper-run plans/gpt2-small-bf16 --row /tmp/piper-bench.md; then
  cat /tmp/piper-bench.md >> "$REPORT"
else
  STATUS=1
  say "| gpt2-small bf16 | FAILED |"
fi
say ""
say "result: $([ $STATUS -eq 0 ] && echo PASS || echo FAIL)"
echo
echo "==== summary ===="
cat "$REPORT"
if [ -n "${OUT:-}" ]; then cp "$REPORT" "$OUT/gpu_check.md"; fi
exit $STATUS
