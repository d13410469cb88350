#!/usr/bin/env bash
# Activation recomputation's and tensor parallelism's memory, planned and
# analytical (docs/recompute.md, docs/tensor-parallel.md). llama-1b (seq
# 2048, microbatches of 4 sequences, fp32) compiled for PP 2 x DP 4 and PP 2
# x DP 4 x TP 4 (with and without --sp), 1F1B, 8 microbatches, under
# --recompute none, selective and full. Per pipeline stage: the planned step memory (arena
# minus parameter state) beside the analytical one, built from first
# principles for our layers:
#   kept activations  = in-flight microbatches x layers x per-layer bytes
#                       (+ the head's logits and norm outputs on the last
#                       stage: V + 2h per token, V/t + 4t + 1 + 2h under
#                       TP's vocabulary parallelism, whose logits are a
#                       member's columns and whose loss keeps [4t + 1]
#                       statistics), per layer and token: 5h + q + 3f elements
#                       without recomputation, 4h + q + 3f selective, h full
#                       (Korthikanti et al. 2022's 34sbh + 5as^2b adapted:
#                       no dropout masks, no s^2 softmax, packed q|k|v and
#                       SwiGLU; derivation in docs/recompute.md); under TP
#                       t the values between the column and row layers
#                       (q|k|v, the attention output, gate|up, the SwiGLU
#                       output) are split: 4h + (h + q + 3f)/t, 4h + (q +
#                       3f)/t selective, h full (Korthikanti's 10 + 24/t);
#                       with sequence parallelism (--sp) the residual
#                       stream and the norms run on s/t of the rows, and
#                       each column layer's input is kept as rows and
#                       gathered again in the backward, as Megatron does:
#                       (5h + q + 3f)/t, (4h + q + 3f)/t selective, h/t
#                       full (Korthikanti's 34/t), and the stage outputs
#                       sent are row shards (h/t per token);
#   send buffers      = every microbatch's stage output (or input gradient),
#                       kept until the step ends (docs/memory-plan.md);
#   backward working set = the largest backward call's scratch, read from
#                       the plan (the gradient temporaries, and under full
#                       the block being recomputed); under TP with full
#                       recomputation the recomputed block no longer fits
#                       one call: its backward is cut at the all-reduces,
#                       and what one piece hands the next (the block's
#                       activations but its input: none's per-token count
#                       minus h) is step buffers while the block's backward
#                       runs ("tp cuts"); and under TP every backward
#                       collective hands a gradient of the block's output
#                       [s*b, h] from one call to the next (the partial
#                       input gradient and its all-reduced sum; with SP a
#                       row shard and the gathered whole), which no call's
#                       scratch holds: 2h per token, 3h with SP (the column
#                       layer's input gathered again) ("tp grads"). The head's backward (on the last
#                       stage, in its own calls under TP) comes first: the
#                       last stage peaks either there (everything kept, the
#                       head's scratch) or in a block's backward after it,
#                       when the head's kept activations of that microbatch
#                       are gone and the cuts and the largest block call's
#                       scratch are live; the formula is the larger of the
#                       two.
# It prints both and their ratio, and Korthikanti's per-layer figure for
# reference. A benchmark, not a test: not part of `bazel test`.
#
# Usage: bench/memory_recompute.sh
# Environment:
#   PIPERC, PIPER_RUN  binaries: skip the builds (PIPER_PLAN defaults to the
#                      piper-plan beside PIPERC)
#   BAZEL, BAZEL_BUILD_FLAGS  as in bench/lib.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
build_tools

work="$(mktemp -d -t piper-recompute-memory-XXXXXX)"
trap 'rm -rf "$work"' EXIT

PP=2 DP=4 MB=8
# The formula's head (logits kept, the loss's gradient computed in the
# backward's working set) is the unfused one: without TP's vocabulary split
# the compiler would fuse the classifier (docs/design-notes.md §2).
"$PIPERC" model llama-1b -o "$work/llama-1b.mlir"
for cfg in 1 4 4sp; do
  tp=${cfg%sp} sp=()
  [[ $cfg == *sp ]] && sp=(--sp)
  for r in none selective full; do
    "$PIPERC" compile "$work/llama-1b.mlir" --pp $PP --dp $DP --tp $tp \
      "${sp[@]}" --microbatches $MB --recompute $r --no-fused-classifier \
      -o "$work/$r-tp$cfg" >/dev/null
    "$PIPERC" compile "$work/llama-1b.mlir" --pp $PP --dp $DP --tp $tp \
      "${sp[@]}" --microbatches $MB --recompute $r --no-fused-classifier \
      --compile-to training-dag -o "$work/$r-tp$cfg.dag.mlir"
  done
done

python3 - "$work" "$PIPER_PLAN" $PP $MB <<'EOF'
import re, subprocess, sys
work, piper_plan, P, M = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
# llama-1b (compiler/frontend/Presets.cpp): its dimensions, read back from
# the model so the formula follows the preset.
model = open(work + "/llama-1b.mlir").read()
att = re.search(r"piper.attention %\S+ \{heads = (\d+) : i64, kv_heads = (\d+) "
                r": i64, rope_theta = \S+ : f64, seq = (\d+) : i64\} : "
                r"\(tensor<(\d+)x(\d+)xf32>\) -> tensor<\d+x(\d+)xf32>", model)
a, kv, s, tokens, q, h = (int(x) for x in att.groups())
b = tokens // s
f = int(re.search(r"piper.swiglu %\S+ : \(tensor<\d+x(\d+)xf32>\)", model).group(1)) // 2
V = int(re.search(r"piper.cross_entropy %\S+, %\S+ : \(tensor<\d+x(\d+)xf32>", model).group(1))
E = 4  # fp32 bytes
def per_token(r, t, sp=False):
    """Kept elements per layer and token: the residual stream and norm
    outputs whole, what lies between the column and row layers over t; with
    sequence parallelism everything over t (the column layers' inputs kept
    as rows, gathered again in the backward)."""
    if sp:
        return {"none": (5 * h + q + 3 * f) / t,
                "selective": (4 * h + q + 3 * f) / t,
                "full": h / t}[r]
    return {"none": 4 * h + (h + q + 3 * f) / t,
            "selective": 4 * h + (q + 3 * f) / t, "full": h}[r]
def head_per_token(r, t):
    """The head's kept elements per token: its logits (a member's V/t
    columns and the loss statistics under vocabulary parallelism), the
    final norm's output and, but under full recomputation, its input."""
    logits = V if t == 1 else V / t + 4 * t + 1
    return logits + (h if r == "full" else 2 * h)
gib = 2.0 ** 30
sbh = s * b * h
print("llama-1b: h %d, heads %d, kv heads %d (q|k|v width %d), ffn %d, vocab %d; "
      "microbatch s %d x b %d; PP %d 1F1B, %d microbatches, fp32" % (
          h, a, kv, q, f, V, s, b, P, M))
for t, sp in ((1, False), (4, False), (4, True)):
    print("TP %d%s: kept per layer per microbatch: none %.0f MiB; in 16-bit units "
          "of sbh: none %.1f sbh, selective %.1f sbh, full %.1f sbh "
          "(Korthikanti et al.: sbh(10 + 24/t), or 34sbh/t with SP, + "
          "5as^2b/t = %.1f sbh, selective %.1f sbh, full 2sbh)" % (
              t, " + SP" if sp else "",
              E * tokens * per_token("none", t, sp) / 2**20,
              2 * per_token("none", t, sp) / h,
              2 * per_token("selective", t, sp) / h,
              2 * per_token("full", t, sp) / h,
              (34 / t if sp else 10 + 24 / t) + 5 * a * s / (h * t),
              34 / t if sp else 10 + 24 / t))
print()
print("%-9s %5s %5s %6s %6s %10s %10s %8s %10s %8s %8s %10s %10s %6s" % (
    "recompute", "tp", "stage", "layers", "flight", "planned", "kept", "sends",
    "bwd work", "tp cuts", "tp grads", "formula", "peak", "ratio"))
for cfg, r in [(c, r) for c in ("1", "4", "4sp")
               for r in ("none", "selective", "full")]:
    t, sp = int(cfg.rstrip("sp")), cfg.endswith("sp")
    dag = open("%s/%s-tp%s.dag.mlir" % (work, r, cfg)).read()
    manifest = open("%s/%s-tp%s/manifest.textproto" % (work, r, cfg)).read()
    for stage, name in enumerate(re.findall(r'plan_file: "([^"]+)"', manifest)):
        body = re.search(r"piper.segment @stage%d_F\(.*?\n  \}" % stage, dag, re.S).group(0)
        layers = body.count("piper.attention ")
        flight = min(P - stage, M)  # 1F1B: stage p keeps P - p in flight
        plan_path = "%s/%s-tp%s/%s" % (work, r, cfg, name)
        mem = subprocess.run([piper_plan, "--memory", "--largest", "100000",
                              plan_path],
                             check=True, capture_output=True, text=True).stdout
        listing = subprocess.run([piper_plan, plan_path], check=True,
                                 capture_output=True, text=True).stdout
        m = re.search(r"arena (\d+) bytes = state (\d+) \+ step (\d+)", mem)
        arena, step = int(m.group(1)), int(m.group(3))
        # Backward calls' scratch, the head's (the segments computing the
        # loss's gradient) apart from the blocks'.
        head_segments = set()
        for seg in re.split(r"\nsegment ", listing):
            m2 = re.match(r's\d+ "([^"]+)"', seg)
            if m2 and "cross_entropy_grad(" in seg:
                head_segments.add(m2.group(1))
        head_ws = block_ws = 0
        for size, task in re.findall(
                r"(\d+) bytes, scratch of stream '[^']+', instruction \d+ "
                r"\(task @(stage\d+_B[^ ]*) ", mem):
            if task in head_segments:
                head_ws = max(head_ws, int(size))
            else:
                block_ws = max(block_ws, int(size))
        if not head_segments or stage != P - 1:
            head_ws = 0
        if layers == 0:
            block_ws = 0
        kept = flight * layers * E * tokens * per_token(r, t, sp)
        if stage == P - 1:
            kept += flight * E * tokens * head_per_token(r, t)
        # One [s*b, h] output or input gradient per microbatch (a row
        # shard under SP).
        sends = M * E * sbh / (t if sp else 1)
        cuts = (E * tokens * (per_token("none", t, sp) - per_token("full", t, sp))
                if r == "full" and t > 1 and layers else 0)
        # Under SP also the column layer's input gathered again for its
        # weight gradient, [s*b, h] whole.
        grads = (2 + sp) * E * sbh if t > 1 else 0
        # The two moments: the head's backward (last stage), a block's.
        at_head = kept + sends + head_ws + grads if head_ws else 0
        head_kept = (E * tokens * head_per_token(r, t)
                     if stage == P - 1 else 0)
        at_block = (kept - (head_kept if head_ws else 0) + sends + block_ws +
                    cuts + grads)
        formula = max(at_head, at_block)
        work_set = head_ws if at_head >= at_block else block_ws
        print("%-9s %5s %5d %6d %6d %9.2fG %9.2fG %7.2fG %9.2fG %7.2fG %7.2fG %9.2fG %9.2fG %6.3f" % (
            r, cfg.replace("sp", "+sp"), stage, layers, flight, step / gib, kept / gib, sends / gib,
            work_set / gib, cuts / gib, grads / gib, formula / gib, arena / gib,
            step / formula))
EOF
