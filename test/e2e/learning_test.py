#!/usr/bin/env python3
"""Learning on real text: gpt-tiny trained for 40 steps on the GPL-3 text
Debian ships (byte tokens) drops its loss from ln 256 to below 3.5.

Usage: learning_test.py PIPERC PIPER_RUN PIPER_TOKENIZE
"""
import json
import os
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN, TOKENIZE = (os.path.abspath(p) for p in sys.argv[1:4])
TEXT = "/usr/share/common-licenses/GPL-3"
STEPS = 40


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout))
    return proc.stdout


def main():
    if not os.path.exists(TEXT):
        sys.exit("missing %s (Debian's base-files package ships it)" % TEXT)
    work = tempfile.mkdtemp(prefix="piper-learn-", dir=os.environ.get("TEST_TMPDIR"))
    tokens = os.path.join(work, "gpl3.bin")
    run([TOKENIZE, TEXT, "-o", tokens])
    model = os.path.join(work, "gpt-tiny.mlir")
    run([PIPERC, "model", "gpt-tiny", "--seq", "64", "--batch", "8", "-o", model])
    out = os.path.join(work, "out")
    run([PIPERC, "compile", model, "--microbatches", "2", "--lr", "3e-3",
         "--warmup-steps", "10", "-o", out])
    metrics = os.path.join(work, "metrics.jsonl")
    run([PIPER_RUN, out, "--nproc", "1", "--steps", str(STEPS), "--seed", "1",
         "--data", tokens, "--metrics", metrics])
    with open(metrics) as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    print("losses:", " ".join("%.3f" % l for l in losses))
    checks = [
        ("starts near ln 256", abs(losses[0] - 5.545) < 0.1),
        ("falls below 3.5 by step %d" % STEPS, losses[-1] < 3.5),
        ("last 5 steps below the first 5", max(losses[-5:]) < min(losses[:5])),
    ]
    failed = 0
    for name, ok in checks:
        print("%s: %s" % ("ok" if ok else "FAIL", name))
        failed += not ok
    print("%d passed, %d failed" % (len(checks) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
