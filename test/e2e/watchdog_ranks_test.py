#!/usr/bin/env python3
"""The watchdog with more than two ranks (gpt-tiny, pp2 x dp2, 4 ranks):
rank 0 reads every rank's heartbeat and the others read only rank 0's
(docs/operations.md §5), yet every rank names the same culprit, whether it
is a rank only rank 0 watches (stopped, or stuck in a SEND) or rank 0
itself; also through the TCP store under torchrun-style variables.
(A rank hung inside a collective or a RECV looks, from outside,
like its peers in the same wait: which of them is named is the watchdog's
deadlock rule, docs/operations.md §5, not tested here.)

Usage: watchdog_ranks_test.py PIPERC PIPER_RUN
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

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

        # The same under torchrun-style variables: the TCP store is rank
        # 0's, which keeps serving it after its verdict until the others
        # have read it (they would otherwise lose it with the store). When
        # rank 0 itself stops, so does the store: every other rank's first
        # store call then waits --timeout-s for an answer, and the store is
        # lost from then on (no later call waits again), so each names rank 0
        # within TIMEOUT + one heartbeat period (1 s) + one poll (0.25 s) of
        # the stop, plus the report and exit: bounded here by 2 x TIMEOUT
        # (before the store was lost for good, every call waited again:
        # 4-5 x TIMEOUT).
        timeout = 3
        for fault, culprit, reason in cases:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            sock.close()
            procs = []
            for r in range(4):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE="4",
                           LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), PIPER_FAULT=fault)
                procs.append(subprocess.Popen(
                    [PIPER_RUN, plans, "--steps", "1000", "--timeout-s",
                     str(timeout)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    text=True, env=env))
            # Every rank's stderr, read as it comes: when the fault acted
            # and when each rank ended.
            errs, ended = [""] * 4, [None] * 4
            faultAt = [None]

            def reader(r):
                for line in procs[r].stderr:
                    if "PIPER_FAULT:" in line and faultAt[0] is None:
                        faultAt[0] = time.monotonic()
                    errs[r] += line
                ended[r] = time.monotonic()

            readers = [threading.Thread(target=reader, args=(r,))
                       for r in range(4)]
            for t in readers:
                t.start()
            # The others first: a stopped culprit never exits by itself
            # (srun or torchrun would kill it once the others failed).
            codes = [None] * 4
            for r in sorted(range(4), key=lambda r: r == culprit):
                pr = procs[r]
                if r == culprit and pr.poll() is None:
                    pr.kill()
                try:
                    pr.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pr.kill()
                    pr.wait()
                readers[r].join()
                codes[r] = pr.returncode
            ok = True
            for r in range(4):
                if r == culprit:
                    continue
                # Rank 0's stop takes its store along: either verdict names
                # it (whichever the watchdog found first).
                why = re.escape(reason) if culprit != 0 else (
                    r"(no heartbeat for|the rendezvous store \(served by "
                    r"rank 0\) failed for)")
                ok = ok and codes[r] == 4 and re.search(
                    r"^piper-run: rank %d: watchdog: rank %d failed: .*%s" %
                    (r, culprit, why), errs[r], re.M)
            check(ok, "TCP store, %s: ranks %s all name rank %d, exit codes "
                  "%s" % (fault, [r for r in range(4) if r != culprit],
                          culprit, codes))
            if not ok:
                for r in range(4):
                    print("rank %d:\n%s" % (r, errs[r][-1500:]))
            if "stall" in fault:
                others = [r for r in range(4) if r != culprit]
                after = [None if ended[r] is None or faultAt[0] is None
                         else round(ended[r] - faultAt[0], 1) for r in others]
                check(all(a is not None and a < 2 * timeout for a in after),
                      "TCP store, %s: ranks %s ended %s s after the stop "
                      "(bound 2 x --timeout-s = %d s)" %
                      (fault, others, after, 2 * timeout))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
