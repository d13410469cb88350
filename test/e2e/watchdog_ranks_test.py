#!/usr/bin/env python3
"""The watchdog with more than two ranks (gpt-tiny, pp2 x dp2, 4 ranks):
rank 0 reads every rank's heartbeat and the others read only rank 0's
(docs/operations.md §5), yet every rank names the same culprit, whether it
is a rank only rank 0 watches (stopped, or stuck in a SEND) or rank 0
itself. (A rank hung inside a collective or a RECV looks, from outside,
like its peers in the same wait: which of them is named is the watchdog's
deadlock rule, docs/operations.md §5, not tested here.)

Usage: watchdog_ranks_test.py PIPERC PIPER_RUN
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])

passed = failed = 0


def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    sys.stdout.flush()


def run(cmd, env=None):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120, env=full)


def main():
    work = tempfile.mkdtemp(prefix="watchdog-ranks-",
                            dir=os.environ.get("TEST_TMPDIR"))
    try:
        model = os.path.join(work, "gpt-tiny.mlir")
        run([PIPERC, "model", "gpt-tiny", "-o", model])
        plans = os.path.join(work, "pp2dp2")
        run([PIPERC, "compile", model, "-o", plans, "--pp", "2", "--dp", "2",
             "--microbatches", "2", "--schedule", "1f1b"])
        cases = [
            ("rank=2,action=stall,step=2", 2, "no heartbeat for"),
            ("rank=0,action=stall,step=2", 0, "no heartbeat for"),
            # A SEND that never completes: its rank waits on nobody.
            ("rank=3,action=hang_comm,step=2,stream=pp_stream,inst=3", 3,
             "stuck: heartbeat alive"),
        ]
        for fault, culprit, reason in cases:
            p = run([PIPER_RUN, plans, "--nproc", "4", "--steps", "1000",
                     "--timeout-s", "3"], {"PIPER_FAULT": fault})
            named = re.findall(r"^piper-run: rank (\d): watchdog: rank (\d) "
                               r"failed: (.*)$", p.stderr, re.M)
            by = {int(r): (int(c), why) for r, c, why in named}
            others = [r for r in range(4) if r != culprit]
            check(p.returncode == 1 and
                  all(r in by and by[r][0] == culprit and reason in by[r][1]
                      for r in others) and
                  "rank %d failed" % culprit in p.stderr,
                  "%s: ranks %s all name rank %d (%s)" %
                  (fault, others, culprit, reason))
            if not all(r in by and by[r][0] == culprit for r in others):
                print("rc %d, verdicts %s\n%s" % (p.returncode, by,
                                                   p.stderr[-3000:]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
