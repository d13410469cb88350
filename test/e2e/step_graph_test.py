#!/usr/bin/env python3
"""Steps as graphs (piper-run --step-graph, docs/runtime.md "Steps as
graphs") give the bits of steps issued as usual, through piper-run on the
emulated CUDA backend, whose capture records the device work a step issues
and whose launch runs that record again.

Each model below is compiled once (with a warmup and a cosine decay of the
learning rate, so AdamW's constants change every step, and clipping) and
trained for 7 steps with --step-graph off and on: the same losses (every
digit of --metrics) and final parameters (the tensors of the --save files
byte for byte), and the graphed run says it captured steps 2 and 3 and
launched their captures for steps 4 to 7. Exact by construction: a launch
runs the kernels the capture recorded with the arguments they were issued
with, on the same memory, after the host has written the step's constants.

The models: GPT in bf16 with two microbatches (packed step buffers, the
fused classifier, GELU epilogues), GPT in fp32 with full recomputation,
Llama in bf16 on the fused-attention model (--attention cudnn), and
Qwen3-MoE in bf16 (the router, dispatch and expert kernels); and plans of
several ranks, whose operations between ranks the emulated communicator
records among the kernels (as NCCL's are captured on CUDA) and runs again
at each launch: GPT PP2 x DP2 with 1F1B and ZeRO-1 in bf16 (sends,
receives, reduce-scatters, all-gathers, the norm's sum), GPT TP2 with
sequence parallelism in bf16, Llama CP2 (ring attention's exchanges) on
the fused-attention model, GPT DP2 with ZeRO-3 in fp32; and the
all-to-alls, whose row counts stay on the device when steps are captured
(each member's rows moved through a block of fixed size): Qwen3-MoE with
expert parallelism (EP2 in bf16, EP4 with ZeRO-1 in fp32) and Llama with
Ulysses context parallelism (CP2 in bf16).

And where steps cannot be captured: --step-graph on refuses, naming why,
on the cpu backend; --step-graph auto runs the steps as usual there and
says so once. (The communicators' refusals: device_test.)

Usage: step_graph_test.py PIPERC PIPER_RUN
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])

STEPS = 7
SCHEDULE = ["--lr", "1e-2", "--warmup-steps", "3", "--decay-steps", "6",
            "--min-lr", "1e-3", "--clip-grad", "0.5"]

# (name, model preset and flags, compile flags, piper-run flags, ranks)
CASES = [
    ("gpt-tiny bf16, 2 microbatches", ["gpt-tiny"],
     ["--dtype", "bf16", "--microbatches", "2"], [], 1),
    ("gpt-tiny fp32, full recompute", ["gpt-tiny"],
     ["--recompute", "full"], [], 1),
    ("llama-tiny bf16, fused attention", ["llama-tiny"], ["--dtype", "bf16"],
     ["--attention", "cudnn"], 1),
    ("qwen3-moe-tiny bf16", ["qwen3-moe-tiny"], ["--dtype", "bf16"], [], 1),
    ("gpt-tiny bf16, pp 2 x dp 2, 1f1b, zero-1", ["gpt-tiny"],
     ["--dtype", "bf16", "--pp", "2", "--dp", "2", "--zero", "1",
      "--microbatches", "2"], [], 4),
    ("gpt-tiny bf16, tp 2 + sp", ["gpt-tiny"],
     ["--dtype", "bf16", "--tp", "2", "--sp"], [], 2),
    ("llama-tiny bf16, cp 2 (ring), fused attention", ["llama-tiny"],
     ["--dtype", "bf16", "--cp", "2"], ["--attention", "cudnn"], 2),
    ("gpt-tiny fp32, dp 2, zero-3", ["gpt-tiny"],
     ["--dp", "2", "--zero", "3"], [], 2),
    # All-to-alls with counts on the device, moved through fixed blocks.
    ("qwen3-moe-tiny bf16, dp 2 x ep 2", ["qwen3-moe-tiny"],
     ["--dtype", "bf16", "--dp", "2", "--ep", "2"], [], 2),
    ("qwen3-moe-tiny fp32, dp 4 x ep 4, zero-1", ["qwen3-moe-tiny"],
     ["--dp", "4", "--ep", "4", "--zero", "1"], [], 4),
    ("llama-tiny bf16, cp 2 (ulysses)", ["llama-tiny"],
     ["--dtype", "bf16", "--cp", "2", "--cp-kind", "ulysses"], [], 2),
]


def run(cmd, ok=True):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=600)
    if ok and proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s%s" % (
            proc.returncode, " ".join(cmd), proc.stdout, proc.stderr))
    return proc


def safetensors_data(path):
    with open(path, "rb") as f:
        data = f.read()
    size = struct.unpack("<Q", data[:8])[0]
    return data[8 + size:]


def train(out, tag, backend, flags, nproc=1):
    metrics = os.path.join(out, "metrics-%s.jsonl" % tag)
    save = os.path.join(out, "final-%s.safetensors" % tag)
    proc = run([PIPER_RUN, out, "--nproc", str(nproc), "--backend", backend,
                "--steps", str(STEPS), "--metrics", metrics, "--save",
                save] + flags)
    with open(metrics) as f:
        losses = [repr(json.loads(l)["loss"]) for l in f if l.strip()]
    return losses, safetensors_data(save), proc.stderr


def main():
    work = tempfile.mkdtemp(prefix="piper-graph-",
                            dir=os.environ.get("TEST_TMPDIR"))
    failures = []

    def check(name, what, ok):
        print("%s %s: %s" % ("ok  " if ok else "FAIL", name, what))
        if not ok:
            failures.append(name + ": " + what)

    for i, (name, preset, flags, run_flags, nproc) in enumerate(CASES):
        model = os.path.join(work, "model-%d.mlir" % i)
        run([PIPERC, "model"] + preset + ["--seq", "16", "--batch", "4",
                                          "--vocab", "100", "-o", model])
        out = os.path.join(work, "plan-%d" % i)
        run([PIPERC, "compile", model, "-o", out] + SCHEDULE + flags)
        usual = train(out, "off", "cuda-emulation",
                      run_flags + ["--step-graph", "off"], nproc)
        graphed = train(out, "on", "cuda-emulation",
                        run_flags + ["--step-graph", "on"], nproc)
        check(name, "%d losses" % STEPS, len(usual[0]) == STEPS)
        check(name, "the same losses: %s vs %s" % (graphed[0], usual[0]),
              graphed[0] == usual[0])
        check(name, "the same parameters, byte for byte",
              graphed[1] == usual[1] and len(usual[1]) > 0)
        said = "rank 0: steps as graphs: 2 captured, %d launched again" % (
            STEPS - 3)
        check(name, "it says: %s" % said, said in graphed[2])
        check(name, "the usual run captures nothing",
              "steps as graphs" not in usual[2])

    # Where steps cannot be captured.
    out = os.path.join(work, "plan-0")
    proc = run([PIPER_RUN, out, "--nproc", "1", "--backend", "cpu",
                "--steps", "1", "--step-graph", "on"], ok=False)
    why = ("steps cannot run as graphs (--step-graph on): the cpu backend "
           "does not capture steps")
    check("cpu, on", "exits 1 saying: %s" % why,
          proc.returncode == 1 and why in proc.stderr)
    proc = run([PIPER_RUN, out, "--nproc", "1", "--backend", "cpu",
                "--steps", "2", "--step-graph", "auto"])
    said = ("steps run as usual, not as graphs: the cpu backend does not "
            "capture steps")
    check("cpu, auto", "runs, saying once: %s" % said,
          proc.stderr.count(said) == 1)

    if failures:
        sys.exit("%d check(s) failed:\n  %s" % (len(failures),
                                                "\n  ".join(failures)))
    print("all %d cases: replayed steps change no bit" % len(CASES))


if __name__ == "__main__":
    main()
