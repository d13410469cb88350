# Shared by the benchmark scripts (sourced, not run).

# Sets PIPERC to a piperc binary: the one given in $PIPERC, or one built
# with $BAZEL_BUILD_FLAGS (default -c opt) under a separate symlink prefix,
# so bazel-bin stays untouched.
build_piperc() {
  if [[ -n "${PIPERC:-}" ]]; then
    return
  fi
  local bazel="${BAZEL:-bazel}" flags prefix
  read -r -a flags <<<"${BAZEL_BUILD_FLAGS:--c opt}"
  echo "building //tools:piperc (${flags[*]}) ..." >&2
  prefix="$(mktemp -d -t piper-bench-XXXXXX)/"
  "$bazel" build "${flags[@]}" --symlink_prefix="$prefix" //tools:piperc >&2
  PIPERC="${prefix}bin/tools/piperc"
}

# Sets PIPERC, PIPER_PLAN and PIPER_RUN: the ones given in the environment
# (PIPER_PLAN defaults to the piper-plan beside PIPERC), or ones built with
# $BAZEL_BUILD_FLAGS (default -c opt) under a separate symlink prefix.
build_tools() {
  if [[ -z "${PIPERC:-}" || -z "${PIPER_RUN:-}" ]]; then
    local bazel="${BAZEL:-bazel}" flags prefix
    read -r -a flags <<<"${BAZEL_BUILD_FLAGS:--c opt}"
    prefix="$(mktemp -d -t piper-bench-XXXXXX)/"
    echo "building piperc, piper-plan and piper-run (${flags[*]}) ..." >&2
    "$bazel" build "${flags[@]}" --symlink_prefix="$prefix" //tools:piperc \
      //tools:piper-plan //tools:piper-run >&2
    PIPERC="${prefix}bin/tools/piperc"
    PIPER_RUN="${prefix}bin/tools/piper-run"
    PIPER_PLAN="${prefix}bin/tools/piper-plan"
  fi
  PIPER_PLAN="${PIPER_PLAN:-$(dirname "$PIPERC")/piper-plan}"
}

# Prints A / B with two decimals.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'
}
