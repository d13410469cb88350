#!/usr/bin/env python3
"""Timelines, predicted and measured, of gpt-tiny under PP2 and PP2 x DP2
1F1B.

piperc compile writes the predicted timeline next to report.txt
(timeline.json, timeline.svg: well-formed, one box per CALL of the trace, one
row per device class). piper-run --trace writes the measured one: valid
JSON, one process per rank named "rank R", its threads named after its
plan's streams, every CALL of the plan exactly once per rank (named as in
the predicted trace), no two events of one stream overlapping, and a
measured bubble in [0, 1) per rank in the metadata. The same when the
ranks are started torchrun-style (the parts then travel through rank 0's
TCP store). An unwritable --trace path and a --trace-step outside the run
are refused before any step.

Usage: trace_test.py PIPERC PIPER_RUN
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
SVG = "{http://www.w3.org/2000/svg}"


def run(cmd, expect=0):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)
    if proc.returncode != expect:
        sys.exit("command exited with %d, not %d: %s\n%s%s" % (
            proc.returncode, expect, " ".join(cmd), proc.stdout, proc.stderr))
    return proc


def predicted(out):
    """The predicted trace's classes: {class: (ranks, stream names, {(stream,
    instruction): name} of its CALLs)}."""
    with open(os.path.join(out, "timeline.json")) as f:
        trace = json.load(f)
    classes = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            ranks = re.search(r"ranks \[([0-9, ]*)\]", e["args"]["name"])
            classes[e["pid"]] = ([int(r) for r in ranks.group(1).split(",")],
                                 {}, {})
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            classes[e["pid"]][1][e["tid"]] = e["args"]["name"]
        elif e["ph"] == "X" and e["cat"] == "CALL":
            classes[e["pid"]][2][(e["tid"], e["args"]["instruction"])] = \
                e["name"]
    return trace, classes


def check_svg(out, classes, checks, what):
    """timeline.svg parses as XML, with a row per class and a box per CALL."""
    root = ET.parse(os.path.join(out, "timeline.svg")).getroot()
    checks.append((what + ": timeline.svg is an SVG document", root.tag == SVG + "svg"))
    rows = [g for g in root.iter(SVG + "g")
            if g.get("class") == "device-class"]
    checks.append((what + ": timeline.svg: one row per device class",
                   len(rows) == len(classes)))
    boxes = [r for r in root.iter(SVG + "rect") if r.get("class") == "box call"]
    calls = sum(len(c[2]) for c in classes.values())
    checks.append((what + ": timeline.svg: one box per CALL (%d)" % calls,
                   len(boxes) == calls))


def check_measured(path, classes, world, step, checks, what):
    with open(path) as f:
        trace = json.load(f)  # valid JSON, or the test fails here
    meta = trace["metadata"]
    checks.append((what + ": measured, step %d, %d ranks" % (step, world),
                   meta["source"] == "measured" and meta["step"] == step
                   and meta["world_size"] == world))
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    checks.append((what + ": one process per rank, named 'rank R'",
                   names == {r: "rank %d" % r for r in range(world)}))
    for c, (ranks, streams, calls) in classes.items():
        for r in ranks:
            threads = {e["tid"]: e["args"]["name"] for e in events
                       if e["ph"] == "M" and e["name"] == "thread_name"
                       and e["pid"] == r}
            checks.append((what + ": rank %d's tracks are its plan's streams"
                           % r, threads == streams))
            seen = {}
            for e in events:
                if e["ph"] == "X" and e["pid"] == r and e["cat"] == "CALL":
                    key = (e["tid"], e["args"]["instruction"])
                    seen.setdefault(key, []).append(e["name"])
            checks.append((what + ": rank %d runs every CALL of its plan "
                           "once, named as predicted" % r,
                           {k: v for k, v in seen.items()} ==
                           {k: [v] for k, v in calls.items()}))
    overlaps = 0
    tracks = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(
                (e["ts"], e["dur"]))
    for spans in tracks.values():
        spans.sort()
        overlaps += sum(1 for a, b in zip(spans, spans[1:])
                        if a[0] + a[1] > b[0] + 1e-3)
    checks.append((what + ": no two events of one stream overlap",
                   overlaps == 0 and tracks))
    bubbles = meta["bubble_fraction"]
    checks.append((what + ": a measured bubble in [0, 1) per rank %s"
                   % bubbles, len(bubbles) == world
                   and all(b is not None and 0 <= b < 1 for b in bubbles)))
    checks.append((what + ": events start at or after time 0",
                   all(e["ts"] >= 0 for e in events if e["ph"] == "X")))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun_style(out, world, args):
    """Starts the `world` ranks of `out` with torchrun's variables at once;
    returns rank 0's stderr."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([PIPER_RUN, out] + args, env=env,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in procs]
    for r, p in enumerate(procs):
        if p.returncode != 0:
            sys.exit("rank %d exited with %d:\n%s%s" % (
                r, p.returncode, outputs[r][0], outputs[r][1]))
    return outputs[0][1]


def main():
    work = tempfile.mkdtemp(prefix="piper-trace-",
                            dir=os.environ.get("TEST_TMPDIR"))
    model = os.path.join(work, "gpt-tiny.mlir")
    run([PIPERC, "model", "gpt-tiny", "--seq", "16", "--batch", "2", "-o",
         model])
    checks = []
    for what, flags, world, steps in [
            ("pp2 1f1b", ["--pp", "2"], 2, ["--steps", "2"]),
            ("pp2 x dp2 1f1b", ["--pp", "2", "--dp", "2"], 4,
             ["--steps", "3", "--trace-step", "2"])]:
        out = os.path.join(work, what.replace(" ", "_"))
        run([PIPERC, "compile", model, "--microbatches", "4", "--schedule",
             "1f1b", "-o", out] + flags)
        with open(os.path.join(out, "report.txt")) as f:
            report = f.read()
        checks.append((what + ": report.txt names the timeline files",
                       "predicted timeline: timeline.json (Chrome/Perfetto "
                       "trace), timeline.svg (picture)" in report))
        _, classes = predicted(out)
        check_svg(out, classes, checks, what)
        path = os.path.join(work, what.replace(" ", "_") + ".trace.json")
        proc = run([PIPER_RUN, out, "--nproc", str(world), "--trace", path]
                   + steps)
        step = int(steps[-1])
        checks.append((what + ": piper-run prints the bubble per rank",
                       ("trace of step %d written to '%s'" % (step, path))
                       in proc.stderr and
                       all(re.search(r"rank %d: step [0-9.]+ ms, compute busy "
                                     r"[0-9.]+ ms, bubble [0-9.]+%%" % r,
                                     proc.stderr) for r in range(world))))
        check_measured(path, classes, world, step, checks, what)

    # Under torchrun-style variables: rank 0's TCP store carries the parts.
    out = os.path.join(work, "pp2_1f1b")
    _, classes = predicted(out)
    path = os.path.join(work, "torchrun.trace.json")
    stderr = run_torchrun_style(out, 2, ["--steps", "2", "--trace", path])
    checks.append(("torchrun-style: rank 0 writes the trace",
                   "trace of step 2 written to '%s'" % path in stderr))
    check_measured(path, classes, 2, 2, checks, "torchrun-style pp2 1f1b")

    # Refused before any rank starts.
    # (A folder under a regular file cannot be created, even by root.)
    under_file = os.path.join(out, "report.txt", "t.json")
    for target, message in [
            (under_file, "piper-run: --trace '%s': " % under_file),
            (work, "piper-run: --trace '%s': is a directory" % work)]:
        proc = run([PIPER_RUN, out, "--nproc", "2", "--steps", "1", "--trace",
                    target], expect=1)
        checks.append(("an unwritable --trace is refused before training: "
                       + proc.stderr.strip(),
                       message in proc.stderr and "step 1/" not in proc.stdout))
    proc = run([PIPER_RUN, out, "--nproc", "2", "--steps", "2", "--trace",
                os.path.join(work, "t.json"), "--trace-step", "3"], expect=2)
    checks.append(("--trace-step past the run is a usage error",
                   "piper-run: --trace-step 3 is not a step of this run (it "
                   "runs steps 1 to 2)" in proc.stderr))
    proc = run([PIPER_RUN, out, "--nproc", "2", "--steps", "0", "--trace",
                os.path.join(work, "t.json")], expect=2)
    checks.append(("--trace without a step is a usage error",
                   "piper-run: --trace: this run has no step to trace "
                   "(--steps 0)" in proc.stderr))

    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print("%s: %s" % ("ok  " if ok else "FAIL", name))
    if failed:
        sys.exit("%d check(s) failed" % len(failed))


if __name__ == "__main__":
    main()
