#!/usr/bin/env bash
# Context parallelism's memory and step time (docs/context-parallel.md):
# llama-1b (fp32, one sequence per microbatch, one microbatch) at sequence
# 32K and 128K compiled for CP 1, 2, 4 and 8 (ring attention) and CP 2, 4
# and 8 (Ulysses). Per rank it prints:
#   planned step memory  the arena minus the parameter state (the
#                        activations, their gradients, scratch: everything
#                        with a row per token, which CP splits), beside
#                        the analytical 1/N of CP 1's, and their ratio;
#   predicted step time  the simulator's (bench/h200-node.json: 400 TFLOP/s,
#                        450 GB/s links) as compiled ("overlap on": each
#                        ring exchange runs beside the step before it, so
#                        only the piece that reads a shard waits for it),
#                        and for the ring the same strategy compiled with
#                        --cp-no-overlap ("overlap off": each exchange waits
#                        for the step before it, on the critical path),
#                        their ratio ("on/off"), and the exchanges' time
#                        (cp_stream's timeline entries, overlaps counted
#                        once).
# The fit "step = A/N + C" through CP 1 and CP 8 separates what CP splits
# (A: every value with a row per token) from what it does not (C). C is
# mostly the ring's sent key/value shards: a SEND's buffer stays alive until
# the step ends (docs/memory-plan.md), so each layer's forward keeps its
# N - 1 sent shards [S/N, 2 kv_heads hd] until the step ends, (N - 1)/N S
# 2 kv_heads hd floats per layer (16 layers x 7 x 64 MiB = 7 GiB of CP 8's
# 49 GiB at 128K), plus what no token count scales (the embedding's and
# the head's weight-gradient temporaries). Freeing a sent buffer when its
# transfer completes would remove it (docs/context-parallel.md §5).
# A benchmark, not a test: not part of `bazel test`.
#
# Usage: bench/context_parallel.sh
# Environment:
#   PIPERC, PIPER_RUN  binaries: skip the builds (PIPER_PLAN defaults to the
#                      piper-plan beside PIPERC)
#   BAZEL, BAZEL_BUILD_FLAGS  as in bench/lib.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
build_tools

work="$(mktemp -d -t piper-cp-XXXXXX)"
trap 'rm -rf "$work"' EXIT
machine="$PWD/bench/h200-node.json"

rows=()
for seq in 32768 131072; do
  "$PIPERC" model llama-1b --seq $seq --batch 1 -o "$work/m$seq.mlir"
  for run in 1:ring 2:ring 4:ring 8:ring 2:ulysses 4:ulysses 8:ulysses; do
    cp=${run%%:*} kind=${run#*:}
    out="$work/s$seq-cp$cp-$kind"
    "$PIPERC" compile "$work/m$seq.mlir" --cp $cp --cp-kind $kind -o "$out" \
      >/dev/null
    step=$("$PIPER_PLAN" --memory "$out/plan_class0.pb" |
      sed -n 's/.*arena [0-9]* bytes = state [0-9]* + step \([0-9]*\).*/\1/p')
    sim=$("$PIPER_PLAN" --simulate --timeline --machine "$machine" "$out")
    total=$(sed -n 's/^step: \([0-9.]*\) \([a-z]*\).*/\1\2/p' <<<"$sim")
    # The exchanges' time: the union of cp_stream's timeline entries (a
    # transfer's SEND and RECV are two entries over the same interval).
    comm=$(python3 bench/stream_union.py cp_stream <<<"$sim")
    serial=-
    if [ "$kind" = ring ] && [ "$cp" -gt 1 ]; then
      "$PIPERC" compile "$work/m$seq.mlir" --cp $cp --cp-no-overlap \
        -o "$out-serial" >/dev/null
      serial=$("$PIPER_PLAN" --simulate --machine "$machine" "$out-serial" |
        sed -n 's/^step: \([0-9.]*\) \([a-z]*\).*/\1\2/p')
    fi
    rows+=("$seq $cp $kind $step $total ${comm:-0ms} $serial")
  done
done
printf '%s\n' "${rows[@]}" | python3 -c '
import re, sys
def secs(text):
    v, unit = re.match(r"([0-9.]+)([a-z]+)", text).groups()
    return float(v) * {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]
rows = [line.split() for line in sys.stdin if line.strip()]
print("%-7s %3s %-8s %14s %14s %6s %12s %12s %7s %12s" % ("seq", "cp",
      "kind", "step memory", "1/N of cp1", "ratio", "overlap off",
      "overlap on", "on/off", "exchanges"))
for seq in sorted({int(r[0]) for r in rows}):
    every = [(int(r[1]), r[2], int(r[3]), secs(r[4]), secs(r[5]), r[6])
             for r in rows if int(r[0]) == seq]
    base = every[0][2]
    for cp, kind, step, total, comm, serial in every:
        # Ulysses exchanges with all-to-alls the attention waits for: there
        # is no order to change, so no "off" row.
        off = "%9.1f ms" % (secs(serial) * 1e3) if serial != "-" else "-"
        ratio = "%7.4f" % (total / secs(serial)) if serial != "-" else "-"
        print("%-7d %3d %-8s %10.2f GiB %10.2f GiB %6.3f %12s %9.1f ms %7s "
              "%9.1f ms" % (seq, cp, kind, step / 2**30, base / cp / 2**30,
                            step * cp / base, off, total * 1e3, ratio,
                            comm * 1e3))
    mine = [(cp, step, total, comm)
            for cp, kind, step, total, comm, _ in every if kind == "ring"]
    # What does not shrink: step = A / N + C through CP 1 and the largest
    # CP, and how far the others are from that line.
    (c1, s1, _, _), (cn, sn, _, _) = mine[0], mine[-1]
    A = (s1 - sn) / (1 - 1 / cn)
    C = s1 - A
    print("        fit step = %.2f GiB / N + %.2f GiB (what CP does not split); "
          "residuals %s GiB" % (A / 2**30, C / 2**30, ", ".join(
              "%+.2f" % ((s - A / c - C) / 2**30) for c, s, _, _ in mine)))
'
