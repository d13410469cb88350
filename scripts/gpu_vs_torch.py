#!/usr/bin/env python3
"""One timed training step of GPT-2 small in bf16 on the GPU: Piper
(piper-run --backend cuda, a plan compiled with --dtype bf16) beside PyTorch
eager on the same GPU (bf16 autocast, fp32 master weights, AdamW, the same
batch and initial weights). Prints tokens/s of both and their ratio, as one
markdown row (and writes it to --row FILE).

  gpu_vs_torch.py PIPER_RUN PLAN_DIR [--steps N] [--warmup N] [--row FILE]

PLAN_DIR is scripts/gpu_bundle.sh's plans/gpt2-small-bf16. The PyTorch model
is test/oracle/torch_models.py's gpt_loss (the bundle carries it), whose
numerics test/oracle checks against Piper's.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout[-3000:]))
    return proc.stdout


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("piper_run")
    ap.add_argument("plans")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--row")
    args = ap.parse_args()
    import numpy as np
    training = read_training(args.plans)
    s, b, mbs = (training["seq_len"], training["microbatch_size"],
                 training["num_microbatches"])
    tokens_per_step = s * b * mbs
    work = tempfile.mkdtemp(prefix="piper-gpu-bench-")
    window = np.random.default_rng(7).integers(0, training["vocab_size"], s + 1)
    data = os.path.join(work, "tokens.bin")
    window.astype("<u2").tofile(data)
    init = os.path.join(work, "init.safetensors")
    run([args.piper_run, args.plans, "--nproc", "1", "--steps", "0", "--seed",
         "1", "--save", init])
    total = args.warmup + args.steps
    metrics = os.path.join(work, "metrics.jsonl")
    run([args.piper_run, args.plans, "--nproc", "1", "--steps", str(total),
         "--seed", "1", "--data", data, "--metrics", metrics, "--backend",
         "cuda"])
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    p_times = [r["step_time_s"] for r in rows][args.warmup:]
    t_times, t_losses = torch_steps(training, init, window, total, args.heads)
    p_tps = tokens_per_step / statistics.median(p_times)
    t_tps = tokens_per_step / statistics.median(t_times[args.warmup:])
    row = ("| gpt2-small bf16, %d tokens/step | piper %.0f tokens/s | pytorch "
           "%.0f tokens/s | ratio %.2f | step-1 loss piper %.4f, pytorch %.4f |"
           % (tokens_per_step, p_tps, t_tps, p_tps / t_tps, rows[0]["loss"],
              t_losses[0]))
    print(row)
    if args.row:
        with open(args.row, "w") as f:
            f.write(row + "\n")


if __name__ == "__main__":
    main()
