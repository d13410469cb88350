#!/usr/bin/env bash
# attention_bench (bench/AttentionBench.cpp) on --backend cuda-emulation:
# both modes print one JSON line with positive times; a bad shape and
# --mode cudnn on a head size cuDNN's model takes are checked too.
set -uo pipefail
BENCH=$1
fails=0
check() { # NAME COMMAND...: COMMAND must succeed
  local name=$1
  shift
  if ! "$@"; then
    echo "FAIL: $name"
    fails=$((fails + 1))
  else
    echo "ok: $name"
  fi
}
json_ok() { # LINE: a JSON object with positive fwd_ms and bwd_ms
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["fwd_ms"] > 0 and r["bwd_ms"] > 0 else 1)' "$1"
}
for mode in simt cudnn; do
  out=$("$BENCH" --backend cuda-emulation --shape 1,4,2,16,16 --mode "$mode" --iters 2 --rope-theta 10000 2>&1)
  rc=$?
  echo "$out"
  check "$mode: exit 0" test "$rc" -eq 0
  check "$mode: one JSON line" json_ok "$(echo "$out" | grep '^{' | tail -1)"
done
out=$("$BENCH" --backend cuda-emulation --shape 1,4,2 2>&1)
rc=$?
check "a short --shape: exit 1" test "$rc" -eq 1
check "a short --shape: says so" grep -q "is not B,Hq,Hkv,T,D" <<<"$out"
out=$("$BENCH" --backend cuda-emulation --shape 1,3,2,8,8 2>&1)
rc=$?
check "heads not a multiple of kv heads: exit 1" test "$rc" -eq 1
out=$("$BENCH" --shape 1,1,1,8,8 --mode flash 2>&1)
rc=$?
check "an unknown mode: exit 2" test "$rc" -eq 2
echo "$((7 - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
