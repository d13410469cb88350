#!/usr/bin/env python3
"""piperc search against an exhaustive measured sweep (docs/search.md §5).

Calibrates a CPU machine file (bench/calibrate_cpu.py), searches the whole
space of a 4-block Llama on 2 ranks (one core each: this machine has 2) with
it, then trains every strategy the search found with piper-run and compares:
the search's first strategy, measured, against the fastest measured of the
whole space (the issue's goal: within 15 %), and the Spearman correlation of
predicted and measured over the space. A benchmark, not a test.

Usage: bench/search_vs_sweep.py PIPERC PIPER_PLAN PIPER_RUN
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

PIPERC, PIPER_PLAN, PIPER_RUN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
sys.path.insert(0, HERE)
STEPS = 5


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=ENV, timeout=1800)
    if p.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stdout))
    return p.stdout


def main():
    work = tempfile.mkdtemp(prefix="piper-sweep-")
    machine = os.path.join(work, "cpu.json")
    print(run([sys.executable, os.path.join(HERE, "calibrate_cpu.py"), PIPERC,
               PIPER_PLAN, PIPER_RUN, machine]).splitlines()[0])
    model = os.path.join(work, "m.mlir")
    run([PIPERC, "model", "llama", "--layers", "4", "--hidden", "256",
         "--heads", "8", "--kv-heads", "4", "--vocab", "512", "--seq", "256",
         "--batch", "2", "-o", model])
    found = os.path.join(work, "found")
    table = run([PIPERC, "search", model, "--devices", "2", "--device-memory",
                 "4GiB", "--global-batch", "8", "--machine", machine,
                 "--max-compiles", "100000", "--top", "100000", "-o", found])
    print(table.splitlines()[0])
    rows = [l for l in table.splitlines() if l[:1].isdigit()]
    predicted, measured, names = [], [], []
    for i, row in enumerate(rows, 1):
        plans = os.path.join(work, "plans%d" % i)
        run([PIPERC, "compile", model, "--strategy",
             os.path.join(found, "%d.json" % i), "-o", plans])
        metrics = os.path.join(work, "metrics.jsonl")
        run([PIPER_RUN, plans, "--nproc", "2", "--backend", "cpu", "--steps",
             str(STEPS), "--metrics", metrics])
        with open(metrics) as f:
            times = [json.loads(l)["step_time_s"] for l in f if l.strip()]
        t = statistics.median(times[2:])
        names.append(" ".join(row[5:73].split()))
        predicted.append(i)  # the search's rank
        measured.append(t)
        print("%3d %-60s measured %.4f s" % (i, names[-1], t))
    best = min(range(len(measured)), key=lambda k: measured[k])
    ratio = measured[0] / measured[best]
    n = len(measured)
    order = sorted(range(n), key=lambda k: measured[k])
    rank = [0] * n
    for r, k in enumerate(order):
        rank[k] = r
    rho = 1 - 6 * sum((k - rank[k]) ** 2 for k in range(n)) / (n * (n * n - 1))
    print("search's first: %s, measured %.4f s; fastest measured: #%d %s, "
          "%.4f s; first / fastest = %.2f (goal <= 1.15); Spearman of the "
          "search's order and the measured order over %d strategies: %.2f" %
          (names[0], measured[0], best + 1, names[best], measured[best], ratio,
           n, rho))


if __name__ == "__main__":
    main()
