#!/usr/bin/env python3
"""Hugging Face reference folders made by `transformers` itself, for
test/oracle/hf_transformers_parity.py (docs/hugging-face.md, "Parity with
transformers"). Run where `transformers` and `torch` are installed (Debian
has no transformers package; the GPU machine of docs/gpu.md has both):

  hf_reference.py OUT_DIR

For each architecture Piper reads (LlamaForCausalLM with and without
Llama 3.1's rope scaling, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
GPT2LMHeadModel) it builds a small model from its transformers config class
(random weights, the norm weights moved away from 1 and the MoE router
scaled up so that they matter), writes it with save_pretrained, and records
one step's reference on CPU in float32: the token window (S + 1 tokens,
uint16), the mean cross-entropy of the model's own logits for tokens[0:S]
(two copies of the sequence) against tokens[1:S+1], and every parameter's
gradient of that loss under the parameter's state_dict name. Layout:

  OUT_DIR/<case>/model/        the save_pretrained folder (config.json, safetensors)
  OUT_DIR/<case>/tokens.bin    the window
  OUT_DIR/<case>/grads.safetensors
  OUT_DIR/<case>/reference.json  {"loss", "transformers", "torch", "seq", "batch"}
  OUT_DIR/log.txt              what was made, and any case that failed
"""
import json
import os
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F

SEQ, BATCH, VOCAB = 16, 2, 64


def cases():
    import transformers as tf
    # Small enough to keep in the repository (test/oracle/transformers):
    # hidden 32, 4 heads (2 key/value heads), and Qwen3's heads of 12.
    common = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-5)
    llama31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               # With head_dim 8, wavelengths 6.3, 167, 4443 and 1.2e5
               # fall in all three ranges (kept, interpolated, divided).
               "original_max_position_embeddings": 256}
    return {
        "llama": (tf.LlamaForCausalLM, lambda: llama3_config(
            tf, common, {"rope_type": "default", "rope_theta": 500000.0})),
        "llama31": (tf.LlamaForCausalLM, lambda: llama3_config(tf, common, llama31)),
        "qwen3": (tf.Qwen3ForCausalLM, lambda: tf.Qwen3Config(
            intermediate_size=48, num_hidden_layers=2, head_dim=12,
            max_position_embeddings=128, tie_word_embeddings=True, **common)),
        "qwen3-moe": (tf.Qwen3MoeForCausalLM, lambda: with_head_dim(
            tf.Qwen3MoeConfig, 12, intermediate_size=40, moe_intermediate_size=16,
            num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=True, mlp_only_layers=[1], max_position_embeddings=128,
            **common)),
        "gpt2": (tf.GPT2LMHeadModel, lambda: tf.GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    }


def with_head_dim(config_class, head_dim, **kw):
    """A config with head_dim (a field of some config classes, an attribute
    the modeling code reads with getattr in others)."""
    try:
        return config_class(head_dim=head_dim, **kw)
    except TypeError:
        config = config_class(**kw)
        config.head_dim = head_dim
        return config


def llama3_config(tf, common, scaling):
    try:
        return tf.LlamaConfig(intermediate_size=48, num_hidden_layers=2,
                              max_position_embeddings=128, rope_parameters=scaling,
                              **common)
    except TypeError:  # transformers 4: rope_theta and rope_scaling
        s = dict(scaling)
        theta = s.pop("rope_theta")
        return tf.LlamaConfig(intermediate_size=48, num_hidden_layers=2,
                              max_position_embeddings=128, rope_theta=theta,
                              rope_scaling=s if s["rope_type"] != "default" else None,
                              **common)


def make(name, cls, config, out, log):
    from safetensors.torch import save_file
    torch.manual_seed(1234)
    try:
        config._attn_implementation = "eager"
    except Exception:  # the default (sdpa) is the same math in float32
        pass
    model = cls(config).float().eval()
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("ln_1.weight") or n.endswith("ln_2.weight") \
                    or n.endswith("ln_f.weight"):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
            elif n.endswith("mlp.gate.weight"):
                p.mul_(20.0)
    case = os.path.join(out, name)
    model.save_pretrained(os.path.join(case, "model"), safe_serialization=True)
    window = np.random.default_rng(5).integers(0, VOCAB, SEQ + 1).astype("<u2")
    window.tofile(os.path.join(case, "tokens.bin"))
    w = torch.tensor(window.astype(np.int64))
    tokens, targets = w[:SEQ].repeat(BATCH, 1), w[1:].repeat(BATCH, 1)
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    model.zero_grad()
    loss.backward()
    names = {id(p): n for n, p in model.named_parameters()}
    grads = {names[id(p)]: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
             .contiguous() for p in model.parameters()}
    save_file(grads, os.path.join(case, "grads.safetensors"))
    import transformers
    with open(os.path.join(case, "reference.json"), "w") as f:
        json.dump({"loss": loss.item(), "transformers": transformers.__version__,
                   "torch": torch.__version__, "seq": SEQ, "batch": BATCH}, f, indent=1)
    files = sorted(os.listdir(os.path.join(case, "model")))
    log.write("%s: loss %.7f; %d gradients; model files %s\n" %
              (name, loss.item(), len(grads), files))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(4)
    with open(os.path.join(out, "log.txt"), "w") as log:
        import transformers
        log.write("transformers %s, torch %s\n" % (transformers.__version__, torch.__version__))
        failed = 0
        for name, (cls, config) in cases().items():
            try:
                make(name, cls, config(), out, log)
            except Exception:
                failed += 1
                log.write("%s: FAILED\n%s\n" % (name, traceback.format_exc()))
            log.flush()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
