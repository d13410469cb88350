#!/usr/bin/env python3
"""piper-run's progress output on a compiled gpt-tiny: with --log-every 2 over
5 steps of a 2-stage pipeline, rank 0 prints the lines of steps 2, 4 and 5
(the last), each with every field, then the summary; the summary's peak
memory per rank is what each rank measured. A manifest whose training config
was edited to disagree with the plans is refused before any rank starts.

Usage: progress_test.py PIPERC PIPER_RUN
"""
import json
import os
import re
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])

LINE = re.compile(
    r"step (\d+)/5 \| loss (\S+) \| grad_norm [0-9.]+(?:e[-+]\d+)? \| "
    r"(\d+) tokens/s \| ([0-9.]+) ms/step \| ETA (\d+):(\d\d):(\d\d)$")
SUMMARY = [
    re.compile(r"summary: 5 steps \(steps 1-5\) in [0-9.]+ s wall time"
               r"( \(\d+:\d\d:\d\d\))?$"),
    re.compile(r"summary: mean \d+ tokens/s, [0-9.]+ ms/step over steps 2-5 "
               r"\(first step excluded: warm-up\)$"),
    re.compile(r"summary: peak arena memory per rank: rank 0 (.+), "
               r"rank 1 (.+)$"),
]


def run(cmd, expect=0):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)
    if proc.returncode != expect:
        sys.exit("command exited with %d, not %d: %s\n%s%s" % (
            proc.returncode, expect, " ".join(cmd), proc.stdout, proc.stderr))
    return proc


def format_bytes(n):
    """Progress.cpp's formatBytes."""
    if n < 1024:
        return "%d B" % n
    value, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    unit = 0
    while value >= 1024 and unit < 3:
        value /= 1024
        unit += 1
    return "%.1f %s" % (value, units[unit])


def main():
    work = tempfile.mkdtemp(prefix="piper-progress-",
                            dir=os.environ.get("TEST_TMPDIR"))
    model = os.path.join(work, "gpt-tiny.mlir")
    run([PIPERC, "model", "gpt-tiny", "--seq", "16", "--batch", "2", "-o",
         model])
    out = os.path.join(work, "out")
    run([PIPERC, "compile", model, "--pp", "2", "--microbatches", "2", "-o",
         out])
    metrics = os.path.join(work, "metrics.jsonl")
    logs = os.path.join(work, "logs")
    proc = run([PIPER_RUN, out, "--nproc", "2", "--steps", "5",
                "--log-every", "2", "--metrics", metrics, "--log-dir", logs])
    lines = proc.stdout.splitlines()
    print("\n".join(lines))
    with open(metrics) as f:
        recorded = [json.loads(l) for l in f if l.strip()]

    checks = []
    steps = [LINE.match(l) for l in lines[:-3]]
    checks.append(("progress lines match the format", all(steps)))
    steps = [m for m in steps if m]
    checks.append(("lines of steps 2, 4 and 5 only",
                   [int(m.group(1)) for m in steps] == [2, 4, 5]))
    checks.append(("the metrics file still has every step",
                   [r["step"] for r in recorded] == [1, 2, 3, 4, 5]))
    checks.append(("each line's loss is its step's (9 digits)", all(
        m.group(2) == "%.9g" % recorded[int(m.group(1)) - 1]["loss"]
        for m in steps)))
    checks.append(("ETA is H:MM:SS, 0:00:00 at the last step",
                   bool(steps) and all(int(m.group(6)) < 60 and
                                       int(m.group(7)) < 60 for m in steps)
                   and steps[-1].groups()[4:] == ("0", "00", "00")))
    summary = [p.match(l) for p, l in zip(SUMMARY, lines[-3:])]
    checks.append(("the summary closes the output", len(lines) >= 3 and
                   all(summary)))
    measured = {}
    for r in (0, 1):
        with open(os.path.join(logs, "rank-%d.log" % r)) as f:
            m = re.search(r"rank %d: peak memory: (\d+) bytes" % r, f.read())
        measured[r] = format_bytes(int(m.group(1))) if m else None
    checks.append(("its peak memory per rank is each rank's measurement",
                   bool(summary[2]) and
                   (summary[2].group(1), summary[2].group(2)) ==
                   (measured[0], measured[1])))

    # The manifest's lr edited: an error naming the field and both values.
    manifest = os.path.join(out, "manifest.textproto")
    with open(manifest) as f:
        text = f.read()
    lr = re.search(r"\blr: (\S+)", text)
    checks.append(("the manifest holds the lr", bool(lr)))
    if lr:
        with open(manifest, "w") as f:
            f.write(text.replace(lr.group(0), "lr: 0.125"))
        bad = run([PIPER_RUN, out, "--nproc", "2", "--steps", "1"], expect=1)
        print(bad.stderr, end="")
        checks.append(("an edited manifest is refused, naming lr", re.search(
            r"^piper-run: manifest '.*manifest.textproto' disagrees with its "
            r"plans: training.lr is 0.125 in the manifest but %s in plan file "
            r"'.*' \(device class 0\)$" % re.escape(lr.group(1)),
            bad.stderr, re.M) is not None and bad.stdout == ""))

    failed = 0
    for name, ok in checks:
        print("%s: %s" % ("ok" if ok else "FAIL", name))
        failed += not ok
    print("%d passed, %d failed" % (len(checks) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
