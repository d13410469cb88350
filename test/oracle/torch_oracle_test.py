#!/usr/bin/env python3
"""Whole-model oracle: with the same weights and batch, Piper's loss and every
parameter gradient of small GPT, Llama and Qwen3-MoE models match PyTorch
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
import torch.nn.functional as F

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
RTOL = 1e-4
SEQ, BATCH, VOCAB = 16, 2, 64

MODELS = {
    "gpt": ["gpt", "--layers", "2", "--hidden", "32", "--heads", "4"],
    "gpt-tied": ["gpt", "--layers", "2", "--hidden", "32", "--heads", "4",
                 "--tied"],
    "llama": ["llama", "--layers", "2", "--hidden", "32", "--heads", "4",
              "--kv-heads", "2", "--ffn", "48"],
    "qwen3-moe": ["qwen3-moe", "--layers", "2", "--hidden", "32", "--heads", "4",
                  "--kv-heads", "2", "--ffn", "24", "--experts", "4",
                  "--top-k", "2", "--aux-loss-coeff", "0.01"],
}


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout))
    return proc.stdout


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[base + begin:base + end], dtype="<f4")
        out[name] = torch.tensor(arr.reshape(info["shape"]).copy())
    return out


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal_attention(q, k, v):
    """q: [B, heads, S, hd]; k, v: [B, heads, S, hd]."""
    hd = q.shape[-1]
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    s = q.shape[-2]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def rope(x, theta):
    """x: [B, heads, S, hd], rotate-half convention."""
    hd, s = x.shape[-1], x.shape[-2]
    freqs = theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
    angles = torch.arange(s, dtype=torch.float64)[:, None] * freqs[None, :]
    cos = torch.cos(angles).float().repeat(1, 2)
    sin = torch.sin(angles).float().repeat(1, 2)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def gpt_loss(p, tokens, targets, layers, heads, tied):
    b, s = tokens.shape
    x = p["wte"][tokens] + p["wpe"][:s]
    h = x.shape[-1]
    hd = h // heads
    for i in range(layers):
        pre = "h.%d." % i
        y = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
        qkv = y @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = (t.reshape(b, s, heads, hd).transpose(1, 2)
                   for t in qkv.split(h, dim=-1))
        a = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
        x = x + a @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        y = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
        y = F.gelu(y @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"],
                   approximate="tanh")
        x = x + y @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ (p["wte"].t() if tied else p["lm_head.weight"])
    return F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(-1))


def llama_loss(p, tokens, targets, layers, heads, kv_heads, moe=None):
    b, s = tokens.shape
    x = p["tok_embeddings.weight"][tokens]
    h = x.shape[-1]
    hd = h // heads
    loss_extra = 0.0
    theta = 1000000.0 if moe else 10000.0
    for i in range(layers):
        pre = "layers.%d." % i
        y = rms_norm(x, p[pre + "attention_norm.weight"])
        qkv = y @ p[pre + "attention.wqkv.weight"]
        q = qkv[..., :heads * hd].reshape(b, s, heads, hd).transpose(1, 2)
        k = qkv[..., heads * hd:(heads + kv_heads) * hd]
        v = qkv[..., (heads + kv_heads) * hd:]
        k = k.reshape(b, s, kv_heads, hd).transpose(1, 2)
        v = v.reshape(b, s, kv_heads, hd).transpose(1, 2)
        q, k = rope(q, theta), rope(k, theta)
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        a = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
        x = x + a @ p[pre + "attention.wo.weight"]
        y = rms_norm(x, p[pre + "ffn_norm.weight"])
        if moe is None:
            gu = y @ p[pre + "feed_forward.w13.weight"]
            f = gu.shape[-1] // 2
            x = x + (F.silu(gu[..., :f]) * gu[..., f:]) @ p[pre + "feed_forward.w2.weight"]
            continue
        experts, top_k, coeff = moe
        flat = y.reshape(b * s, h)
        logits = flat @ p[pre + "moe.router.weight"]
        probs = torch.softmax(logits, dim=-1)
        top_p, top_i = probs.topk(top_k, dim=-1)
        weights = top_p / top_p.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        w13, w2 = p[pre + "moe.experts.w13"], p[pre + "moe.experts.w2"]
        for j in range(top_k):
            for e in range(experts):
                rows = (top_i[:, j] == e).nonzero().flatten()
                if rows.numel() == 0:
                    continue
                gu = flat[rows] @ w13[e]
                f = gu.shape[-1] // 2
                y_e = (F.silu(gu[:, :f]) * gu[:, f:]) @ w2[e]
                out = out.index_add(0, rows, weights[rows, j:j + 1] * y_e)
        counts = torch.zeros(experts)
        for e in range(experts):
            counts[e] = (top_i == e).sum()
        frac = counts / (b * s * top_k)
        aux = experts * (frac * probs.mean(0)).sum()
        loss_extra = loss_extra + coeff * aux
        x = x + out.reshape(b, s, h)
    x = rms_norm(x, p["norm.weight"])
    logits = x @ p["output.weight"]
    return F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(-1)) + loss_extra


def torch_loss(name, params, tokens, targets):
    if name.startswith("gpt"):
        return gpt_loss(params, tokens, targets, 2, 4, name == "gpt-tied")
    if name == "llama":
        return llama_loss(params, tokens, targets, 2, 4, 2)
    return llama_loss(params, tokens, targets, 2, 4, 2, moe=(4, 2, 0.01))


def check(work, name, args):
    model = os.path.join(work, name + ".mlir")
    plans = os.path.join(work, name + "-plans")
    run([PIPERC, "model"] + args + ["--vocab", str(VOCAB), "--seq", str(SEQ),
                                    "--batch", str(BATCH), "-o", model])
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
    for name, args in MODELS.items():
        t, f = check(work, name, args)
        total, failed = total + t, failed + f
    print("%d passed, %d failed" % (total - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
