#!/usr/bin/env python3
"""End-to-end numerics: one small GPT trained under several strategies gives
the same loss at every step and the same final parameters as one device.

Usage: strategies_test.py PIPERC PIPER_RUN
"""
import array
import json
import os
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
STEPS = 5
SEED = 7
# Loss: same global batch, same seed; only the reduction order may differ.
LOSS_RTOL = 1e-5
# Parameters after 5 AdamW steps (lr 1e-3): AdamW divides each gradient by
# its own running magnitude, so round-off in a near-zero gradient can move an
# element by a small fraction of lr. 1e-4 is 10% of one step's size.
PARAM_ATOL = 1e-4

# (name, piperc flags, ranks): every strategy uses 8 microbatches of 4.
STRATEGIES = [
    ("1 device", ["--microbatches", "8"], 1),
    ("pp2 x dp2, 1f1b, 4 mb", ["--pp", "2", "--dp", "2", "--microbatches", "4",
                                "--schedule", "1f1b"], 4),
    ("pp4, gpipe, 8 mb", ["--pp", "4", "--microbatches", "8",
                          "--schedule", "gpipe"], 4),
    ("dp4, 2 mb", ["--dp", "4", "--microbatches", "2"], 4),
]


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout))
    return proc.stdout


def load_params(folder):
    params = {}
    for name in sorted(os.listdir(folder)):
        values = array.array("f")
        with open(os.path.join(folder, name), "rb") as f:
            values.frombytes(f.read())
        params[name] = values
    return params


def main():
    work = tempfile.mkdtemp(prefix="piper-e2e-", dir=os.environ.get("TEST_TMPDIR"))
    model = os.path.join(work, "gpt.mlir")
    run([PIPERC, "model", "gpt", "--layers", "4", "--hidden", "64", "--heads", "4",
         "--vocab", "256", "--seq", "32", "--batch", "4", "-o", model])
    results = []
    for i, (name, flags, ranks) in enumerate(STRATEGIES):
        out = os.path.join(work, "plans%d" % i)
        metrics = os.path.join(work, "metrics%d.jsonl" % i)
        params = os.path.join(work, "params%d" % i)
        run([PIPERC, "compile", model, "-o", out] + flags)
        run([PIPER_RUN, out, "--nproc", str(ranks), "--backend", "cpu",
             "--steps", str(STEPS), "--seed", str(SEED), "--metrics", metrics,
             "--save-params", params])
        with open(metrics) as f:
            losses = [json.loads(line)["loss"] for line in f if line.strip()]
        if len(losses) != STEPS:
            sys.exit("%s: expected %d metrics lines, got %d" % (name, STEPS, len(losses)))
        results.append((name, losses, load_params(params)))

    failures = 0
    ref_name, ref_losses, ref_params = results[0]
    if not ref_losses[-1] < ref_losses[0]:
        print("FAIL: the loss does not fall on one device: %s" % ref_losses)
        failures += 1
    for name, losses, params in results[1:]:
        for step, (a, b) in enumerate(zip(ref_losses, losses), 1):
            rel = abs(a - b) / abs(a)
            status = "ok" if rel <= LOSS_RTOL else "FAIL"
            failures += status == "FAIL"
            print("%s: %s step %d loss %.9f vs %.9f (rel %.2e)" %
                  (status, name, step, b, a, rel))
        if sorted(params) != sorted(ref_params):
            print("FAIL: %s: parameter set differs: %s" %
                  (name, sorted(set(params) ^ set(ref_params))))
            failures += 1
            continue
        worst, where = 0.0, ""
        for key, ref in ref_params.items():
            if len(ref) != len(params[key]):
                print("FAIL: %s: %s has %d elements, expected %d" %
                      (name, key, len(params[key]), len(ref)))
                failures += 1
                continue
            for x, y in zip(ref, params[key]):
                if abs(x - y) > worst:
                    worst, where = abs(x - y), key
        status = "ok" if worst <= PARAM_ATOL else "FAIL"
        failures += status == "FAIL"
        print("%s: %s final parameters: max |diff| %.2e (%s)" %
              (status, name, worst, where or "all equal"))
    print("%d passed, %d failed" % (3 * (STEPS + 1) - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
