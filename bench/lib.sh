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

# Prints A / B with two decimals.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'
}
