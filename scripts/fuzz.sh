#!/bin/bash
# Builds the libFuzzer targets of test/fuzz (clang 22, ASan + UBSan) into
# .fuzz/, without Bazel: protoc and mlir-tblgen generate the plan format's
# and the dialect's sources. Then, by mode:
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   fuzz each target SECONDS (60)
#   scripts/fuzz.sh --runs N [TARGET...]    fuzz each target N executions
#   scripts/fuzz.sh --replay [TARGET...]    run each target once over its
#       seeds and crash reproducers (test/fuzz/corpus/<target>/ and
#       test/fuzz/crashes/<target>/); non-zero when one fails to build or
#       crashes. scripts/test.sh runs it, so that every target keeps
#       building and no reproducer crashes again.
#
# Fuzzing prints one line per target (executions, executions per second,
# crashes) and exits non-zero when any target crashed; a crash's input is
# saved under .fuzz/crashes/<target>/. See docs/fuzzing.md.
#
# Environment: FUZZ_JOBS (parallel compiles, default nproc), FUZZ_ARGS (extra
# libFuzzer flags), FUZZ_DIR (the build folder, default .fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=time seconds=60 runs=
case "${1:-}" in
--replay) mode=replay; shift ;;
--runs) mode=runs; runs="${2:?--runs needs a count}"; shift 2 ;;
[0-9]*) seconds="$1"; shift ;;
esac

# Each target and its entry point in test/fuzz/Targets.h.
declare -A entry=([plan]=fuzzPlan [manifest]=fuzzManifest
  [safetensors]=fuzzSafetensors [strategy]=fuzzStrategy
  [hfconfig]=fuzzHfConfig [tokenfile]=fuzzTokenFile [mlir]=fuzzMlir)
all_targets=(plan manifest safetensors strategy hfconfig tokenfile mlir)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [ -n "${entry[$t]:-}" ] || { echo "fuzz: no target '$t' (${all_targets[*]})" >&2; exit 2; }
done

LLVM=/usr/lib/llvm-22
CXX=clang++-22
for tool in "$CXX" protoc "$LLVM/bin/mlir-tblgen"; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz: $tool not found; run scripts/setup.sh" >&2
    exit 2
  fi
done

out="${FUZZ_DIR:-.fuzz}"
gen="$out/gen"
mkdir -p "$out/obj" "$out/bin" "$gen/proto" "$gen/dialects/piper"

# Generated sources, remade when their input is newer: the plan format
# (protoc) and the piper dialect's declarations (mlir-tblgen; the strategy
# parser uses its enums, test/fuzz/PiperEnums.cpp).
if [ proto/plan.proto -nt "$gen/proto/plan.pb.cc" ]; then
  protoc --cpp_out="$gen" proto/plan.proto
fi
tblgen() { # TD_FILE FLAGS OUTPUT
  local td="dialects/piper/$1" o="$gen/dialects/piper/$3"
  if [ ! -f "$o" ] || [ -n "$(find dialects/piper -name '*.td' -newer "$o")" ]; then
    # shellcheck disable=SC2086
    "$LLVM/bin/mlir-tblgen" $2 -I "$LLVM/include" -I dialects/piper "$td" -o "$o"
  fi
}
tblgen PiperDialect.td "-gen-dialect-decls -dialect=piper" PiperDialect.h.inc
tblgen PiperDialect.td "-gen-typedef-decls -typedefs-dialect=piper" PiperTypes.h.inc
tblgen PiperDialect.td "-gen-attrdef-decls -attrdefs-dialect=piper" PiperAttrs.h.inc
tblgen PiperDialect.td -gen-enum-decls PiperEnums.h.inc
tblgen PiperDialect.td -gen-enum-defs PiperEnums.cpp.inc
tblgen PiperInterfaces.td -gen-op-interface-decls PiperInterfaces.h.inc
tblgen PiperOps.td -gen-op-decls PiperOps.h.inc

FLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer
  -Wno-deprecated-declarations -fsanitize=address,undefined
  -fno-sanitize-recover=all)
INCLUDES=(-I. -I"$gen" -I"$LLVM/include")

# Every source the targets link: the readers, what runs on their results,
# and what those call. The replay in scripts/test.sh fails when one is
# missing here; the validator's files are globbed (runtime/exec/Validate*),
# since a check moved to a new file there is the usual way to miss one.
sources=(
  "$gen/proto/plan.pb.cc"
  proto/InputFile.cpp proto/PlanFile.cpp proto/KernelIds.cpp
  proto/PlanGroups.cpp proto/PlanShards.cpp proto/PlanTensors.cpp
  proto/analysis/ArenaSweep.cpp proto/analysis/MemoryPlan.cpp
  proto/analysis/MemoryReport.cpp proto/analysis/StreamOrder.cpp
  runtime/exec/Validate*.cpp
  runtime/formats/CheckpointManifest.cpp runtime/formats/Integrity.cpp
  runtime/formats/Json.cpp runtime/formats/Safetensors.cpp
  runtime/data/TokenFile.cpp support/AtomicFile.cpp
  support/Errno.cpp support/FileIO.cpp
  support/ParallelLayout.cpp support/RegularFile.cpp
  compiler/strategy/JsonScan.cpp compiler/strategy/Schedules.cpp
  compiler/strategy/Strategy.cpp compiler/strategy/StrategyParse.cpp
  compiler/driver/MlirScan.cpp
  compiler/frontend/HfConfig.cpp compiler/frontend/GptConfig.cpp
  test/fuzz/PiperEnums.cpp test/fuzz/Targets.cpp test/fuzz/MlirTarget.cpp
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
  # shellcheck disable=SC2086
  $CXX $FLAGS_STR -fsanitize=fuzzer-no-link $INCLUDES_STR \
    -MMD -MF "$obj.d" -c "$src" -o "$obj"
}
export -f compile
FLAGS_STR="${FLAGS[*]}" INCLUDES_STR="${INCLUDES[*]}"
export CXX FLAGS_STR INCLUDES_STR
objects=()
jobs=()
for src in "${sources[@]}"; do
  obj="$out/obj/$(echo "${src%.*}" | tr / _).o"
  objects+=("$obj")
  jobs+=("$src" "$obj")
done
start=$SECONDS
printf '%s\0%s\0' "${jobs[@]}" |
  xargs -0 -n 2 -P "${FUZZ_JOBS:-$(nproc)}" bash -c 'compile "$0" "$1"'

LIBS=(-L"$LLVM/lib" -Wl,-rpath,"$LLVM/lib"
  -lMLIR -lLLVM -lprotobuf -lfmt -lz -lpthread)
for t in "${targets[@]}"; do
  main="$out/obj/main_$t.o" exe="$out/bin/fuzz_$t"
  if [ ! -f "$exe" ] || [ test/fuzz/fuzz_main.cpp -nt "$main" ] ||
    [ -n "$(find "${objects[@]}" -newer "$exe" | head -1)" ]; then
    "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "${INCLUDES[@]}" \
      -DPIPER_FUZZ_TARGET="${entry[$t]}" -c test/fuzz/fuzz_main.cpp -o "$main"
    "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "$main" "${objects[@]}" \
      "${LIBS[@]}" -o "$exe"
  fi
done
echo "fuzz: built ${#targets[@]} target(s) in $((SECONDS - start)) s"

# Flags of one target: the MLIR text target needs longer inputs to nest.
target_args() {
  [ "$1" = mlir ] && echo "-max_len=16384"
  return 0
}

if [ "$mode" = replay ]; then
  status=0
  for t in "${targets[@]}"; do
    inputs=()
    while IFS= read -r -d '' f; do inputs+=("$f"); done < <(
      find "test/fuzz/corpus/$t" "test/fuzz/crashes/$t" -type f -print0 \
        2>/dev/null | sort -z)
    log="$out/replay_$t.log"
    if [ ${#inputs[@]} -eq 0 ]; then
      echo "fuzz: $t: no seeds in test/fuzz/corpus/$t" | tee "$log"
      status=1
    elif "$out/bin/fuzz_$t" -rss_limit_mb=2048 -timeout=30 \
      "${inputs[@]}" >"$log" 2>&1; then
      echo "fuzz: $t: ${#inputs[@]} input(s) replayed"
    else
      echo "fuzz: $t: replay FAILED, see $log"
      grep -m3 -E 'ERROR: |runtime error|Running: ' "$log" | tail -3 || true
      status=1
    fi
  done
  exit "$status"
fi

status=0
summary=()
for t in "${targets[@]}"; do
  seeds="test/fuzz/corpus/$t"
  work="$out/corpus/$t"
  crashes="$out/crashes/$t"
  mkdir -p "$work" "$crashes"
  log="$out/$t.log"
  budget=(-max_total_time="$seconds")
  [ "$mode" = runs ] && budget=(-runs="$runs")
  echo "fuzz: $t (${budget[*]})"
  touch "$out/$t.start"
  set +e
  # shellcheck disable=SC2046,SC2086
  "$out/bin/fuzz_$t" "$work" "$seeds" "${budget[@]}" $(target_args "$t") \
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
echo "fuzz: summary (${budget[*]} per target)"
printf '  %s\n' "${summary[@]}"
exit "$status"
