#!/usr/bin/env bash
# The GPU performance run (docs/gpu.md; the measurement plan of issue 41):
# one command, run inside the folder scripts/gpu_bundle.sh made, on a
# machine with one NVIDIA GPU, PyTorch and Python 3. Rows, in order, each
# under its own time limit:
#   P0  the GPU (nvidia-smi: name, power limit, SM and memory clocks,
#       driver; nothing is changed), torch, cuDNN and NCCL versions, the
#       libcudnn.so.9 torch loads, the peak bf16 TFLOP/s assumed for MFU;
#   P1  causal bf16 attention, forward and forward + backward: torch SDPA
#       pinned to cuDNN and to FLASH, and Piper's attention_bench where the
#       bundle has it (gpu_perf.py states its CLI), 4 shapes;
#   P3  GPT-2 small, 8 x 1024, bf16: Piper (3 + 10 steps), torch eager +
#       SDPA, torch.compile + SDPA (the same weights and batch): tokens/s,
#       MFU, peak memory; Piper's step again with piper-run --step-graph
#       on (each step after the third a CUDA graph launch: its worth);
#       then Piper's plan compiled with --no-fused-epilogues (the epilogue
#       fusions' worth);
#   P4  Llama-1B (piperc model llama-1b) at seq 2048 x 4 and 4096 x 2: torch
#       eager + SDPA (enable_gqa), Piper (fewer steps: its attention may run
#       on CUDA cores), then torch.compile; then, in the time left before
#       P4's end, GPT-2's Piper step again with piper-run
#       --unpack-step-buffers (the packed bf16 storage's worth, a P3 row);
# Piper runs with --attention $GPU_PERF_PIPER_ATTENTION (default auto) where
# piper-run has that option; each row records the choice and what piper-run
# said about it.
#   P5  where time is left: GPT-2 small under piper-run --profile=gpu, or
#       --profile (host issue times) where piper-run has no GPU profile.
# FLOP conventions are in gpu_perf.py's docstring and in every row.
#
# One deadline, GPU_PERF_DEADLINE_S seconds from the start (default 420),
# as gpu_check.sh's: a step that would start with less than 10 s left is
# recorded "skipped: deadline", every step's limit is cut to what is left.
# P4 ends P5_RESERVE_S (40) before the deadline. GPU_PERF_SKIP holds step
# names or globs to leave out (e.g. 'P3-compile P4-*-compile'), recorded
# "skipped: GPU_PERF_SKIP", for runs that rotate (docs/gpu.md).
#
# Results, written row by row as they are produced, to $OUT (else a new
# /tmp folder, named at the end):
#   perf.md           the report: a markdown table per row group
#   perf.jsonl        one JSON object a row: commit, tree, date, gpu, row,
#                     case, result and the row's numbers; append it to the
#                     repository's docs/gpu-perf-history.jsonl
#   perf.log          everything printed
#   perf_failures.log the output of every step that failed
#   perf_profile.log  P5's whole profile
# Exit status 0 when no row failed (skipped rows do not fail the run) and
# a GPU was seen.
#
# GPU_PERF_FORCE=1 runs the steps where nothing shows a GPU.
set -uo pipefail
shopt -s nullglob

DEADLINE_S=${GPU_PERF_DEADLINE_S:-420}
case $DEADLINE_S in
  '' | *[!0-9]*)
    echo "gpu_perf.sh: GPU_PERF_DEADLINE_S must be whole seconds, not '$DEADLINE_S'" >&2
    exit 2
    ;;
esac
DEADLINE=$((SECONDS + DEADLINE_S))
MIN_STEP_S=10
P5_RESERVE_S=40

RESULTS=${OUT:-$(mktemp -d /tmp/piper-gpu-perf.XXXXXX)}
mkdir -p "$RESULTS" && RESULTS=$(cd "$RESULTS" && pwd) || exit 2
cd "$(dirname "$0")" || exit 2
# The bundle's libraries travel as lib.tar.xz (gpu_bundle.sh): unpacked
# once, here.
if [ ! -d lib ] && [ -f lib.tar.xz ]; then
  tar -xJf lib.tar.xz 2>/dev/null ||
    python3 -c 'import tarfile; tarfile.open("lib.tar.xz").extractall()' ||
    { echo "$(basename "$0"): cannot unpack lib.tar.xz" >&2; exit 2; }
fi
HERE=$(pwd)
MD=$RESULTS/perf.md
JSONL=$RESULTS/perf.jsonl
FAILLOG=$RESULTS/perf_failures.log
STEPLOG=$(mktemp /tmp/piper-gpu-perf-step.XXXXXX) || exit 2
WORK=$(mktemp -d /tmp/piper-gpu-perf-work.XXXXXX) || exit 2
for f in "$MD" "$JSONL" "$FAILLOG" "$RESULTS/perf.log"; do
  : >"$f"
done

exec 3>&1 4>&2
exec > >(tee -a "$RESULTS/perf.log") 2>&1
TEE=$!

OK=0 FAILED=0 SKIPPED=0
NO_GPU=0
STEP=start
NCOLS=2

finish() {
  exec 1>&3 2>&4
  wait "$TEE" 2>/dev/null
  rm -rf "$WORK" "$STEPLOG"
}
on_signal() {
  say ""
  say "stopped by a signal during $STEP, at $SECONDS s"
  finish
  exit 1
}
trap on_signal TERM INT HUP

say() { printf '%s\n' "$*" | tee -a "$MD"; }
cell() { tr '\n' ' ' | cut -c1-300 | sed 's/  */ /g; s/^ //; s/ $//; s/|/\//g'; }
# json_str TEXT: TEXT as a JSON string.
json_str() {
  local s
  s=$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037')
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/\\r}
  s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}
count() {
  case $1 in
    ok* | n/a*) OK=$((OK + 1)) ;;
    skipped*) SKIPPED=$((SKIPPED + 1)) ;;
    *) FAILED=$((FAILED + 1)) ;;
  esac
}
# row ROW CASE RESULT: a row the shell writes itself (a step skipped, or
# one that failed before writing its own), to perf.md and perf.jsonl.
row() {
  local md i
  md="| $(printf '%s' "$2" | cell) | $(printf '%s' "$3" | cell) |"
  for ((i = 2; i < NCOLS; i++)); do md+=" |"; done
  say "$md"
  printf '{"commit": %s, "tree": %s, "date": %s, "gpu": %s, "row": %s, "case": %s, "result": %s}\n' \
    "$(json_str "$COMMIT")" "$(json_str "$TREE")" "$(json_str "$DATE")" \
    "$(json_str "$GPU_PERF_GPU")" "$(json_str "$1")" "$(json_str "$2")" \
    "$(json_str "$3")" >>"$JSONL"
}
# section TITLE COLUMN...: a heading and a table header.
section() {
  local title=$1 c
  shift
  NCOLS=$#
  say ""
  say "## $title"
  say ""
  local head="|" sep="|"
  for c in "$@"; do
    head+=" $c |"
    sep+="---|"
  done
  say "$head"
  say "$sep"
}
limit() {
  local left=$((${2:-$DEADLINE} - SECONDS))
  echo $(($1 < left ? $1 : left))
}
# skip_reason NAME [END]: why step NAME is not run, or nothing.
skip_reason() {
  local pattern patterns
  read -ra patterns <<<"${GPU_PERF_SKIP:-}" # words, not expanded as globs here
  for pattern in "${patterns[@]}"; do
    # shellcheck disable=SC2053 # a glob on purpose
    if [[ $1 == $pattern ]]; then
      echo "skipped: GPU_PERF_SKIP"
      return
    fi
  done
  if [ "$NO_GPU" = 1 ]; then
    echo "skipped: no GPU"
  elif [ $((${2:-$DEADLINE} - SECONDS)) -lt "$MIN_STEP_S" ]; then
    echo "skipped: deadline"
  fi
}
shorten() {
  local file=$1 cap=${2:-262144} size
  size=$(wc -c <"$file")
  if [ "$size" -le "$cap" ]; then
    cat "$file"
    return
  fi
  head -c $((cap / 4)) "$file"
  printf '\n[... %d bytes left out ...]\n' $((size - cap))
  tail -c $((cap - cap / 4)) "$file"
}
# step ROW NAME CASE LIMIT_S END PY_ARGS...: gpu_perf.py PY_ARGS under
# `timeout` (LIMIT_S cut to END), or a "skipped" row. gpu_perf.py writes its
# own rows and exits 0, or 3 after a failure row; any other end (a timeout,
# a crash) gets a row here, named CASE.
step() {
  local rowid=$1 name=$2 case=$3 lim=$4 end=$5 skip start=$SECONDS rc result
  shift 5
  skip=$(skip_reason "$name" "$end")
  if [ -n "$skip" ]; then
    count "$skip"
    row "$rowid" "$case" "$skip"
    return
  fi
  lim=$(limit "$lim" "$end")
  STEP=$name
  echo "---- $name: limit $lim s, $((DEADLINE - SECONDS)) s to the deadline"
  printf '$ gpu_perf.py %s\n' "$*" >"$STEPLOG"
  # -k: KILL what ignores the TERM 5 s later; timeout signals its process
  # group, so piper-run and its ranks stop with it.
  timeout -k 5 "$lim" python3 -u gpu_perf.py --out "$RESULTS" --work "$WORK" \
    --budget-s "$lim" "$@" >>"$STEPLOG" 2>&1 </dev/null
  rc=$?
  case $rc in
    0) result=ok ;;
    3) result="FAIL (its row says why)" ;;
    124) result="FAIL: timed out after $lim s" ;;
    137) result="FAIL: killed after $((SECONDS - start)) s (timeout, or out of memory)" ;;
    *) result="FAIL: gpu_perf.py exit $rc" ;;
  esac
  shorten "$STEPLOG"
  echo "---- $name: $result ($((SECONDS - start)) s)"
  count "$result"
  if [ "$rc" -ne 0 ]; then
    {
      printf '\n==== %s: %s (%s s)\n' "$name" "$result" "$((SECONDS - start))"
      shorten "$STEPLOG" 1048576
    } >>"$FAILLOG"
  fi
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    row "$rowid" "$case" "$result: $(grep -v '^\$ ' "$STEPLOG" | tail -1)"
  fi
}

DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
COMMIT=unknown TREE=unknown
if [ -r COMMIT ]; then
  COMMIT=$(sed -n 1p COMMIT)
  TREE=$(sed -n 2p COMMIT)
fi
: "${COMMIT:=unknown}" "${TREE:=unknown}"
SMI=$(command -v nvidia-smi || echo /usr/local/nvidia/bin/nvidia-smi)
GPU_PERF_GPU=$(timeout 20 "$SMI" --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
: "${GPU_PERF_GPU:=unknown}"
if [ "$GPU_PERF_GPU" = unknown ] && [ ! -e /dev/nvidiactl ] &&
  [ "${GPU_PERF_FORCE:-0}" != 1 ]; then
  NO_GPU=1
fi

# cuBLASLt, NCCL and cuDNN for piper's processes: the toolkit's, else
# PyTorch's wheels' (as gpu_check.sh).
PYLIBS=$(timeout 30 python3 - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for mod in ("nvidia.cublas", "nvidia.nccl", "nvidia.cudnn", "nvidia.cu13"):
    try:
        m = importlib.import_module(mod)
        for p in getattr(m, "__path__", []):
            dirs += [os.path.join(p, "lib")]
    except Exception:
        pass
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
PIPER_LD_PATH="$HERE/lib:/usr/local/cuda/lib64${PYLIBS:+:$PYLIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for tool in piper-run attention_bench; do
  {
    echo '#!/usr/bin/env bash'
    printf 'export LD_LIBRARY_PATH=%q\n' "$PIPER_LD_PATH"
    printf 'exec %q "$@"\n' "$HERE/$tool"
  } >"$WORK/$tool"
  chmod +x "$WORK/$tool"
done
export GPU_PERF_COMMIT=$COMMIT GPU_PERF_TREE=$TREE GPU_PERF_DATE=$DATE GPU_PERF_GPU
export GPU_PERF_PIPER_RUN=$WORK/piper-run

say "# Piper GPU performance ($DATE, commit $COMMIT ($TREE), deadline $DEADLINE_S s)"
[ "$NO_GPU" = 1 ] && say "" && say "No GPU seen (nvidia-smi, /dev/nvidiactl): the steps are skipped (GPU_PERF_FORCE=1 runs them)."

section "P0: the machine" item value
step P0 P0 environment 30 "$DEADLINE" env
# P0's detection, for every later row's MFU (unless set by the caller).
if [ -z "${GPU_PERF_PEAK_TFLOPS:-}" ] && [ -s "$WORK/peak_tflops" ]; then
  GPU_PERF_PEAK_TFLOPS=$(cat "$WORK/peak_tflops")
  export GPU_PERF_PEAK_TFLOPS
fi

section "P1: causal bf16 attention (FA papers' FLOPs: fwd 4·B·Hq·T²·D/2, bwd 2.5× fwd)" \
  case result "fwd ms" "fwd TF/s" "fwd+bwd ms" "fwd+bwd TF/s" "bwd TF/s" note
step P1 P1-torch "torch SDPA (all shapes)" 90 "$DEADLINE" attention torch
for mode in simt cudnn; do
  if [ -x attention_bench ]; then
    step P1 "P1-piper-$mode" "piper-$mode (all shapes)" 60 "$DEADLINE" \
      attention piper "$WORK/attention_bench" --mode "$mode"
  else
    count n/a
    row P1 "piper-$mode (all shapes)" "n/a: piper: not in this bundle (no attention_bench)"
  fi
done

TRAIN_COLUMNS=(case result tokens/s "ms/step" MFU "FLOP/token" "peak memory"
  "steps (warm-up + timed)" "step-1 loss" note)
GPT2=plans/gpt2-small-bf16
section "P3: GPT-2 small, 8 x 1024 tokens, bf16" "${TRAIN_COLUMNS[@]}"
step P3 P3-piper "gpt2-small piper" 90 "$DEADLINE" piper-train "$GPT2" \
  --model gpt2-small --case "gpt2-small piper" --row P3 --same-weights
# The same step as a CUDA graph (docs/runtime.md, "Steps as graphs"): steps
# 2 and 3 captured, every later one launched from their captures.
step P3 P3-piper-graph "gpt2-small piper --step-graph on" 60 "$DEADLINE" \
  piper-train "$GPT2" --model gpt2-small \
  --case "gpt2-small piper --step-graph on" --row P3 \
  --run-arg=--step-graph=on
step P3 P3-eager "gpt2-small torch eager+SDPA" 60 "$DEADLINE" torch-train \
  "$GPT2" --model gpt2-small --case "gpt2-small torch eager+SDPA" --row P3 --mode eager
step P3 P3-compile "gpt2-small torch.compile+SDPA" 150 "$DEADLINE" torch-train \
  "$GPT2" --model gpt2-small --case "gpt2-small torch.compile+SDPA" --row P3 --mode compile
# The same step compiled with --no-fused-epilogues: what the compiler's GEMM
# fusions (bias gradient, gradient accumulation and GELU in the epilogues)
# are worth, measured in this run (the ratios below).
if [ -d "$GPT2-unfused" ]; then
  step P3 P3-piper-unfused "gpt2-small piper --no-fused-epilogues" 90 "$DEADLINE" \
    piper-train "$GPT2-unfused" --model gpt2-small \
    --case "gpt2-small piper --no-fused-epilogues" --row P3
else
  count n/a
  row P3 "gpt2-small piper --no-fused-epilogues" "n/a: not in this bundle (no $GPT2-unfused)"
fi

# Piper's Llama steps: few, since where its attention runs on CUDA cores
# (--attention simt, or auto falling back) a 2048-token sequence takes
# ~1-2 s, 4x that at 4096: 1 warm-up + 3 or 2 timed steps.
P4_END=$((DEADLINE - P5_RESERVE_S))
section "P4: Llama-1B (llama-1b preset: 16 layers, hidden 2048, 32/8 heads, ffn 8192, vocab 32000), bf16" \
  "${TRAIN_COLUMNS[@]}"
for cfg in 2048x4 4096x2; do
  plan=plans/llama-1b-$cfg-bf16
  timed=3
  [ "$cfg" = 4096x2 ] && timed=2
  step P4 "P4-$cfg-eager" "llama-1b $cfg torch eager+SDPA" 60 "$P4_END" torch-train \
    "$plan" --model llama-1b --case "llama-1b $cfg torch eager+SDPA" --row P4 --mode eager
  step P4 "P4-$cfg-piper" "llama-1b $cfg piper" 90 "$P4_END" piper-train "$plan" \
    --model llama-1b --case "llama-1b $cfg piper" --row P4 --warmup 1 --steps $timed \
    --timeout-s 120 --note "fewer steps than torch's (in case attention runs on CUDA cores)"
done
for cfg in 2048x4 4096x2; do
  step P4 "P4-$cfg-compile" "llama-1b $cfg torch.compile+SDPA" 150 "$P4_END" torch-train \
    "plans/llama-1b-$cfg-bf16" --model llama-1b --case "llama-1b $cfg torch.compile+SDPA" \
    --row P4 --mode compile
done

# What the runtime's packed bf16 storage is worth (docs/runtime.md, "Packed
# step buffers and values"): GPT-2's step again with piper-run
# --unpack-step-buffers. Last, in the time the rows above left.
section "P3, last: GPT-2 small without the packed bf16 storage" "${TRAIN_COLUMNS[@]}"
step P3 P3-piper-unpacked "gpt2-small piper --unpack-step-buffers" 60 "$P4_END" \
  piper-train "$GPT2" --model gpt2-small \
  --case "gpt2-small piper --unpack-step-buffers" --row P3 \
  --run-arg=--unpack-step-buffers

# The ratios the issue's targets are stated in, from the rows above (a
# reference that did not run gives n/a).
section "Piper against PyTorch, measured in this run (tokens/s ratios)" \
  case result "piper / eager" "piper / torch.compile"
step ratios ratios "piper / torch" 10 "$DEADLINE" ratios

section "P5: where GPT-2 small's step goes (piper-run's profile, 3 steps, the first left out)" \
  case result detail
step P5 P5 "gpt2-small profile" 60 "$DEADLINE" profile "$GPT2"

STEP=summary
say ""
say "rows: $OK ok, $FAILED failed, $SKIPPED skipped; $SECONDS s of the $DEADLINE_S s deadline"
say ""
say "Append the results to the repository's history (from the repository root, on the development machine):"
say "  cat <the returned perf.jsonl> >> docs/gpu-perf-history.jsonl"
echo
echo "results in $RESULTS (perf.md, perf.jsonl)"
finish
[ "$FAILED" -eq 0 ] && [ "$NO_GPU" = 0 ]
