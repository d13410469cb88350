#!/bin/bash
# Builds piperc, piper-opt, piper-run, piper-plan and piper-tokenize and installs them
# into PREFIX/bin so that they run from any folder, not only from bazel-bin:
#   scripts/install.sh PREFIX            (e.g. scripts/install.sh ~/.local)
# Bazel links its binaries against shared libraries through runfiles paths
# ($ORIGIN/../_solib_k8/...) that exist only inside bazel-bin. Here every
# library a binary needs is found either by the system loader, or in a
# Debian package folder outside the loader's path (LLVM/MLIR 22 in
# /usr/lib/llvm-22/lib), which goes into the binary's RUNPATH, or anywhere
# else, in which case it is copied into PREFIX/lib ($ORIGIN/../lib). The
# result needs the packages of scripts/setup.sh, nothing from this tree.
# Environment: BAZEL (default: bazel), BAZEL_BUILD_FLAGS (e.g. "-c opt").
set -euo pipefail

if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
mkdir -p "$1"
PREFIX="$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."

TOOLS=(piperc piper-opt piper-run piper-plan piper-tokenize)
BAZEL="${BAZEL:-bazel}"
read -r -a BUILD_FLAGS <<<"${BAZEL_BUILD_FLAGS:-}"
"$BAZEL" build "${BUILD_FLAGS[@]}" "${TOOLS[@]/#///tools:}"
BIN="$("$BAZEL" info "${BUILD_FLAGS[@]}" bazel-bin 2>/dev/null)/tools"

command -v patchelf >/dev/null ||
  { echo "install: patchelf is missing (scripts/setup.sh installs it)" >&2; exit 1; }

# Sonames the system loader finds without any RUNPATH.
system_libs="$(ldconfig -p | awk '{print $1}' | sort -u)"

mkdir -p "$PREFIX/bin" "$PREFIX/lib"
for tool in "${TOOLS[@]}"; do
  src="$BIN/$tool"
  dst="$PREFIX/bin/$tool"
  rpath=()
  # ldd, run on the binary where it was built, resolves every library
  # through Bazel's runfiles RUNPATH: "libX.so.1 => /path/libX.so.1 (0x...)".
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" && -n "$path" && "$path" != "not" ]] || {
      [[ "$arrow" == "=>" ]] && { echo "install: $tool: $soname not found" >&2; exit 1; }
      continue
    }
    grep -qxF "$soname" <<<"$system_libs" && continue
    real="$(readlink -f "$path")"
    case "$real" in
    /usr/* | /lib/* | /lib64/*)
      # A system package's library outside the loader's path.
      dir="$(dirname "$real")"
      ;;
    *)
      # Built or fetched into Bazel's tree: ship a copy.
      cp -fL "$real" "$PREFIX/lib/$soname"
      chmod 0644 "$PREFIX/lib/$soname"
      dir='$ORIGIN/../lib'
      ;;
    esac
    [[ " ${rpath[*]:-} " == *" $dir "* ]] || rpath+=("$dir")
  done < <(ldd "$src")
  rm -f "$dst"
  cp -L "$src" "$dst"
  chmod 0755 "$dst"
  if [[ ${#rpath[@]} -gt 0 ]]; then
    patchelf --set-rpath "$(IFS=:; echo "${rpath[*]}")" "$dst"
  else
    patchelf --remove-rpath "$dst"
  fi
  echo "installed $dst (RUNPATH: $(patchelf --print-rpath "$dst" | sed 's/^$/none/'))"
done
rmdir "$PREFIX/lib" 2>/dev/null || true
