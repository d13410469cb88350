#!/usr/bin/env python3
"""Timed training steps of GPT-2 small in bf16 on the GPU: Piper
(piper-run --backend cuda, a plan compiled with --dtype bf16) beside PyTorch
eager on the same GPU (bf16 autocast, fp32 master weights, AdamW, the same
batch and initial weights). Prints tokens/s of both, their ratio and the
step-1 losses as one markdown row (also written to --row FILE), and exits 1
when the step-1 losses differ by more than 2e-2 relative.

  gpu_vs_torch.py PIPER_RUN PLAN_DIR [--steps N] [--warmup N] [--row FILE]
      [--timeout-s T] [--wall-s S]

PLAN_DIR is scripts/gpu_bundle.sh's plans/gpt2-small-bf16. The PyTorch model
is test/oracle/torch_models.py's gpt_loss (the bundle carries it), whose
numerics test/oracle checks against Piper's. --timeout-s goes to piper-run
(its watchdog); --wall-s stops a piper-run still running after S seconds.

Piper runs first and its row (tokens/s, step-1 loss) is printed and written
before torch is imported, so a PyTorch that is missing, or fails, keeps
Piper's numbers. Nothing before that needs numpy or torch.

The same weights and batch, as read in the code:
- Weights: piper-run fills every parameter on the host from --seed alone
  (runtime/exec/Init.h: a pure function of seed, name and index, copied to
  the device afterwards), so the `--steps 0 --save` run and the
  `--backend cuda` run, both --seed 1, start from the same fp32 weights, the
  ones torch reads from that file.
- Batch: the token file holds S + 1 tokens. A window starts at
  floor(h * (N - S) / 2^64) (docs/data.md section 2) with N - S = 1, i.e.
  always at 0, so every sequence of every microbatch is tokens[0:S] with
  targets[1:S+1]: what torch_steps repeats.

Why 2e-2 bounds the step-1 loss (compare_backends.py's bound for bf16):
the two differ only in rounding. Piper rounds every parameter and activation
to bf16 (8 significant bits: at most 2^-9 relative per rounding, to nearest,
so unbiased); autocast rounds the matmul operands and keeps the norms,
softmax and residual stream in fp32. Over 12 layers (24 residual additions)
the logits' relative error grows to about sqrt(24) * 2^-9, near 1%. A
token's loss, logsumexp(z) - z[target], changes by at most 2 * max|dz|, and
to first order by sum(p_i * dz_i) - dz[target]. At initialization (weights
of std 0.02) the logits are about 0.5 in size and p nearly uniform, so a
token's loss moves by about 0.005, and the mean over 8192 tokens, whose
errors do not share a sign, by far less: around 1e-4 relative is expected.
2e-2 (0.2 in a loss near ln 50257 = 10.8) leaves two orders of magnitude,
so a larger difference is a defect (a NaN, a wrong kernel or layout,
garbage logits), not rounding. What it cannot see: at initialization nearly
any small logits give a loss near 10.8, so a subtly wrong kernel can pass;
the kernel cases and compare_backends.py check those. The last step's
losses are printed for information only: after AdamW steps the two drift
apart by more than rounding (AdamW's first steps move each weight by about
lr whatever its gradient's size, so a near-zero gradient whose sign the
rounding flips moves its weight the other way).
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
import traceback

from compare_backends import run

HERE = os.path.dirname(os.path.abspath(__file__))
BOUND = 2e-2
HEADER = ("| case | piper tokens/s | pytorch tokens/s | piper / pytorch "
          "| step-1 loss piper | step-1 loss pytorch | relative diff "
          "| result |\n|---|---|---|---|---|---|---|---|")


class Row:
    """The report's row, printed and written each time it changes, so that
    what is known survives a failure or a kill later on."""

    def __init__(self, case, path):
        self.cells = {"case": case}
        self.path = path
        self.printed = False

    def emit(self, result, **cells):
        self.cells.update(cells)
        self.cells["result"] = result
        keys = ["case", "piper", "torch", "ratio", "loss_piper", "loss_torch",
                "diff", "result"]
        row = "| " + " | ".join(str(self.cells.get(k, "-")) for k in keys) + " |"
        print(row if self.printed else HEADER + "\n" + row, flush=True)
        self.printed = True
        if self.path:
            with open(self.path, "w") as f:
                f.write(row + "\n")


def piper(what, cmd, wall_s):
    """Runs piper-run: "" when it succeeded, else why not (its output is
    printed)."""
    rc, out = run(cmd, wall_s)
    if rc == 0:
        return ""
    print("%s\n%s" % (" ".join(cmd), out[-6000:]), flush=True)
    if rc is None:
        return "piper-run %s timed out after %d s" % (what, wall_s)
    return "piper-run %s failed (%d)" % (what, rc)


def read_training(plans):
    text = open(os.path.join(plans, "manifest.textproto")).read()
    block = text[text.index("training {"):]
    block = block[:block.index("}")]
    out = {}
    for key, value in re.findall(r"(\w+): ([-0-9.e+]+)", block):
        out[key] = float(value) if re.search(r"[.e]", value) else int(value)
    return out


def torch_steps(training, init, window, steps, heads):
    import torch
    for path in (HERE, os.path.join(HERE, "..", "test", "oracle")):
        sys.path.insert(0, path)
    import torch_models as m
    dev = torch.device("cuda")
    params = {k: v.to(dev).requires_grad_() for k, v in
              m.read_safetensors(init).items()}
    layers = 1 + max(int(x.group(1)) for name in params
                     for x in [re.match(r"h\.(\d+)\.", name)] if x)
    s, b = training["seq_len"], training["microbatch_size"]
    mbs = training["num_microbatches"]
    w = torch.tensor(window, dtype=torch.long, device=dev)
    tokens, targets = w[:s].repeat(b, 1), w[1:].repeat(b, 1)
    mask = m.causal_mask(s).to(dev)
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": training["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=training["lr"], betas=(training["beta1"], training["beta2"]),
        eps=training["eps"], fused=True)
    times, losses = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        total = 0.0
        for _ in range(mbs):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m.gpt_loss(params, tokens, targets, layers, heads, True,
                                  mask) / mbs
            loss.backward()
            total += loss.detach()
        if training.get("clip_grad_norm", 0.0) > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()),
                                           training["clip_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(total))
    return times, losses


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def compare(args, work):
    training = read_training(args.plans)
    s, b, mbs = (training["seq_len"], training["microbatch_size"],
                 training["num_microbatches"])
    tokens_per_step = s * b * mbs
    row = Row("gpt2-small bf16, %d tokens/step" % tokens_per_step, args.row)
    # One window of S + 1 tokens (so every sequence is the same, above),
    # little-endian uint16 as --data reads it; no numpy needed here.
    rng = random.Random(7)
    window = [rng.randrange(training["vocab_size"]) for _ in range(s + 1)]
    data = os.path.join(work, "tokens.bin")
    with open(data, "wb") as f:
        f.write(struct.pack("<%dH" % len(window), *window))
    init = os.path.join(work, "init.safetensors")
    limits = ["--timeout-s", str(args.timeout_s)]
    err = piper("--save (the initial weights)",
                [args.piper_run, args.plans, "--nproc", "1", "--steps", "0",
                 "--seed", "1", "--save", init] + limits, args.wall_s)
    total = args.warmup + args.steps
    metrics = os.path.join(work, "metrics.jsonl")
    if not err:
        err = piper("--backend cuda",
                    [args.piper_run, args.plans, "--nproc", "1", "--steps",
                     str(total), "--seed", "1", "--data", data, "--metrics",
                     metrics, "--backend", "cuda"] + limits, args.wall_s)
    if err:
        row.emit("FAIL: " + err)
        return 1
    try:
        with open(metrics) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        p_losses = [float(r["loss"]) for r in rows]
        p_times = [float(r["step_time_s"]) for r in rows][args.warmup:]
    except (OSError, ValueError, KeyError, TypeError) as e:
        row.emit("FAIL: unreadable --metrics (%r)" % e)
        return 1
    if len(rows) != total:
        row.emit("FAIL: %d steps in --metrics, not %d" % (len(rows), total))
        return 1
    p_tps = tokens_per_step / statistics.median(p_times)
    row.emit("pytorch not run yet", piper="%.0f" % p_tps,
             loss_piper="%.4f" % p_losses[0])

    try:
        t_times, t_losses = torch_steps(training, init, window, total,
                                        args.heads)
    except Exception as e:  # a missing torch, no GPU for it, out of memory
        traceback.print_exc()
        row.emit("FAIL: pytorch: %s" % (str(e).splitlines() or [repr(e)])[0]
                 .replace("|", "/")[:120])
        return 1
    t_tps = tokens_per_step / statistics.median(t_times[args.warmup:])
    diff = relative(p_losses[0], t_losses[0])
    ok = math.isfinite(p_losses[0]) and diff <= BOUND
    row.emit("ok" if ok else "FAIL: step-1 losses differ by more than %g"
             % BOUND, torch="%.0f" % t_tps, ratio="%.2f" % (p_tps / t_tps),
             loss_torch="%.4f" % t_losses[0], diff="%.1e" % diff)
    print("step %d (information only, not checked): loss piper %.4f, pytorch "
          "%.4f, relative diff %.1e" % (total, p_losses[-1], t_losses[-1],
                                        relative(p_losses[-1], t_losses[-1])))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("piper_run")
    ap.add_argument("plans")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--row")
    ap.add_argument("--timeout-s", type=int, default=60)
    ap.add_argument("--wall-s", type=int, default=150)
    args = ap.parse_args()
    # The init file alone is 500 MB: do not leave it behind, also when
    # gpu_check.sh's time limit stops this with a SIGTERM.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = tempfile.mkdtemp(prefix="piper-gpu-bench-")
    try:
        return compare(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
