#!/usr/bin/env python3
"""One training step of a model in Piper (piper-run, one CPU rank) against the
same step in PyTorch eager (CPU, float32), on the same machine, in the same
run: same architecture, initial weights, batch, dtype, optimizer (AdamW with
global-norm clipping) and thread count. Prints tokens/s of both and the ratio.

Called by bench/cpu_vs_torch.sh, which builds the tools and fixes the
environment (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_CORETYPE) before
this process imports torch. See docs/performance.md.

The PyTorch models are the ones of test/oracle/torch_oracle_test.py (which
checks that they match Piper's numerics), copied here because that file is a
test driver, not a module. As a guard that both sides compute the same model,
the step-1 losses are compared: Piper trains on a token file of exactly seq+1
tokens, so every sequence of the batch is that window, and PyTorch starts from
Piper's initial weights (piper-run --steps 0 --save).
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

# name -> (piperc model args, compile args, torch model kwargs, warm-up steps,
#          measured steps)
CASES = {
    # GPT-2 small (124M, tied head) at sequence 256, one sequence per step.
    "gpt2-small": dict(
        model=["gpt2-small", "--seq", "256", "--batch", "1"],
        microbatches=1, family="gpt", heads=12, kv_heads=12, tied=True,
        warmup=1, steps=5),
    # The tiny Llama preset (2 layers, hidden 64, GQA 4/2, RoPE, SwiGLU,
    # seq 32): 4 microbatches of 8 sequences per step.
    "llama-tiny": dict(
        model=["llama-tiny", "--batch", "8"],
        microbatches=4, family="llama", heads=4, kv_heads=2, tied=False,
        warmup=3, steps=20),
    # A small GPT (hidden 256, vocab 4096, seq 128, batch 4: 2,048 tokens a
    # step), where elementwise kernels weigh more than in gpt2-small: the
    # shape on which an AVX2-only Zen 3 showed scalar kernels (issue 18).
    "gpt-256": dict(
        model=["gpt", "--layers", "4", "--hidden", "256", "--heads", "4",
               "--vocab", "4096", "--seq", "128", "--batch", "4"],
        microbatches=1, family="gpt", heads=4, kv_heads=4, tied=False,
        warmup=2, steps=10),
}


def safetensors_shapes(path):
    """name -> shape of a safetensors file's tensors (header only)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def kernel_elements(shapes, tokens):
    """Elements one call of each elementwise or row kernel touches, for its
    ns-per-element column: tokens x hidden (norms), tokens x ffn (GELU,
    SwiGLU), tokens x vocab (cross-entropy)."""
    emb = next(v for k, v in shapes.items()
               if k in ("wte", "tok_embeddings.weight"))
    vocab, hidden = emb
    # GPT's c_fc is [hidden, ffn]; Llama's w1/w3 are [hidden, ffn] too.
    ffns = [v[1] for k, v in shapes.items()
            if len(v) == 2 and k.endswith(("c_fc.weight", "w1.weight"))]
    ffn = ffns[0] if ffns else 4 * hidden
    out = {}
    for k in ("layer_norm", "layer_norm_grad_input", "rms_norm",
              "rms_norm_grad_input", "add"):
        out[k] = tokens * hidden
    for k in ("gelu", "gelu_grad", "swiglu", "swiglu_grad"):
        out[k] = tokens * ffn
    for k in ("cross_entropy", "cross_entropy_grad", "cross_entropy_fused"):
        out[k] = tokens * vocab
    return out


def ns_per_element(table, elements):
    """Lines 'kernel  ns/element' from piper-run --profile's table."""
    lines = []
    for m in re.finditer(r"^\s+(\w+)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+$",
                         table, re.M):
        name, count, total_ms = m.group(1), int(m.group(2)), float(m.group(3))
        if name in elements and count:
            lines.append("  %-22s %8.2f ns/element (%d elements a call)" % (
                name, 1e6 * total_ms / count / elements[name], elements[name]))
    return lines


def log(msg):
    print(msg, flush=True)


def run(cmd, env=None):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s%s" % (
            proc.returncode, " ".join(cmd), proc.stdout, proc.stderr))
    return proc.stdout, proc.stderr


def blas_core():
    """OpenBLAS's kernel core in this process, e.g. 'Prescott' or 'SkylakeX'."""
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    return "unknown"


# ---------------------------------------------------------------------------
# PyTorch models, as in test/oracle/torch_oracle_test.py.

def _models():
    """The shared PyTorch model code (imported lazily: torch loads slowly)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "test", "oracle"))
    import torch_models
    return torch_models


def MatmulFlops():
    """A context that counts 2*m*k*n for every aten matrix product dispatched
    inside it (forward and autograd backward). PyTorch 1.13 (Debian's) has no
    torch.utils.flop_counter, so this is the few lines of it we need."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    aten = torch.ops.aten

    class Counter(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            packet = getattr(func, "overloadpacket", None)
            if packet in (aten.mm, aten.addmm):
                a, b = (args[0], args[1]) if packet is aten.mm else (args[1], args[2])
                self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
            elif packet in (aten.bmm, aten.baddbmm):
                a, b = (args[0], args[1]) if packet is aten.bmm else (args[1], args[2])
                self.flops += 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
            return out

    return Counter()


def torch_train(case, training, init_path, window, threads):
    """Times warm-up + measured steps of PyTorch eager; returns
    (step seconds, losses)."""
    import torch
    m = _models()
    read_safetensors, gpt_loss, llama_loss, rope_tables = (
        m.read_safetensors, m.gpt_loss, m.llama_loss, m.rope_tables)
    torch.set_num_threads(threads)
    params = read_safetensors(init_path)
    for t in params.values():
        t.requires_grad_()
    layers = 1 + max(int(m.group(1)) for name in params
                     for m in [re.match(r"(?:h|layers)\.(\d+)\.", name)] if m)
    s = training["seq_len"]
    b = training["microbatch_size"]
    mbs = training["num_microbatches"]
    tokens = window[:s].repeat(b, 1)
    targets = window[1:].repeat(b, 1)
    mask = m.causal_mask(s)
    if case["family"] == "gpt":
        def loss_fn():
            return gpt_loss(params, tokens, targets, layers, case["heads"],
                            case["tied"], mask)
    else:
        h = params["tok_embeddings.weight"].shape[1]
        cos, sin = rope_tables(s, h // case["heads"], 10000.0)

        def loss_fn():
            return llama_loss(params, tokens, targets, layers, case["heads"],
                              case["kv_heads"], mask, cos, sin)
    # As piperc: decoupled weight decay on matrices only.
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": training["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=training["lr"], betas=(training["beta1"], training["beta2"]),
        eps=training["eps"])
    clip = training.get("clip_grad_norm", 0.0)
    all_params = list(params.values())
    # The FLOPs of one training step (forward + backward of every
    # microbatch): the matrix products PyTorch actually dispatches on the
    # same model (elementwise work and the optimizer are left out).
    with MatmulFlops() as counter:
        loss_fn().backward()
    step_flops = counter.flops * mbs
    opt.zero_grad(set_to_none=True)
    times, losses = [], []
    for _ in range(case["warmup"] + case["steps"]):
        start = time.perf_counter()
        total = 0.0
        for _ in range(mbs):
            loss = loss_fn() / mbs
            loss.backward()
            total += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(all_params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(total)
    return times, losses, step_flops


def sgemm_gflops(threads, n=2048, reps=5):
    """The machine's float32 GEMM ceiling as this process sees it: the best
    of `reps` n x n x n products on `threads` threads (torch.mm, the same
    OpenBLAS Piper links)."""
    import torch
    torch.set_num_threads(threads)
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n ** 3 / best / 1e9


# ---------------------------------------------------------------------------

def read_training(plans):
    """The training block of the manifest (text proto), as floats/ints."""
    out = {}
    text = open(os.path.join(plans, "manifest.textproto")).read()
    block = text[text.index("training {"):]
    block = block[:block.index("}")]
    for key, value in re.findall(r"(\w+): ([-0-9.e+]+)", block):
        out[key] = float(value) if re.search(r"[.e]", value) else int(value)
    return out


def piper_train(args, case, plans, work, data, env):
    steps = case["warmup"] + case["steps"]
    metrics = os.path.join(work, "metrics.jsonl")
    cmd = [args.piper_run, plans, "--nproc", "1", "--steps", str(steps),
           "--seed", "1", "--data", data, "--metrics", metrics]
    if args.profile:
        cmd.append("--profile")
    _, err = run(cmd, env)
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    return ([r["step_time_s"] for r in rows], [r["loss"] for r in rows], rows,
            err)


def bench(args, name):
    import numpy as np
    import torch
    case = dict(CASES[name])
    if args.steps:
        case["steps"] = args.steps
    if args.warmup is not None:
        case["warmup"] = args.warmup
    work = tempfile.mkdtemp(prefix="piper-bench-%s-" % name)
    model = os.path.join(work, "model.mlir")
    plans = os.path.join(work, "plans")
    run([args.piperc, "model"] + case["model"] + ["-o", model])
    run([args.piperc, "compile", model, "--microbatches",
         str(case["microbatches"]), "-o", plans])
    training = read_training(plans)
    s, b, mbs = (training["seq_len"], training["microbatch_size"],
                 training["num_microbatches"])
    tokens_per_step = s * b * mbs

    # One window of seq+1 tokens: every sequence Piper samples is this one.
    rng = np.random.default_rng(7)
    window = rng.integers(0, training["vocab_size"], s + 1)
    data = os.path.join(work, "tokens.bin")
    window.astype("<u2" if training["vocab_size"] <= 65536 else "<u4").tofile(data)
    init = os.path.join(work, "init.safetensors")
    env = dict(os.environ)
    run([args.piper_run, plans, "--nproc", "1", "--steps", "0", "--seed", "1",
         "--save", init], env)

    log("== %s: seq %d, microbatch %d x %d microbatches = %d tokens/step, "
        "float32, %d thread(s), OpenBLAS core %s; %d warm-up + %d measured "
        "steps ==" % (name, s, b, mbs, tokens_per_step, args.threads,
                      blas_core(), case["warmup"], case["steps"]))

    p_times, p_losses, p_rows, p_err = piper_train(args, case, plans, work,
                                                   data, env)
    t_times, t_losses, step_flops = torch_train(case, training, init,
                                    torch.tensor(window.astype(np.int64)),
                                    args.threads)
    w = case["warmup"]
    p_med = statistics.median(p_times[w:])
    t_med = statistics.median(t_times[w:])
    p_tps, t_tps = tokens_per_step / p_med, tokens_per_step / t_med
    rel = abs(p_losses[0] - t_losses[0]) / abs(t_losses[0])
    peak = re.search(r"peak memory: .*", p_err)
    log("piper  : median step %8.1f ms  %10.1f tokens/s  (steps: %s ms)" % (
        1e3 * p_med, p_tps, " ".join("%.0f" % (1e3 * t) for t in p_times)))
    log("pytorch: median step %8.1f ms  %10.1f tokens/s  (steps: %s ms)" % (
        1e3 * t_med, t_tps, " ".join("%.0f" % (1e3 * t) for t in t_times)))
    log("ratio piper/pytorch tokens/s: %.2fx" % (p_tps / t_tps))
    p_gflops, t_gflops = step_flops / p_med / 1e9, step_flops / t_med / 1e9
    log("achieved: piper %.1f GFLOP/s, pytorch %.1f GFLOP/s (%.2f GFLOP per "
        "step of matrix products); sgemm 2048^3 ceiling %.1f GFLOP/s "
        "-> piper at %.0f%% of it" % (p_gflops, t_gflops, step_flops / 1e9,
                                       args.sgemm, 100.0 * p_gflops / args.sgemm))
    log("step-1 loss: piper %.6f, pytorch %.6f (relative difference %.1e%s)" % (
        p_losses[0], t_losses[0], rel, "" if rel < 1e-3 else " -- MISMATCH"))
    if peak:
        log("piper %s" % peak.group(0))
    log("pytorch process max RSS: %.1f MiB (this helper, all models so far)" %
        (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0))
    if args.profile:
        table = p_err[p_err.find("profile of"):]
        log(table.rstrip())
        log("piper per-element cost of the elementwise and row kernels:")
        for line in ns_per_element(table, kernel_elements(
                safetensors_shapes(init), s * b)):
            log(line)
    log("")
    return dict(model=name, tokens_per_step=tokens_per_step,
                threads=args.threads, blas_core=blas_core(),
                piper_step_s=p_med, torch_step_s=t_med,
                piper_tokens_per_s=p_tps, torch_tokens_per_s=t_tps,
                ratio=p_tps / t_tps, loss_rel_diff=rel,
                step_flops=step_flops, piper_gflops=p_gflops,
                torch_gflops=t_gflops, sgemm_gflops=args.sgemm,
                piper_peak_bytes=p_rows[-1].get("peak_bytes"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--piperc", required=True)
    ap.add_argument("--piper-run", required=True)
    ap.add_argument("--models", default="gpt2-small,llama-tiny,gpt-256",
                    help="comma-separated, from: " + ", ".join(CASES))
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=0,
                    help="measured steps (default: per model)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up steps (default: per model)")
    ap.add_argument("--profile", action="store_true",
                    help="also print piper-run --profile's table")
    ap.add_argument("--json", help="append one JSON object per model here")
    args = ap.parse_args()
    if os.environ.get("OPENBLAS_NUM_THREADS") != str(args.threads):
        sys.exit("set OPENBLAS_NUM_THREADS=%d before starting (torch and "
                 "piper-run must see the same BLAS threads)" % args.threads)
    args.sgemm = sgemm_gflops(args.threads)
    log("sgemm 2048^3 on %d thread(s): %.1f GFLOP/s" % (args.threads, args.sgemm))
    results = []
    for name in args.models.split(","):
        if name not in CASES:
            sys.exit("unknown model '%s' (known: %s)" % (name, ", ".join(CASES)))
        results.append(bench(args, name))
    log("summary (%d thread(s)):" % args.threads)
    for r in results:
        log("  %-11s piper %9.1f tokens/s   pytorch %9.1f tokens/s   "
            "piper/pytorch %.2fx   piper %.1f GFLOP/s (%.0f%% of sgemm)" % (
                r["model"], r["piper_tokens_per_s"], r["torch_tokens_per_s"],
                r["ratio"], r["piper_gflops"],
                100.0 * r["piper_gflops"] / r["sgemm_gflops"]))
    if args.json:
        with open(args.json, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
