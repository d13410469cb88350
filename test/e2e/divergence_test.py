#!/usr/bin/env python3
"""A diverging run stops at the first non-finite step, whether or not it
clips, and writes nothing from it (issue 42, item 7): gpt-tiny compiled with
--lr 1e30 turns its weights non-finite in step 1's update, so step 2's
gradients and loss are NaN.

- With --clip-grad 0 (no clipping: the norm is measured at the end of the
  step), on one rank and on DP2: exit 1 with "non-finite gradient norm at
  step 2", one line of --metrics, the step-1 checkpoint only, no --save file.
- With --clip-grad 1: the same message (CLIP_GRADS stops before the update).

Usage: divergence_test.py PIPERC PIPER_RUN
"""
import json
import os
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
MESSAGE = "non-finite gradient norm at step 2"


def run(cmd, expect_ok=True):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    if expect_ok and proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode,
                                                 " ".join(cmd), proc.stdout))
    return proc


def main():
    work = tempfile.mkdtemp(prefix="piper-diverge-",
                            dir=os.environ.get("TEST_TMPDIR"))
    model = os.path.join(work, "gpt-tiny.mlir")
    run([PIPERC, "model", "gpt-tiny", "--seq", "16", "--batch", "2", "-o",
         model])
    checks = []
    for name, clip, dp in (("no clipping, 1 rank", "0", 1),
                           ("no clipping, DP2", "0", 2),
                           ("clipping, 1 rank", "1", 1)):
        out = os.path.join(work, "out-%s-%d" % (clip, dp))
        run([PIPERC, "compile", model, "--lr", "1e30", "--min-lr", "0",
             "--clip-grad", clip, "--dp", str(dp), "-o", out])
        metrics = os.path.join(out, "metrics.jsonl")
        ckpt = os.path.join(out, "ckpt")
        save = os.path.join(out, "final.safetensors")
        proc = run([PIPER_RUN, out, "--nproc", str(dp), "--steps", "4",
                    "--metrics", metrics, "--checkpoint-dir", ckpt,
                    "--checkpoint-every", "1", "--save", save],
                   expect_ok=False)
        with open(metrics) as f:
            losses = [json.loads(l)["loss"] for l in f if l.strip()]
        steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step-")) \
            if os.path.isdir(ckpt) else []
        checks += [
            (name + ": exit 1", proc.returncode == 1),
            (name + ": says '%s'" % MESSAGE, MESSAGE in proc.stdout),
            (name + ": one finite loss in --metrics",
             len(losses) == 1 and losses[0] is not None),
            (name + ": only step 1's checkpoint", steps == ["step-1"]),
            (name + ": no --save file", not os.path.exists(save)),
        ]
        if not all(ok for _, ok in checks[-5:]):
            print("output of %s:\n%s\ncheckpoints: %s, losses: %s" % (
                name, proc.stdout, steps, losses))
    failed = 0
    for what, ok in checks:
        print("%s: %s" % ("ok" if ok else "FAIL", what))
        failed += not ok
    print("%d passed, %d failed" % (len(checks) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
