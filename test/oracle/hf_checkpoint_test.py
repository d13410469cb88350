#!/usr/bin/env python3
"""Hugging Face folders in and out (docs/hugging-face.md), against the
Hugging Face-convention Llama of hf_models.py (separate q/k/v and gate/up,
[out, in] weights), in PyTorch (CPU, float32):

- load: `piper-run --load FOLDER`, one step: the loss equals the oracle's
  (relative 1e-5) and every gradient, mapped to Piper's layout, too
  (relative norm 1e-4), for a tied Llama-3.2-style folder (one file), an
  untied one in three shards with an index, and bf16 and f16 ones (the
  oracle then uses the values they hold);
- strategies: three training steps from the folder under PP2 x DP2 ZeRO-3
  and under TP2 give one device's losses;
- out: `--save-hf` after three steps writes a folder whose tensors are the
  trained parameters of `--save` (exactly), and the oracle's loss of that
  folder is Piper's; a load -> save-hf round trip of an fp32 folder is
  bit-identical, tensor by tensor; bf16 export rounds as torch does;
- bad input, each a clear error: a missing or truncated shard, a tensor of
  the wrong shape, a missing tensor, an extra tensor, an unsupported
  rope_scaling type, a config that contradicts the weights or the compiled
  model, a model not built from a Hugging Face config.

Usage: hf_checkpoint_test.py PIPERC PIPER_RUN
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models as hf  # noqa: E402
from torch_models import read_safetensors  # noqa: E402

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
SEQ, VOCAB = 32, 256
LOSS_RTOL, GRAD_RTOL = 1e-5, 1e-4

# Llama-3.2-1B's config.json keys, scaled down (it ties its head).
LLAMA32 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": VOCAB, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None,
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
    "mlp_bias": False, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
    "bos_token_id": 128000, "eos_token_id": 128001,
    "transformers_version": "4.45.0",
}
UNTIED = dict(LLAMA32, tie_word_embeddings=False, num_hidden_layers=3)
# Llama 3.1's rope_scaling, with an original context of 64 so that at head
# dim 16 the frequencies fall in all three of its ranges (kept,
# interpolated, divided by the factor) and it changes the loss at seq 32.
LLAMA31 = dict(UNTIED, num_hidden_layers=2, rope_scaling={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 64})

# Qwen3-0.6B's config.json keys, scaled down: a head_dim of its own (24 x 4
# heads = 96, not hidden_size 64), grouped-query attention, q/k norms, tied.
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
    "vocab_size": VOCAB, "max_position_embeddings": 40960,
    "max_window_layers": 28, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "rope_scaling": None, "hidden_act": "silu", "attention_bias": False,
    "attention_dropout": 0.0, "sliding_window": None,
    "use_sliding_window": False, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True,
    "bos_token_id": 151643, "eos_token_id": 151645,
    "transformers_version": "4.51.0",
}

# Qwen3-30B-A3B's config.json keys, scaled down: 4 experts of 32, top-2
# renormalized, heads of 24 (4 x 24 = 96, hidden 64), and layer 1 dense
# (mlp_only_layers) with intermediate_size 80.
QWEN3_MOE = dict(
    QWEN3, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
    num_hidden_layers=3, intermediate_size=80, moe_intermediate_size=32,
    num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[1], output_router_logits=False,
    router_aux_loss_coef=0.001, tie_word_embeddings=False,
    max_window_layers=48)

# GPT-2's config.json keys (dropout set to 0: Piper trains without it), at
# a smaller size; the position table is longer than the sequence.
GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
    "vocab_size": VOCAB, "n_positions": 64, "n_embd": 64, "n_layer": 2,
    "n_head": 4, "n_inner": None, "activation_function": "gelu_new",
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
    "summary_type": "cls_index", "summary_use_proj": True,
    "summary_activation": None, "summary_proj_to_labels": True,
    "summary_first_dropout": 0.1, "scale_attn_weights": True,
    "use_cache": True, "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False, "bos_token_id": 50256,
    "eos_token_id": 50256, "transformers_version": "4.45.0",
}

failures = []


def run(cmd, expect_ok=True):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if expect_ok and proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout))
    return proc


def check(ok, what):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    if not ok:
        failures.append(what)


def compile_model(work, name, folder, *flags, batch=2):
    model = os.path.join(work, name + ".mlir")
    plans = os.path.join(work, name + "-plans")
    run([PIPERC, "model", "--hf", folder, "--seq", str(SEQ), "--batch", str(batch),
         "-o", model])
    run([PIPERC, "compile", model, "-o", plans] + list(flags))
    return plans


def losses(metrics):
    with open(metrics) as f:
        return [json.loads(line)["loss"] for line in f]


def rel(a, b):
    return abs(a - b) / abs(b)


def grads_match(name, work, folder, config, weights, tokens_all, dtype="F32",
                arch="llama"):
    """One step from `folder`: loss and gradients against the oracle."""
    loss_fn, to_piper = hf.ARCHS[arch]
    plans = compile_model(work, name, folder, "--microbatches", "1",
                          "--no-optimizer", "--clip-grad", "0")
    data = os.path.join(work, name + "-tokens.bin")
    tokens_all.tofile(data)
    grads = os.path.join(work, name + "-grads.safetensors")
    metrics = os.path.join(work, name + "-metrics.jsonl")
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "1", "--load", folder,
         "--data", data, "--metrics", metrics, "--save-grads", grads])
    stored = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype]
    p = {k: v.detach().to(stored).float().clone().requires_grad_()
         for k, v in weights.items()}
    window = torch.tensor(tokens_all.astype(np.int64))
    tokens, targets = window[:SEQ].repeat(2, 1), window[1:].repeat(2, 1)
    loss = loss_fn(p, config, tokens, targets)
    loss.backward()
    piper_loss = losses(metrics)[0]
    check(rel(piper_loss, loss.item()) <= LOSS_RTOL,
          "%s: loss piper %.7f oracle %.7f (rel %.1e)" %
          (name, piper_loss, loss.item(), rel(piper_loss, loss.item())))
    # An expert no token chose has no gradient in torch: zeros in Piper.
    ref = to_piper({k: v.grad if v.grad is not None else torch.zeros_like(v)
                    for k, v in p.items()}, config)
    got = read_safetensors(grads)
    if sorted(ref) != sorted(got):
        check(False, "%s: gradient names differ: %s" % (name, sorted(set(ref) ^ set(got))))
        return
    worst, where = 0.0, ""
    for k in ref:
        err = (got[k] - ref[k]).norm().item() / max(ref[k].norm().item(), 1e-12)
        if err > worst:
            worst, where = err, k
    check(worst <= GRAD_RTOL, "%s: %d gradients, worst relative error %.1e (%s)" %
          (name, len(ref), worst, where))


def train_like_one_device(work, name, folder, weights, data, runs, exported):
    """Three steps from `folder` on one device (four microbatches), then
    under each of `runs` ((suffix, compile flags, ranks)): the same losses;
    and run `exported`'s --save-hf folder holds the model's names with one
    device's parameters."""
    curves = {}
    for suffix, flags, nproc in [("single", ["--microbatches", "4"], 1)] + runs:
        run_name = name + "-" + suffix
        plans = compile_model(work, "train-" + run_name, folder, *flags, batch=1)
        metrics = os.path.join(work, run_name + "-train.jsonl")
        run([PIPER_RUN, plans, "--nproc", str(nproc), "--steps", "3", "--load",
             folder, "--data", data, "--seed", "9", "--metrics", metrics,
             "--save-hf", os.path.join(work, run_name + "-export")])
        curves[suffix] = losses(metrics)
        if suffix != "single":
            worst = max(rel(a, b) for a, b in zip(curves[suffix], curves["single"]))
            check(len(curves[suffix]) == 3 and worst <= LOSS_RTOL,
                  "%s: losses %s vs one device %s (worst rel %.1e)" %
                  (run_name, curves[suffix], curves["single"], worst))
    single, other = (hf.read_folder(os.path.join(work, "%s-%s-export" % (name, n)))
                     for n in ("single", exported))
    worst = max((single[k][0] - other[k][0]).norm().item() / single[k][0].norm().item()
                for k in single) if sorted(single) == sorted(weights) == sorted(other) else 1
    check(worst <= GRAD_RTOL, "%s export after 3 steps, %s against one device: the "
          "Hugging Face names, worst relative difference %.1e" % (name, exported, worst))


def round_trip(work, name, folder):
    """Zero steps from `folder`, then --save-hf: the same tensors, bit for
    bit."""
    plans = compile_model(work, "roundtrip-" + name, folder, "--microbatches", "1")
    back = os.path.join(work, "roundtrip-" + name)
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "0", "--load", folder,
         "--save-hf", back])
    original, again = hf.read_folder(folder), hf.read_folder(back)
    check(sorted(original) == sorted(again) and
          all(original[k][2] == again[k][2] for k in original),
          "%s round trip load -> --save-hf: %d tensors bit-identical" % (name, len(original)))


def expect_error(what, cmd, needle):
    proc = run(cmd, expect_ok=False)
    ok = proc.returncode != 0 and needle in proc.stdout and "Traceback" not in proc.stdout \
        and proc.returncode < 128
    check(ok, "error: %s (exit %d)" % (what, proc.returncode))
    if not ok:
        print("  expected %r in:\n%s" % (needle, proc.stdout))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="piper-hf-", dir=os.environ.get("TEST_TMPDIR"))
    gen = torch.Generator().manual_seed(11)
    rng = np.random.default_rng(5)
    window = rng.integers(0, VOCAB, SEQ + 1).astype("<u2")

    # --- Load: one step, loss and gradients ---
    tied_w = hf.llama_random_weights(LLAMA32, gen)
    tied = os.path.join(work, "llama32-tied")
    # As some exporters do, the tied head is in the file too (ignored).
    hf.write_folder(tied, LLAMA32, dict(tied_w, **{"lm_head.weight": tied_w["model.embed_tokens.weight"]}))
    grads_match("tied", work, tied, LLAMA32, tied_w, window)

    untied_w = hf.llama_random_weights(UNTIED, gen)
    sharded = os.path.join(work, "llama-sharded")
    hf.write_folder(sharded, UNTIED, untied_w, shards=3)
    grads_match("sharded", work, sharded, UNTIED, untied_w, window)

    bf16 = os.path.join(work, "llama-bf16")
    hf.write_folder(bf16, UNTIED, untied_w, dtype="BF16", shards=2)
    grads_match("bf16", work, bf16, UNTIED, untied_w, window, dtype="BF16")
    f16 = os.path.join(work, "llama-f16")
    hf.write_folder(f16, UNTIED, untied_w, dtype="F16")
    grads_match("f16", work, f16, UNTIED, untied_w, window, dtype="F16")

    # Llama 3.1's rope scaling: the oracle's loss with it is not the one
    # without (so the check below can fail), and Piper's matches it, also
    # under context parallelism (the ring's rotary positions).
    scaled_w = hf.llama_random_weights(LLAMA31, gen)
    scaled = os.path.join(work, "llama31")
    hf.write_folder(scaled, LLAMA31, scaled_w)
    grads_match("llama31", work, scaled, LLAMA31, scaled_w, window)
    w = torch.tensor(window.astype(np.int64))
    with torch.no_grad():
        args = (w[:SEQ].repeat(2, 1), w[1:].repeat(2, 1))
        with_scaling = hf.llama_loss(scaled_w, LLAMA31, *args).item()
        without = hf.llama_loss(scaled_w, dict(LLAMA31, rope_scaling=None), *args).item()
    check(rel(with_scaling, without) > 100 * LOSS_RTOL,
          "llama31: rope_scaling changes the oracle's loss (%.7f vs %.7f unscaled)" %
          (with_scaling, without))

    # GPT-2: a position table of n_positions (64) rows for seq 32, tied;
    # also as GPT-2's original files hold it: GPT2Model's names without
    # "transformer." and the attention mask buffers (both ignored by
    # from_pretrained, and by Piper).
    gpt2_w = hf.gpt2_random_weights(GPT2, gen)
    gpt2 = os.path.join(work, "gpt2")
    hf.write_folder(gpt2, GPT2, gpt2_w)
    grads_match("gpt2", work, gpt2, GPT2, gpt2_w, window, arch="gpt2")
    hub = {k[len("transformer."):]: v for k, v in gpt2_w.items()}
    for i in range(GPT2["n_layer"]):
        hub["h.%d.attn.bias" % i] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
    gpt2_hub = os.path.join(work, "gpt2-hub")
    hf.write_folder(gpt2_hub, GPT2, hub)
    grads_match("gpt2-hub-names", work, gpt2_hub, GPT2, gpt2_w, window, arch="gpt2")
    gpt2_untied = dict(GPT2, tie_word_embeddings=False, n_inner=80)
    untied_gpt2_w = hf.gpt2_random_weights(gpt2_untied, gen)
    gpt2_u = os.path.join(work, "gpt2-untied")
    hf.write_folder(gpt2_u, gpt2_untied, untied_gpt2_w, shards=2)
    grads_match("gpt2-untied", work, gpt2_u, gpt2_untied, untied_gpt2_w, window,
                arch="gpt2")

    # Qwen3: the q/k norms' gradients are among those compared; without
    # the norms the oracle's loss differs (so the check can fail).
    qwen3_w = hf.llama_random_weights(QWEN3, gen)
    qwen3 = os.path.join(work, "qwen3")
    hf.write_folder(qwen3, QWEN3, qwen3_w, shards=2)
    grads_match("qwen3", work, qwen3, QWEN3, qwen3_w, window, arch="qwen3")
    with torch.no_grad():
        plain = {k: v for k, v in qwen3_w.items() if "_norm.weight" not in k or "layernorm" in k}
        no_norm = hf.llama_loss(plain, dict(QWEN3, architectures=["LlamaForCausalLM"],
                                            model_type="llama"), *args).item()
        with_norm = hf.llama_loss(qwen3_w, QWEN3, *args).item()
    check(rel(with_norm, no_norm) > 100 * LOSS_RTOL,
          "qwen3: the q/k norms change the oracle's loss (%.7f vs %.7f without)" %
          (with_norm, no_norm))

    # Qwen3-MoE: experts in layers 0 and 2, a dense MLP in layer 1; the
    # router's gradient through the renormalized top-2 weights; and without
    # renormalization (norm_topk_prob false, transformers' default) with
    # every other layer dense (decoder_sparse_step 2).
    moe_w = hf.llama_random_weights(QWEN3_MOE, gen)
    moe = os.path.join(work, "qwen3-moe")
    hf.write_folder(moe, QWEN3_MOE, moe_w, shards=3)
    grads_match("qwen3-moe", work, moe, QWEN3_MOE, moe_w, window, arch="qwen3-moe")
    moe_plain = dict(QWEN3_MOE, norm_topk_prob=False, decoder_sparse_step=2,
                     mlp_only_layers=[])
    moe_plain_w = hf.llama_random_weights(moe_plain, gen)
    moe_plain_dir = os.path.join(work, "qwen3-moe-plain")
    hf.write_folder(moe_plain_dir, moe_plain, moe_plain_w)
    grads_match("qwen3-moe-unnormalized", work, moe_plain_dir, moe_plain, moe_plain_w,
                window, arch="qwen3-moe")
    with torch.no_grad():
        normalized = hf.llama_loss(moe_plain_w, dict(moe_plain, norm_topk_prob=True),
                                   *args).item()
        plain = hf.llama_loss(moe_plain_w, moe_plain, *args).item()
    # (One MoE layer of three: the difference is smaller, still 10x the
    # loss bound.)
    check(rel(normalized, plain) > 10 * LOSS_RTOL,
          "qwen3-moe: norm_topk_prob changes the oracle's loss (%.7f vs %.7f)" %
          (normalized, plain))

    # --- Strategies: three steps from the folder, one device's losses ---
    long_data = os.path.join(work, "long-tokens.bin")
    rng.integers(0, VOCAB, 4096).astype("<u2").tofile(long_data)
    runs = {
        "single": (["--microbatches", "4"], 1),
        "pp2-dp2-zero3": (["--pp", "2", "--dp", "2", "--zero", "3",
                           "--microbatches", "2"], 4),
        "tp2": (["--tp", "2", "--microbatches", "4"], 2),
    }
    curves, saved = {}, {}
    for name, (flags, nproc) in runs.items():
        plans = compile_model(work, "train-" + name, sharded, *flags, batch=1)
        metrics = os.path.join(work, name + "-train.jsonl")
        out = os.path.join(work, name + "-export")
        save = os.path.join(work, name + "-params.safetensors")
        run([PIPER_RUN, plans, "--nproc", str(nproc), "--steps", "3", "--load",
             sharded, "--data", long_data, "--seed", "9", "--metrics", metrics,
             "--save-hf", out, "--hf-shard-size", "200KB",
             "--save", save])
        curves[name], saved[name] = losses(metrics), (out, save)
    for name, flags, nproc in (("llama31-single", ["--microbatches", "2"], 1),
                               ("llama31-cp2", ["--cp", "2", "--microbatches", "2"], 2)):
        plans = compile_model(work, "train-" + name, scaled, *flags, batch=1)
        metrics = os.path.join(work, name + "-train.jsonl")
        run([PIPER_RUN, plans, "--nproc", str(nproc), "--steps", "3", "--load",
             scaled, "--data", long_data, "--seed", "9", "--metrics", metrics])
        curves[name] = losses(metrics)
    # Qwen3 under tensor parallelism (each member normalizes its own heads;
    # the q/k norm weight's gradient is summed over the group), with
    # replicated key/value heads (TP4 over 2), and PP2 x DP2 ZeRO-3.
    # Four sequences a step in each.
    train_like_one_device(work, "qwen3", qwen3, qwen3_w, long_data, [
        ("tp2", ["--tp", "2", "--microbatches", "4"], 2),
        ("tp4", ["--tp", "4", "--microbatches", "4"], 4),
        ("pp2-dp2-zero3", ["--pp", "2", "--dp", "2", "--zero", "3",
                           "--microbatches", "2"], 4),
        ("cp2", ["--cp", "2", "--microbatches", "4"], 2)], "tp2")
    # Qwen3-MoE under expert parallelism (each rank reads only its experts'
    # tensors), tensor parallelism (the attention split, the experts whole
    # on each member) and PP2 x DP2 ZeRO-3 (the dense layer on one stage).
    train_like_one_device(work, "qwen3-moe", moe, moe_w, long_data, [
        ("dp2-ep2", ["--dp", "2", "--ep", "2", "--microbatches", "2"], 2),
        ("tp2", ["--tp", "2", "--microbatches", "4"], 2),
        ("pp2-dp2-zero3", ["--pp", "2", "--dp", "2", "--zero", "3",
                           "--microbatches", "2"], 4)], "dp2-ep2")
    for name, flags, nproc in (("gpt2-single", ["--microbatches", "4"], 1),
                               ("gpt2-pp2-dp2-zero3", ["--pp", "2", "--dp", "2", "--zero",
                                                       "3", "--microbatches", "2"], 4)):
        plans = compile_model(work, "train-" + name, gpt2_u, *flags, batch=1)
        metrics = os.path.join(work, name + "-train.jsonl")
        out = os.path.join(work, name + "-export")
        run([PIPER_RUN, plans, "--nproc", str(nproc), "--steps", "3", "--load",
             gpt2_u, "--data", long_data, "--seed", "9", "--metrics", metrics,
             "--save-hf", out])
        curves[name] = losses(metrics)
    worst = max(rel(a, b) for a, b in zip(curves["gpt2-pp2-dp2-zero3"], curves["gpt2-single"]))
    check(worst <= LOSS_RTOL, "gpt2 under PP2 x DP2 ZeRO-3: losses %s vs one device %s "
          "(worst rel %.1e)" % (curves["gpt2-pp2-dp2-zero3"], curves["gpt2-single"], worst))
    exported = hf.read_folder(os.path.join(work, "gpt2-pp2-dp2-zero3-export"))
    check(sorted(exported) == sorted(untied_gpt2_w),
          "gpt2 export: GPT2LMHeadModel's names (%d tensors)" % len(exported))
    worst = max(rel(a, b) for a, b in zip(curves["llama31-cp2"], curves["llama31-single"]))
    check(worst <= LOSS_RTOL, "llama31 under CP2: losses %s vs one device %s (worst rel %.1e)" %
          (curves["llama31-cp2"], curves["llama31-single"], worst))
    for name in ("pp2-dp2-zero3", "tp2"):
        worst = max(rel(a, b) for a, b in zip(curves[name], curves["single"]))
        check(len(curves[name]) == 3 and worst <= LOSS_RTOL,
              "%s from the folder: losses %s vs one device %s (worst rel %.1e)" %
              (name, curves[name], curves["single"], worst))

    # --- Out: the exported folder is the trained parameters ---
    for name, (out, save) in saved.items():
        exported = {k: v[0] for k, v in hf.read_folder(out).items()}
        with open(os.path.join(out, "config.json")) as f:
            same_config = json.load(f) == UNTIED
        mapped = hf.to_piper(exported, UNTIED)
        params = read_safetensors(save)
        exact = sorted(mapped) == sorted(params) and all(
            torch.equal(mapped[k], params[k]) for k in params)
        check(exact and same_config and sorted(exported) == sorted(untied_w),
              "%s: --save-hf holds the --save parameters exactly, and config.json" % name)
    out = saved["single"][0]
    exported = {k: v[0] for k, v in hf.read_folder(out).items()}
    plans = compile_model(work, "reload", out, "--microbatches", "1", "--no-optimizer")
    data = os.path.join(work, "reload-tokens.bin")
    window.tofile(data)
    metrics = os.path.join(work, "reload.jsonl")
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "1", "--load", out, "--data",
         data, "--metrics", metrics])
    w = torch.tensor(window.astype(np.int64))
    with torch.no_grad():
        oracle = hf.llama_loss(exported, UNTIED, w[:SEQ].repeat(2, 1), w[1:].repeat(2, 1)).item()
    got = losses(metrics)[0]
    check(rel(got, oracle) <= LOSS_RTOL,
          "trained export: oracle loss %.7f, piper %.7f after --load" % (oracle, got))

    # Round trip: load -> save-hf, fp32, bit for bit; bf16 as torch rounds.
    plans = compile_model(work, "roundtrip", sharded, "--microbatches", "1")
    back = os.path.join(work, "roundtrip")
    back16 = os.path.join(work, "roundtrip-bf16")
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "0", "--load", sharded,
         "--save-hf", back])
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "0", "--load", sharded,
         "--save-hf", back16, "--hf-dtype", "bf16"])
    original = hf.read_folder(sharded)
    again = hf.read_folder(back)
    check(sorted(original) == sorted(again) and
          all(original[k][2] == again[k][2] and again[k][1] == "F32" for k in original),
          "round trip load -> --save-hf: %d tensors bit-identical (fp32)" % len(original))
    again16 = hf.read_folder(back16)
    check(all(again16[k][1] == "BF16" and
              torch.equal(again16[k][0], original[k][0].to(torch.bfloat16).float())
              for k in original),
          "--hf-dtype bf16: every tensor rounded as torch's .to(bfloat16)")
    for name, folder in (("qwen3", qwen3), ("qwen3-moe", moe), ("gpt2", gpt2_u)):
        round_trip(work, name, folder)
    check(os.path.exists(os.path.join(back, "model.safetensors")) and
          not os.path.exists(os.path.join(back, "model.safetensors.index.json")),
          "a small export is one model.safetensors")
    with open(os.path.join(saved["single"][0], "model.safetensors.index.json")) as f:
        index = json.load(f)
    check(len(set(index["weight_map"].values())) >= 2 and
          index["metadata"]["total_size"] == sum(v.numel() * 4 for v in exported.values()),
          "--hf-shard-size 200KB: %d shards and an index with the total size" %
          len(set(index["weight_map"].values())))

    # --- Bad input ---
    def broken(name, config=UNTIED, weights=None, shards=3, dtype="F32"):
        folder = os.path.join(work, "bad-" + name)
        hf.write_folder(folder, config, untied_w if weights is None else weights,
                        dtype=dtype, shards=shards)
        return folder

    base = [PIPER_RUN, plans, "--nproc", "1", "--steps", "1", "--load"]
    folder = broken("missing-shard")
    os.remove(os.path.join(folder, "model-00002-of-00003.safetensors"))
    expect_error("missing shard", base + [folder], "model-00002-of-00003.safetensors")
    folder = broken("truncated-shard")
    path = os.path.join(folder, "model-00003-of-00003.safetensors")
    os.truncate(path, os.path.getsize(path) - 10)
    expect_error("truncated shard", base + [folder], "model-00003-of-00003.safetensors")
    w = dict(untied_w)
    w["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    expect_error("tensor of the wrong shape", base + [broken("shape", weights=w)],
                 "tensor 'model.layers.1.self_attn.k_proj.weight' has shape [16, 64], "
                 "the model needs [32, 64]")
    w = {k: v for k, v in untied_w.items() if k != "model.layers.2.mlp.up_proj.weight"}
    expect_error("missing tensor", base + [broken("missing", weights=w)],
                 "missing tensor 'model.layers.2.mlp.up_proj.weight'")
    w = dict(untied_w, **{"model.layers.0.self_attn.q_norm.weight": torch.ones(16)})
    expect_error("extra tensor", base + [broken("extra", weights=w)],
                 "unexpected tensor 'model.layers.0.self_attn.q_norm.weight'")
    folder = broken("index")
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors"
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    expect_error("an index mapping a tensor to a file without it", base + [folder],
                 "maps \"model.norm.weight\" to model-00001-of-00003.safetensors, "
                 "which does not hold it")
    folder = broken("heads", config=dict(UNTIED, num_attention_heads=8, head_dim=8))
    expect_error("config.json contradicting the compiled model", base + [folder],
                 "\"num_attention_heads\": 8 here, 4 in the compiled model")
    folder = broken("sizes", config=dict(UNTIED, hidden_size=128, head_dim=32))
    bad_plans = compile_model(work, "bad-sizes", folder, "--microbatches", "1")
    expect_error("config whose sizes contradict the weights",
                 [PIPER_RUN, bad_plans, "--nproc", "1", "--steps", "1", "--load", folder],
                 "has shape [256, 64], the model needs [256, 128]")
    folder = os.path.join(work, "gpt2-dropout")
    hf.write_folder(folder, dict(GPT2, resid_pdrop=0.1), gpt2_w)
    expect_error("GPT-2 with dropout",
                 [PIPERC, "model", "--hf", folder, "--seq", str(SEQ), "-o",
                  os.path.join(work, "dropout.mlir")],
                 "\"resid_pdrop\" is 0.1")
    folder = broken("yarn", config=dict(UNTIED, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    expect_error("unsupported rope_scaling type",
                 [PIPERC, "model", "--hf", folder, "--seq", str(SEQ), "-o",
                  os.path.join(work, "yarn.mlir")], "rope_scaling")
    preset = os.path.join(work, "preset.mlir")
    preset_plans = os.path.join(work, "preset-plans")
    run([PIPERC, "model", "llama-tiny", "-o", preset])
    run([PIPERC, "compile", preset, "-o", preset_plans])
    expect_error("--load DIR for a model not built from a Hugging Face config",
                 [PIPER_RUN, preset_plans, "--nproc", "1", "--steps", "1", "--load", sharded],
                 "not built from a Hugging Face configuration")
    expect_error("--save-hf for a model not built from a Hugging Face config",
                 [PIPER_RUN, preset_plans, "--nproc", "1", "--steps", "1", "--save-hf",
                  os.path.join(work, "nope")], "not built from a Hugging Face configuration")

    export = [PIPER_RUN, plans, "--nproc", "1", "--steps", "0", "--load", sharded,
              "--save-hf", os.path.join(work, "never")]
    expect_error("--hf-shard-size 0", export + ["--hf-shard-size", "0"],
                 "--hf-shard-size must be a positive size")
    expect_error("--hf-shard-size 5XB", export + ["--hf-shard-size", "5XB"],
                 "--hf-shard-size must be a positive size")
    expect_error("--hf-dtype fp8", export + ["--hf-dtype", "fp8"], "--hf-dtype")

    ckpt = os.path.join(work, "ckpt")
    run([PIPER_RUN, plans, "--nproc", "1", "--steps", "1", "--load", sharded, "--data",
         long_data, "--checkpoint-dir", ckpt, "--checkpoint-every", "1"])
    expect_error("--load of a --checkpoint-dir step directory",
                 base + [os.path.join(ckpt, "step-1")],
                 "a checkpoint directory of --checkpoint-dir, not a Hugging Face folder")

    shutil.rmtree(work, ignore_errors=True)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
