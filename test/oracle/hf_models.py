"""Hugging Face-convention models for the oracle, written from the published
`transformers` definitions (LlamaForCausalLM in
src/transformers/models/llama/modeling_llama.py, GPT2LMHeadModel in
src/transformers/models/gpt2/modeling_gpt2.py), not from Piper's code:
separate q/k/v and gate/up projections, `nn.Linear` weights stored
[out, in], rotate-half rotary embeddings, and the checkpoint folders
`save_pretrained` writes (config.json, model.safetensors or shards with
model.safetensors.index.json).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

from torch_models import read_safetensors_any


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: name -> float32 torch tensor, written in `dtype` (F32, BF16
    or F16), in the given order, with {"format": "pt"} metadata."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if dtype in ("BF16", "F16"):
            half = torch.bfloat16 if dtype == "BF16" else torch.float16
            raw = t.to(half).view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            raw = t.float().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_folder(folder):
    """A Hugging Face folder's tensors: name -> (tensor, dtype, bytes)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors_any(single)
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for file in sorted(set(weight_map.values())):
        part = read_safetensors_any(os.path.join(folder, file))
        for name, value in part.items():
            assert weight_map[name] == file, (name, file)
            out[name] = value
    assert sorted(out) == sorted(weight_map)
    return out


def write_folder(folder, config, tensors, dtype="F32", shards=1):
    """save_pretrained's layout: config.json and the tensors in `shards`
    files (with an index when more than one)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    names = list(tensors)
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors, dtype)
        return
    weight_map, total = {}, 0
    per = -(-len(names) // shards)
    for k in range(shards):
        file = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        part = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
        write_safetensors(os.path.join(folder, file), part, dtype)
        for n, t in part.items():
            weight_map[n] = file
            total += t.numel() * (4 if dtype == "F32" else 2)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)


def is_qwen3_moe(config):
    """Qwen3MoeForCausalLM: Qwen3's attention, mixture-of-experts MLPs."""
    return (config.get("architectures") or [None])[0] == "Qwen3MoeForCausalLM" or \
        config.get("model_type") == "qwen3_moe"


def is_qwen3(config):
    """Qwen3ForCausalLM (or -Moe): Llama plus q_norm/k_norm; the dense
    model's head_dim is 128 unless given."""
    return (config.get("architectures") or [None])[0] == "Qwen3ForCausalLM" or \
        config.get("model_type") == "qwen3" or is_qwen3_moe(config)


def head_dim(config):
    h, heads = config["hidden_size"], config["num_attention_heads"]
    default = 128 if is_qwen3(config) and not is_qwen3_moe(config) else h // heads
    return config.get("head_dim") or default


def tied(config):
    return config.get("tie_word_embeddings", is_qwen3(config) and not is_qwen3_moe(config))


def num_experts(config):
    """num_experts, which transformers 5 writes as num_local_experts."""
    return config.get("num_experts", config.get("num_local_experts", 128))


def moe_layer(config, i):
    """Qwen3MoeDecoderLayer's choice: experts unless in mlp_only_layers or
    (i + 1) is not a multiple of decoder_sparse_step."""
    return is_qwen3_moe(config) and i not in (config.get("mlp_only_layers") or []) and \
        num_experts(config) > 0 and \
        (i + 1) % config.get("decoder_sparse_step", 1) == 0


def llama_random_weights(config, generator):
    """A LlamaForCausalLM (or Qwen3ForCausalLM) state dict of random float32
    weights (norm weights around 1, so that they matter)."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = head_dim(config)
    v = config["vocab_size"]

    def rand(*shape, scale=0.05):
        return torch.randn(*shape, generator=generator) * scale

    p = {"model.embed_tokens.weight": rand(v, h, scale=0.5)}
    for i in range(config["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        p[pre + "input_layernorm.weight"] = 1 + rand(h, scale=0.1)
        p[pre + "self_attn.q_proj.weight"] = rand(heads * hd, h, scale=0.2)
        p[pre + "self_attn.k_proj.weight"] = rand(kv * hd, h, scale=0.2)
        p[pre + "self_attn.v_proj.weight"] = rand(kv * hd, h, scale=0.2)
        p[pre + "self_attn.o_proj.weight"] = rand(h, heads * hd, scale=0.1)
        if is_qwen3(config):
            p[pre + "self_attn.q_norm.weight"] = 1 + rand(hd, scale=0.3)
            p[pre + "self_attn.k_norm.weight"] = 1 + rand(hd, scale=0.3)
        p[pre + "post_attention_layernorm.weight"] = 1 + rand(h, scale=0.1)
        if moe_layer(config, i):
            e, f = num_experts(config), config["moe_intermediate_size"]
            p[pre + "mlp.gate.weight"] = rand(e, h, scale=0.5)
            for x in range(e):
                q = pre + "mlp.experts.%d." % x
                p[q + "gate_proj.weight"] = rand(f, h, scale=0.1)
                p[q + "up_proj.weight"] = rand(f, h, scale=0.1)
                p[q + "down_proj.weight"] = rand(h, f, scale=0.1)
            continue
        p[pre + "mlp.gate_proj.weight"] = rand(inter, h, scale=0.1)
        p[pre + "mlp.up_proj.weight"] = rand(inter, h, scale=0.1)
        p[pre + "mlp.down_proj.weight"] = rand(h, inter, scale=0.1)
    p["model.norm.weight"] = 1 + rand(h, scale=0.1)
    if not tied(config):
        p["lm_head.weight"] = rand(v, h, scale=0.1)
    return p


def _rms_norm(x, w, eps):
    # LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), times the weight.
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def _rotate_half(x):
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(config, hd):
    """LlamaRotaryEmbedding's inverse frequencies, in float32 as
    transformers computes them: rope_type "default", or "llama3"
    (modeling_rope_utils._compute_llama3_parameters: long wavelengths
    divided by `factor`, short ones kept, those between interpolated)."""
    theta = config["rope_theta"]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def llama_logits(p, config, tokens):
    """LlamaForCausalLM's forward: [B, S] token ids -> [B, S, V] logits.
    Qwen3ForCausalLM's too: Qwen3Attention RMS-normalizes each query and key
    head (q_norm, k_norm, over head_dim) after the projection and before the
    rotation."""
    h = config["hidden_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = head_dim(config)
    eps = config["rms_norm_eps"]
    b, s = tokens.shape
    inv_freq = rope_inv_freq(config, hd)
    freqs = torch.arange(s).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    x = p["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        y = _rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = F.linear(y, p[pre + "self_attn.q_proj.weight"]).view(b, s, heads, hd)
        k = F.linear(y, p[pre + "self_attn.k_proj.weight"]).view(b, s, kv, hd)
        if is_qwen3(config):
            q = _rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = _rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = F.linear(y, p[pre + "self_attn.v_proj.weight"]).view(b, s, kv, hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(heads // kv, dim=1)  # repeat_kv
        v = v.repeat_interleave(heads // kv, dim=1)
        scores = (q @ k.transpose(2, 3)) * hd ** -0.5
        scores = scores.masked_fill(mask, float("-inf"))
        a = torch.softmax(scores, dim=-1) @ v
        a = a.transpose(1, 2).reshape(b, s, heads * hd)
        x = x + F.linear(a, p[pre + "self_attn.o_proj.weight"])
        y = _rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        if moe_layer(config, i):
            x = x + _sparse_moe(p, config, pre, y)
            continue
        gate = F.linear(y, p[pre + "mlp.gate_proj.weight"])
        up = F.linear(y, p[pre + "mlp.up_proj.weight"])
        x = x + F.linear(F.silu(gate) * up, p[pre + "mlp.down_proj.weight"])
    x = _rms_norm(x, p["model.norm.weight"], eps)
    head = p.get("lm_head.weight", p["model.embed_tokens.weight"])
    return F.linear(x, head)


def _sparse_moe(p, config, pre, y):
    """Qwen3MoeSparseMoeBlock: softmax over the router's logits, the top
    num_experts_per_tok, renormalized with norm_topk_prob, each token's
    experts' SwiGLU outputs summed with those weights (dropless)."""
    b, s, h = y.shape
    t = y.reshape(-1, h)
    probs = torch.softmax(F.linear(t, p[pre + "mlp.gate.weight"]), dim=-1, dtype=torch.float)
    weights, chosen = torch.topk(probs, config["num_experts_per_tok"], dim=-1)
    if config.get("norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(t)
    for x in range(num_experts(config)):
        token, slot = torch.where(chosen == x)
        if token.numel() == 0:
            continue
        q = pre + "mlp.experts.%d." % x
        z = t[token]
        z = F.linear(F.silu(F.linear(z, p[q + "gate_proj.weight"])) *
                     F.linear(z, p[q + "up_proj.weight"]), p[q + "down_proj.weight"])
        out = out.index_add(0, token, z * weights[token, slot, None])
    return out.reshape(b, s, h)


def llama_loss(p, config, tokens, targets):
    logits = llama_logits(p, config, tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def to_piper(hf, config):
    """Hugging Face Llama tensors (weights or their gradients) in Piper's
    names and layouts: Meta-style names, [in, out] weights, q|k|v and
    gate|up fused along the output columns."""
    out = {"tok_embeddings.weight": hf["model.embed_tokens.weight"],
           "norm.weight": hf["model.norm.weight"]}
    if "lm_head.weight" in hf and not tied(config):
        out["output.weight"] = hf["lm_head.weight"].t()
    for i in range(config["num_hidden_layers"]):
        pre, to = "model.layers.%d." % i, "layers.%d." % i
        out[to + "attention_norm.weight"] = hf[pre + "input_layernorm.weight"]
        out[to + "ffn_norm.weight"] = hf[pre + "post_attention_layernorm.weight"]
        if moe_layer(config, i):
            e = num_experts(config)
            q = pre + "mlp.experts.%d."
            out[to + "moe.router.weight"] = hf[pre + "mlp.gate.weight"].t()
            out[to + "moe.experts.w13"] = torch.stack([torch.cat(
                [hf[q % x + "gate_proj.weight"].t(), hf[q % x + "up_proj.weight"].t()], dim=1)
                for x in range(e)])
            out[to + "moe.experts.w2"] = torch.stack(
                [hf[q % x + "down_proj.weight"].t() for x in range(e)])
        out[to + "attention.wqkv.weight"] = torch.cat(
            [hf[pre + "self_attn.%s_proj.weight" % n].t() for n in "qkv"], dim=1)
        out[to + "attention.wo.weight"] = hf[pre + "self_attn.o_proj.weight"].t()
        if is_qwen3(config):
            out[to + "attention.qk_norm.weight"] = torch.cat(
                [hf[pre + "self_attn.q_norm.weight"], hf[pre + "self_attn.k_norm.weight"]])
        if moe_layer(config, i):
            continue
        out[to + "feed_forward.w13.weight"] = torch.cat(
            [hf[pre + "mlp.gate_proj.weight"].t(), hf[pre + "mlp.up_proj.weight"].t()], dim=1)
        out[to + "feed_forward.w2.weight"] = hf[pre + "mlp.down_proj.weight"].t()
    return out


def gpt2_random_weights(config, generator):
    """A GPT2LMHeadModel state dict of random float32 weights (Conv1D
    weights [in, out]; LayerNorm weights around 1, biases nonzero)."""
    h, v, n = config["n_embd"], config["vocab_size"], config["n_positions"]
    inner = config.get("n_inner") or 4 * h

    def rand(*shape, scale=0.05):
        return torch.randn(*shape, generator=generator) * scale

    p = {"transformer.wte.weight": rand(v, h, scale=0.5),
         "transformer.wpe.weight": rand(n, h, scale=0.1)}
    for i in range(config["n_layer"]):
        pre = "transformer.h.%d." % i
        for ln in ("ln_1", "ln_2"):
            p[pre + ln + ".weight"] = 1 + rand(h, scale=0.1)
            p[pre + ln + ".bias"] = rand(h, scale=0.1)
        p[pre + "attn.c_attn.weight"] = rand(h, 3 * h, scale=0.2)
        p[pre + "attn.c_attn.bias"] = rand(3 * h, scale=0.1)
        p[pre + "attn.c_proj.weight"] = rand(h, h, scale=0.1)
        p[pre + "attn.c_proj.bias"] = rand(h, scale=0.1)
        p[pre + "mlp.c_fc.weight"] = rand(h, inner, scale=0.1)
        p[pre + "mlp.c_fc.bias"] = rand(inner, scale=0.1)
        p[pre + "mlp.c_proj.weight"] = rand(inner, h, scale=0.1)
        p[pre + "mlp.c_proj.bias"] = rand(h, scale=0.1)
    p["transformer.ln_f.weight"] = 1 + rand(h, scale=0.1)
    p["transformer.ln_f.bias"] = rand(h, scale=0.1)
    if not config.get("tie_word_embeddings", True):
        p["lm_head.weight"] = rand(v, h, scale=0.1)
    return p


def _gelu_new(x):
    # NewGELUActivation.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_logits(p, config, tokens):
    """GPT2LMHeadModel's forward (no dropout): [B, S] -> [B, S, V]."""
    h, heads = config["n_embd"], config["n_head"]
    hd, eps = h // heads, config.get("layer_norm_epsilon", 1e-5)
    b, s = tokens.shape
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][:s]
    for i in range(config["n_layer"]):
        pre = "transformer.h.%d." % i
        y = F.layer_norm(x, (h,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
        # Conv1D: x @ W + b, W [in, out].
        qkv = y @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = (t.view(b, s, heads, hd).permute(0, 2, 1, 3) for t in qkv.split(h, dim=2))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(mask, float("-inf"))
        a = (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).reshape(b, s, h)
        x = x + a @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        y = F.layer_norm(x, (h,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
        y = _gelu_new(y @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"])
        x = x + y @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (h,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    return F.linear(x, p.get("lm_head.weight", p["transformer.wte.weight"]))


def gpt2_to_piper(hf, config):
    """GPT-2 tensors in Piper's names: GPT2Model's without "transformer."
    (wte and wpe without ".weight"); the untied head transposed."""
    out = {}
    for name, t in hf.items():
        if name == "lm_head.weight":
            if not config.get("tie_word_embeddings", True):
                out[name] = t.t()
            continue
        name = name[len("transformer."):]
        out[{"wte.weight": "wte", "wpe.weight": "wpe"}.get(name, name)] = t
    return out


ARCHS = {"llama": (llama_loss, to_piper), "qwen3": (llama_loss, to_piper),
         "qwen3-moe": (llama_loss, to_piper)}


def gpt2_loss(p, config, tokens, targets):
    logits = gpt2_logits(p, config, tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


ARCHS["gpt2"] = (gpt2_loss, gpt2_to_piper)
