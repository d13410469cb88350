#!/usr/bin/env bash
# The GPU check: one command, run inside the folder scripts/gpu_bundle.sh
# made, on a machine with one NVIDIA GPU, a driver for CUDA 13 (580 or
# newer), PyTorch and Python 3 (none of our Debian packages). In order:
#   0. a preflight: glibc, the driver, cuBLASLt and NCCL, python3 and torch,
#      whether the bundle's binaries load;
#   1. every GPU test binary (the CUDA kernels against the CPU kernels, the
#      device, NCCL at world size 1), 120 s each;
#   2. gpt-tiny, llama-tiny and qwen3-moe-tiny (and bf16, PP2 x DP2, DP2 x EP2,
#      ZeRO-3 plans) for 5 steps on --backend cuda and on --backend cpu,
#      comparing the losses, piper-run with --timeout-s 30 and 90 s per run;
#      multi-rank plans share the one GPU through --comm gloo;
#   2b. the Hugging Face models of test/oracle/transformers (Llama, Llama
#      3.1, Qwen3, Qwen3-MoE, GPT-2, as transformers wrote them) loaded and
#      stepped once on --backend cuda, their losses and gradients against
#      transformers' own;
#   3. timed steps of GPT-2 small in bf16 beside PyTorch's on the same GPU,
#      failing when their step-1 losses differ by more than 2e-2;
#   4. where time is left, where GPT-2 small's step goes: piper-run
#      --profile with CUDA_LAUNCH_BLOCKING=1 (each kernel's launch then
#      waits for it, so the profile's host times are the kernels' times),
#      the costliest rows in the report (information, not a check).
# All of it runs under one deadline, GPU_CHECK_DEADLINE_S seconds from the
# start (default 420): a step that would start past it is recorded as
# "skipped: deadline", and each step's own limit is cut to what is left. So
# the script ends, its results written, inside the device tool's limit for
# one command (docs/gpu.md: timeout_s about 540).
#
# The results are written as they are produced, so that a run stopped from
# outside keeps what was done, to $OUT (else to a new /tmp folder, named at
# the end): seven files, as the tool brings back at most eight:
#   gpu_check.md            the report, a table row per check
#   gpu_check.log           everything printed
#   gpu_check_failures.log  the output of every step that failed
#   gpu_tests.log           the test binaries' output
#   gpu_check_step.log      the output of the step running (or the last)
#   gpu_profile.log         step 4's whole profile
#   cudnn_deviceprop.json   the GPU's cuDNN device description (written by
#                           cudnn_sdpa_gpu_test): commit it as
#                           runtime/hal/cuda/testdata/ to plan for this GPU
#                           without one (docs/gpu.md)
# Exit status 0 when every check ran and passed.
#
# GPU_CHECK_FORCE=1 runs the GPU steps even where the preflight saw no GPU.
set -uo pipefail
shopt -s nullglob

DEADLINE_S=${GPU_CHECK_DEADLINE_S:-420}
case $DEADLINE_S in
  '' | *[!0-9]*)
    echo "gpu_check.sh: GPU_CHECK_DEADLINE_S must be whole seconds, not '$DEADLINE_S'" >&2
    exit 2
    ;;
esac
DEADLINE=$((SECONDS + DEADLINE_S))
# A step is not started with less than this left: it could only time out.
MIN_STEP_S=10
# The training cases end this long before the deadline, so that GPT-2
# small, the only full-size run, still gets its turn.
GPT2_RESERVE_S=150

# Before the cd: $OUT may be relative.
RESULTS=${OUT:-$(mktemp -d /tmp/piper-gpu-check.XXXXXX)}
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
REPORT=$RESULTS/gpu_check.md
FAILLOG=$RESULTS/gpu_check_failures.log
STEPLOG=$RESULTS/gpu_check_step.log
TESTLOG=$RESULTS/gpu_tests.log
WORK=$(mktemp -d /tmp/piper-gpu-work.XXXXXX) || exit 2
# A fresh start where an earlier run left its files.
for f in "$REPORT" "$FAILLOG" "$STEPLOG" "$TESTLOG" "$RESULTS/gpu_check.log"; do
  : >"$f"
done

# Everything printed goes to gpu_check.log as it is printed.
exec 3>&1 4>&2
exec > >(tee -a "$RESULTS/gpu_check.log") 2>&1
TEE=$!

PASSED=0 FAILED=0 SKIPPED=0
NO_GPU=0
STEP=preflight

finish() {
  exec 1>&3 2>&4 # tee reads to the end of its input...
  wait "$TEE" 2>/dev/null # ...and has written gpu_check.log before the exit
  rm -rf "$WORK"
}
# Best effort: bash runs this once the step in progress has returned.
on_signal() {
  say ""
  say "result: FAIL (stopped by a signal during $STEP, at $SECONDS s)"
  finish
  exit 1
}
trap on_signal TERM INT HUP

# say LINE: a line of the report, appended now (and printed).
say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
# Text as one table cell: one line, its | escaped.
cell() { tr '\n' ' ' | cut -c1-300 | sed 's/  */ /g; s/^ //; s/ $//; s/|/\\|/g'; }
# row RESULT LINE: a report row, counted by its result.
row() {
  case $1 in
    ok) PASSED=$((PASSED + 1)) ;;
    skipped*) SKIPPED=$((SKIPPED + 1)) ;;
    *) FAILED=$((FAILED + 1)) ;;
  esac
  say "$2"
}
# limit S [END]: S seconds, cut to what is left before END (default: the
# deadline).
limit() {
  local left=$((${2:-$DEADLINE} - SECONDS))
  echo $(($1 < left ? $1 : left))
}
# skip_reason [END]: why the next step is not run, or nothing.
skip_reason() {
  if [ "$NO_GPU" = 1 ]; then
    echo "skipped: no GPU"
  elif [ $((${1:-$DEADLINE} - SECONDS)) -lt "$MIN_STEP_S" ]; then
    echo "skipped: deadline"
  fi
}
# shorten FILE [BYTES]: FILE, or its start and end where it is longer.
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
# run_step NAME LIMIT_S COMMAND...: COMMAND under `timeout`, its output in
# $STEPLOG (there while it runs), then in the log; a failing step's output
# is also appended to $FAILLOG. Sets STEP_RC, STEP_S and STEP_RESULT.
run_step() {
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  STEP=$name
  echo "---- $name: limit $limit s, $((DEADLINE - SECONDS)) s to the deadline"
  printf '$ %s\n' "$*" >"$STEPLOG"
  # -k: what ignores the TERM gets a KILL 5 s later. timeout signals its
  # whole process group, so piper-run's ranks stop with it.
  timeout -k 5 "$limit" "$@" >>"$STEPLOG" 2>&1 </dev/null
  STEP_RC=$?
  STEP_S=$((SECONDS - start))
  case $STEP_RC in
    0) STEP_RESULT=ok ;;
    124) STEP_RESULT="FAIL: timed out after $limit s" ;;
    137) STEP_RESULT="FAIL: killed after $STEP_S s (timeout, or out of memory)" ;;
    *) STEP_RESULT="FAIL: exit $STEP_RC" ;;
  esac
  shorten "$STEPLOG"
  echo "---- $name: $STEP_RESULT ($STEP_S s)"
  if [ "$STEP_RC" -ne 0 ]; then
    {
      printf '\n==== %s: %s (%s s)\n' "$name" "$STEP_RESULT" "$STEP_S"
      shorten "$STEPLOG" 1048576
    } >>"$FAILLOG"
  fi
}

# profile_rows FILE: piper-run --profile's table rows of FILE as markdown
# rows (row, calls, ms per step, percent).
profile_rows() {
  awk '/^profile of/ { on = 1; next }
       on && /^  / && NF >= 4 && $NF ~ /^[0-9.]+$/ && $(NF - 1) ~ /^[0-9.]+$/ {
         calls = $(NF - 3); last = NF - 4
         if (calls !~ /^[0-9]+$/) { calls = ""; last = NF - 3 }
         name = $1
         for (i = 2; i <= last; i++) name = name " " $i
         printf "| %s | %s | %s | %s |\n", name, calls, $(NF - 1), $NF
       }' "$1"
}

say "# Piper GPU check ($(date -u +%Y-%m-%dT%H:%MZ), deadline $DEADLINE_S s)"
say ""
say "## Preflight"
say ""
say "| check | result | detail |"
say "|---|---|---|"
check() { row "$2" "| $1 | $2 | $(printf '%s' "$3" | cell) |"; }

glibc=$(ldd --version 2>&1 | head -1)
if [ -n "$glibc" ]; then check glibc ok "$glibc"; else check glibc FAIL "ldd --version printed nothing"; fi

SMI_SEES_GPU=0
SMI=$(command -v nvidia-smi || echo /usr/local/nvidia/bin/nvidia-smi)
if [ ! -x "$SMI" ]; then
  check driver FAIL "no nvidia-smi on PATH or in /usr/local/nvidia/bin: no NVIDIA driver here?"
else
  smi=$(timeout 30 "$SMI" --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>&1)
  rc=$?
  driver=$(printf '%s\n' "$smi" | head -1 | cut -d, -f2 | tr -d ' ')
  if [ $rc -ne 0 ] || ! [[ ${driver%%.*} =~ ^[0-9]+$ ]]; then
    check driver FAIL "nvidia-smi failed ($rc): $(printf '%s\n' "$smi" | head -3)"
  elif [ "${driver%%.*}" -lt 580 ]; then
    SMI_SEES_GPU=1 # the steps then fail at once, saying so
    check driver FAIL "driver $driver is older than 580, the first for CUDA 13: every CUDA call will fail (cudaErrorInsufficientDriver). $smi"
  else
    SMI_SEES_GPU=1
    check driver ok "$smi"
  fi
fi

# cuBLASLt, NCCL and cuDNN for piper's processes: the toolkit's, else
# PyTorch's wheels'.
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
# Only piper's own processes get the bundle's lib/ on their path (the
# binaries' RUNPATH finds their direct libraries; this, the libraries those
# need). python3 and torch keep this machine's environment: the bundle's
# libraries were built for Debian 12 and are not theirs to load.
PIPER_LD_PATH="$HERE/lib:/usr/local/cuda/lib64${PYLIBS:+:$PYLIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "piper's LD_LIBRARY_PATH: $PIPER_LD_PATH"
# piper-run as the Python scripts call it.
PIPER_RUN=$WORK/piper-run
{
  echo '#!/usr/bin/env bash'
  printf 'export LD_LIBRARY_PATH=%q\n' "$PIPER_LD_PATH"
  printf 'exec %q "$@"\n' "$HERE/piper-run"
} >"$PIPER_RUN"
chmod +x "$PIPER_RUN"

# find_lib NAME: the first NAME on piper's path, else ldconfig's.
find_lib() {
  local dir IFS=:
  for dir in $PIPER_LD_PATH; do
    if [ -n "$dir" ] && [ -e "$dir/$1" ]; then
      echo "$dir/$1"
      return
    fi
  done
  "$(command -v ldconfig || echo /sbin/ldconfig)" -p 2>/dev/null |
    awk -v n="$1" '$1 == n { print $NF; exit }'
}
# check_lib WHAT SONAME VARIABLE: piper-run loads VARIABLE's file when it
# is set, else SONAME from the loader's path.
check_lib() {
  local chosen=${!3:-} path
  if [ -n "$chosen" ]; then
    if [ -e "$chosen" ]; then check "$1" ok "\$$3=$chosen"; else check "$1" FAIL "\$$3=$chosen does not exist"; fi
    return
  fi
  path=$(find_lib "$2")
  if [ -n "$path" ]; then
    check "$1" ok "$path"
  else
    check "$1" FAIL "$2 is not in the bundle's lib/, /usr/local/cuda/lib64, python's nvidia packages, \$LD_LIBRARY_PATH or ldconfig -p"
  fi
}
check_lib cuBLASLt libcublasLt.so.13 PIPER_CUBLASLT_LIBRARY
check_lib NCCL libnccl.so.2 PIPER_NCCL_LIBRARY
# cuDNN: bf16 plans' attention (--attention auto falls back to the SIMT
# kernels without it, and says so; the -cudnn training cases then fail).
check_lib cuDNN libcudnn.so.9 PIPER_CUDNN_LIBRARY

TORCH_SEES_GPU=0
torch=$(timeout 90 python3 - <<'PY' 2>&1
import sys
print("python %s;" % sys.version.split()[0], end=" ", flush=True)
import torch
ok = torch.cuda.is_available()
print("torch %s for CUDA %s; cuda available: %s%s" % (
    torch.__version__, torch.version.cuda, ok,
    ", " + torch.cuda.get_device_name(0) if ok else ""))
PY
)
rc=$?
case $rc:$torch in
  0:*"available: True"*)
    TORCH_SEES_GPU=1
    check "python3, torch" ok "$torch"
    ;;
  0:*) check "python3, torch" FAIL "$torch" ;;
  124:*) check "python3, torch" FAIL "no answer in 90 s: $torch" ;;
  *) check "python3, torch" FAIL "exit $rc: $(printf '%s\n' "$torch" | tail -2)" ;;
esac

BINARIES=(piper-run tests/*)
if [ ! -x piper-run ]; then
  check "piper binaries load" FAIL "no piper-run in $HERE: not a folder from scripts/gpu_bundle.sh?"
else
  # ldd names a missing library or a missing GLIBC/GLIBCXX version.
  missing=$(LD_LIBRARY_PATH=$PIPER_LD_PATH timeout 30 ldd "${BINARIES[@]}" 2>&1 |
    grep 'not found' | sort -u)
  help=$(timeout 30 "$PIPER_RUN" --help 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && [ -z "$missing" ]; then
    check "piper binaries load" ok "ldd finds every library of ${BINARIES[*]}; piper-run --help runs"
  else
    check "piper binaries load" FAIL "${missing:-piper-run --help: exit $rc: $(printf '%s\n' "$help" | head -3)}"
  fi
fi

# Any sign of a GPU runs the GPU steps: a preflight wrong about it must not
# waste the run.
if [ "$TORCH_SEES_GPU" = 0 ] && [ "$SMI_SEES_GPU" = 0 ] && [ ! -e /dev/nvidiactl ] &&
  [ "${GPU_CHECK_FORCE:-0}" != 1 ]; then
  NO_GPU=1
  check GPU FAIL "none seen (nvidia-smi, torch, /dev/nvidiactl): the GPU steps are skipped (GPU_CHECK_FORCE=1 runs them anyway)"
fi

STEP="GPU tests"
say ""
say "## GPU tests"
say ""
say "| test | result | time | note |"
say "|---|---|---|---|"
TESTS=(tests/*)
if [ ${#TESTS[@]} -eq 0 ]; then
  row FAIL "| (none) | FAIL: no test binary in tests/ | | |"
fi
for t in "${TESTS[@]}"; do
  name=$(basename "$t")
  skip=$(skip_reason)
  if [ -n "$skip" ]; then
    row "$skip" "| $name | $skip | | |"
    continue
  fi
  run_step "$name" "$(limit 120)" env LD_LIBRARY_PATH="$PIPER_LD_PATH" \
    PIPER_CUDNN_DEVICEPROP_OUT="$RESULTS/cudnn_deviceprop.json" "./$t"
  {
    printf '==== %s: %s (%s s)\n' "$name" "$STEP_RESULT" "$STEP_S"
    cat "$STEPLOG"
  } >>"$TESTLOG"
  note=$(grep -E "cuda kernels:|test cases:" "$STEPLOG" | tail -2 | cell)
  row "$STEP_RESULT" "| $name | $STEP_RESULT | $STEP_S s | $note |"
done

STEP=training
say ""
say "## Training: cuda against cpu (5 steps)"
say ""
say "| case | ranks | dtype | cuda losses | worst relative diff vs cpu | result | time |"
say "|---|---|---|---|---|---|---|"
if ! CASES=$(timeout 30 python3 compare_backends.py list 2>&1); then
  row FAIL "| (all) | | | | | FAIL: compare_backends.py list: $(printf '%s' "$CASES" | cell) | |"
  CASES=
fi
TRAINING_END=$((DEADLINE - GPT2_RESERVE_S))
for name in $CASES; do
  skip=$(skip_reason "$TRAINING_END")
  if [ -n "$skip" ]; then
    row "$skip" "| $name | | | | | $skip | |"
    continue
  fi
  rm -f "$WORK/case.md"
  # Two piper-runs (cpu, then cuda) of at most 90 s each.
  run_step "$name" "$(limit 190 "$TRAINING_END")" python3 -u compare_backends.py run \
    "$PIPER_RUN" plans cuda --comm gloo --steps 5 --only "$name" \
    --timeout-s 30 --wall-s 90 --table "$WORK/case.md"
  # compare_backends.py's own row, else (it was stopped) ours.
  line=$(sed -n 3p "$WORK/case.md" 2>/dev/null)
  row "$STEP_RESULT" "${line:-| $name | | | | | $STEP_RESULT | $STEP_S s |}"
done

STEP=transformers
say ""
say "## Hugging Face models on cuda against transformers (one step)"
say ""
skip=$(skip_reason)
if [ -n "$skip" ]; then
  row "$skip" "| (all) | $skip |"
else
  run_step transformers "$(limit 120)" python3 -u hf_transformers_parity.py - \
    "$PIPER_RUN" transformers --plans plans/hf --backend cuda
  say "| check | result |"
  say "|---|---|"
  grep -E '^(ok|FAIL):' "$STEPLOG" | while IFS= read -r line; do
    say "| ${line#*: } | ${line%%:*} |"
  done
  row "$STEP_RESULT" "| (all) | $STEP_RESULT ($STEP_S s) |"
fi

STEP=gpt2-small
say ""
say "## GPT-2 small, bf16, one GPU: Piper beside PyTorch"
say ""
say "| case | piper tokens/s | pytorch tokens/s | piper / pytorch | step-1 loss piper | step-1 loss pytorch | relative diff | result |"
say "|---|---|---|---|---|---|---|---|"
skip=$(skip_reason)
if [ -n "$skip" ]; then
  row "$skip" "| gpt2-small bf16 | | | | | | | $skip |"
else
  rm -f "$WORK/bench.md"
  # Two piper-runs of at most 150 s each (the initial weights, the timed
  # steps), then PyTorch's steps.
  run_step gpt2-small "$(limit 360)" python3 -u gpu_vs_torch.py "$PIPER_RUN" \
    plans/gpt2-small-bf16 --row "$WORK/bench.md" --timeout-s 60 --wall-s 150
  # gpu_vs_torch.py writes its row as it learns more: Piper's numbers
  # survive a PyTorch that fails or is stopped.
  line=$(cat "$WORK/bench.md" 2>/dev/null)
  case $STEP_RC in
    0) ;;
    124 | 137) line=$(printf '%s' "$line" | sed "s#| [^|]* |\$#| $STEP_RESULT |#") ;;
  esac
  row "$STEP_RESULT" "${line:-| gpt2-small bf16 | | | | | | | $STEP_RESULT |}"
fi

STEP=profile
say ""
say "## GPT-2 small, bf16: where a step goes (CUDA_LAUNCH_BLOCKING=1, information only)"
say ""
skip=$(skip_reason)
if [ -n "$skip" ]; then
  say "$skip"
else
  # Three steps (the profile leaves out the first, the warm-up).
  run_step gpt2-small-profile "$(limit 150)" env CUDA_LAUNCH_BLOCKING=1 \
    "$PIPER_RUN" plans/gpt2-small-bf16 --nproc 1 --backend cuda --steps 3 \
    --profile --timeout-s 60
  cp "$STEPLOG" "$RESULTS/gpu_profile.log"
  if [ "$STEP_RC" -eq 0 ]; then
    # The profile's rows (Reporting.cpp): name (may hold spaces), calls
    # (blank for the totals), ms over the steps, ms per step, percent.
    say "| row | calls | ms per step | % of the step |"
    say "|---|---|---|---|"
    profile_rows "$STEPLOG" | while IFS= read -r line; do say "$line"; done
  else
    say "not measured: $STEP_RESULT (gpu_profile.log)"
  fi
fi

STEP=summary
say ""
if [ "$FAILED" -eq 0 ] && [ "$SKIPPED" -eq 0 ] && [ "$PASSED" -gt 0 ]; then
  verdict=PASS
else
  verdict=FAIL
fi
say "result: $verdict ($PASSED passed, $FAILED failed, $SKIPPED skipped; $SECONDS s)"
echo
echo "==== summary ===="
cat "$REPORT"
echo "results in $RESULTS"
finish
[ "$verdict" = PASS ]
