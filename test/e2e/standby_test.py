#!/usr/bin/env python3
"""End-to-end hot spares (--standby): a gpt-tiny run whose rank is killed in
the middle continues on a spare, with the lost state copied from a surviving
data-parallel replica (pp2 x dp2, dp2; under tp2 x dp2 and tp2 x cp2 the
replica of the same tensor-parallel member) or, without one, from the newest
checkpoint (pp2, ZeRO-1 dp2, tp2), and gives the same loss at every step, bit for bit, and
the same final parameters as a run never interrupted; spares are used before
--max-restarts; the error paths are named.

Usage: standby_test.py PIPERC PIPER_RUN
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
STEPS = 6
SEED = 5

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


def piper_run(plans, nproc, extra, env=None, expect=0):
    return run([PIPER_RUN, plans, "--nproc", str(nproc), "--seed", str(SEED),
                "--steps", str(STEPS)] + extra, env, expect)


def compile_plans(work, model, tag, flags):
    plans = os.path.join(work, tag)
    run([PIPERC, "compile", model, "-o", plans] + flags)
    return plans


def reference(work, plans, nproc, tag):
    """An uninterrupted run: its metrics and final parameters."""
    m = os.path.join(work, tag + "-ref.jsonl")
    save = os.path.join(work, tag + "-ref.safetensors")
    piper_run(plans, nproc, ["--metrics", m, "--save", save])
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


def replaced(tag, stderr, rank, step, source):
    """The launcher's and rank 0's lines about the spare taking `rank`'s
    place; returns the seconds from the failure to training again."""
    promoted = re.search(r"rank %d replaced by standby 0, (.*) \(([0-9.]+) s "
                         r"after the failure\)" % rank, stderr)
    again = re.search(r"rank %d replaced by standby 0; training again: step "
                      r"(\d+) done ([0-9.]+) s after the failure" % rank,
                      stderr)
    check(promoted and source.search(promoted.group(1)) and again and
          again.group(1) == str(step),
          "%s: rank %d replaced by standby 0 (%s), %s s after the failure; "
          "step %s done %s s after it" %
          (tag, rank, promoted.group(1) if promoted else "?",
           promoted.group(2) if promoted else "?",
           again.group(1) if again else "?", again.group(2) if again else "?"))
    if not (promoted and again):
        print(stderr)


def main():
    work = tempfile.mkdtemp(prefix="standby-",
                            dir=os.environ.get("TEST_TMPDIR"))
    try:
        model = os.path.join(work, "gpt-tiny.mlir")
        run([PIPERC, "model", "gpt-tiny", "-o", model])

        # pp2 x dp2: rank 3 crashes at the start of step 4; its spare gets
        # the state of step 3 from the other replica of its stage, newer
        # than the checkpoint of step 2.
        pp2dp2 = compile_plans(work, model, "pp2dp2",
                               ["--pp", "2", "--dp", "2", "--microbatches",
                                "2", "--schedule", "1f1b"])
        ref, ref_params = reference(work, pp2dp2, 4, "pp2dp2")
        m = os.path.join(work, "pp2dp2.jsonl")
        save = os.path.join(work, "pp2dp2.safetensors")
        p = piper_run(pp2dp2, 4, ["--standby", "1", "--metrics", m, "--save",
                                  save, "--checkpoint-every", "2",
                                  "--checkpoint-dir",
                                  os.path.join(work, "pp2dp2-ckpt")],
                      {"PIPER_FAULT": "rank=3,action=crash,step=4,attempt=0"})
        check("PIPER_FAULT: crashing" in p.stderr, "pp2dp2: rank 3 crashed")
        replaced("pp2dp2", p.stderr, 3, 4,
                 re.compile(r"state of step 3 from its replica rank \d"))
        same_run("pp2dp2 on a standby", ref, ref_params, m, save)

        # dp2, a crash in the middle of step 3 (instruction 5): the
        # survivor's state of step 2; logs in --log-dir.
        dp2 = compile_plans(work, model, "dp2",
                            ["--dp", "2", "--microbatches", "2"])
        ref, ref_params = reference(work, dp2, 2, "dp2")
        m = os.path.join(work, "dp2.jsonl")
        save = os.path.join(work, "dp2.safetensors")
        logs = os.path.join(work, "dp2-logs")
        p = piper_run(dp2, 2, ["--standby", "1", "--metrics", m, "--save",
                               save, "--log-dir", logs],
                      {"PIPER_FAULT":
                       "rank=1,action=crash,step=3,inst=5,attempt=0"})
        with open(os.path.join(logs, "rank-0.log")) as f:
            rank0 = f.read()
        with open(os.path.join(logs, "rank-1.log")) as f:
            rank1 = f.read()
        with open(os.path.join(logs, "standby-0.log")) as f:
            spare = f.read()
        replaced("dp2", p.stderr + rank0, 1, 3,
                 re.compile(r"state of step 2 from its replica rank 0"))
        check("standby 0: strategy loaded (1 device classes), parked" in spare
              and "standby 0: promoted to rank 1" in spare and
              "rank 1: this is standby 0, promoted" in rank1,
              "dp2: the spare parked, then wrote to rank-1.log")
        same_run("dp2 on a standby", ref, ref_params, m, save)

        # Rank 0 stopped (SIGSTOP) in step 4: the watchdogs name it after
        # --timeout-s, the launcher kills it, and the spare becomes rank 0.
        p = piper_run(dp2, 2, ["--standby", "1", "--timeout-s", "2",
                               "--metrics", m, "--save", save],
                      {"PIPER_FAULT": "rank=0,action=stall,step=4,attempt=0"})
        check("rank 0 failed (watchdog: no heartbeat for" in p.stderr,
              "dp2: the watchdog named the stopped rank 0")
        replaced("dp2 stall", p.stderr, 0, 4,
                 re.compile(r"state of step 3 from its replica rank 1"))
        same_run("dp2 rank 0 on a standby", ref, ref_params, m, save)

        # More failures than spares: a crash in every generation uses the
        # spare, then the restart, then stops.
        p = piper_run(dp2, 2, ["--standby", "1", "--max-restarts", "1",
                               "--checkpoint-dir",
                               os.path.join(work, "dp2-ckpt")],
                      {"PIPER_FAULT": "rank=1,action=crash,step=3"}, expect=1)
        order = [m.group(0) for m in re.finditer(
            r"rank 1 replaced by standby 0|restart 1 of 1: relaunching 2 "
            r"ranks, state of step 2 from its replica rank 0|no standby left "
            r"\(1 of 1 used\)|no restart left \(1 of 1 used\)", p.stderr)]
        check(len(order) == 4 and order[0].startswith("rank 1 replaced") and
              order[1].startswith("restart 1 of 1"),
              "dp2: the spare first, then --max-restarts, then none left: %s"
              % order)
        p = piper_run(dp2, 2, ["--standby", "1"],
                      {"PIPER_FAULT": "rank=1,action=crash,step=3"}, expect=1)
        check("no standby left (1 of 1 used)" in p.stderr and
              "no restart left" not in p.stderr,
              "dp2: a second failure with one spare stops the run")

        # pp2: no replica holds a stage's state, so the spare needs a
        # checkpoint; without --checkpoint-dir that is an error up front.
        pp2 = compile_plans(work, model, "pp2",
                            ["--pp", "2", "--microbatches", "4", "--schedule",
                             "1f1b"])
        p = piper_run(pp2, 2, ["--standby", "1"], expect=1)
        check("--standby needs --checkpoint-dir (with --checkpoint-every) for "
              "this strategy: device class 0 is rank 0 alone" in p.stderr,
              "pp2 without --checkpoint-dir: " + p.stderr.strip())
        ref, ref_params = reference(work, pp2, 2, "pp2")
        ckpt = os.path.join(work, "pp2-ckpt")
        m = os.path.join(work, "pp2.jsonl")
        save = os.path.join(work, "pp2.safetensors")
        p = piper_run(pp2, 2, ["--standby", "1", "--checkpoint-dir", ckpt,
                               "--checkpoint-every", "2", "--metrics", m,
                               "--save", save],
                      {"PIPER_FAULT": "rank=1,action=crash,step=5,attempt=0"})
        replaced("pp2", p.stderr, 1, 5,
                 re.compile(r"every rank resuming from the newest checkpoint "
                            r"of '.*' \(no surviving rank of device class 1 "
                            r"\(ranks 1\) holds its state\)"))
        check("resuming from '%s/step-4' (step 4)" % ckpt in p.stderr,
              "pp2: resumed from step-4")
        same_run("pp2 on a standby", ref, ref_params, m, save)

        # ZeRO-1 dp2: each replica holds only its shard of the moments, so
        # the spare needs a checkpoint, as a pipeline stage does.
        zero = compile_plans(work, model, "dp2-zero1",
                             ["--dp", "2", "--microbatches", "2", "--zero",
                              "1"])
        p = piper_run(zero, 2, ["--standby", "1"], expect=1)
        check("device class 0 shards its state over its replicas (ZeRO)" in
              p.stderr, "ZeRO without --checkpoint-dir: " + p.stderr.strip())
        ref, ref_params = reference(work, zero, 2, "zero1")
        ckpt = os.path.join(work, "zero-ckpt")
        m = os.path.join(work, "zero.jsonl")
        save = os.path.join(work, "zero.safetensors")
        p = piper_run(zero, 2, ["--standby", "1", "--checkpoint-dir", ckpt,
                                "--checkpoint-every", "2", "--metrics", m,
                                "--save", save],
                      {"PIPER_FAULT": "rank=1,action=crash,step=5,attempt=0"})
        replaced("zero1", p.stderr, 1, 5,
                 re.compile(r"every rank resuming from the newest checkpoint "
                            r"of '.*' \(device class 0 shards its state over "
                            r"its replicas \(ZeRO\)"))
        same_run("zero1 on a standby", ref, ref_params, m, save)

        # tp2 x dp2: a rank holds its tensor-parallel member's slices, which
        # the same member of the other data replica holds too (replica r is
        # member r mod 2): rank 3's from rank 1, not rank 0.
        tp2dp2 = compile_plans(work, model, "tp2dp2",
                               ["--tp", "2", "--dp", "2", "--microbatches",
                                "2"])
        ref, ref_params = reference(work, tp2dp2, 4, "tp2dp2")
        m = os.path.join(work, "tp2dp2.jsonl")
        save = os.path.join(work, "tp2dp2.safetensors")
        p = piper_run(tp2dp2, 4, ["--standby", "1", "--metrics", m, "--save",
                                  save],
                      {"PIPER_FAULT": "rank=3,action=crash,step=4,attempt=0"})
        replaced("tp2dp2", p.stderr, 3, 4,
                 re.compile(r"state of step 3 from its replica rank 1$"))
        same_run("tp2dp2 on a standby", ref, ref_params, m, save)

        # tp2 x cp2: context members hold the same slices as well (rank 2
        # is member 0 of the second context member: rank 0's state).
        tp2cp2 = compile_plans(work, model, "tp2cp2",
                               ["--tp", "2", "--cp", "2", "--microbatches",
                                "2"])
        ref, ref_params = reference(work, tp2cp2, 4, "tp2cp2")
        m = os.path.join(work, "tp2cp2.jsonl")
        save = os.path.join(work, "tp2cp2.safetensors")
        p = piper_run(tp2cp2, 4, ["--standby", "1", "--metrics", m, "--save",
                                  save],
                      {"PIPER_FAULT":
                       "rank=2,action=crash,step=4,inst=7,attempt=0"})
        replaced("tp2cp2", p.stderr, 2, 4,
                 re.compile(r"state of step 3 from its replica rank 0$"))
        same_run("tp2cp2 on a standby", ref, ref_params, m, save)

        # tp2 alone: no other rank holds a member's slices, so, as for a
        # pipeline stage, a checkpoint is needed.
        tp2 = compile_plans(work, model, "tp2",
                            ["--tp", "2", "--microbatches", "2"])
        p = piper_run(tp2, 2, ["--standby", "1"], expect=1)
        check("--standby needs --checkpoint-dir (with --checkpoint-every) for "
              "this strategy: device class 0's tensor-parallel member 0 is "
              "rank 0 alone (tensor parallelism without data parallelism)" in
              p.stderr, "tp2 without --checkpoint-dir: " + p.stderr.strip())
        ref, ref_params = reference(work, tp2, 2, "tp2")
        ckpt = os.path.join(work, "tp2-ckpt")
        m = os.path.join(work, "tp2.jsonl")
        save = os.path.join(work, "tp2.safetensors")
        p = piper_run(tp2, 2, ["--standby", "1", "--checkpoint-dir", ckpt,
                               "--checkpoint-every", "2", "--metrics", m,
                               "--save", save],
                      {"PIPER_FAULT": "rank=1,action=crash,step=5,attempt=0"})
        replaced("tp2", p.stderr, 1, 5,
                 re.compile(r"every rank resuming from the newest checkpoint "
                            r"of '.*' \(no surviving rank of device class 0's "
                            r"tensor-parallel member 1 \(ranks 1\) holds its "
                            r"state\)"))
        check("resuming from '%s/step-4' (step 4)" % ckpt in p.stderr,
              "tp2: resumed from step-4")
        same_run("tp2 on a standby", ref, ref_params, m, save)

        # Usage errors.
        p = piper_run(dp2, 2, ["--standby", "1", "--load", save], expect=2)
        check("--standby cannot continue a run from --load" in p.stderr,
              "--standby with --load: " + p.stderr.strip())
        p = run([PIPER_RUN, dp2, "--standby", "1", "--steps", "1"],
                {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, expect=2)
        check("--standby needs piper-run's local launcher" in p.stderr,
              "--standby under torchrun-style variables: " + p.stderr.strip())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
