#!/bin/bash
# Builds the libFuzzer targets of test/fuzz (clang 22, ASan + UBSan) and runs
# each for SECONDS (default 60) on its seed corpus, test/fuzz/corpus/<target>/.
# Prints one line per target (executions, executions per second, crashes) and
# exits non-zero when any target crashed; a crash's input is saved under
# .fuzz/crashes/<target>/. See docs/fuzzing.md.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Environment: FUZZ_JOBS (parallel compiles, default nproc), FUZZ_ARGS (extra
# libFuzzer flags).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
all_targets=(plan manifest safetensors strategy tokenfile)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")

CXX=clang++-22
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz: $CXX not found; run scripts/setup.sh" >&2
  exit 2
fi

# Generated sources come from the Bazel build: plan.pb.{h,cc} and the piper
# dialect's tblgen output (the strategy parser uses its enums; see
# test/fuzz/PiperEnums.cpp).
gen=(//proto:plan_cc_proto //dialects/piper:piper_dialect_inc
  //dialects/piper:piper_interfaces_inc //dialects/piper:piper_ops_inc)
bazel build "${gen[@]}" >/dev/null 2>&1 || bazel build "${gen[@]}"
bin="$(bazel info bazel-bin 2>/dev/null)"

out=.fuzz
mkdir -p "$out/obj" "$out/bin"
LLVM=/usr/lib/llvm-22
FLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer
  -Wno-deprecated-declarations -fsanitize=address,undefined
  -fno-sanitize-recover=all)
INCLUDES=(-I. -I"$bin" -I"$LLVM/include")

sources=(
  "$bin/proto/plan.pb.cc"
  proto/PlanFile.cpp proto/KernelIds.cpp
  proto/analysis/MemoryPlan.cpp proto/analysis/MemoryReport.cpp
  proto/analysis/StreamOrder.cpp
  runtime/exec/Validate.cpp runtime/exec/ValidateChecks.cpp
  runtime/exec/ValidateOrdering.cpp runtime/exec/ValidateStrategy.cpp
  runtime/checkpoint/Json.cpp runtime/checkpoint/Safetensors.cpp
  runtime/data/AtomicFile.cpp runtime/data/TokenFile.cpp
  compiler/strategy/Strategy.cpp
  test/fuzz/PiperEnums.cpp test/fuzz/Targets.cpp
)

# Recompile an object when its source or any header it includes (from the
# compiler's dependency file) is newer.
compile() {
  local src="$1" obj="$2"
  if [ -f "$obj" ] && [ -f "$obj.d" ]; then
    local stale=0 dep
    for dep in $(sed -e 's/\\$//' -e 's/^[^:]*://' "$obj.d"); do
      if [ "$dep" -nt "$obj" ]; then stale=1; break; fi
    done
    [ "$stale" -eq 0 ] && return 0
  fi
  echo "fuzz: compiling $src"
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer-no-link "${INCLUDES[@]}" \
    -MMD -MF "$obj.d" -c "$src" -o "$obj"
}
export -f compile
export CXX
objects=()
jobs=()
for src in "${sources[@]}"; do
  obj="$out/obj/$(basename "${src%.*}").o"
  objects+=("$obj")
  jobs+=("$src" "$obj")
done
FLAGS_STR="${FLAGS[*]}"
INCLUDES_STR="${INCLUDES[*]}"
export FLAGS_STR INCLUDES_STR
printf '%s\0%s\0' "${jobs[@]}" |
  xargs -0 -n 2 -P "${FUZZ_JOBS:-$(nproc)}" bash -c '
    FLAGS=($FLAGS_STR); INCLUDES=($INCLUDES_STR); compile "$0" "$1"'

LIBS=(-L"$LLVM/lib" -Wl,-rpath,"$LLVM/lib"
  -lMLIR -lLLVM -lprotobuf -lfmt -lz -lpthread)
for t in "${all_targets[@]}"; do
  fn="fuzz$(tr '[:lower:]' '[:upper:]' <<<"${t:0:1}")${t:1}"
  [ "$t" = tokenfile ] && fn=fuzzTokenFile
  main="$out/obj/main_$t.o"
  exe="$out/bin/fuzz_$t"
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "${INCLUDES[@]}" \
    -DPIPER_FUZZ_TARGET="$fn" -c test/fuzz/fuzz_main.cpp -o "$main"
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "$main" "${objects[@]}" "${LIBS[@]}" \
    -o "$exe"
done

status=0
summary=()
for t in "${targets[@]}"; do
  seeds="test/fuzz/corpus/$t"
  work="$out/corpus/$t"
  crashes="$out/crashes/$t"
  mkdir -p "$work" "$crashes"
  log="$out/$t.log"
  echo "fuzz: $t for ${seconds}s"
  touch "$out/$t.start"
  set +e
  # shellcheck disable=SC2086
  "$out/bin/fuzz_$t" "$work" "$seeds" -max_total_time="$seconds" \
    -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$crashes/" ${FUZZ_ARGS:-} >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  found=$(find "$crashes" -type f -newer "$out/$t.start" | wc -l)
  line="$(printf '%-12s %12s execs %8s execs/s  %d new crash file(s)' "$t" \
    "${execs:-?}" "${rate:-?}" "$found")"
  if [ "$rc" -ne 0 ]; then
    status=1
    line+="  FAILED (rc $rc): see $log"
    grep -m1 -E 'ERROR: |runtime error' "$log" || true
  fi
  echo "$line"
  summary+=("$line")
done
echo "fuzz: summary (${seconds}s per target)"
printf '  %s\n' "${summary[@]}"
exit "$status"
