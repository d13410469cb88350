#!/usr/bin/env python3
"""The fused classifier (issue 41, stage 3) changes no bit: each model and
strategy below is compiled twice, by default (the loss and its logits
gradient computed in one pass in the forward, `cross_entropy_fused`) and
with --no-fused-classifier (`cross_entropy` in the forward,
`cross_entropy_grad` in the backward), trained for 3 steps from the same
initialization, and must give the same losses (every digit of --metrics)
and the same final parameters (the tensors of the --save files byte for
byte, and their headers but for the run's id).

The bound is exact by construction: the fused kernel runs the two kernels'
row loop (runtime/kernels/LossKernels.cpp, runtime/hal/gpu/LinearLaunch.inl),
and in bf16 the logits the forward rounds are those the backward would have
unpacked. The cases cover one rank in fp32 and bf16, the emulated CUDA
backend (bf16), a pipeline (the last stage's forward and backward are
separate tasks, 1F1B and zero-bubble), data parallelism with ZeRO-2, tensor
parallelism without the vocabulary split (a replicated head), full
recomputation, a Llama and a tied-head GPT, and an MoE model.

Each default plan must hold `cross_entropy_fused` and no
`cross_entropy_grad`; each --no-fused-classifier plan the reverse.

Usage: fused_classifier_test.py PIPERC PIPER_RUN
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])

# (name, model preset and flags, compile flags, ranks, backend)
CASES = [
    ("gpt-tiny f32, 1 rank", ["gpt-tiny"], [], 1, "cpu"),
    ("gpt-tiny bf16, 1 rank", ["gpt-tiny"], ["--dtype", "bf16"], 1, "cpu"),
    ("gpt-tiny bf16, cuda-emulation", ["gpt-tiny"], ["--dtype", "bf16"], 1,
     "cuda-emulation"),
    ("gpt-tiny PP2 1F1B x 4 microbatches", ["gpt-tiny"],
     ["--pp", "2", "--microbatches", "4", "--schedule", "1f1b"], 2, "cpu"),
    ("gpt-tiny PP2 zb-h1 bf16", ["gpt-tiny"],
     ["--pp", "2", "--microbatches", "3", "--schedule", "zb-h1", "--dtype",
      "bf16"], 2, "cpu"),
    ("llama-tiny DP2 ZeRO-2", ["llama-tiny"], ["--dp", "2", "--zero", "2"], 2,
     "cpu"),
    ("llama-tiny TP2, head not split", ["llama-tiny"],
     ["--tp", "2", "--no-vocab-parallel"], 2, "cpu"),
    ("gpt tied head, full recompute", ["gpt", "--layers", "2"],
     ["--recompute", "full"], 1, "cpu"),
    ("qwen3-moe-tiny bf16", ["qwen3-moe-tiny"], ["--dtype", "bf16"], 1,
     "cpu"),
]


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode,
                                                 " ".join(cmd), proc.stdout))
    return proc


def plan_bytes(folder):
    data = b""
    for path in sorted(glob.glob(os.path.join(folder, "*"))):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                data += f.read()
    return data


def train(work, tag, model, flags, ranks, backend):
    out = os.path.join(work, tag)
    run([PIPERC, "compile", model, "-o", out, "--lr", "1e-2"] + flags)
    metrics = os.path.join(out, "metrics.jsonl")
    save = os.path.join(out, "final.safetensors")
    run([PIPER_RUN, out, "--nproc", str(ranks), "--backend", backend,
         "--steps", "3", "--metrics", metrics, "--save", save])
    with open(metrics) as f:
        losses = [l for l in f.read().splitlines() if l.strip()]
    # Only the losses: timings differ from run to run.
    losses = [repr(json.loads(l)["loss"]) for l in losses]
    return plan_bytes(out), losses, safetensors(save)


def safetensors(path):
    """The header (without the run's random id) and the tensors' bytes."""
    with open(path, "rb") as f:
        data = f.read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    header.get("__metadata__", {}).pop("piper.run_id", None)
    return header, data[8 + size:]


def main():
    work = tempfile.mkdtemp(prefix="piper-fused-",
                            dir=os.environ.get("TEST_TMPDIR"))
    failures = []
    for i, (name, preset, flags, ranks, backend) in enumerate(CASES):
        model = os.path.join(work, "model-%d.mlir" % i)
        run([PIPERC, "model"] + preset + ["--seq", "16", "--batch", "2",
                                          "-o", model])
        plan, losses, params = train(work, "fused-%d" % i, model, flags,
                                     ranks, backend)
        plan0, losses0, params0 = train(work, "plain-%d" % i, model,
                                        flags + ["--no-fused-classifier"],
                                        ranks, backend)
        checks = [
            ("the default plan holds cross_entropy_fused",
             b"cross_entropy_fused" in plan),
            ("the default plan holds no cross_entropy_grad",
             b"cross_entropy_grad" not in plan),
            ("--no-fused-classifier's plan holds cross_entropy_grad only",
             b"cross_entropy_grad" in plan0
             and b"cross_entropy_fused" not in plan0),
            ("3 losses", len(losses) == 3),
            ("the same losses: %s vs %s" % (losses, losses0),
             losses == losses0),
            ("the same parameters, byte for byte", params[1] == params0[1]
             and len(params[1]) > 0),
            ("the same safetensors header", params[0] == params0[0]),
        ]
        for what, ok in checks:
            print("%s %s: %s" % ("ok  " if ok else "FAIL", name, what))
            if not ok:
                failures.append(name + ": " + what)
    if failures:
        sys.exit("%d check(s) failed:\n  %s" % (len(failures),
                                                "\n  ".join(failures)))
    print("all %d cases: the fused classifier changes no bit" % len(CASES))


if __name__ == "__main__":
    main()
