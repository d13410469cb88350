#!/usr/bin/env python3
"""ZeRO, EP and TP checkpoints end to end: a small qwen3-moe run under PP2 x
DP2 ZeRO-3 writes --checkpoint-dir checkpoints (every rank contributing its
shards), resumes under the same strategy bit for bit, and resumes under
other strategies (one device, DP4 ZeRO-1, DP2 ZeRO-2, DP2 EP2, DP4 EP2 with
ZeRO-2, TP2, PP2 x DP2 x TP2, and TP with ZeRO-1, 2 and 3) to the
uninterrupted losses within fp32 round-off; checkpoints written under EP and
under TP (each member's slices of the fused weights, or under ZeRO each
rank's range of them) resume on one device and under DP2 ZeRO-2, as do
checkpoints written under context parallelism (CP2 x EP2, DP2 x CP2
ZeRO-2), which the ZeRO-3 checkpoint also resumes into (CP2 x EP2, DP2 x
CP2 ZeRO-2, CP2 x TP2, CP2 Ulysses). A
checkpoint from ZeRO-1 loads into ZeRO-3 with --load too, and one saved
whole under TP (and TP x ZeRO-3) into one device.

Usage: zero_checkpoint_test.py PIPERC PIPER_RUN
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
STEPS = 6
SEED = 5
LOSS_RTOL = 1e-5

# The same global batch (4 microbatches of 2 sequences) under each strategy.
STRATEGIES = {
    "pp2-dp2-zero3": (["--pp", "2", "--dp", "2", "--microbatches", "2",
                       "--zero", "3"], 4),
    "one-device": (["--microbatches", "4"], 1),
    "dp4-zero1": (["--dp", "4", "--microbatches", "1", "--zero", "1"], 4),
    "dp2-zero2": (["--dp", "2", "--microbatches", "2", "--zero", "2"], 2),
    "dp2-ep2": (["--dp", "2", "--microbatches", "2", "--ep", "2"], 2),
    "dp4-ep2-zero2": (["--dp", "4", "--microbatches", "1", "--ep", "2",
                       "--zero", "2"], 4),
    "tp2": (["--tp", "2", "--microbatches", "4"], 2),
    "pp2-dp2-tp2": (["--pp", "2", "--dp", "2", "--tp", "2",
                     "--microbatches", "2"], 8),
    "dp2-tp2-ep2": (["--dp", "2", "--tp", "2", "--ep", "2",
                     "--microbatches", "2"], 4),
    # ZeRO with TP: each member's tensors (its slices, and its copies of
    # the unsplit ones) sharded over that member's data replicas.
    "dp2-tp2-zero3": (["--dp", "2", "--tp", "2", "--microbatches", "2",
                       "--zero", "3"], 4),
    "pp2-dp2-tp2-zero1": (["--pp", "2", "--dp", "2", "--tp", "2",
                           "--microbatches", "2", "--zero", "1"], 8),
    "dp2-tp2-ep2-zero2": (["--dp", "2", "--tp", "2", "--ep", "2",
                           "--microbatches", "2", "--zero", "2"], 4),
    # ZeRO with sequence parallelism: the partial norm weights whole on
    # every rank, the other tensors sharded per member.
    "dp2-tp2-sp-zero3": (["--dp", "2", "--tp", "2", "--sp",
                          "--microbatches", "2", "--zero", "3"], 4),
    # Context parallelism splits no parameter: its checkpoints are any
    # other's (each microbatch's sequence over 2 members, MoE layers on the
    # gathered sequence).
    "cp2-ep2": (["--cp", "2", "--ep", "2", "--microbatches", "4"], 2),
    "dp2-cp2-zero2": (["--dp", "2", "--cp", "2", "--microbatches", "2",
                       "--zero", "2"], 4),
    "cp2-tp2": (["--cp", "2", "--tp", "2", "--microbatches", "4"],
                        4),
    "cp2-ulysses": (["--cp", "2", "--cp-kind", "ulysses", "--microbatches",
                     "4"], 2),
}

passed = failed = 0


def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    sys.stdout.flush()


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout))
    return proc.stdout


def losses(path):
    with open(path) as f:
        return {o["step"]: o["loss"] for o in map(json.loads, f) if o}


def train(plans, ranks, *extra):
    run([PIPER_RUN, plans, "--nproc", str(ranks), "--backend", "cpu",
         "--seed", str(SEED)] + list(extra))


def main():
    work = tempfile.mkdtemp(prefix="piper-zero-ckpt-",
                            dir=os.environ.get("TEST_TMPDIR"))
    model = os.path.join(work, "moe.mlir")
    run([PIPERC, "model", "qwen3-moe", "--layers", "2", "--hidden", "32",
         "--heads", "4", "--kv-heads", "2", "--ffn", "32", "--experts", "4",
         "--top-k", "2", "--vocab", "64", "--seq", "16", "--batch", "2",
         "-o", model])
    plans = {}
    for name, (flags, ranks) in STRATEGIES.items():
        plans[name] = (os.path.join(work, "plans-" + name), ranks)
        run([PIPERC, "compile", model, "-o", plans[name][0]] + flags)

    zero3, ranks3 = plans["pp2-dp2-zero3"]
    ref = os.path.join(work, "ref.jsonl")
    train(zero3, ranks3, "--steps", str(STEPS), "--metrics", ref)
    ref_losses = losses(ref)
    check(len(ref_losses) == STEPS and ref_losses[STEPS] < ref_losses[1],
          "the uninterrupted ZeRO-3 run trains: %s" % ref_losses)

    # The first half, checkpointed at step 3 by every rank (shards gathered).
    ckpt = os.path.join(work, "ckpt")
    train(zero3, ranks3, "--steps", "3", "--checkpoint-dir", ckpt,
          "--checkpoint-every", "3")
    # Sharded: one file per rank holding only its own slices, no gather.
    step3 = os.path.join(ckpt, "step-3")
    with open(os.path.join(step3, "state.json")) as f:
        state = json.load(f)
    names = sorted(os.listdir(step3))
    check(state.get("layout") == "shards" and
          names == ["rank-%d.safetensors" % r for r in range(4)] + ["state.json"],
          "the ZeRO-3 run wrote step-3 as one slice file per rank: %s" % names)

    # A sharded checkpoint missing a rank's slices is refused, naming what
    # it lacks (not resumed from, not silently skipped).
    broken = os.path.join(work, "ckpt-broken")
    shutil.copytree(ckpt, broken)
    os.remove(os.path.join(broken, "step-3", "rank-1.safetensors"))
    del state["files"]["rank-1.safetensors"]
    with open(os.path.join(broken, "step-3", "state.json"), "w") as f:
        json.dump(state, f)
    proc = subprocess.run([PIPER_RUN, zero3, "--nproc", "4", "--steps", "6",
                           "--seed", str(SEED), "--checkpoint-dir", broken,
                           "--resume"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    check(proc.returncode != 0 and "its slices of" in proc.stdout,
          "a sharded checkpoint without rank 1's slices is refused: %s" %
          proc.stdout.strip().splitlines()[-1:])

    for name, (folder, ranks) in plans.items():
        mine = os.path.join(work, "ckpt-" + name)
        shutil.copytree(ckpt, mine)
        metrics = os.path.join(work, "resumed-%s.jsonl" % name)
        train(folder, ranks, "--steps", str(STEPS), "--checkpoint-dir", mine,
              "--resume", "--metrics", metrics)
        got = losses(metrics)
        same = name == "pp2-dp2-zero3"
        for step in range(4, STEPS + 1):
            a, b = ref_losses[step], got.get(step)
            if same:
                check(b == a, "%s resumed: step %d loss %r == %r (bit for bit)"
                      % (name, step, b, a))
            else:
                rel = abs(a - b) / abs(a) if b is not None else float("inf")
                check(rel <= LOSS_RTOL, "%s resumed from the ZeRO-3 checkpoint: "
                      "step %d loss %r vs %r (rel %.2e)" % (name, step, b, a, rel))

    # A checkpoint written under EP (experts gathered from their owners)
    # resumes on one device.
    ep, ep_ranks = plans["dp2-ep2"]
    ep_ckpt = os.path.join(work, "ckpt-ep")
    train(ep, ep_ranks, "--steps", "3", "--checkpoint-dir", ep_ckpt,
          "--checkpoint-every", "3")
    metrics = os.path.join(work, "from-ep.jsonl")
    train(plans["one-device"][0], 1, "--steps", str(STEPS), "--checkpoint-dir",
          ep_ckpt, "--resume", "--metrics", metrics)
    got = losses(metrics)
    for step in range(4, STEPS + 1):
        a, b = ref_losses[step], got.get(step)
        rel = abs(a - b) / abs(a) if b is not None else float("inf")
        check(rel <= LOSS_RTOL, "one device resumed from the DP2 EP2 "
              "checkpoint: step %d loss %r vs %r (rel %.2e)" % (step, b, a, rel))

    # Checkpoints written under PP2 x DP2 x TP2 (each member of the first
    # tensor-parallel group writing its slices of every split weight) and
    # under DP2 x TP2 x EP2 (the experts' blocks from the first expert
    # group of member 0), and under DP2 x TP2 ZeRO-3 (every rank its ZeRO
    # range of its member's slices) resume on one device and under DP2
    # ZeRO-2.
    for writer in ("pp2-dp2-tp2", "dp2-tp2-ep2", "dp2-tp2-zero3",
                   "dp2-tp2-sp-zero3", "cp2-ep2", "dp2-cp2-zero2"):
        tp, tp_ranks = plans[writer]
        tp_ckpt = os.path.join(work, "ckpt-" + writer)
        train(tp, tp_ranks, "--steps", "3", "--checkpoint-dir", tp_ckpt,
              "--checkpoint-every", "3")
        for name in ("one-device", "dp2-zero2"):
            mine = os.path.join(work, "ckpt-%s-%s" % (writer, name))
            shutil.copytree(tp_ckpt, mine)
            metrics = os.path.join(work, "from-%s-%s.jsonl" % (writer, name))
            folder, ranks = plans[name]
            train(folder, ranks, "--steps", str(STEPS), "--checkpoint-dir", mine,
                  "--resume", "--metrics", metrics)
            got = losses(metrics)
            for step in range(4, STEPS + 1):
                a, b = ref_losses[step], got.get(step)
                rel = abs(a - b) / abs(a) if b is not None else float("inf")
                check(rel <= LOSS_RTOL, "%s resumed from the %s checkpoint: "
                      "step %d loss %r vs %r (rel %.2e)" %
                      (name, writer, step, b, a, rel))
    # --save under TP gathers whole tensors: one device --load-s them.
    saved = os.path.join(work, "tp2.safetensors")
    train(plans["tp2"][0], 2, "--steps", "2", "--save", saved)
    metrics = os.path.join(work, "loaded-tp.jsonl")
    train(plans["one-device"][0], 1, "--load", saved, "--steps", "1",
          "--metrics", metrics)
    got = losses(metrics)
    rel = abs(got[3] - ref_losses[3]) / ref_losses[3]
    check(rel <= LOSS_RTOL, "TP2 parameters --load-ed on one device: step 3 "
          "loss %r vs %r (rel %.2e)" % (got[3], ref_losses[3], rel))

    # --save under TP x ZeRO-3 gathers each member's ranges, then the
    # members' slices; --load scatters a whole tensor into ranges of slices.
    saved = os.path.join(work, "tp2-zero3.safetensors")
    train(plans["dp2-tp2-zero3"][0], 4, "--steps", "2", "--save", saved)
    for name in ("one-device", "dp2-tp2-zero3"):
        metrics = os.path.join(work, "loaded-tp-zero3-%s.jsonl" % name)
        folder, ranks = plans[name]
        train(folder, ranks, "--load", saved, "--steps", "1", "--metrics",
              metrics)
        got = losses(metrics)
        rel = abs(got[3] - ref_losses[3]) / ref_losses[3]
        check(rel <= LOSS_RTOL, "DP2 x TP2 ZeRO-3 parameters --load-ed into "
              "%s: step 3 loss %r vs %r (rel %.2e)" %
              (name, got[3], ref_losses[3], rel))

    # --save from ZeRO-1 (whole parameters), --load into ZeRO-3 (shards).
    saved = os.path.join(work, "dp4.safetensors")
    train(plans["dp4-zero1"][0], 4, "--steps", "2", "--save", saved)
    metrics = os.path.join(work, "loaded.jsonl")
    train(zero3, ranks3, "--load", saved, "--steps", "1", "--metrics", metrics)
    got = losses(metrics)
    rel = abs(got[3] - ref_losses[3]) / ref_losses[3]
    # --load starts fresh AdamW moments, so only the first loss (same
    # parameters, same data) must agree.
    check(rel <= LOSS_RTOL, "ZeRO-1 parameters --load-ed into ZeRO-3: step 3 "
          "loss %r vs %r (rel %.2e)" % (got[3], ref_losses[3], rel))

    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
