#!/usr/bin/env bash
# Checks scripts/gpu_perf.sh without a GPU: runs it inside a temporary fake
# bundle (its scripts, plans with a manifest's training block, a fake
# piper-run that prints and writes what the real one does: progress lines,
# --metrics JSON lines, --save safetensors, the --profile table and the
# memory line of runtime/launch/rank/Reporting.cpp; a fake attention_bench)
# with a fake nvidia-smi on PATH and GPU_PERF_FAKE_TORCH=1 (torch on the
# CPU, tiny models). Three runs:
#   A  everything works: every row is in perf.md and perf.jsonl (each line
#      valid JSON with the bundle's commit and the GPU), all ok, exit 0; the
#      FLOP counts and peak detection of gpu_perf.py against the numbers of
#      the measurement plan;
#   B  torch fails to import, no attention_bench, no --no-fused-epilogues
#      plan, GPU_PERF_SKIP, a piper-run with --profile=gpu: Piper's rows are
#      still there and ok, torch's rows fail, the piper attention rows and
#      the unfused plan's say "not in this bundle" (n/a), skipped rows
#      say so, P5 uses --profile=gpu, GPU_PERF_PIPER_ATTENTION reaches
#      piper-run, exit non-zero;
#   C  piper-run hangs, deadline 30 s: the script ends within the deadline
#      plus 15 s, the hung step is a failure row, the later ones "skipped:
#      deadline", each still a row;
#   D  torch hangs (only gpu_perf.sh's own time limit can stop that step),
#      deadline 25 s: the same.
#   scripts/gpu_perf_test.sh     (prints "gpu_perf_test PASSED" or exits 1)
# Needs a python3 with torch and numpy (CPU): $PYTHON, python3 or
# /usr/bin/python3 (Debian's python3-torch).
set -uo pipefail
SRC=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$SRC/.." && pwd)
WORK=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpu-perf-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}

PY=
for p in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch, numpy' 2>/dev/null; then
    PY=$(command -v "$p")
    break
  fi
done
if [ -z "$PY" ]; then
  echo "gpu_perf_test: no python3 with torch and numpy (\$PYTHON, python3, /usr/bin/python3)"
  echo "gpu_perf_test FAILED"
  exit 1
fi

# ---- the fake machine: nvidia-smi, python3 (with torch) ----
BIN=$WORK/bin
mkdir -p "$BIN"
ln -s "$PY" "$BIN/python3"
cat >"$BIN/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# Answers --query-gpu=a,b,... as nvidia-smi does (csv: ", " between fields).
q=
for a; do case $a in --query-gpu=*) q=${a#--query-gpu=} ;; esac; done
[ -n "$q" ] || { echo "fake nvidia-smi: only --query-gpu"; exit 2; }
IFS=, read -ra fields <<<"$q"
out=
for f in "${fields[@]}"; do
  case $f in
    name) v="NVIDIA H200" ;;
    power.limit) v=700.00 ;;
    clocks.sm) v=1980 ;;
    clocks.mem) v=3201 ;;
    clocks.max.sm) v=1980 ;;
    clocks.max.mem) v=3201 ;;
    driver_version) v=580.159.04 ;;
    memory.total) v=143771 ;;
    *) v="[N/A]" ;;
  esac
  out+=${out:+, }$v
done
echo "$out"
EOF
chmod +x "$BIN/nvidia-smi"

# ---- the fake bundle ----
make_bundle() {
  local b=$1 plan
  mkdir -p "$b/plans"
  cp "$SRC/gpu_perf.sh" "$SRC/gpu_perf.py" "$SRC/gpu_vs_torch.py" \
    "$SRC/compare_backends.py" "$ROOT/test/oracle/torch_models.py" "$b/"
  printf '0123456789abcdef0123456789abcdef01234567\nclean\n' >"$b/COMMIT"
  # The fake torch's tiny models (gpu_perf.py FAKE_MODELS): seq, batch.
  for plan in gpt2-small-bf16:32:2 gpt2-small-bf16-unfused:32:2 llama-1b-2048x4-bf16:32:2 \
    llama-1b-4096x2-bf16:64:1; do
    IFS=: read -r name seq batch <<<"$plan"
    mkdir -p "$b/plans/$name"
    cat >"$b/plans/$name/manifest.textproto" <<EOF
world_size: 1
training {
  num_microbatches: 1
  num_replicas: 1
  microbatch_size: $batch
  seq_len: $seq
  vocab_size: 256
  lr: 0.0003
  beta1: 0.9
  beta2: 0.95
  eps: 1e-08
  weight_decay: 0.1
  clip_grad_norm: 1
  compute_dtype: BF16
}
EOF
  done
  cat >"$b/piper-run" <<'EOF'
#!/usr/bin/env python3
"""Fake piper-run: the outputs of the real one (Progress.cpp, Reporting.cpp)."""
import json, os, random, re, struct, sys, time
argv = sys.argv[1:]
if "--help" in argv:
    gpu = os.environ.get("FAKE_PIPER_PROFILE_GPU") == "1"
    print("Usage: piper-run OUT [OPTIONS]\n  --attention TEXT:{auto,cudnn,simt} "
          "how --backend cuda runs attention\n  --profile%s  time every kernel op "
          "and instruction kind (first step excluded)" %
          ("[=gpu]  (gpu: GPU times)" if gpu else ""))
    sys.exit(0)
time.sleep(float(os.environ.get("FAKE_PIPER_SLEEP", "0")))
def opt(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
plan = argv[0]
text = open(os.path.join(plan, "manifest.textproto")).read()
t = dict(re.findall(r"(\w+): ([0-9.e+-]+)", text))
seq, batch = int(t["seq_len"]), int(t["microbatch_size"])
steps = int(opt("--steps", "1"))
if steps > 0 and opt("--backend") != "cuda":  # --save's run is the CPU's
    sys.exit("fake piper-run: steps on --backend cuda expected")
save = opt("--save")
if save:  # gpu_perf.py's FAKE_MODELS gpt2-small: 2 layers, 64, vocab 256
    c, v, rng = 64, 256, random.Random(1)
    shapes = {"wte": [v, c], "wpe": [seq, c], "ln_f.weight": [c], "ln_f.bias": [c]}
    for i in range(2):
        p = "h.%d." % i
        shapes.update({p + "ln_1.weight": [c], p + "ln_1.bias": [c],
                       p + "attn.c_attn.weight": [c, 3 * c], p + "attn.c_attn.bias": [3 * c],
                       p + "attn.c_proj.weight": [c, c], p + "attn.c_proj.bias": [c],
                       p + "ln_2.weight": [c], p + "ln_2.bias": [c],
                       p + "mlp.c_fc.weight": [c, 4 * c], p + "mlp.c_fc.bias": [4 * c],
                       p + "mlp.c_proj.weight": [4 * c, c], p + "mlp.c_proj.bias": [c]})
    header, blobs, off = {}, [], 0
    for name, sh in shapes.items():
        n = 1
        for d in sh:
            n *= d
        vals = ([1.0] * n if name.endswith("weight") and len(sh) == 1 else
                [0.0] * n if len(sh) == 1 else [rng.gauss(0, 0.02) for _ in range(n)])
        blob = struct.pack("<%df" % n, *vals)
        header[name] = {"dtype": "F32", "shape": sh, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header).encode()
    with open(save, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
if steps and opt("--attention", "auto") != "simt":
    sys.stderr.write("piper-run: attention: cuDNN 9.19.0 fused attention "
                     "(/fake/nvidia/cudnn/lib/libcudnn.so.9)\n")
metrics = opt("--metrics")
lines = []
for s in range(1, steps + 1):
    # --unpack-step-buffers: a slower step (more passes), 60 ms;
    # --step-graph=on: a faster one (no host issuing), 40 ms.
    st = 0.05
    if "--unpack-step-buffers" in argv:
        st = 0.06
    if "--step-graph=on" in argv:
        st = 0.04
    st = st if s > 1 else 0.2
    tps = seq * batch / st
    print("step %d/%d | loss %.9g | grad_norm 1.234 | %.0f tokens/s | %.1f ms/step | ETA 0:00:00"
          % (s, steps, 5.5 - 0.01 * s, tps, st * 1e3))
    lines.append(json.dumps({"step": s, "loss": 5.5 - 0.01 * s, "tokens_per_s": tps,
                             "step_time_s": st, "lr": 0.0003, "grad_norm": 1.234,
                             "peak_bytes": 123456789, "max_rss_bytes": 98765432}))
if metrics:
    with open(metrics, "w") as f:
        f.write("".join(l + "\n" for l in lines))
if steps:
    print("summary: %d steps (steps 1-%d) in 1.0 s wall time" % (steps, steps))
    print("summary: peak arena memory per rank: rank 0 117.7 MiB")
if "--profile" in argv or "--profile=gpu" in argv:
    sys.stderr.write(
        "profile of rank 0: steps 2-3 (2 steps, warm-up excluded), 1 stream, 50.000 ms/step, cuda\n"
        "  kernel / instruction                 count    total ms    ms/step  % step\n"
        "  attention_grad                          24      64.000     32.000   64.00\n"
        "  attention                               24      20.000     10.000   20.00\n"
        "  CALL other                               6       4.000      2.000    4.00\n"
        "  linear                                  98       2.000      1.000    2.00\n"
        "  (all kernels)                                   86.000     43.000   86.00\n"
        "  (all rows)                                      90.000     45.000   90.00\n"
        "  (step wall time)                               100.000     50.000  100.00\n")
sys.stderr.write("piper-run: rank 0: peak memory: 123456789 bytes, 117.7 MiB (memory plan arena "
                 "123456789 bytes, 117.7 MiB); state 1000 bytes, 0.0 MiB (memory plan state "
                 "1000 bytes); max RSS 94.2 MiB\n")
EOF
  chmod +x "$b/piper-run"
}
add_attention_bench() {
  cat >"$1/attention_bench" <<'EOF'
#!/usr/bin/env bash
# Fake: attention_bench --shape B,Hq,Hkv,T,D --mode simt|cudnn --iters N
[ "$1" = --shape ] && [ "$3" = --mode ] && [ "$5" = --iters ] || { echo "usage" >&2; exit 2; }
echo "fake attention_bench $2 $4"
echo '{"fwd_ms": 2.5, "bwd_ms": 7.5}'
EOF
  chmod +x "$1/attention_bench"
}

# run_perf NAME [VAR=VALUE...]: the fake bundle NAME's gpu_perf.sh with
# OUT=$WORK/NAME-out; sets RC and ELAPSED.
run_perf() {
  local name=$1 start
  shift
  start=$(date +%s)
  # timeout: a gpu_perf.sh that ignores its deadline fails, not hangs, this.
  timeout -k 5 150 env PATH="$BIN:$PATH" OUT="$WORK/$name-out" GPU_PERF_FAKE_TORCH=1 "$@" \
    bash "$WORK/$name/gpu_perf.sh" >"$WORK/$name.log" 2>&1
  RC=$?
  ELAPSED=$(($(date +%s) - start))
  echo "run $name: exit $RC in $ELAPSED s"
}

# check OUT_DIR PYTHON_CHECKS: perf.jsonl parsed (every line JSON, the
# common fields), then the checks, Python with `rows` (a list) and
# `by_case` (case -> row) and `md` (perf.md's text); prints what fails.
check() {
  "$PY" - "$1" "$2" <<'EOF'
import json, os, sys
out, checks = sys.argv[1], sys.argv[2]
rows, bad = [], []
with open(os.path.join(out, "perf.jsonl")) as f:
    for n, line in enumerate(f, 1):
        try:
            r = json.loads(line)
        except ValueError as e:
            bad.append("perf.jsonl line %d is not JSON (%s): %r" % (n, e, line[:200]))
            continue
        for k in ("commit", "tree", "date", "gpu", "row", "case", "result"):
            if k not in r:
                bad.append("perf.jsonl line %d has no %s" % (n, k))
        rows.append(r)
md = open(os.path.join(out, "perf.md")).read()
by_case = {}
for r in rows:
    if r.get("case") in by_case:
        bad.append("case %r twice" % r.get("case"))
    by_case[r.get("case")] = r
def expect(cond, what):
    if not cond:
        bad.append(what)
def md_row(case):
    """perf.md's row of `case`: its cells, or None."""
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == case:
            return cells
    return None
exec(checks)
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
EOF
}

P1_SHAPES="['(1,2,2,32,16)', '(1,4,2,32,16)', '(1,4,2,64,16)', '(1,2,2,64,32)']"
TRAIN_CASES="['gpt2-small piper', 'gpt2-small torch eager+SDPA', 'gpt2-small torch.compile+SDPA', 'gpt2-small piper --no-fused-epilogues', 'gpt2-small piper --unpack-step-buffers', 'gpt2-small piper --step-graph on'] + ['llama-1b %s %s' % (c, i) for c in ('2048x4', '4096x2') for i in ('piper', 'torch eager+SDPA', 'torch.compile+SDPA')]"

# ---- A: everything works ----
make_bundle "$WORK/a"
add_attention_bench "$WORK/a"
run_perf a
[ "$RC" -eq 0 ] || fail "A: exit $RC, not 0 (log: $(tail -5 "$WORK/a.log"))"
check "$WORK/a-out" "
cases = ['environment'] + ['%s %s' % (s, i) for s in $P1_SHAPES
         for i in ('torch-cudnn', 'torch-flash', 'piper-simt', 'piper-cudnn')]
cases += $TRAIN_CASES + ['gpt2-small profile']
for c in cases:
    expect(c in by_case, 'A: no perf.jsonl row %r' % c)
    expect(md_row(c) is not None, 'A: no perf.md row %r' % c)
for r in rows:
    expect(r['result'] == 'ok', 'A: %r: %r' % (r['case'], r['result']))
    expect(r['commit'] == '0123456789abcdef0123456789abcdef01234567', 'A: commit %r' % r['commit'])
    expect(r['gpu'] == 'NVIDIA H200', 'A: gpu %r' % r['gpu'])
    expect(r['tree'] == 'clean', 'A: tree %r' % r['tree'])
e = by_case.get('environment', {})
expect(e.get('peak_bf16_tflops') == 989, 'A: peak %r, not 989 (H200 at 700 W)' % e.get('peak_bf16_tflops'))
expect(e.get('driver') == '580.159.04', 'A: driver %r' % e.get('driver'))
expect('torch' in e and 'cudnn' in e and 'nccl' in e and 'libcudnn' in e, 'A: P0 lacks torch facts: %r' % e)
p = by_case.get('gpt2-small piper', {})
# 2 x 32 tokens at the fake 50 ms a step.
expect(abs(p.get('tokens_per_s', 0) - 1280) < 1e-6, 'A: piper tokens/s %r, not 1280' % p.get('tokens_per_s'))
expect(p.get('peak_bytes') == 123456789 and p.get('timed_steps') == 10 and p.get('warmup') == 3,
       'A: piper row %r' % p)
expect(p.get('attention') == 'auto' and 'cuDNN 9.19.0' in p.get('attention_said', ''),
       'A: piper attention %r, %r' % (p.get('attention'), p.get('attention_said')))
expect(abs(p.get('mfu', 0) / (p.get('flop_per_token', 0) * 1280 / 989e12) - 1) < 1e-3, 'A: MFU %r' % p)
expect('MFLOP/token = 6*N_matmul + 6*L*C*T' in p.get('flop_count', ''), 'A: FLOP count not stated: %r' % p)
t = by_case.get('gpt2-small torch eager+SDPA', {})
expect(t.get('tokens_per_s', 0) > 0 and 'loss_step1' in t, 'A: torch row %r' % t)
expect('Piper\'s initial weights' in (md_row('gpt2-small torch eager+SDPA') or [''])[-1],
       'A: torch did not read Piper\'s initial weights: %r' % md_row('gpt2-small torch eager+SDPA'))
l = by_case.get('llama-1b 4096x2 piper', {})
expect(l.get('timed_steps') == 2 and l.get('warmup') == 1, 'A: llama 4096 piper steps %r' % l)
a = by_case.get('(1,4,2,64,16) piper-simt', {})
expect(a.get('fwd_ms') == 2.5 and a.get('fwd_bwd_ms') == 10.0, 'A: attention_bench row %r' % a)
# fwd 4*B*Hq*T^2*D/2 = 4*1*4*64*64*16/2 = 524288 FLOP in 2.5 ms.
expect(abs(a.get('fwd_tflops', 0) - round(524288 / 2.5e-3 / 1e12, 2)) < 1e-9, 'A: fwd TF/s %r' % a)
pr = by_case.get('gpt2-small profile', {})
expect([x['name'] for x in pr.get('top', [])] == ['attention_grad', 'attention', 'CALL other', 'linear'],
       'A: profile rows %r' % pr.get('top'))
expect('host issue times' in pr.get('kind', ''), 'A: profile kind %r' % pr.get('kind'))
expect('docs/gpu-perf-history.jsonl' in md, 'A: perf.md does not say where perf.jsonl goes')
# The ratios row: Piper's tokens/s over each reference's, from this run.
for prefix in ('gpt2-small', 'llama-1b 2048x4', 'llama-1b 4096x2'):
    q = by_case.get(prefix, {})
    pt = by_case.get(prefix + ' piper', {}).get('tokens_per_s', 0)
    for key, ref in (('piper_over_eager', ' torch eager+SDPA'),
                     ('piper_over_compile', ' torch.compile+SDPA')):
        rt = by_case.get(prefix + ref, {}).get('tokens_per_s', 0)
        expect(rt > 0 and abs(q.get(key, 0) - pt / rt) < 1e-9,
               'A: %s %s %r, not %r / %r' % (prefix, key, q.get(key), pt, rt))
# ... and the default plan's over its --no-fused-epilogues twin's.
q = by_case.get('gpt2-small piper / piper --no-fused-epilogues', {})
ut = by_case.get('gpt2-small piper --no-fused-epilogues', {}).get('tokens_per_s', 0)
pt = by_case.get('gpt2-small piper', {}).get('tokens_per_s', 0)
expect(ut > 0 and q.get('result') == 'ok' and abs(q.get('fused_over_unfused', 0) - pt / ut) < 1e-9,
       'A: fused over unfused %r, not %r / %r' % (q, pt, ut))
# ... and over the same plan run with --unpack-step-buffers (the fake's
# 60 ms a step against 50: the flag reached piper-run).
q = by_case.get('gpt2-small piper / piper --unpack-step-buffers', {})
ut = by_case.get('gpt2-small piper --unpack-step-buffers', {}).get('tokens_per_s', 0)
expect(ut > 0 and q.get('result') == 'ok' and abs(q.get('packed_over_unpacked', 0) - pt / ut) < 1e-9
       and abs(q.get('packed_over_unpacked', 0) - 1.2) < 1e-3,
       'A: packed over unpacked %r, not %r / %r (about 1.2)' % (q, pt, ut))
# ... and the step as a CUDA graph over the step issued as usual (40 ms
# against 50: --step-graph=on reached piper-run).
q = by_case.get('gpt2-small piper --step-graph on / piper', {})
gt = by_case.get('gpt2-small piper --step-graph on', {}).get('tokens_per_s', 0)
expect(gt > 0 and q.get('result') == 'ok' and abs(q.get('graphed_over_usual', 0) - gt / pt) < 1e-9
       and abs(q.get('graphed_over_usual', 0) - 1.25) < 1e-3,
       'A: graphed over usual %r, not %r / %r (about 1.25)' % (q, gt, pt))
" || fail "A: the checks above"
# gpu_perf.py's conventions against the measurement plan's numbers.
(cd "$WORK/a" && "$PY" - <<'EOF') || fail "A: FLOP counts or peak detection"
import gpu_perf as g
gpt, llama = g.MODELS["gpt2-small"], g.MODELS["llama-1b"]
checks = [
    (abs(g.n_matmul(gpt) / 1e6 - 123.5) < 0.1, "GPT-2 N_matmul %.2fM" % (g.n_matmul(gpt) / 1e6)),
    (abs(g.flop_per_token(gpt, 1024) / 1e6 - 798) < 1, "GPT-2 %.1f MFLOP/token" % (g.flop_per_token(gpt, 1024) / 1e6)),
    (abs(g.n_matmul(llama) / 1e9 - 1.04) < 0.01, "Llama-1B N_matmul %.3fB" % (g.n_matmul(llama) / 1e9)),
    (abs(g.flop_per_token(llama, 2048) / 1e9 - 6.63) < 0.01, "Llama 2048: %.3f GFLOP/token" % (g.flop_per_token(llama, 2048) / 1e9)),
    (abs(g.flop_per_token(llama, 4096) / 1e9 - 7.04) < 0.01, "Llama 4096: %.3f GFLOP/token" % (g.flop_per_token(llama, 4096) / 1e9)),
    (g.peak_tflops("NVIDIA H200", "700.00")[0] == 989, "H200 SXM"),
    (g.peak_tflops("NVIDIA H200 NVL", "600.00")[0] == 835, "H200 NVL by name"),
    (g.peak_tflops("NVIDIA H200", "600.00")[0] == 835, "H200 NVL by power"),
    (g.peak_tflops("NVIDIA H100 80GB HBM3", "700.00")[0] == 989, "H100 SXM"),
]
bad = [what for ok, what in checks if not ok]
for b in bad:
    print("  wrong: " + b)
raise SystemExit(1 if bad else 0)
EOF

# ---- B: torch fails; no attention_bench, no --no-fused-epilogues plan; two
# steps skipped on request ----
make_bundle "$WORK/b"
rm -r "$WORK/b/plans/gpt2-small-bf16-unfused"
run_perf b GPU_PERF_FAKE_TORCH=fail GPU_PERF_SKIP='P4-*-compile' FAKE_PIPER_PROFILE_GPU=1 \
  GPU_PERF_PIPER_ATTENTION=simt
[ "$RC" -ne 0 ] || fail "B: exit 0 although torch failed"
check "$WORK/b-out" "
for c in ['gpt2-small piper', 'llama-1b 2048x4 piper', 'llama-1b 4096x2 piper']:
    r = by_case.get(c, {})
    expect(r.get('result') == 'ok' and r.get('tokens_per_s', 0) > 0, 'B: Piper row %r lost: %r' % (c, r))
    expect(r.get('attention') == 'simt' and r.get('attention_said') == '', 'B: %r attention %r' % (c, r))
    expect(md_row(c) is not None and md_row(c)[1] == 'ok', 'B: perf.md row %r: %r' % (c, md_row(c)))
for c in ['gpt2-small torch eager+SDPA', 'gpt2-small torch.compile+SDPA',
          'llama-1b 2048x4 torch eager+SDPA', '(1,2,2,32,16) torch-cudnn']:
    r = by_case.get(c, {})
    expect(r.get('result', '').startswith('FAIL: pytorch'), 'B: %r: %r' % (c, r.get('result')))
for c in ['llama-1b 2048x4 torch.compile+SDPA', 'llama-1b 4096x2 torch.compile+SDPA']:
    expect(by_case.get(c, {}).get('result') == 'skipped: GPU_PERF_SKIP', 'B: %r: %r' % (c, by_case.get(c)))
for c in ['gpt2-small piper --no-fused-epilogues', 'gpt2-small piper / piper --no-fused-epilogues']:
    expect(by_case.get(c, {}).get('result', '').startswith('n/a'), 'B: %r: %r' % (c, by_case.get(c)))
for m in ('simt', 'cudnn'):
    r = by_case.get('piper-%s (all shapes)' % m, {})
    expect('not in this bundle' in r.get('result', ''), 'B: piper-%s: %r' % (m, r))
e = by_case.get('environment', {})
expect(e.get('name') == 'NVIDIA H200' and e.get('result', '').startswith('FAIL: torch'),
       'B: P0 row %r' % e)
pr = by_case.get('gpt2-small profile', {})
expect(pr.get('result') == 'ok' and pr.get('flag') == '--profile=gpu' and pr.get('kind', '').startswith('GPU times'),
       'B: profile row (piper-run with --profile=gpu) %r' % pr)
" || fail "B: the checks above"

# ---- C: piper-run hangs; a 30 s deadline ----
make_bundle "$WORK/c"
run_perf c GPU_PERF_DEADLINE_S=30 FAKE_PIPER_SLEEP=1000
[ "$ELAPSED" -le 45 ] || fail "C: took $ELAPSED s, past the 30 s deadline + 15 s"
[ "$RC" -ne 0 ] || fail "C: exit 0 although a step timed out"
check "$WORK/c-out" "
cases = ['environment'] + $TRAIN_CASES + ['gpt2-small profile']
for c in cases:
    expect(c in by_case, 'C: no perf.jsonl row %r' % c)
    expect(md_row(c) is not None, 'C: no perf.md row %r' % c)
expect(by_case.get('environment', {}).get('result') == 'ok', 'C: P0 %r' % by_case.get('environment'))
expect(by_case.get('gpt2-small piper', {}).get('result', '').startswith('FAIL'),
       'C: the hung piper-run: %r' % by_case.get('gpt2-small piper'))
later = [c for c in cases if c not in ('environment', 'gpt2-small piper')]
for c in later:
    expect(by_case.get(c, {}).get('result') == 'skipped: deadline', 'C: %r: %r' % (c, by_case.get(c, {}).get('result')))
" || fail "C: the checks above"
if pgrep -f "$WORK/c/piper-run" >/dev/null; then
  fail "C: a fake piper-run still runs after gpu_perf.sh ended"
fi

# ---- D: torch hangs; a 25 s deadline ----
make_bundle "$WORK/d"
run_perf d GPU_PERF_DEADLINE_S=25 GPU_PERF_FAKE_TORCH=hang
[ "$ELAPSED" -le 40 ] || fail "D: took $ELAPSED s, past the 25 s deadline + 15 s"
[ "$RC" -ne 0 ] || fail "D: exit 0 although a step timed out"
check "$WORK/d-out" "
cases = ['environment', 'torch SDPA (all shapes)'] + $TRAIN_CASES + ['gpt2-small profile']
for c in cases:
    expect(c in by_case, 'D: no perf.jsonl row %r' % c)
    expect(md_row(c) is not None, 'D: no perf.md row %r' % c)
expect(by_case.get('torch SDPA (all shapes)', {}).get('result', '').startswith('FAIL: timed out'),
       'D: the hung torch step: %r' % by_case.get('torch SDPA (all shapes)'))
for c in cases[2:]:
    expect(by_case.get(c, {}).get('result') == 'skipped: deadline', 'D: %r: %r' % (c, by_case.get(c, {}).get('result')))
" || fail "D: the checks above"

if [ "$FAILS" -ne 0 ]; then
  for n in a b c d; do
    echo "==== $n: perf.md"
    cat "$WORK/$n-out/perf.md" 2>/dev/null
    echo "==== $n: the log's last lines"
    tail -30 "$WORK/$n.log"
  done
  echo "gpu_perf_test FAILED ($FAILS)"
  exit 1
fi
echo "gpu_perf_test PASSED"
