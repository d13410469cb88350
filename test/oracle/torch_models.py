"""PyTorch (CPU) re-implementations of Piper's model families, written from
the model descriptions, not from Piper's code: the numerical oracle of
test/oracle/torch_oracle_test.py and the reference side of
bench/cpu_vs_torch.py. Parameters come in Piper's names and layouts
(a safetensors file written by `piper-run --save`).
"""
import json

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors_any(path):
    """Every tensor of a safetensors file as float32 (from F32 or BF16), by
    name, with its dtype and raw bytes: name -> (tensor, dtype, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        if info["dtype"] == "F32":
            t = torch.tensor(np.frombuffer(raw, dtype="<f4").copy())
        elif info["dtype"] == "BF16":
            t = torch.tensor(np.frombuffer(raw, dtype="<i2").copy()).view(
                torch.bfloat16).float()
        else:
            raise ValueError("dtype %s" % info["dtype"])
        out[name] = (t.reshape(info["shape"]), info["dtype"], raw)
    return out


def read_safetensors(path):
    """Every F32 tensor of a safetensors file, by name."""
    out = {}
    for name, (t, dtype, _) in read_safetensors_any(path).items():
        assert dtype == "F32", (name, dtype)
        out[name] = t
    return out


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal_mask(s):
    """[S, S] bool, True above the diagonal (the positions masked out)."""
    return torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)


def causal_attention(q, k, v, mask):
    """q, k, v: [B, heads, S, hd]; mask from causal_mask."""
    hd = q.shape[-1]
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def rope_tables(s, hd, theta):
    freqs = theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
    angles = torch.arange(s, dtype=torch.float64)[:, None] * freqs[None, :]
    return (torch.cos(angles).float().repeat(1, 2),
            torch.sin(angles).float().repeat(1, 2))


def rope(x, cos, sin):
    """x: [B, heads, S, hd], rotate-half convention."""
    hd = x.shape[-1]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def gpt_loss(p, tokens, targets, layers, heads, tied, mask):
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
        a = causal_attention(q, k, v, mask).transpose(1, 2).reshape(b, s, h)
        x = x + a @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        y = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
        y = F.gelu(y @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"],
                   approximate="tanh")
        x = x + y @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ (p["wte"].t() if tied else p["lm_head.weight"])
    return F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(-1))


def llama_loss(p, tokens, targets, layers, heads, kv_heads, mask, cos, sin,
               moe=None, eps=1e-6):
    """Llama, or Qwen3-MoE with moe = (experts, top_k, aux loss coeff);
    `eps` is RMSNorm's."""
    b, s = tokens.shape
    x = p["tok_embeddings.weight"][tokens]
    h = x.shape[-1]
    hd = h // heads
    loss_extra = 0.0
    for i in range(layers):
        pre = "layers.%d." % i
        y = rms_norm(x, p[pre + "attention_norm.weight"], eps)
        qkv = y @ p[pre + "attention.wqkv.weight"]
        q = qkv[..., :heads * hd].reshape(b, s, heads, hd).transpose(1, 2)
        k = qkv[..., heads * hd:(heads + kv_heads) * hd]
        v = qkv[..., (heads + kv_heads) * hd:]
        k = k.reshape(b, s, kv_heads, hd).transpose(1, 2)
        v = v.reshape(b, s, kv_heads, hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        a = causal_attention(q, k, v, mask).transpose(1, 2).reshape(b, s, h)
        x = x + a @ p[pre + "attention.wo.weight"]
        y = rms_norm(x, p[pre + "ffn_norm.weight"], eps)
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
    x = rms_norm(x, p["norm.weight"], eps)
    # A tied head (no output.weight) is the token embedding's transpose.
    head = p["output.weight"] if "output.weight" in p else p["tok_embeddings.weight"].t()
    logits = x @ head
    return F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(-1)) + loss_extra
