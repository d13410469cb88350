#!/usr/bin/env python3
"""End-to-end checkpoints: a gpt-tiny run killed in the middle and resumed
from its --checkpoint-dir (or restarted by --max-restarts) gives the same loss
at every step, bit for bit, and the same final parameters as a run never
interrupted; broken checkpoints are skipped, old ones pruned, mismatches
named.

Usage: resume_test.py PIPERC PIPER_RUN resume|restart
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
MODE = sys.argv[3]
STEPS = 8
SEED = 3
PP2_DP2 = ["--pp", "2", "--dp", "2", "--microbatches", "2", "--schedule", "1f1b"]

passed = failed = 0


def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    sys.stdout.flush()


def run(cmd, env=None, expect=0):
    full = dict(os.environ)
    full.update(env or {})
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300, env=full)
    if expect is not None and proc.returncode != expect:
        sys.exit("command exited %d, expected %d: %s\nstdout:\n%s\nstderr:\n%s"
                 % (proc.returncode, expect, " ".join(cmd), proc.stdout,
                    proc.stderr))
    return proc


def metrics(path):
    """(step, loss, grad_norm) of every line: exact doubles."""
    with open(path) as f:
        return [(o["step"], o["loss"], o["grad_norm"])
                for o in map(json.loads, f) if o]


def tensors(path):
    """name -> raw bytes of every tensor of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def steps_in(folder):
    return sorted(int(m.group(1)) for m in
                  (re.fullmatch(r"step-(\d+)", n) for n in os.listdir(folder))
                  if m)


def piper_run(plans, extra, env=None, expect=0, seed=SEED):
    return run([PIPER_RUN, plans, "--nproc", "4", "--seed", str(seed)] + extra,
               env, expect)


def reference(work, plans, tag):
    """An uninterrupted run: its metrics and final parameters."""
    m = os.path.join(work, tag + "-ref.jsonl")
    save = os.path.join(work, tag + "-ref.safetensors")
    piper_run(plans, ["--steps", str(STEPS), "--metrics", m, "--save", save])
    ref = metrics(m)
    check(len(ref) == STEPS and ref[-1][1] < ref[0][1],
          "%s: reference run of %d steps, loss %.6f -> %.6f" %
          (tag, STEPS, ref[0][1], ref[-1][1]))
    return ref, tensors(save)


def same_run(tag, ref, ref_params, metrics_path, save_path):
    got = metrics(metrics_path)
    check(got == ref, "%s: every step's loss and grad norm bit-identical to "
          "the uninterrupted run (%d steps)" % (tag, len(got)))
    if got != ref:
        for a, b in zip(ref, got):
            print("  ref %r\n  got %r" % (a, b))
    params = tensors(save_path)
    check(params == ref_params, "%s: final parameters bit-identical (%d "
          "tensors)" % (tag, len(params)))


def crash_and_resume(work, plans, tag, ref, ref_params):
    """Checkpoints every 2 steps, rank 0 crashes in step 7, --resume. (Rank
    0 completes each checkpoint before its next step: the crash cannot cut
    off step-6.)"""
    ckpt = os.path.join(work, tag + "-ckpt")
    m = os.path.join(work, tag + ".jsonl")
    save = os.path.join(work, tag + ".safetensors")
    common = ["--checkpoint-dir", ckpt, "--checkpoint-every", "2",
              "--keep-checkpoints", "2", "--metrics", m, "--save", save]
    p = piper_run(plans, ["--steps", str(STEPS)] + common,
                  {"PIPER_FAULT": "rank=0,action=crash,step=7"}, expect=1)
    check("PIPER_FAULT: crashing" in p.stderr, "%s: rank 0 crashed in step 7"
          % tag)
    written = re.findall(r"checkpoint '[^']*' written: ([0-9.]+) MB in "
                         r"([0-9.]+) s", p.stderr)
    check(len(written) == 3, "%s: checkpoints after steps 2, 4, 6 (%s)" %
          (tag, ", ".join("%s MB in %s s" % w for w in written)))
    check(steps_in(ckpt) == [4, 6], "%s: --keep-checkpoints 2 kept steps %s"
          % (tag, steps_in(ckpt)))
    check(not os.path.exists(save), "%s: no --save after the crash" % tag)
    p = piper_run(plans, ["--steps", str(STEPS), "--resume"] + common)
    check("resuming from '%s/step-6' (step 6)" % ckpt in p.stderr,
          "%s: resumed from step 6" % tag)
    same_run(tag + " resumed", ref, ref_params, m, save)
    check(steps_in(ckpt) == [6, 8], "%s: checkpoints now %s" %
          (tag, steps_in(ckpt)))
    return ckpt, common, m, save


def fp32_reference(work):
    """gpt-tiny compiled for pp2 x dp2 and its uninterrupted fp32 run."""
    model = os.path.join(work, "gpt-tiny.mlir")
    run([PIPERC, "model", "gpt-tiny", "-o", model])
    plans = os.path.join(work, "pp2dp2")
    run([PIPERC, "compile", model, "-o", plans] + PP2_DP2)
    ref, ref_params = reference(work, plans, "fp32")
    return model, plans, ref, ref_params


def resume_mode(work):
    model, plans, ref, ref_params = fp32_reference(work)
    ckpt, common, m, save = crash_and_resume(work, plans, "fp32", ref,
                                             ref_params)

    # The checkpoint's files: parameters (loadable by --load) and moments.
    model_t = tensors(os.path.join(ckpt, "step-8", "model.safetensors"))
    opt_t = tensors(os.path.join(ckpt, "step-8", "optimizer.safetensors"))
    check(model_t == ref_params, "step-8/model.safetensors holds the final "
          "parameters")
    check(sorted(opt_t) == sorted([n + ".exp_avg" for n in model_t] +
                                  [n + ".exp_avg_sq" for n in model_t]),
          "step-8/optimizer.safetensors holds exp_avg and exp_avg_sq of "
          "every parameter")
    with open(os.path.join(ckpt, "step-8", "state.json")) as f:
        state = json.load(f)
    check(state["step"] == 8 and state["run"]["seed"] == SEED,
          "state.json records the step and the run")

    # A resumed run already at --steps runs nothing.
    p = piper_run(plans, ["--steps", str(STEPS), "--resume"] + common)
    check("step 8 reached --steps 8, no step to run" in p.stderr and
          not re.search(r"^step ", p.stdout, re.M),
          "--resume at the final step runs nothing")
    same_run("fp32 resumed at the end", ref, ref_params, m, save)

    # A truncated newest checkpoint is skipped for the one before it.
    newest = os.path.join(ckpt, "step-8", "model.safetensors")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) - 100)
    p = piper_run(plans, ["--steps", str(STEPS), "--resume"] + common)
    check("skipping '%s/step-8'" % ckpt in p.stderr and
          "resuming from '%s/step-6'" % ckpt in p.stderr,
          "a truncated step-8 is skipped for step-6")
    same_run("fp32 after a truncated checkpoint", ref, ref_params, m, save)

    # A checkpoint without its completion marker (cut off before state.json)
    # is skipped too.
    os.remove(os.path.join(ckpt, "step-8", "state.json"))
    p = piper_run(plans, ["--steps", str(STEPS), "--resume"] + common)
    check("skipping '%s/step-8': incomplete (no state.json)" % ckpt in p.stderr
          and "resuming from '%s/step-6'" % ckpt in p.stderr,
          "step-8 without state.json is skipped for step-6")
    same_run("fp32 after an incomplete checkpoint", ref, ref_params, m, save)

    # A leftover of a write cut off (step-N.tmp) is never read, and removed.
    os.makedirs(os.path.join(ckpt, "step-10.tmp"))
    p = piper_run(plans, ["--steps", "10", "--resume"] + common)
    check("resuming from '%s/step-8'" % ckpt in p.stderr and
          steps_in(ckpt) == [8, 10] and
          not os.path.exists(os.path.join(ckpt, "step-10.tmp")),
          "step-10.tmp ignored and removed; steps 9-10 run (%s)" %
          steps_in(ckpt))

    # No checkpoint yet: --resume starts fresh.
    empty = os.path.join(work, "empty-ckpt")
    p = piper_run(plans, ["--steps", "2", "--resume", "--checkpoint-dir",
                          empty])
    check("no complete checkpoint in '%s', starting fresh" % empty in p.stderr
          and "step 1/2 |" in p.stdout, "--resume with none starts fresh")

    # Errors.
    p = piper_run(plans, ["--steps", "2", "--resume"], expect=2)
    check(p.stderr == "piper-run: --resume needs --checkpoint-dir (the "
          "directory to resume from)\n", "--resume without --checkpoint-dir: "
          + p.stderr.strip())
    p = piper_run(plans, ["--steps", str(STEPS), "--resume", "--checkpoint-dir",
                          ckpt], expect=1, seed=4)
    check("is of another run: seed 3 (this run: 4)" in p.stderr,
          "another --seed: " + p.stderr.strip())
    other = os.path.join(work, "other.mlir")
    run([PIPERC, "model", "gpt", "--layers", "1", "--hidden", "32", "--heads",
         "4", "--vocab", "256", "--seq", "32", "--batch", "4", "-o", other])
    other_plans = os.path.join(work, "other-pp2dp2")
    run([PIPERC, "compile", other, "-o", other_plans] + PP2_DP2)
    p = piper_run(other_plans, ["--steps", str(STEPS), "--resume",
                                "--checkpoint-dir", ckpt], expect=1)
    check("does not match the model" in p.stderr and
          "model.safetensors" in p.stderr,
          "another model: " + p.stderr.strip()[:200])
    dp4 = os.path.join(work, "dp4-mb2")
    run([PIPERC, "compile", model, "-o", dp4, "--dp", "4", "--microbatches",
         "2"])
    p = piper_run(dp4, ["--steps", str(STEPS), "--resume", "--checkpoint-dir",
                        ckpt], expect=1)
    check("is of another run: microbatches_per_step 4 (this run: 8)" in
          p.stderr, "another global batch: " + p.stderr.strip()[:200])


def restart_mode(work):
    model, plans, ref, ref_params = fp32_reference(work)

    # A crash in the first attempt only: --max-restarts resumes and finishes.
    ckpt = os.path.join(work, "restart-ckpt")
    m = os.path.join(work, "restart.jsonl")
    save = os.path.join(work, "restart.safetensors")
    p = piper_run(plans, ["--steps", str(STEPS), "--checkpoint-dir", ckpt,
                          "--checkpoint-every", "2", "--max-restarts", "2",
                          "--metrics", m, "--save", save],
                  {"PIPER_FAULT": "rank=0,action=crash,step=5,attempt=0"})
    restarts = re.findall(r"restart (\d) of 2: relaunching 4 ranks .* \(([0-9.]+)"
                          r" s after the failure\)", p.stderr)
    again = re.findall(r"training again: step (\d+) done ([0-9.]+) s after "
                       r"the failure", p.stderr)
    check(len(restarts) == 1 and again and again[0][0] == "5",
          "one restart, from step-4: ranks stopped and relaunched %s s after "
          "the failure, step 5 done %s s after it" %
          (restarts[0][1] if restarts else "?", again[0][1] if again else "?"))
    same_run("restarted", ref, ref_params, m, save)

    # A fault on every attempt uses the restarts up and fails.
    ckpt2 = os.path.join(work, "restart-ckpt2")
    p = piper_run(plans, ["--steps", "4", "--checkpoint-dir", ckpt2,
                          "--checkpoint-every", "2", "--max-restarts", "1"],
                  {"PIPER_FAULT": "rank=0,action=crash,step=3"}, expect=1)
    check("restart 1 of 1" in p.stderr and
          "no restart left (1 of 1 used)" in p.stderr,
          "a fault on every attempt exhausts --max-restarts")
    p = piper_run(plans, ["--steps", "2", "--max-restarts", "1"], expect=2)
    check("--max-restarts needs --checkpoint-dir" in p.stderr,
          "--max-restarts without --checkpoint-dir")

    # Mixed precision: bf16 compute, fp32 masters and moments.
    bf16 = os.path.join(work, "pp2dp2-bf16")
    run([PIPERC, "compile", model, "-o", bf16, "--dtype", "bf16"] + PP2_DP2)
    ref, ref_params = reference(work, bf16, "bf16")
    crash_and_resume(work, bf16, "bf16", ref, ref_params)


def main():
    work = tempfile.mkdtemp(prefix="resume-",
                            dir=os.environ.get("TEST_TMPDIR"))
    try:
        {"resume": resume_mode, "restart": restart_mode}[MODE](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
