#!/usr/bin/env python3
"""The rows of scripts/gpu_perf.sh (docs/gpu.md, "The GPU performance run"):
each subcommand measures one thing on the GPU and appends its rows, as it
learns them, to OUT/perf.md (markdown table rows) and OUT/perf.jsonl (one
JSON object a row: commit, gpu, date, row, case, result, metrics).

  gpu_perf.py [--out DIR] [--work DIR] [--budget-s S] SUBCOMMAND ...
    env                                   P0: GPU, driver, torch, cuDNN, NCCL
    attention torch                       P1: torch SDPA, cuDNN and FLASH
    attention piper BENCH --mode M        P1: Piper's attention_bench
    piper-train PLAN --model M --case C   P3/P4: piper-run --backend cuda
    torch-train PLAN --model M --case C --mode eager|compile
                                          P3/P4: PyTorch on the same GPU
    ratios                                Piper over torch from perf.jsonl
    profile PLAN                          P5: piper-run --profile

Exit status: 0, or 3 when a row records a failure (the row is written), or
anything else when this script itself failed (gpu_perf.sh then writes the
row). torch is imported only inside the subcommands that need it, so a
missing or failing torch never loses a Piper row.

The environment gpu_perf.sh sets: GPU_PERF_COMMIT, GPU_PERF_TREE,
GPU_PERF_DATE, GPU_PERF_GPU (nvidia-smi's name), GPU_PERF_PEAK_TFLOPS (the
peak for MFU; P0 detects it, this variable overrides the detection),
GPU_PERF_PIPER_RUN (piper-run with the bundle's library path). The caller
may set GPU_PERF_PIPER_ATTENTION: piper-run's --attention (auto, cudnn,
simt; default auto) where piper-run has that option.

GPU_PERF_FAKE_TORCH=1 (scripts/gpu_perf_test.sh, no GPU): torch on the CPU
with tiny models and shapes, no backend pinning, no torch.compile;
GPU_PERF_FAKE_TORCH=fail: importing torch fails; =hang: a step that wants
a torch device waits forever.

FLOP conventions (printed in every row): a training step of a decoder is
6 * N_matmul + 6 * L * C * T FLOP per token as llm.c counts it (N_matmul
the weights of every matmul, the LM head included and the embedding lookup
not; the attention term 12 * L * C * T of PaLM's appendix B, halved for
causal attention). GPT-2 small: N_matmul 123.5M, 798 MFLOP/token at
T = 1024. Attention alone as the FlashAttention papers count it: forward
4 * B * Hq * T^2 * D, halved when causal; backward 2.5 times the forward.
"""
import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import struct
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# gpu_vs_torch.py's Piper side: piper() runs piper-run under a wall limit
# (compare_backends.run), read_training() reads a plan's training block.
from gpu_vs_torch import piper, read_training, relative  # noqa: E402
from compare_backends import run  # noqa: E402

FAKE = os.environ.get("GPU_PERF_FAKE_TORCH", "")

# The presets' sizes (compiler/frontend/Presets.cpp); the fake ones are what
# gpu_perf_test.sh's fake piper-run writes.
MODELS = {
    "gpt2-small": dict(family="gpt", layers=12, hidden=768, heads=12,
                       vocab=50257, tied=True),
    "llama-1b": dict(family="llama", layers=16, hidden=2048, heads=32,
                     kv_heads=8, ffn=8192, vocab=32000, theta=10000.0),
}
FAKE_MODELS = {
    "gpt2-small": dict(family="gpt", layers=2, hidden=64, heads=4, vocab=256,
                       tied=True),
    "llama-1b": dict(family="llama", layers=2, hidden=64, heads=4, kv_heads=2,
                     ffn=128, vocab=256, theta=10000.0),
}

# P1's shapes (B, Hq, Hkv, T, D): GPT-2 small; Llama-1B at 2048 and 4096;
# a long sequence with head size 128.
SHAPES = [(8, 12, 12, 1024, 64), (4, 32, 8, 2048, 64), (2, 32, 8, 4096, 64),
          (1, 16, 16, 8192, 128)]
FAKE_SHAPES = [(1, 2, 2, 32, 16), (1, 4, 2, 32, 16), (1, 4, 2, 64, 16),
               (1, 2, 2, 64, 32)]

P1_COLUMNS = 8  # case result fwd-ms fwd-TF fb-ms fb-TF bwd-TF note
TRAIN_COLUMNS = 10


def model_config(name):
    return (FAKE_MODELS if FAKE else MODELS)[name]


def n_matmul(cfg):
    """The weights of every matmul of one forward (the LM head included,
    the embedding lookup not)."""
    c, layers = cfg["hidden"], cfg["layers"]
    if cfg["family"] == "gpt":
        per_layer = c * 3 * c + c * c + c * 4 * c + 4 * c * c
    else:
        hd = c // cfg["heads"]
        per_layer = (c * (cfg["heads"] + 2 * cfg["kv_heads"]) * hd +
                     cfg["heads"] * hd * c + c * 2 * cfg["ffn"] + cfg["ffn"] * c)
    return layers * per_layer + c * cfg["vocab"]


def flop_per_token(cfg, seq):
    return 6 * n_matmul(cfg) + 6 * cfg["layers"] * cfg["hidden"] * seq


def flop_note(cfg, seq):
    return ("%.0f MFLOP/token = 6*N_matmul + 6*L*C*T (N_matmul %.1fM, L %d, "
            "C %d, T %d; llm.c's count)" % (
                flop_per_token(cfg, seq) / 1e6, n_matmul(cfg) / 1e6,
                cfg["layers"], cfg["hidden"], seq))


# ---- GPU facts (no torch) ----

def nvidia_smi():
    for smi in ("nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"):
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,power.limit,clocks.sm,clocks.mem,"
                 "clocks.max.sm,clocks.max.mem,driver_version,memory.total",
                 "--format=csv,noheader,nounits"], capture_output=True,
                text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            f = [x.strip() for x in out.stdout.splitlines()[0].split(",")]
            keys = ["name", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz",
                    "max_sm_clock_mhz", "max_mem_clock_mhz", "driver",
                    "memory_mib"]
            return dict(zip(keys, f))
    return {}


def peak_tflops(name, power):
    """(dense bf16 TFLOP/s, why): H100/H200 SXM 989, H200 NVL and H100 NVL
    835, H100 PCIe 756 (NVIDIA's data sheets, without sparsity)."""
    env = os.environ.get("GPU_PERF_PEAK_TFLOPS")
    if env:
        return float(env), "GPU_PERF_PEAK_TFLOPS"
    n = (name or "").upper()
    try:
        watts = float(power)
    except (TypeError, ValueError):
        watts = None
    if "H200" in n:
        if "NVL" in n or (watts is not None and watts <= 650):
            return 835.0, "H200 NVL (name or power limit <= 650 W)"
        return 989.0, "H200 SXM (power limit %s W)" % power
    if "H100" in n:
        if "NVL" in n:
            return 835.0, "H100 NVL"
        if "PCIE" in n or (watts is not None and watts <= 400):
            return 756.0, "H100 PCIe"
        return 989.0, "H100 SXM"
    if "A100" in n:
        return 312.0, "A100"
    return 989.0, "unknown GPU '%s': H100/H200 SXM's 989 assumed" % name


def peak():
    """The peak for MFU: GPU_PERF_PEAK_TFLOPS (gpu_perf.sh sets it from
    P0), else detected here."""
    smi = {} if os.environ.get("GPU_PERF_PEAK_TFLOPS") else nvidia_smi()
    return peak_tflops(smi.get("name"), smi.get("power_limit_w"))[0]


# ---- output ----

def cell(x):
    return str(x).replace("\n", " ").replace("|", "/")


class Out:
    def __init__(self, args):
        self.dir = args.out
        self.failed = False

    def row(self, row, case, result, cells, ncols, **metrics):
        """Appends one row: markdown `cells` (case and result first,
        padded to ncols) and the JSON object with `metrics`."""
        if not result.startswith(("ok", "n/a", "skipped")):
            self.failed = True
        rec = {"commit": os.environ.get("GPU_PERF_COMMIT", "unknown"),
               "tree": os.environ.get("GPU_PERF_TREE", "unknown"),
               "date": os.environ.get("GPU_PERF_DATE", ""),
               "gpu": os.environ.get("GPU_PERF_GPU", "unknown"),
               "row": row, "case": case, "result": result}
        rec.update(metrics)
        md_cells = [case, result] + list(cells)
        md_cells += [""] * (ncols - len(md_cells))
        md = "| " + " | ".join(cell(c) for c in md_cells) + " |"
        print(md, flush=True)
        if self.dir:
            with open(os.path.join(self.dir, "perf.md"), "a") as f:
                f.write(md + "\n")
            with open(os.path.join(self.dir, "perf.jsonl"), "a") as f:
                f.write(json.dumps(rec, allow_nan=False, default=str) + "\n")

    def md(self, line):
        print(line, flush=True)
        if self.dir:
            with open(os.path.join(self.dir, "perf.md"), "a") as f:
                f.write(line + "\n")


def first_line(e):
    return (str(e).strip().splitlines() or [repr(e)])[0][:160]


def import_torch():
    if FAKE == "fail":
        raise ImportError("GPU_PERF_FAKE_TORCH=fail: torch made to fail")
    import torch
    return torch


def device(torch):
    if FAKE == "hang":  # a torch step only gpu_perf.sh's limit stops
        time.sleep(10**6)
    if FAKE:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    return torch.device("cuda")


def sync(torch):
    if not FAKE:
        torch.cuda.synchronize()


# ---- P0 ----

def cmd_env(args, out):
    smi = nvidia_smi()
    name = smi.get("name", "")
    p, why = peak_tflops(name, smi.get("power_limit_w"))
    facts = dict(smi)
    facts["peak_bf16_tflops"] = p
    facts["peak_reason"] = why
    if args.work:
        with open(os.path.join(args.work, "gpu_name"), "w") as f:
            f.write(name or "unknown")
        with open(os.path.join(args.work, "peak_tflops"), "w") as f:
            f.write("%g" % p)
    result = "ok" if smi else "FAIL: nvidia-smi printed nothing"
    try:
        torch = import_torch()
        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        facts["cudnn"] = torch.backends.cudnn.version()  # loads libcudnn
        try:
            v = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
        except Exception as e:  # a CPU build has no NCCL
            facts["nccl"] = "n/a (%s)" % first_line(e)
        facts["libcudnn"] = cudnn_path()
    except Exception as e:
        traceback.print_exc()
        result = "FAIL: torch: %s" % first_line(e)
    out.row("P0", "environment", result, [], 2, **facts)
    labels = [("name", "GPU"), ("power_limit_w", "power limit (W)"),
              ("sm_clock_mhz", "SM clock now / max (MHz)"),
              ("mem_clock_mhz", "memory clock now / max (MHz)"),
              ("driver", "driver"), ("memory_mib", "memory (MiB)"),
              ("torch", "torch (CUDA)"), ("cudnn", "cuDNN (torch)"),
              ("nccl", "NCCL (torch)"), ("libcudnn", "libcudnn.so.9 torch loads"),
              ("peak_bf16_tflops", "peak dense bf16 TFLOP/s for MFU")]
    for key, label in labels:
        value = facts.get(key, "-")
        if key == "sm_clock_mhz":
            value = "%s / %s" % (value, facts.get("max_sm_clock_mhz", "-"))
        elif key == "mem_clock_mhz":
            value = "%s / %s" % (value, facts.get("max_mem_clock_mhz", "-"))
        elif key == "torch" and "torch" in facts:
            value = "%s (CUDA %s)" % (value, facts.get("torch_cuda"))
        elif key == "peak_bf16_tflops":
            value = "%g (%s)" % (value, why)
        out.md("| %s | %s |" % (cell(label), cell(value)))
    return 3 if out.failed else 0


def cudnn_path():
    """The libcudnn.so.9 this process mapped, else the one in torch's
    nvidia/cudnn/lib, else 'not found'."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libcudnn.so" in os.path.basename(path):
                    return path + " (mapped)"
    except OSError:
        pass
    try:
        import nvidia.cudnn as c
        for d in getattr(c, "__path__", []):
            p = os.path.join(d, "lib", "libcudnn.so.9")
            if os.path.exists(p):
                return p + " (torch's nvidia/cudnn/lib; not mapped)"
    except Exception:
        pass
    return "not found"


# ---- P1 ----

def attention_flops(shape):
    b, hq, _, t, d = shape
    fwd = 4.0 * b * hq * t * t * d / 2  # causal: half
    return fwd, 2.5 * fwd


def shape_text(shape):
    return "(%s)" % ",".join(map(str, shape))


def attention_row(out, shape, impl, fwd_ms, fb_ms, note, **extra):
    fwd, bwd = attention_flops(shape)
    bwd_ms = fb_ms - fwd_ms
    tf = lambda flop, ms: flop / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
    m = dict(shape=list(shape), impl=impl, fwd_ms=round(fwd_ms, 4),
             fwd_bwd_ms=round(fb_ms, 4), fwd_tflops=round(tf(fwd, fwd_ms), 2),
             fwd_bwd_tflops=round(tf(fwd + bwd, fb_ms), 2),
             bwd_tflops=round(tf(bwd, bwd_ms), 2), fwd_gflop=fwd / 1e9,
             flop_count="fwd 4*B*Hq*T^2*D/2 (causal), bwd 2.5x fwd")
    m.update(extra)
    out.row("P1", "%s %s" % (shape_text(shape), impl), "ok",
            ["%.3f" % fwd_ms, "%.1f" % m["fwd_tflops"], "%.3f" % fb_ms,
             "%.1f" % m["fwd_bwd_tflops"], "%.1f" % m["bwd_tflops"], note],
            P1_COLUMNS, **m)


def make_attention(torch, dev):
    """attn(q, k, v): causal attention on [B, H, T, D]; k and v may have
    fewer heads (GQA). SDPA with enable_gqa where this torch has it, else
    with k/v repeated, else (old torch, the fake test) the plain math."""
    import torch.nn.functional as F
    if not hasattr(F, "scaled_dot_product_attention"):
        def manual(q, k, v):
            g = q.shape[1] // k.shape[1]
            if g > 1:
                k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            t = q.shape[-2]
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool,
                                         device=q.device), diagonal=1)
            s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
            return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v
        return manual, "plain math (this torch has no SDPA)"
    x = torch.zeros(1, 2, 4, 8, device=dev)
    y = torch.zeros(1, 1, 4, 8, device=dev)
    try:
        F.scaled_dot_product_attention(x, y, y, is_causal=True, enable_gqa=True)
        gqa = True
    except (TypeError, RuntimeError):
        gqa = False

    def attn(q, k, v):
        if k.shape[1] != q.shape[1]:
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      enable_gqa=True)
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn, "SDPA is_causal" + (", enable_gqa" if gqa else
                                     ", k/v repeated (no enable_gqa)")


def timer(torch, warmup, iters):
    """time_ms(fn): the mean of `iters` calls after `warmup`, by CUDA
    events (perf_counter on the fake CPU)."""
    def time_ms(fn):
        for _ in range(warmup):
            fn()
        if FAKE:
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - start) * 1e3 / iters
        torch.cuda.synchronize()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / iters
    return time_ms


def measure_attention(torch, time_ms, attn, q, k, v, dout):
    """(forward ms, forward + backward ms, whether two backwards gave the
    same bits) of attn on q, k, v."""
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def fwd():
        with torch.no_grad():
            attn(q, k, v)

    def fwd_bwd():
        o = attn(qg, kg, vg)
        return torch.autograd.grad(o, (qg, kg, vg), dout)

    fwd_ms = time_ms(fwd)
    fb_ms = time_ms(fwd_bwd)
    g1, g2 = fwd_bwd(), fwd_bwd()
    return fwd_ms, fb_ms, all(torch.equal(x, y) for x, y in zip(g1, g2))


def cmd_attention_torch(args, out):
    start = time.monotonic()
    shapes = FAKE_SHAPES if FAKE else SHAPES
    backends = ["cudnn", "flash"]
    try:
        torch = import_torch()
        dev = device(torch)
        if FAKE:
            pin = {b: contextlib.nullcontext for b in backends}
            how = "fake: CPU, no backend pinning"
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            pin = {"cudnn": lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION),
                   "flash": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)}
            how = "sdpa_kernel"
        attn, attn_note = make_attention(torch, dev)
    except Exception as e:
        traceback.print_exc()
        for shape in shapes:
            for b in backends:
                out.row("P1", "%s torch-%s" % (shape_text(shape), b),
                        "FAIL: pytorch: %s" % first_line(e), [], P1_COLUMNS)
        return 3
    warmup, iters = (1, 2) if FAKE else (5, 20)
    time_ms = timer(torch, warmup, iters)
    dtype = torch.float32 if FAKE else torch.bfloat16
    for shape in shapes:
        b, hq, hkv, t, d = shape
        for backend in backends:
            case = "%s torch-%s" % (shape_text(shape), backend)
            if args.budget_s and time.monotonic() - start > args.budget_s - 5:
                out.row("P1", case, "skipped: step limit", [], P1_COLUMNS)
                continue
            try:
                g = torch.Generator(device=dev).manual_seed(1)
                q = torch.randn(b, hq, t, d, device=dev, dtype=dtype, generator=g)
                k = torch.randn(b, hkv, t, d, device=dev, dtype=dtype, generator=g)
                v = torch.randn(b, hkv, t, d, device=dev, dtype=dtype, generator=g)
                dout = torch.randn(b, hq, t, d, device=dev, dtype=dtype,
                                   generator=g)
                note = attn_note
                try:
                    with pin[backend]():
                        fwd_ms, fb_ms, det = measure_attention(
                            torch, time_ms, attn, q, k, v, dout)
                except RuntimeError as e:
                    if hkv == hq:
                        raise
                    # This backend refuses GQA: k and v repeated to Hq
                    # heads beforehand (not timed); the FLOPs stay Hq's.
                    print("%s with GQA: %s; again with k/v repeated" % (
                        case, first_line(e)), flush=True)
                    k, v = (x.repeat_interleave(hq // hkv, 1) for x in (k, v))
                    with pin[backend]():
                        fwd_ms, fb_ms, det = measure_attention(
                            torch, time_ms, attn, q, k, v, dout)
                    note = "k/v repeated to Hq heads (refused GQA: %s)" % (
                        first_line(e)[:60])
                attention_row(out, shape, "torch-" + backend, fwd_ms, fb_ms,
                              "%s; %s; bwd twice: %s" % (
                                  how, note,
                                  "same bits" if det else "bits differ"),
                              warmup=warmup, iters=iters,
                              bwd_deterministic=det, torch=torch.__version__)
            except Exception as e:
                traceback.print_exc()
                out.row("P1", case, "FAIL: %s" % first_line(e), [],
                        P1_COLUMNS)
            finally:
                if not FAKE:
                    torch.cuda.empty_cache()
    return 3 if out.failed else 0


# attention_bench, the CLI gpu_perf.sh expects of Piper's attention
# microbenchmark (a bundle binary; not built yet when this was written):
#   attention_bench --shape B,Hq,Hkv,T,D --mode simt|cudnn --iters N
# runs Piper's causal bf16 attention kernels (`attention`, then
# `attention_grad` on the GPU, random operands, warmed up itself, at least
# one call each) N timed times with CUDA events, and prints one JSON line
#   {"fwd_ms": <mean forward ms>, "bwd_ms": <mean backward ms>}
# (bwd_ms the backward kernel alone); exit status non-zero when it cannot
# run (e.g. --mode cudnn without cuDNN), with the reason on stderr.
def cmd_attention_piper(args, out):
    start = time.monotonic()
    shapes = FAKE_SHAPES if FAKE else SHAPES
    # SIMT attention runs at ~1 TFLOP/s: (1,16,16,8192,128) takes ~1 s a
    # call, so it gets fewer iterations.
    iters = args.iters or (3 if args.mode == "simt" else 20)
    for shape in shapes:
        case = "%s piper-%s" % (shape_text(shape), args.mode)
        left = args.budget_s - (time.monotonic() - start) if args.budget_s else 600
        if left < 5:
            out.row("P1", case, "skipped: step limit", [], P1_COLUMNS)
            continue
        cmd = [args.bench, "--shape", ",".join(map(str, shape)), "--mode",
               args.mode, "--iters", str(iters)]
        rc, text = run(cmd, int(left))
        try:
            if rc != 0:
                raise RuntimeError("exit %s: %s" % (rc, text.strip()[-200:]))
            line = [l for l in text.splitlines() if l.strip().startswith("{")][-1]
            r = json.loads(line)
            fwd_ms, bwd_ms = float(r["fwd_ms"]), float(r["bwd_ms"])
        except Exception as e:
            print(text)
            out.row("P1", case, "FAIL: attention_bench: %s" % first_line(e),
                    [], P1_COLUMNS)
            continue
        attention_row(out, shape, "piper-" + args.mode, fwd_ms, fwd_ms + bwd_ms,
                      "attention_bench, %d iterations" % iters, iters=iters)
    return 3 if out.failed else 0


# ---- P3, P4: training steps ----

def make_window(vocab, s):
    """gpu_vs_torch.py's batch: one window of S + 1 tokens, every sequence
    the same (the window always starts at 0: docs/data.md section 2)."""
    rng = random.Random(7)
    return [rng.randrange(vocab) for _ in range(s + 1)]


def piper_help(piper_run):
    rc, text = run([piper_run, "--help"], 30)
    return text if rc == 0 else ""


def attention_choice(help_text):
    """(piper-run arguments, what the row records): --attention
    $GPU_PERF_PIPER_ATTENTION (default auto) where piper-run has the
    option."""
    if not re.search(r"^\s*--attention\b", help_text, re.M):
        return [], "n/a (this piper-run has no --attention)"
    mode = os.environ.get("GPU_PERF_PIPER_ATTENTION") or "auto"
    return ["--attention", mode], mode


def attention_said(text):
    """What piper-run printed about its attention path (the cuDNN library
    and engines, or the fall-back to SIMT): up to two lines."""
    lines = [l.strip() for l in text.splitlines()
             if re.search(r"cudnn|attention", l, re.I) and
             not l.startswith(("step ", "summary:", "  "))]
    return "; ".join(l[:200] for l in lines[:2])


def train_row(out, row, case, result, tps=None, step_s=None, cfg=None, seq=None,
              peak_bytes=None, peak_note="", steps="", loss=None, note="",
              **extra):
    cells, m = [], {}
    if tps:
        pk = peak()
        fpt = flop_per_token(cfg, seq)
        mfu = fpt * tps / (pk * 1e12)
        m = dict(tokens_per_s=round(tps, 1), step_ms=round(step_s * 1e3, 3),
                 mfu=float("%.4g" % mfu), flop_per_token=fpt, n_matmul=n_matmul(cfg),
                 peak_tflops=pk, flop_count=flop_note(cfg, seq))
        cells = ["%.0f" % tps, "%.1f" % (step_s * 1e3), "%.1f%%" % (100 * mfu),
                 "%.0f MFLOP (N_matmul %.1fM)" % (fpt / 1e6, n_matmul(cfg) / 1e6)]
    else:
        cells = ["", "", "", ""]
    if peak_bytes:
        m["peak_bytes"] = peak_bytes
        cells.append("%.2f GiB%s" % (peak_bytes / 2**30, peak_note))
    else:
        cells.append("n/a" if tps else "")
    cells.append(steps)
    cells.append("" if loss is None else "%.4f" % loss)
    if loss is not None:
        m["loss_step1"] = loss
    cells.append(note)
    m.update(extra)
    out.row(row, case, result, cells, TRAIN_COLUMNS, **m)


def cmd_piper_train(args, out):
    start = time.monotonic()
    cfg = model_config(args.model)
    piper_run = os.environ.get("GPU_PERF_PIPER_RUN", "piper-run")
    try:
        training = read_training(args.plan)
    except (OSError, ValueError) as e:
        train_row(out, args.row, args.case, "FAIL: plan: %s" % first_line(e))
        return 3
    s, b, mbs = (training["seq_len"], training["microbatch_size"],
                 training["num_microbatches"])
    tokens = s * b * mbs
    limits = ["--timeout-s", str(args.timeout_s)]

    def wall():
        return max(5, int(args.budget_s - (time.monotonic() - start) - 3)
                   if args.budget_s else 600)
    extra_args, notes = [], []
    if args.same_weights:
        # The batch and initial weights torch-train reads (as gpu_vs_torch).
        data = os.path.join(args.work, "%s-tokens.bin" % args.model)
        window = make_window(training["vocab_size"], s)
        with open(data, "wb") as f:
            f.write(struct.pack("<%dH" % len(window), *window))
        init = os.path.join(args.work, "%s-init.safetensors" % args.model)
        err = piper("--save (the initial weights)",
                    [piper_run, args.plan, "--nproc", "1", "--steps", "0",
                     "--seed", "1", "--save", init] + limits, wall())
        if err:
            notes.append("no init file for torch (%s)" % err)
            if os.path.exists(init):
                os.remove(init)
        extra_args = ["--data", data]
    metrics = os.path.join(args.work, "%s-metrics.jsonl" %
                           re.sub(r"[^A-Za-z0-9_.-]", "_", args.case))
    total = args.warmup + args.steps
    attn_args, attention = attention_choice(piper_help(piper_run))
    # piper() of gpu_vs_torch, but the output is kept: what piper-run says
    # about its attention path goes into the row.
    cmd = ([piper_run, args.plan, "--nproc", "1", "--steps", str(total),
            "--seed", "1", "--metrics", metrics, "--backend", "cuda"] +
           attn_args + extra_args + limits + args.run_arg)
    rc, text = run(cmd, wall())
    if rc != 0:
        print("%s\n%s" % (" ".join(cmd), text[-6000:]), flush=True)
        err = ("piper-run --backend cuda timed out" if rc is None else
               "piper-run --backend cuda failed (%d)" % rc)
        train_row(out, args.row, args.case, "FAIL: %s: %s" % (
            err, (text.strip().splitlines() or [""])[-1][:200]),
            note="; ".join(notes), attention=attention)
        return 3
    notes.insert(0, "attention: %s%s" % (attention, (
        " (%s)" % attention_said(text)) if attention_said(text) else ""))
    try:
        with open(metrics) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        times = [float(r["step_time_s"]) for r in rows][args.warmup:]
        loss = float(rows[0]["loss"])
        peak_bytes = int(rows[-1].get("peak_bytes") or 0)
        if len(rows) != total or not times:
            raise ValueError("%d steps in --metrics, not %d" % (len(rows), total))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        train_row(out, args.row, args.case, "FAIL: unreadable --metrics (%s)"
                  % first_line(e))
        return 3
    step_s = statistics.median(times)
    if args.same_weights:
        with open(os.path.join(args.work, "%s-piper.json" % args.model), "w") as f:
            json.dump({"loss_step1": loss}, f)
    notes.append("median of %d timed steps" % len(times))
    if args.note:
        notes.append(args.note)
    train_row(out, args.row, args.case, "ok", tokens / step_s, step_s, cfg, s,
              peak_bytes, " (arena: state + activations; stream scratch and "
              "cuBLASLt workspace not counted)", "%d + %d" % (args.warmup,
                                                                len(times)),
              loss, "; ".join(notes), tokens_per_step=tokens,
              warmup=args.warmup, timed_steps=len(times), impl="piper",
              attention=attention, attention_said=attention_said(text))
    return 0


def gpt_sdpa_loss(m, attn, cfg):
    import torch.nn.functional as F
    layers, heads = cfg["layers"], cfg["heads"]

    def loss_fn(p, tokens, targets):
        b, s = tokens.shape
        x = p["wte"][tokens] + p["wpe"][:s]
        h = x.shape[-1]
        hd = h // heads
        for i in range(layers):
            pre = "h.%d." % i
            y = m.layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
            qkv = y @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
            q, k, v = (t.reshape(b, s, heads, hd).transpose(1, 2)
                       for t in qkv.split(h, dim=-1))
            a = attn(q, k, v).transpose(1, 2).reshape(b, s, h)
            x = x + a @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
            y = m.layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
            y = F.gelu(y @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"],
                       approximate="tanh")
            x = x + y @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
        x = m.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
        logits = x @ p["wte"].t()
        return F.cross_entropy(logits.reshape(b * s, -1).float(),
                               targets.reshape(-1))
    return loss_fn


def llama_sdpa_loss(m, attn, cfg, cos, sin):
    import torch.nn.functional as F
    layers, heads, kv = cfg["layers"], cfg["heads"], cfg["kv_heads"]

    def loss_fn(p, tokens, targets):
        b, s = tokens.shape
        x = p["tok_embeddings.weight"][tokens]
        h = x.shape[-1]
        hd = h // heads
        for i in range(layers):
            pre = "layers.%d." % i
            y = m.rms_norm(x, p[pre + "attention_norm.weight"])
            qkv = y @ p[pre + "attention.wqkv.weight"]
            q = qkv[..., :heads * hd].reshape(b, s, heads, hd).transpose(1, 2)
            k = qkv[..., heads * hd:(heads + kv) * hd]
            v = qkv[..., (heads + kv) * hd:]
            k = k.reshape(b, s, kv, hd).transpose(1, 2)
            v = v.reshape(b, s, kv, hd).transpose(1, 2)
            c, sn = cos.to(q.dtype), sin.to(q.dtype)
            q, k = m.rope(q, c, sn), m.rope(k, c, sn)
            a = attn(q, k, v).transpose(1, 2).reshape(b, s, h)
            x = x + a @ p[pre + "attention.wo.weight"]
            y = m.rms_norm(x, p[pre + "ffn_norm.weight"])
            gu = y @ p[pre + "feed_forward.w13.weight"]
            f = gu.shape[-1] // 2
            x = x + (F.silu(gu[..., :f]) * gu[..., f:]) @ p[pre + "feed_forward.w2.weight"]
        x = m.rms_norm(x, p["norm.weight"])
        logits = x @ p["output.weight"]
        return F.cross_entropy(logits.reshape(b * s, -1).float(),
                               targets.reshape(-1))
    return loss_fn


def random_params(torch, cfg, seq, dev):
    """Piper's names and layouts, std 0.02 (norm weights 1, biases 0)."""
    g = torch.Generator(device=dev).manual_seed(1)
    c, v = cfg["hidden"], cfg["vocab"]
    shapes = {}
    if cfg["family"] == "gpt":
        shapes["wte"], shapes["wpe"] = (v, c), (seq, c)
        for i in range(cfg["layers"]):
            pre = "h.%d." % i
            for n, sh in [("ln_1.weight", (c,)), ("ln_1.bias", (c,)),
                          ("attn.c_attn.weight", (c, 3 * c)),
                          ("attn.c_attn.bias", (3 * c,)),
                          ("attn.c_proj.weight", (c, c)), ("attn.c_proj.bias", (c,)),
                          ("ln_2.weight", (c,)), ("ln_2.bias", (c,)),
                          ("mlp.c_fc.weight", (c, 4 * c)), ("mlp.c_fc.bias", (4 * c,)),
                          ("mlp.c_proj.weight", (4 * c, c)),
                          ("mlp.c_proj.bias", (c,))]:
                shapes[pre + n] = sh
        shapes["ln_f.weight"] = shapes["ln_f.bias"] = (c,)
    else:
        hd, f = c // cfg["heads"], cfg["ffn"]
        shapes["tok_embeddings.weight"] = (v, c)
        for i in range(cfg["layers"]):
            pre = "layers.%d." % i
            shapes[pre + "attention_norm.weight"] = (c,)
            shapes[pre + "attention.wqkv.weight"] = (
                c, (cfg["heads"] + 2 * cfg["kv_heads"]) * hd)
            shapes[pre + "attention.wo.weight"] = (cfg["heads"] * hd, c)
            shapes[pre + "ffn_norm.weight"] = (c,)
            shapes[pre + "feed_forward.w13.weight"] = (c, 2 * f)
            shapes[pre + "feed_forward.w2.weight"] = (f, c)
        shapes["norm.weight"] = (c,)
        shapes["output.weight"] = (c, v)
    params = {}
    for name, sh in shapes.items():
        if len(sh) == 1:
            t = (torch.zeros if name.endswith("bias") else torch.ones)(sh, device=dev)
        else:
            t = torch.randn(sh, device=dev, generator=g) * 0.02
        params[name] = t.requires_grad_()
    return params


def cmd_torch_train(args, out):
    cfg = model_config(args.model)
    impl = "torch-" + args.mode
    try:
        training = read_training(args.plan)
    except (OSError, ValueError) as e:
        train_row(out, args.row, args.case, "FAIL: plan: %s" % first_line(e))
        return 3
    s, b, mbs = (training["seq_len"], training["microbatch_size"],
                 training["num_microbatches"])
    tokens_per_step = s * b * mbs
    notes = []
    try:
        torch = import_torch()
        dev = device(torch)
        for path in (HERE, os.path.join(HERE, "..", "test", "oracle")):
            sys.path.insert(0, path)
        import torch_models as m
        attn, attn_note = make_attention(torch, dev)
        notes.append(attn_note)
        init = os.path.join(args.work, "%s-init.safetensors" % args.model)
        if cfg["family"] == "gpt" and os.path.exists(init):
            params = {k: v.to(dev).requires_grad_() for k, v in
                      m.read_safetensors(init).items()}
            if tuple(params["wte"].shape) != (cfg["vocab"], cfg["hidden"]):
                raise ValueError("Piper's init file has wte %s, not (%d, %d)" % (
                    tuple(params["wte"].shape), cfg["vocab"], cfg["hidden"]))
            notes.append("Piper's initial weights and batch")
        else:
            params = random_params(torch, cfg, s, dev)
            notes.append("weights: torch's own random init")
        if cfg["family"] == "gpt":
            window = make_window(training["vocab_size"], s)
            w = torch.tensor(window, dtype=torch.long, device=dev)
            tokens, targets = w[:s].repeat(b, 1), w[1:].repeat(b, 1)
            loss_fn = gpt_sdpa_loss(m, attn, cfg)
        else:
            g = torch.Generator(device=dev).manual_seed(2)
            w = torch.randint(cfg["vocab"], (b, s + 1), device=dev, generator=g)
            tokens, targets = w[:, :s].contiguous(), w[:, 1:].contiguous()
            cos, sin = m.rope_tables(s, cfg["hidden"] // cfg["heads"], cfg["theta"])
            loss_fn = llama_sdpa_loss(m, attn, cfg, cos.to(dev), sin.to(dev))
        if args.mode == "compile":
            if FAKE or not hasattr(torch, "compile"):
                notes.append("fake: not compiled")
            else:
                loss_fn = torch.compile(loss_fn)
                notes.append("torch.compile (default mode)")
        decay = [t for t in params.values() if t.dim() >= 2]
        no_decay = [t for t in params.values() if t.dim() < 2]
        opt_args = dict(lr=training["lr"], betas=(training["beta1"],
                                                  training["beta2"]),
                        eps=training["eps"])
        if not FAKE:
            opt_args["fused"] = True
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": training["weight_decay"]},
             {"params": no_decay, "weight_decay": 0.0}], **opt_args)
        clip = training.get("clip_grad_norm", 0.0)
        amp = (contextlib.nullcontext if FAKE else
               lambda: torch.autocast("cuda", dtype=torch.bfloat16))
        if not FAKE:
            torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for _ in range(args.warmup + args.steps):
            sync(torch)
            t0 = time.perf_counter()
            total = 0.0
            for _ in range(mbs):
                with amp():
                    loss = loss_fn(params, tokens, targets) / mbs
                loss.backward()
                total += loss.detach()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(torch)
            times.append(time.perf_counter() - t0)
            losses.append(float(total))
        peak_bytes = 0 if FAKE else torch.cuda.max_memory_allocated()
    except Exception as e:  # no torch, no GPU for it, out of memory, compile
        traceback.print_exc()
        train_row(out, args.row, args.case, "FAIL: pytorch: %s" % first_line(e),
                  note="; ".join(notes), impl=impl)
        return 3
    step_s = statistics.median(times[args.warmup:])
    if args.mode == "compile":
        notes.append("first step (compiles) %.1f s" % times[0])
    if cfg["family"] == "gpt":
        try:
            with open(os.path.join(args.work, "%s-piper.json" % args.model)) as f:
                pl = json.load(f)["loss_step1"]
            notes.append("step-1 loss vs Piper's: %.1e relative" %
                         relative(losses[0], pl))
        except (OSError, ValueError, KeyError):
            pass
    notes.append(("fake: fp32 on the CPU, AdamW, clip %g" if FAKE else
                  "bf16 autocast, fp32 weights, fused AdamW, clip %g") % clip)
    train_row(out, args.row, args.case, "ok", tokens_per_step / step_s, step_s,
              cfg, s, peak_bytes, " (max_memory_allocated)",
              "%d + %d" % (args.warmup, args.steps), losses[0], "; ".join(notes),
              tokens_per_step=tokens_per_step, warmup=args.warmup,
              timed_steps=args.steps, impl=impl,
              torch=torch.__version__, first_step_s=round(times[0], 3))
    return 0


# ---- P5 ----

def profile_rows(text):
    """piper-run --profile's rows: (name, calls or '', ms per step, %)."""
    rows, header, on = [], "", False
    for line in text.splitlines():
        if line.startswith("profile of"):
            on, header = True, line
            continue
        if not on or not line.startswith("  "):
            continue
        f = line.split()
        if len(f) < 4 or not all(re.fullmatch(r"[0-9.]+", x) for x in f[-3:]):
            continue
        if re.fullmatch(r"[0-9]+", f[-4]) and len(f) >= 5:
            name, calls = " ".join(f[:-4]), f[-4]
        else:
            name, calls = " ".join(f[:-3]), ""
        rows.append((name, calls, float(f[-2]), float(f[-1])))
    return header, rows


def cmd_profile(args, out):
    piper_run = os.environ.get("GPU_PERF_PIPER_RUN", "piper-run")
    help_text = piper_help(piper_run)
    gpu = bool(re.search(r"--profile\b[^\n]*gpu", help_text))
    attn_args, attention = attention_choice(help_text)
    flag = "--profile=gpu" if gpu else "--profile"
    kind = ("GPU times (--profile=gpu)" if gpu else
            "host issue times, not GPU times (--profile without "
            "CUDA_LAUNCH_BLOCKING: kernels run asynchronously)")
    # The profile's own timing, not the serialized one gpu_check.sh's
    # step 4 measures.
    os.environ.pop("CUDA_LAUNCH_BLOCKING", None)
    cmd = [piper_run, args.plan, "--nproc", "1", "--backend", "cuda", "--steps",
           "3", flag, "--timeout-s", "60"] + attn_args
    rc, text = run(cmd, max(5, int(args.budget_s) - 3) if args.budget_s else 150)
    if args.out:
        with open(os.path.join(args.out, "perf_profile.log"), "w") as f:
            f.write("$ %s\n%s" % (" ".join(cmd), text))
    header, rows = profile_rows(text)
    if rc != 0 or not rows:
        print(text[-4000:])
        out.row("P5", "gpt2-small profile", "FAIL: %s" % (
            "piper-run exit %s" % rc if rc != 0 else "no profile table"), [], 3)
        return 3
    kernels = [r for r in rows if not r[0].startswith("(")]
    totals = [r for r in rows if r[0].startswith("(")]
    top = kernels[:args.top]
    step_ms = next((ms for n, _, ms, _ in totals if n == "(step wall time)"), None)
    rec = dict(kind=kind, flag=flag, header=header, step_ms=step_ms,
               attention=attention,
               top=[dict(name=n, calls=int(c) if c else None, ms_per_step=ms,
                         percent=p) for n, c, ms, p in top],
               totals=[dict(name=n, ms_per_step=ms, percent=p)
                       for n, _, ms, p in totals])
    out.row("P5", "gpt2-small profile", "ok",
            ["%s; %s; attention: %s; the %d costliest rows below" % (
                header, kind, attention, len(top))],
            3, **rec)
    out.md("")
    out.md("| row | calls | ms per step | % of the step |")
    out.md("|---|---|---|---|")
    for name, calls, ms, pct in top + totals:
        out.md("| %s | %s | %.2f | %.1f |" % (cell(name), calls, ms, pct))
    return 0


RATIO_COLUMNS = 4


def cmd_ratios(args, out):
    """Piper's tokens/s over each PyTorch reference measured in this run
    (perf.jsonl's P3 and P4 rows): one row per model and shape."""
    rows = []
    try:
        with open(os.path.join(args.out, "perf.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError, TypeError) as e:
        out.row("ratios", "(all)", "FAIL: perf.jsonl: %s" % first_line(e), [],
                RATIO_COLUMNS)
        return 3
    tps = {r["case"]: r["tokens_per_s"] for r in rows
           if r.get("row") in ("P3", "P4") and r.get("tokens_per_s")}
    for prefix in ("gpt2-small", "llama-1b 2048x4", "llama-1b 4096x2"):
        piper = tps.get(prefix + " piper")
        refs = [tps.get(prefix + " torch eager+SDPA"),
                tps.get(prefix + " torch.compile+SDPA")]
        cells = ["%.2f" % (piper / r) if piper and r else "n/a" for r in refs]
        result = "ok" if piper else "n/a: no Piper row"
        out.row("ratios", prefix, result, cells, RATIO_COLUMNS,
                piper_over_eager=(piper / refs[0] if piper and refs[0] else None),
                piper_over_compile=(piper / refs[1] if piper and refs[1] else None))
    # GPT-2's default step over the same step without one of Piper's own
    # speed-ups (both Piper; in the eager column): the compiler's epilogue
    # fusions (the plan compiled with --no-fused-epilogues) and the
    # runtime's packed bf16 storage (run with --unpack-step-buffers,
    # docs/runtime.md).
    piper = tps.get("gpt2-small piper")
    for flag, key in (("--no-fused-epilogues", "fused_over_unfused"),
                      ("--unpack-step-buffers", "packed_over_unpacked")):
        without = tps.get("gpt2-small piper " + flag)
        ratio = piper / without if piper and without else None
        out.row("ratios", "gpt2-small piper / piper " + flag,
                "ok" if ratio else "n/a: no row of one of them",
                ["%.2f" % ratio if ratio else "n/a", "n/a"], RATIO_COLUMNS,
                **{key: ratio})
    # And the step as a CUDA graph over the step issued as usual.
    graphed = tps.get("gpt2-small piper --step-graph on")
    ratio = graphed / piper if piper and graphed else None
    out.row("ratios", "gpt2-small piper --step-graph on / piper",
            "ok" if ratio else "n/a: no row of one of them",
            ["%.2f" % ratio if ratio else "n/a", "n/a"], RATIO_COLUMNS,
            graphed_over_usual=ratio)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--work", default="/tmp")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="this step's limit: what starts later is skipped")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env")
    a = sub.add_parser("attention")
    a.add_argument("impl", choices=["torch", "piper"])
    a.add_argument("bench", nargs="?")
    a.add_argument("--mode", choices=["simt", "cudnn"], default="simt")
    a.add_argument("--iters", type=int, default=0)
    for name in ("piper-train", "torch-train"):
        t = sub.add_parser(name)
        t.add_argument("plan")
        t.add_argument("--model", choices=sorted(MODELS), required=True)
        t.add_argument("--case", required=True)
        t.add_argument("--row", default="P3")
        t.add_argument("--warmup", type=int, default=3)
        t.add_argument("--steps", type=int, default=10)
        t.add_argument("--note", default="")
        if name == "piper-train":
            t.add_argument("--same-weights", action="store_true",
                           help="write the batch and --save the initial "
                           "weights for torch-train (GPT-2)")
            t.add_argument("--timeout-s", type=int, default=60)
            t.add_argument("--run-arg", action="append", default=[],
                           help="one more piper-run argument (repeatable)")
        else:
            t.add_argument("--mode", choices=["eager", "compile"], default="eager")
    sub.add_parser("ratios")
    p = sub.add_parser("profile")
    p.add_argument("plan")
    p.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    # gpu_perf.sh's limit stops this with a TERM: unwind (finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Out(args)
    if args.cmd == "env":
        return cmd_env(args, out)
    if args.cmd == "attention":
        if args.impl == "torch":
            return cmd_attention_torch(args, out)
        return cmd_attention_piper(args, out)
    if args.cmd == "piper-train":
        return cmd_piper_train(args, out)
    if args.cmd == "torch-train":
        return cmd_torch_train(args, out)
    if args.cmd == "ratios":
        return cmd_ratios(args, out)
    return cmd_profile(args, out)


if __name__ == "__main__":
    sys.exit(main())
