#!/usr/bin/env python3
"""The compiler's fusions and its vocabulary padding (issue 41) change no
bit. Each model (of a vocabulary of 100, which the padding makes 128) and
strategy below is compiled four times: by default, with
--no-fused-classifier, with --no-fused-epilogues and with --pad-vocab 0,
trained for 3 steps from the same initialization, and each run without a
fusion (or without the padding) must give the default run's losses (every
digit of --metrics) and final parameters (the tensors of the --save files
byte for byte, and their headers but for the run's id).

The fusions:
- the fused classifier: by default the loss and its logits gradient are
  computed in one pass in the forward (`cross_entropy_fused`); without it
  `cross_entropy` runs in the forward and `cross_entropy_grad` in the
  backward. Exact by construction: the fused kernel runs the two kernels'
  row loop (runtime/kernels/LossKernels.cpp, runtime/hal/gpu/
  LinearLaunch.inl), and in bf16 the logits the forward rounds are those
  the backward would have unpacked.
- a biased linear's weight and bias gradients in one op
  (`linear_grad_weight_bias`) instead of `linear_grad_weight` and
  `bias_grad`. Exact by construction on the CPU (the fused kernel runs the
  two kernels' computations) and on the emulated GPU (whose GEMMs sum no
  operand: the kernel sums the bias gradient as `bias_grad` does); on CUDA
  the sums come out of cuBLASLt's epilogue, in its order (not run here).
- a weight gradient added to its parameter's accumulator by its
  linear_grad_weight(_bias) kernel (`accumulate`) instead of by an
  `accumulate` kernel after it (also off with --no-fused-epilogues).
  Exact by construction on the CPU and the emulated GPU: the kernel
  computes the product whole, rounds it to bf16 in mixed precision, and
  adds it, as the two kernels did; on CUDA the GEMM adds it itself
  (beta = 1), without that rounding in bf16 (not run here). The norms'
  weight gradients the same way (layer_norm_grad_weight,
  rms_norm_grad_weight), both of layer norm's by one kernel, and the
  embeddings' (embedding_grad, position_add_grad): exact on every backend
  (the sums rounded, then added; rows without a gradient add +0).
- the residual stream's add run by the norm after it (`add_layer_norm`,
  `add_rms_norm`: the sum and the norm of it) and by the norm's input
  gradient before it (`layer_norm_grad_input_add`,
  `rms_norm_grad_input_add`); also off with --no-fused-epilogues. Exact by
  construction on the CPU and the emulated GPU (and on CUDA, whose kernel
  is the emulation's): the kernel rounds the first step's result to bf16
  in mixed precision as the executor rounded it, then runs the second
  kernel's loop.
- gelu run by the linear before it (`linear_gelu`) and gelu_grad by the
  linear_grad_input before it (`linear_grad_input_gelu`; also off with
  --no-fused-epilogues). Exact by construction on the CPU and the emulated
  GPU: the kernel rounds the GEMM's product to bf16 in mixed precision
  and runs gelu's (gelu_grad's) loop on it; on CUDA cuBLASLt's epilogue
  applies GELU to the fp32 product instead (not run here).

- the GEMMs of the GPU backends reading packed bf16 step buffers as they
  are stored (the default) instead of the executor unpacking them to
  fp32 first (piper-run --unpack-step-buffers): on the bf16 cases of the
  emulated CUDA backend, a fifth run of the default plan with that flag.
  Exact by construction: the same bf16 values reach the GEMM either way.
  Likewise the kernels writing such values packed (the norms' outputs,
  the MLP activations of gelu, swiglu and linear_gelu, swiglu_grad's
  gradient, attention's y, which attention_grad also reads as stored, the
  MoE kernels' slot buffers and outputs, the
  fused classifier's dlogits) store the rounded values the executor would
  have packed; one Llama case runs the fused attention's path
  (--attention cudnn, the emulation's model of cuDNN's). On the one-rank cases piper-run must say it
  stores each of them so (packed_checks), and nothing with the flag.
  There the arena is laid out again, below the plan file's, and
  `piper-plan --backend` (no device: the executor's layout alone) gives
  the arena piper-run ran with, on every one-rank case.

- the vocabulary padding: the classifier's logits (and, where its
  gradient stays in the segment, the gradient) stored with rows of 128
  columns, 100 of them valid (`valid_cols`). Exact by construction: the
  kernels compute the valid columns as the dense ones (only the row
  stride differs) and never read the others. The default plan must have
  `valid_cols` somewhere, --pad-vocab 0's nowhere.

The cases cover one rank in fp32 and bf16, the emulated CUDA backend
(bf16), a pipeline (the last stage's forward and backward are separate
tasks, 1F1B and zero-bubble, the latter in bf16 on the emulated CUDA
backend), data parallelism with ZeRO-2, tensor parallelism without the
vocabulary split (a replicated head; also with sequence parallelism and
full recomputation in bf16 on the emulated CUDA backend), full
recomputation, a Llama (also on the emulated CUDA backend in bf16, with
the SIMT and with the fused attention) and a tied-head GPT, and an MoE
model.

Each default plan must hold `cross_entropy_fused` and no
`cross_entropy_grad` (--no-fused-classifier's the reverse), and, for the
GPT models (whose linears have biases), `linear_grad_weight_bias`;
--no-fused-epilogues' plan holds none, and one `bias_grad` more for each.
Each default plan's weight gradients accumulate in their kernels (but
under ZeRO-2, whose gradients go to reduce-scatter buckets instead), and
--no-fused-epilogues' plan has an `accumulate` kernel more for each
gradient so accumulated (piper-plan's listing). The GPT models' default plans run GELU with
their GEMMs, forward and backward; --no-fused-epilogues' plans hold a
`gelu` and a `gelu_grad` more for each. Every default plan adds the
residual stream in its norms, forward and backward; --no-fused-epilogues'
plan holds none of those kernels, and an `add` and the norm (or its
grad_input) more for each.

Usage: fusions_test.py PIPERC PIPER_RUN PIPER_PLAN
"""
import glob
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN, PIPER_PLAN = (os.path.abspath(p) for p in sys.argv[1:4])

# (name, model preset and flags, compile flags, ranks, backend[, piper-run
# flags])
CASES = [
    ("gpt-tiny f32, 1 rank", ["gpt-tiny"], [], 1, "cpu"),
    ("gpt-tiny bf16, 1 rank", ["gpt-tiny"], ["--dtype", "bf16"], 1, "cpu"),
    ("gpt-tiny bf16, cuda-emulation", ["gpt-tiny"], ["--dtype", "bf16"], 1,
     "cuda-emulation"),
    ("gpt-tiny PP2 1F1B x 4 microbatches", ["gpt-tiny"],
     ["--pp", "2", "--microbatches", "4", "--schedule", "1f1b"], 2, "cpu"),
    ("gpt-tiny PP2 zb-h1 bf16, cuda-emulation", ["gpt-tiny"],
     ["--pp", "2", "--microbatches", "3", "--schedule", "zb-h1", "--dtype",
      "bf16"], 2, "cuda-emulation"),
    ("llama-tiny DP2 ZeRO-2", ["llama-tiny"], ["--dp", "2", "--zero", "2"], 2,
     "cpu"),
    ("llama-tiny bf16, cuda-emulation", ["llama-tiny"], ["--dtype", "bf16"],
     1, "cuda-emulation"),
    # The fused attention's path (the emulation's model of cuDNN's), with
    # attention's y written and read packed.
    ("llama-tiny bf16, cuda-emulation, --attention cudnn", ["llama-tiny"],
     ["--dtype", "bf16"], 1, "cuda-emulation", ["--attention", "cudnn"]),
    ("gpt-tiny TP2, head not split", ["gpt-tiny"],
     ["--tp", "2", "--no-vocab-parallel"], 2, "cpu"),
    ("gpt tied head, full recompute", ["gpt", "--layers", "2"],
     ["--recompute", "full"], 1, "cpu"),
    ("llama-tiny TP2 SP, full recompute, bf16, cuda-emulation",
     ["llama-tiny"], ["--tp", "2", "--sp", "--no-vocab-parallel",
                      "--recompute", "full", "--dtype", "bf16"], 2,
     "cuda-emulation"),
    ("qwen3-moe-tiny bf16", ["qwen3-moe-tiny"], ["--dtype", "bf16"], 1,
     "cpu"),
    # The MoE kernels reading and writing packed bf16 (packed_checks).
    ("qwen3-moe-tiny bf16, cuda-emulation", ["qwen3-moe-tiny"],
     ["--dtype", "bf16"], 1, "cuda-emulation"),
]


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode,
                                                 " ".join(cmd), proc.stdout))
    return proc


def plan_bytes(folder):
    data = b""
    for path in sorted(glob.glob(os.path.join(folder, "*"))):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                data += f.read()
    return data


GELU_KERNELS = ("linear_gelu", "linear_grad_input_gelu", "gelu", "gelu_grad")
# Each fused residual kernel: the kernels it stands for (the add, and the
# norm or its grad_input).
RESIDUAL_KERNELS = {
    "add_layer_norm": "layer_norm",
    "add_rms_norm": "rms_norm",
    "layer_norm_grad_input_add": "layer_norm_grad_input",
    "rms_norm_grad_input_add": "rms_norm_grad_input",
}


def kernel_counts(folder):
    """How many kernels accumulate a weight gradient themselves, how many
    `accumulate` kernels, and how many calls of each GELU_KERNELS kernel,
    of each RESIDUAL_KERNELS kernel, of the kernels they stand for and of
    `add`, in piper-plan's listing of every plan."""
    text = run([PIPER_PLAN, folder]).stdout
    names = (GELU_KERNELS + tuple(RESIDUAL_KERNELS) +
             tuple(RESIDUAL_KERNELS.values()) + ("add",))
    calls = {k: text.count(" %s(" % k) for k in names}
    # The gradients the kernels accumulate: a norm's weight gradient kernel
    # adds two (layer norm's gamma and beta) in one.
    accumulated = sum(line.split(" = ")[0].count(":grad")
                      for line in text.splitlines()
                      if "accumulate = 1" in line)
    return accumulated, text.count(" accumulate("), calls


def residual_checks(counts, apart):
    """The default plan runs the residual stream's adds with the norms,
    forward and backward; --no-fused-epilogues' plan runs none, and an
    add and the norm (or its grad_input) for each."""
    fused = {k: counts[k] for k in RESIDUAL_KERNELS}
    forward = fused["add_layer_norm"] + fused["add_rms_norm"]
    backward = (fused["layer_norm_grad_input_add"] +
                fused["rms_norm_grad_input_add"])
    return [
        ("the default plan adds the residual stream in its norms: %s" % fused,
         forward > 0 and backward > 0),
        ("--no-fused-epilogues' plan: no residual norm, an add and the "
         "norm (its grad_input) more for each",
         all(apart[k] == 0 for k in RESIDUAL_KERNELS)
         and all(apart[unfused] == counts[unfused] + counts[k]
                 for k, unfused in RESIDUAL_KERNELS.items())
         and apart["add"] == counts["add"] + forward + backward),
    ]


def train(work, tag, model, flags, ranks, backend, run_flags=()):
    out = os.path.join(work, tag)
    run([PIPERC, "compile", model, "-o", out, "--lr", "1e-2"] + flags)
    metrics = os.path.join(out, "metrics.jsonl")
    save = os.path.join(out, "final.safetensors")
    log = run([PIPER_RUN, out, "--nproc", str(ranks), "--backend", backend,
               "--steps", "3", "--metrics", metrics, "--save", save] +
              list(run_flags)).stdout
    with open(metrics) as f:
        losses = [l for l in f.read().splitlines() if l.strip()]
    # Only the losses: timings differ from run to run.
    losses = [repr(json.loads(l)["loss"]) for l in losses]
    return (plan_bytes(out), losses, safetensors(save), kernel_counts(out),
            packed_counts(log), arenas(log))


def packed_counts(log):
    """piper-run's line on what the device stores as packed bf16: results
    written packed, other values, arguments read as stored, parameter
    copies; None where it says nothing (nothing is)."""
    for line in log.splitlines():
        if "stored as packed bf16" in line:
            words = line.split(": ")[-1].replace(",", "").split()
            return tuple(int(w) for w in words if w.isdigit())
    return None


def arenas(log):
    """piper-run's arena: the memory plan's it ran (its peak) and, where it
    laid the step out again for values stored packed, the plan file's
    (else None)."""
    m = re.search(r"peak memory: (\d+) bytes, [^(]*\(memory plan arena "
                  r"(\d+) bytes[^;)]*(?:; laid out again for the values this "
                  r"device stores packed: the plan file's (\d+) bytes)?", log)
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2)),
            int(m.group(3)) if m.group(3) else None)


def layout_checks(folder, backend, arena):
    """piper-plan --backend BACKEND --memory lays the plan out as piper-run
    on that backend did, without its device: the same arena, to the byte;
    without --backend, the plan file's."""
    def plan_arena(flags):
        text = run([PIPER_PLAN, folder, "--memory", "--largest", "0"] +
                   flags).stdout
        m = re.search(r"arena (\d+) bytes", text)
        return int(m.group(1)) if m else None
    laid, file_arena = plan_arena(["--backend", backend]), plan_arena([])
    return [
        ("piper-plan --backend %s lays the plan out as piper-run did: "
         "%s vs %s" % (backend, laid, arena),
         arena is not None and laid == arena[1]),
        ("piper-plan without --backend: the plan file's arena (%s)" %
         file_arena,
         arena is not None and file_arena == (arena[2] or arena[1])),
    ]


def arena_checks(packed, unpacked):
    """The emulated GPU stores values packed and lays the step's memory
    plan out again (docs/runtime.md): an arena below the plan file's, its
    peak the new layout's; --unpack-step-buffers keeps the file's."""
    return [
        ("the arena laid out again for the packed values, below the plan "
         "file's, its peak the layout's: %s" % (packed,),
         packed is not None and packed[2] is not None
         and packed[0] == packed[1] < packed[2]),
        ("--unpack-step-buffers keeps the plan file's arena: %s vs %s" %
         (unpacked, packed),
         unpacked is not None and unpacked[2] is None and packed is not None
         and unpacked[0] == unpacked[1] == packed[2]),
    ]


def packed_checks(packed, unpacked, listing):
    """One rank of a pre-norm transformer on the emulated GPU in bf16:
    the residual stream (the residual norms' sums), every norm's output,
    MLP activation (gelu, swiglu, linear_gelu's y)
    and the fused classifier's dlogits is read only by GEMMs, the input of
    swiglu and gelu only by them and their gradients, and
    attention's y by GEMMs and attention_grad, as is its qkv (the output of
    the GEMM before it) by attention and attention_grad only, so each is
    written packed by its kernel into its step buffer. So are, inside
    their segment, swiglu_grad's gradient (read by the two GEMMs of its
    linear), GPT's GELU gradient from linear_grad_input_gelu (read by a
    GEMM and linear_grad_weight_bias, whose bias sums read it packed too),
    attention_grad's dqkv (read by the QKV projection's GEMMs and bias
    sums), the branch outputs that the residual norms add (`r` of
    add_layer_norm and add_rms_norm, out of the projections' GEMMs), the
    gradient each norm's backward takes (`dy` of its grad_input and
    grad_weight, out of the GEMMs after it) and the gradient along the
    residual stream each writes (read by the GEMMs, the next norm's
    backward and the embeddings'), an MoE block's slot buffers, expert
    outputs and their gradients, GPT's token embeddings (which
    position_add reads packed), the classifier's logits (the head's GEMM writes them packed, the fused
    classifier reads them so) and the dy that linear_grad_input hands
    attention_grad, swiglu_grad and gelu_grad.
    --unpack-step-buffers stores nothing so."""
    writers = sum(listing.count(" %s(" % k) for k in (
        "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "gelu",
        "linear_gelu", "swiglu", "attention", "cross_entropy_fused"))
    writers += listing.count(" attention(")  # its qkv
    # The activations' inputs (Llama's gate|up), which they and their
    # gradients read packed: written so by the projection's GEMM.
    writers += listing.count(" swiglu(") + listing.count(" gelu(")
    # An MoE block's capacity slots (moe_dispatch's buf, which the expert
    # GEMMs read, saved for the weight gradient) and its experts' outputs
    # (the last expert_linear's, which moe_combine and, saved,
    # moe_combine_grad read); the first expert_linear's is swiglu's input.
    writers += listing.count(" moe_dispatch(") + listing.count(" moe_combine(")
    # The residual stream: the residual norms' sums, saved for the norms'
    # backward, which reads them packed, as the next residual norm does.
    writers += (listing.count(" add_layer_norm(") +
                listing.count(" add_rms_norm("))
    # And its first value: position_add's output where the model has
    # learned positions (the embedding's output, which position_add reads,
    # is then another packed value), else the embedding's.
    writers += (listing.count(" position_add(") or
                listing.count(" embedding("))
    values = (2 * listing.count(" swiglu_grad(") +
              listing.count(" cross_entropy_fused(") +
              2 * listing.count(" attention_grad(") +
              listing.count(" gelu_grad(") +
              listing.count(" linear_grad_input_gelu(") +
              sum(listing.count(" %s(" % k) for k in (
                  "add_layer_norm", "add_rms_norm")))
    norm_grads = sum(listing.count(" %s(" % k) for k in (
        "layer_norm_grad_input", "layer_norm_grad_input_add",
        "rms_norm_grad_input", "rms_norm_grad_input_add"))
    # Each norm gradient's dy, and the gradient along the residual stream
    # that each writes (the last read by the embeddings' backward).
    values += 2 * norm_grads + listing.count(" position_add(")
    # An MoE block's backward: its slot buffers' gradients, moe_combine_grad's
    # (read by the expert GEMMs) and the first expert GEMM's input gradient
    # (read by moe_dispatch_grad); moe_dispatch_grad's dx, which an `add`
    # sums with the router's input gradient (the norm's dy, counted above);
    # that input gradient; and the router's logit gradient, an `add` of
    # moe_router_grad's and the aux loss's that the router's GEMMs read.
    # (moe_combine's output is a residual norm's r, counted above.)
    values += (listing.count(" moe_combine_grad(") +
               2 * listing.count(" moe_dispatch_grad(") +
               2 * listing.count(" moe_router_grad("))
    return [
        ("packed storage: %d results written packed (%d: the residual "
         "stream, norms, MLP activations and their inputs, attention inputs "
         "and outputs, MoE slots and expert outputs, dlogits), %d other "
         "values (%d: swiglu_grad's, linear_grad_input_gelu's and "
         "attention_grad's gradients, logits, the dy of attention_grad, "
         "swiglu_grad and gelu_grad, the residual norms' r, the norm "
         "gradients' dy and dx, the MoE slots' gradients): %s" %
         (packed[0] if packed else -1, writers,
          packed[1] if packed else -1, values, packed),
         packed is not None and packed[0] == writers and packed[1] == values),
        ("piper-run --unpack-step-buffers stores nothing packed",
         unpacked is None),
    ]


def safetensors(path):
    """The header (without the run's random id) and the tensors' bytes."""
    with open(path, "rb") as f:
        data = f.read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    header.get("__metadata__", {}).pop("piper.run_id", None)
    return header, data[8 + size:]


def main():
    work = tempfile.mkdtemp(prefix="piper-fused-",
                            dir=os.environ.get("TEST_TMPDIR"))
    failures = []
    for i, (name, preset, flags, ranks, backend, *more) in enumerate(CASES):
        run_flags = more[0] if more else []
        model = os.path.join(work, "model-%d.mlir" % i)
        run([PIPERC, "model"] + preset + ["--seq", "16", "--batch", "2",
                                          "--vocab", "100", "-o", model])
        plan, losses, params, counts, packed, arena = train(
            work, "fused-%d" % i, model, flags, ranks, backend, run_flags)
        plain = train(work, "plain-%d" % i, model,
                      flags + ["--no-fused-classifier"], ranks, backend,
                      run_flags)
        apart = train(work, "apart-%d" % i, model,
                      flags + ["--no-fused-epilogues"], ranks, backend,
                      run_flags)
        unpadded = train(work, "unpadded-%d" % i, model,
                         flags + ["--pad-vocab", "0"], ranks, backend,
                         run_flags)
        variants = [("--no-fused-classifier", plain),
                    ("--no-fused-epilogues", apart),
                    ("--pad-vocab 0", unpadded)]
        if backend == "cuda-emulation" and "bf16" in flags:
            variants.append(("piper-run --unpack-step-buffers",
                             train(work, "unpacked-%d" % i, model, flags,
                                   ranks, backend,
                                   run_flags + ["--unpack-step-buffers"])))
        biased = preset[0].startswith("gpt")
        zero2 = "--zero" in flags and flags[flags.index("--zero") + 1] != "1"
        fused = plan.count(b"linear_grad_weight_bias")
        checks = [
            ("the default plan holds cross_entropy_fused",
             b"cross_entropy_fused" in plan),
            ("the default plan holds no cross_entropy_grad",
             b"cross_entropy_grad" not in plan),
            ("--no-fused-classifier's plan holds cross_entropy_grad only",
             b"cross_entropy_grad" in plain[0]
             and b"cross_entropy_fused" not in plain[0]),
            ("the default plan holds linear_grad_weight_bias%s" %
             ("" if biased else " only where a linear has a bias (none)"),
             (fused > 0) == biased),
            ("--no-fused-epilogues' plan holds no linear_grad_weight_bias "
             "and a bias_grad for each of the default plan's",
             b"linear_grad_weight_bias" not in apart[0]
             and apart[0].count(b"bias_grad") ==
             plan.count(b"bias_grad") + fused),
            ("the default plan's weight gradients accumulate in their "
             "kernels (%d)%s" % (counts[0], " (none: ZeRO-2)" if zero2 else ""),
             (counts[0] == 0) == zero2),
            ("--no-fused-epilogues' plan: no kernel accumulates, an "
             "accumulate kernel more for each (%d, %d vs %d)" %
             (counts[0], apart[3][1], counts[1]),
             apart[3][0] == 0 and apart[3][1] == counts[1] + counts[0]),
            ("the default plan runs GELU with its GEMMs%s: %s" %
             ("" if biased else " (none: no GELU)", counts[2]),
             (counts[2]["linear_gelu"] > 0
              and counts[2]["linear_grad_input_gelu"] > 0) == biased),
            ("--no-fused-epilogues' plan: no GELU with a GEMM, a gelu and "
             "a gelu_grad more for each: %s" % apart[3][2],
             apart[3][2]["linear_gelu"] == 0
             and apart[3][2]["linear_grad_input_gelu"] == 0
             and apart[3][2]["gelu"] ==
             counts[2]["gelu"] + counts[2]["linear_gelu"]
             and apart[3][2]["gelu_grad"] ==
             counts[2]["gelu_grad"] + counts[2]["linear_grad_input_gelu"]),
            ("the default plan pads the vocabulary (valid_cols)",
             b"valid_cols" in plan),
            ("--pad-vocab 0's plan pads nothing",
             b"valid_cols" not in unpadded[0]),
            ("3 losses", len(losses) == 3),
        ] + residual_checks(counts[2], apart[3][2])
        if ranks == 1:
            checks += layout_checks(os.path.join(work, "fused-%d" % i),
                                    backend, arena)
        if backend == "cuda-emulation" and "bf16" in flags and ranks == 1:
            checks += packed_checks(packed, variants[-1][1][4],
                                    run([PIPER_PLAN, os.path.join(
                                        work, "fused-%d" % i)]).stdout)
            checks += arena_checks(arena, variants[-1][1][5])
        for flag, (_, losses0, params0, *_) in variants:
            checks += [
                ("%s: the same losses: %s vs %s" % (flag, losses, losses0),
                 losses == losses0),
                ("%s: the same parameters, byte for byte" % flag,
                 params[1] == params0[1] and len(params[1]) > 0),
                ("%s: the same safetensors header" % flag,
                 params[0] == params0[0]),
            ]
        for what, ok in checks:
            print("%s %s: %s" % ("ok  " if ok else "FAIL", name, what))
            if not ok:
                failures.append(name + ": " + what)
    if failures:
        sys.exit("%d check(s) failed:\n  %s" % (len(failures),
                                                "\n  ".join(failures)))
    print("all %d cases: no fusion changes a bit" % len(CASES))


if __name__ == "__main__":
    main()
