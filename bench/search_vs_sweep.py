#!/usr/bin/env python3
"""piperc search against an exhaustive measured sweep (docs/search.md §5).

Calibrates a CPU machine file (bench/calibrate_cpu.py), searches the whole
space of a 4-block Llama on RANKS ranks (default 2, one core each; the
issue's 4 needs a host of 4 cores) with it, then trains every strategy the
search found with piper-run and compares: the search's first strategy,
measured, against the fastest measured of the whole space (the issue's
goal: within 15 %), and the Spearman correlation of predicted and measured
over the space. A benchmark, not a test.

Usage: [RANKS=N] bench/search_vs_sweep.py PIPERC PIPER_PLAN PIPER_RUN
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The same arguments, environment (one BLAS thread a rank) and runner.
from calibrate_cpu import (PIPERC, PIPER_PLAN, PIPER_RUN, RANKS,  # noqa: E402
                           measure, model, run, spearman)


def main():
    work = tempfile.mkdtemp(prefix="piper-sweep-")
    machine = os.path.join(work, "cpu.json")
    print(run([sys.executable, os.path.join(HERE, "calibrate_cpu.py"), PIPERC,
               PIPER_PLAN, PIPER_RUN, machine]))
    # The model calibrate_cpu.py sweeps.
    mlir = model(work, "m", 256, 256)
    found = os.path.join(work, "found")
    table = run([PIPERC, "search", mlir, "--devices", str(RANKS), "--device-memory",
                 "4GiB", "--global-batch", "8", "--machine", machine,
                 "--max-compiles", "100000", "--top", "100000", "-o", found])
    print(table.splitlines()[0])
    rows = [l for l in table.splitlines() if l[:1].isdigit()]
    measured, names = [], []
    for i, row in enumerate(rows, 1):
        _, t = measure(work, mlir, ["--strategy",
                                     os.path.join(found, "%d.json" % i)], RANKS)
        names.append(" ".join(row[5:73].split()))
        measured.append(t)
        print("%3d %-60s measured %.4f s" % (i, names[-1], t))
    best = min(range(len(measured)), key=lambda k: measured[k])
    ratio = measured[0] / measured[best]
    n = len(measured)
    rho = spearman(list(range(n)), measured)  # the search's order: 0, 1, ...
    print("search's first: %s, measured %.4f s; fastest measured: #%d %s, "
          "%.4f s; first / fastest = %.2f (goal <= 1.15); Spearman of the "
          "search's order and the measured order over %d strategies: %.2f" %
          (names[0], measured[0], best + 1, names[best], measured[best], ratio,
           n, rho))


if __name__ == "__main__":
    main()
