#!/usr/bin/env python3
"""Piper against transformers itself, on the reference folders that
scripts/hf_reference.py makes where transformers is installed
(docs/hugging-face.md, "Parity with transformers"):

  hf_transformers_parity.py PIPERC PIPER_RUN REFERENCE_DIR [--backend B]
      [--plans DIR]

--backend goes to piper-run (scripts/gpu_check.sh runs the cases on
cuda); with --plans, DIR/<case> are the compiled plans (gpu_bundle.sh's,
on a machine without piperc: PIPERC may then be "-").

For each case: piperc model --hf <case>/model, then one step of piper-run
--load <case>/model on <case>/tokens.bin (two copies of the window, one
microbatch, no optimizer, no clipping), and the loss and every gradient
against transformers' (reference.json, grads.safetensors: its own forward
and autograd). Bounds as the oracle test's: loss 1e-5 relative, each
gradient 1e-4 in relative norm (float32 sums in another order; measured
far below, docs/hugging-face.md). transformers 5 keeps Qwen3-MoE's experts
fused in memory (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H,
I]); their gradients are split per expert into the Hub names first.
Exit status 1 if any check fails.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models as hf  # noqa: E402
from torch_models import read_safetensors  # noqa: E402

LOSS_RTOL, GRAD_RTOL = 1e-5, 1e-4


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), proc.returncode, proc.stdout))
    return proc.stdout


def hub_names(grads, config):
    """transformers 5's fused expert gradients as the Hub's per-expert ones."""
    out = {}
    for name, g in grads.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[:-len("gate_up_proj")]
            f = g.shape[1] // 2
            for x in range(g.shape[0]):
                out[pre + "%d.gate_proj.weight" % x] = g[x, :f]
                out[pre + "%d.up_proj.weight" % x] = g[x, f:]
        elif name.endswith("mlp.experts.down_proj"):
            pre = name[:-len("down_proj")]
            for x in range(g.shape[0]):
                out[pre + "%d.down_proj.weight" % x] = g[x]
        else:
            out[name] = g
    return out


def compile_commands(piperc, model, ref, mlir, plans):
    """The model of `model`'s config.json at the reference's sizes, and its
    plans: one microbatch, no optimizer, no clipping."""
    return ([piperc, "model", "--hf", model, "--seq", str(ref["seq"]), "--batch",
             str(ref["batch"]), "-o", mlir],
            [piperc, "compile", mlir, "-o", plans, "--microbatches", "1", "--no-optimizer",
             "--clip-grad", "0"])


def check_case(piperc, piper_run, case, work, backend="cpu", plans_dir=None):
    model = os.path.join(case, "model")
    with open(os.path.join(case, "reference.json")) as f:
        ref = json.load(f)
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    name = os.path.basename(case)
    if plans_dir:
        plans = os.path.join(plans_dir, name)
    else:
        mlir = os.path.join(work, name + ".mlir")
        plans = os.path.join(work, name + "-plans")
        for cmd in compile_commands(piperc, model, ref, mlir, plans):
            run(cmd)
    metrics = os.path.join(work, name + ".jsonl")
    grads = os.path.join(work, name + "-grads.safetensors")
    run([piper_run, plans, "--nproc", "1", "--steps", "1", "--backend", backend,
         "--load", model, "--data", os.path.join(case, "tokens.bin"), "--metrics",
         metrics, "--save-grads", grads, "--timeout-s", "60"])
    with open(metrics) as f:
        loss = json.loads(f.readline())["loss"]
    rel = abs(loss - ref["loss"]) / abs(ref["loss"])
    ok_loss = rel <= LOSS_RTOL
    print("%s: %s loss piper (%s) %.7f transformers %s %.7f (rel %.1e)" %
          ("ok" if ok_loss else "FAIL", name, backend, loss, ref["transformers"], ref["loss"],
           rel))
    theirs = hub_names(read_safetensors(os.path.join(case, "grads.safetensors")), config)
    arch = "gpt2" if config["model_type"] == "gpt2" else "llama"
    mapped = hf.ARCHS[arch][1](theirs, config)
    ours = read_safetensors(grads)
    if sorted(mapped) != sorted(ours):
        print("FAIL: %s gradient names differ: %s" % (name, sorted(set(mapped) ^ set(ours))))
        return False
    worst, where = 0.0, ""
    for k, g in mapped.items():
        err = (ours[k] - g).norm().item() / max(g.norm().item(), 1e-12)
        if err > worst:
            worst, where = err, k
    ok_grads = worst <= GRAD_RTOL
    print("%s: %s %d gradients, worst relative error %.1e (%s)" %
          ("ok" if ok_grads else "FAIL", name, len(ours), worst, where))
    return ok_loss and ok_grads


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("piperc")
    parser.add_argument("piper_run")
    parser.add_argument("reference")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--plans")
    parser.add_argument("--compile-to", help="only compile every case's plans into this folder")
    args = parser.parse_args()
    piperc, piper_run, reference = args.piperc, args.piper_run, args.reference
    work = tempfile.mkdtemp(prefix="piper-hf-parity-", dir=os.environ.get("TEST_TMPDIR"))
    torch.set_num_threads(1)
    if args.compile_to:
        for name in sorted(os.listdir(reference)):
            case = os.path.join(reference, name)
            if os.path.isdir(case):
                with open(os.path.join(case, "reference.json")) as f:
                    ref = json.load(f)
                mlir = os.path.join(work, name + ".mlir")
                for cmd in compile_commands(piperc, os.path.join(case, "model"), ref, mlir,
                                            os.path.join(args.compile_to, name)):
                    run(cmd)
        return
    failed = 0
    for name in sorted(os.listdir(reference)):
        case = os.path.join(reference, name)
        if not os.path.isdir(case):
            continue
        try:
            failed += not check_case(piperc, piper_run, case, work, args.backend, args.plans)
        except RuntimeError as e:
            failed += 1
            print("FAIL: %s: %s" % (name, e))
    # Llama 3.1's rope scaling is the only difference between these two
    # references (same seed, same weights): their gradients must differ by
    # far more than the bound, so that a Piper ignoring it would fail.
    pair = [os.path.join(reference, n, "grads.safetensors") for n in ("llama", "llama31")]
    if all(os.path.exists(p) for p in pair):
        a, b = (read_safetensors(p) for p in pair)
        diff = max(((a[k] - b[k]).norm() / a[k].norm()).item() for k in a)
        ok = diff > 100 * GRAD_RTOL
        failed += not ok
        print("%s: llama31's rope scaling moves transformers' gradients by %.1e relative "
              "(more than 100x the bound)" % ("ok" if ok else "FAIL", diff))
    print("%d failed" % failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
