#!/usr/bin/env python3
"""Whole-model oracle: with the same weights and batch, Piper's loss and every
parameter gradient of the gpt-tiny and llama-tiny (untied and tied) and
qwen3-moe-tiny presets, and of a Llama built from a Hugging Face config.json
(`piperc model --hf`: RMSNorm epsilon 1e-5, rope_theta 500000, GQA), match
PyTorch
(CPU, float32, written independently here) to relative error <= 1e-4.

Piper side: `piperc compile --no-optimizer` (gradients accumulate, nothing is
applied), `piper-run --steps 0 --save` for the initial weights and
`--steps 1 --data --save-grads` for one step's gradients. The token file holds
exactly seq + 1 tokens, so every sampled window is the whole file.

Usage: torch_oracle_test.py PIPERC PIPER_RUN
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import gpt_loss, llama_loss, read_safetensors, causal_mask, rope_tables  # noqa: E402

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
RTOL = 1e-4
# The presets' sizes (2 layers, hidden 64, 4 heads, vocab 256, seq 32); only
# the microbatch is smaller, to keep the test fast.
SEQ, BATCH, VOCAB, HIDDEN = 32, 2, 256, 64

MODELS = {
    "gpt": ["gpt-tiny"],
    "gpt-tied": ["gpt-tiny", "--tied"],
    "llama": ["llama-tiny"],
    "llama-tied": ["llama-tiny", "--tied"],
    "qwen3-moe": ["qwen3-moe-tiny"],
    # Filled in by main(): the folder of HF_CONFIG.
    "hf-llama": None,
}
# A Llama-3-style config.json at the presets' sizes: the keys it sets must
# reach the model (the oracle uses the same epsilon and theta).
HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": VOCAB,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "rope_scaling": None, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout))
    return proc.stdout


def torch_loss(name, params, tokens, targets):
    mask = causal_mask(SEQ)
    if name.startswith("gpt"):
        return gpt_loss(params, tokens, targets, 2, 4, name == "gpt-tied", mask)
    hd = HIDDEN // 4
    if name in ("llama", "llama-tied"):
        cos, sin = rope_tables(SEQ, hd, 10000.0)
        return llama_loss(params, tokens, targets, 2, 4, 2, mask, cos, sin)
    if name == "hf-llama":
        cos, sin = rope_tables(SEQ, hd, HF_CONFIG["rope_theta"])
        return llama_loss(params, tokens, targets, 2, 4, 2, mask, cos, sin,
                          eps=HF_CONFIG["rms_norm_eps"])
    cos, sin = rope_tables(SEQ, hd, 1000000.0)
    return llama_loss(params, tokens, targets, 2, 4, 2, mask, cos, sin,
                      moe=(4, 2, 0.01))


def check(work, name, args):
    model = os.path.join(work, name + ".mlir")
    plans = os.path.join(work, name + "-plans")
    run([PIPERC, "model"] + args + ["--batch", str(BATCH), "-o", model])
    run([PIPERC, "compile", model, "--microbatches", "1", "--no-optimizer",
         "--clip-grad", "0", "-o", plans])
    rng = np.random.default_rng(7)
    tokens_all = rng.integers(0, VOCAB, SEQ + 1).astype("<u2")
    data = os.path.join(work, name + "-tokens.bin")
    tokens_all.tofile(data)
    init = os.path.join(work, name + "-init.safetensors")
    grads = os.path.join(work, name + "-grads.safetensors")
    metrics = os.path.join(work, name + "-metrics.jsonl")
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "0", "--seed", "3",
         "--save", init])
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "1", "--seed", "3",
         "--data", data, "--metrics", metrics, "--save-grads", grads])
    with open(metrics) as f:
        piper_loss = json.loads(f.readline())["loss"]

    params = {k: v.requires_grad_() for k, v in read_safetensors(init).items()}
    window = torch.tensor(tokens_all.astype(np.int64))
    tokens = window[:SEQ].repeat(BATCH, 1)
    targets = window[1:].repeat(BATCH, 1)
    loss = torch_loss(name, params, tokens, targets)
    loss.backward()

    failed = 0
    rel = abs(loss.item() - piper_loss) / abs(loss.item())
    ok = rel <= RTOL
    failed += not ok
    print("%s: %s loss piper %.7f torch %.7f (rel %.1e)" %
          ("ok" if ok else "FAIL", name, piper_loss, loss.item(), rel))
    piper_grads = read_safetensors(grads)
    if sorted(piper_grads) != sorted(params):
        print("FAIL: %s: parameter names differ: %s" %
              (name, sorted(set(piper_grads) ^ set(params))))
        return 1, 1
    worst, where = 0.0, ""
    for key, p in params.items():
        ref = p.grad if p.grad is not None else torch.zeros_like(p)
        err = (piper_grads[key] - ref).norm().item() / max(ref.norm().item(), 1e-12)
        if err > worst:
            worst, where = err, key
    ok = worst <= RTOL
    failed += not ok
    print("%s: %s %d gradients, worst relative error %.1e (%s)" %
          ("ok" if ok else "FAIL", name, len(params), worst, where))
    return 2, failed


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="piper-oracle-", dir=os.environ.get("TEST_TMPDIR"))
    total = failed = 0
    folder = os.path.join(work, "hf-llama-folder")
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(HF_CONFIG, f)
    MODELS["hf-llama"] = ["--hf", folder, "--seq", str(SEQ)]
    for name, args in MODELS.items():
        t, f = check(work, name, args)
        total, failed = total + t, failed + f
    print("%d passed, %d failed" % (total - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
