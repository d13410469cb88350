#!/usr/bin/env python3
"""Trains the same compiled plans on two backends and compares the losses.

  compare_backends.py compile PIPERC PLANS_DIR
      compiles every case below into PLANS_DIR/<case> (done where piperc is:
      the development machine, or scripts/gpu_bundle.sh).
  compare_backends.py run PIPER_RUN PLANS_DIR BACKEND [--comm C] [--steps N]
      [--only NAME,...] [--table FILE] [--timeout-s T] [--wall-s S]
      trains every case for N steps (default 5) on --backend cpu and on
      BACKEND (cuda, or cuda-emulation; a case may add piper-run options
      there, e.g. --attention cudnn, and require BACKEND to give the same
      losses exactly without some of them, e.g. --step-graph on: then it
      runs once more without them) and compares each step's loss:
      fp32 within 1e-4 relative, bf16 within 2e-2 (a one-ulp difference of
      an fp32 sum can flip a bf16 rounding, 2^-8 relative, in an
      activation). Multi-rank cases run with BACKEND's ranks on one device
      (--comm gloo stages collectives through host memory). Prints one row
      per case; exits 1 if any case fails. --timeout-s T is passed to
      every piper-run (its watchdog: a rank stuck for T seconds stops the
      run); --wall-s S kills a piper-run still running after S seconds
      (default 900) and fails its case with a message.
  compare_backends.py list
      prints the case names, one a line (scripts/gpu_check.sh runs them one
      at a time, to skip those past its deadline).
  compare_backends.py test PIPERC PIPER_RUN BACKEND [run options]
      both: compiles into a temporary folder, then runs (the e2e test
      //test/e2e:cuda_emulation_test with BACKEND cuda-emulation).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

# name -> (model args, compile args, ranks, dtype[, piper-run args of the
# backend compared with the cpu[, of those, the ones without which the
# backend must give the same losses exactly: run once more without them]])
CASES = {
    "gpt-tiny": (["gpt-tiny"], ["--microbatches", "2"], 1, "f32"),
    "llama-tiny": (["llama-tiny"], ["--microbatches", "2"], 1, "f32"),
    "qwen3-moe-tiny": (["qwen3-moe-tiny"], ["--microbatches", "2"], 1, "f32"),
    # Qwen3's q/k norm and a head size of its own (4 heads of 24, hidden 64),
    # under tensor parallelism (the ranks share the GPU).
    "qwen3-tiny-tp2": (["qwen3-tiny"], ["--tp", "2", "--microbatches", "2"],
                       2, "f32"),
    "gpt-tiny-bf16": (["gpt-tiny"], ["--microbatches", "2", "--dtype", "bf16"],
                      1, "bf16"),
    # Attention on the fused path: cuDNN's flash attention on cuda, its host
    # model on cuda-emulation (runtime/hal/gpu/host/HostFusedAttention.h);
    # llama-tiny's rotary embeddings and shared key/value heads go through
    # the path's packing and unpacking. The bf16 bound holds: the path only
    # moves where activations are rounded to bf16 (q and k after their
    # rotation, y, the gradients), each 2^-8 relative.
    "gpt-tiny-bf16-cudnn": (["gpt-tiny"],
                            ["--microbatches", "2", "--dtype", "bf16"], 1,
                            "bf16", ["--attention", "cudnn"]),
    "llama-tiny-bf16-cudnn": (["llama-tiny"],
                              ["--microbatches", "2", "--dtype", "bf16"], 1,
                              "bf16", ["--attention", "cudnn"]),
    # Steps as CUDA graphs (--step-graph on, docs/runtime.md): steps 2 and
    # 3 captured, 4 and 5 launched from their captures, also with cuDNN's
    # attention in the captured work. The same launches on the same memory
    # as steps issued as usual: the losses must equal those of the same
    # backend without --step-graph on, every digit (and so the bf16 bound
    # against the cpu holds as for the cases above).
    "gpt-tiny-bf16-graph": (["gpt-tiny"],
                            ["--microbatches", "2", "--dtype", "bf16"], 1,
                            "bf16", ["--step-graph", "on"],
                            ["--step-graph", "on"]),
    "llama-tiny-bf16-cudnn-graph": (["llama-tiny"],
                                    ["--microbatches", "2", "--dtype", "bf16"],
                                    1, "bf16",
                                    ["--attention", "cudnn", "--step-graph",
                                     "on"], ["--step-graph", "on"]),
    "llama-tiny-pp2-dp2": (["llama-tiny"],
                           ["--pp", "2", "--dp", "2", "--microbatches", "4"],
                           4, "f32"),
    "qwen3-moe-tiny-dp2-ep2": (["qwen3-moe-tiny"],
                               ["--dp", "2", "--ep", "2", "--microbatches", "2"],
                               2, "f32"),
    "gpt-tiny-dp2-zero3": (["gpt-tiny"],
                           ["--dp", "2", "--zero", "3", "--microbatches", "2"],
                           2, "f32"),
}
BOUND = {"f32": 1e-4, "bf16": 2e-2}


def run(cmd, timeout=900):
    """(exit status, output). The status is None when the command was still
    running after `timeout` seconds and was stopped: a hung GPU run becomes a
    failed case, not a traceback that loses the table. The output goes
    through a file, not a pipe, so that what was printed before the stop can
    be read even if a stray child still holds it open (piper-run's ranks get
    SIGKILL when it exits, PR_SET_PDEATHSIG, but not every child need)."""
    with tempfile.TemporaryFile() as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            proc.terminate()  # piper-run stops its ranks and says so
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        f.seek(0)
        out = f.read().decode(errors="replace")
    if rc is None:
        out += "\n[stopped: still running after %d s]" % timeout
    return rc, out


def failure(what, rc, seconds):
    if rc is None:
        return "%s timed out after %d s" % (what, seconds)
    return "%s failed (%d)" % (what, rc)


def must(cmd):
    rc, out = run(cmd)
    if rc != 0:
        sys.exit("%s: %s\n%s" % (failure("command", rc, 900), " ".join(cmd),
                                  out))
    return out


def compile_all(piperc, plans):
    os.makedirs(plans, exist_ok=True)
    for name, (model, args, *_) in CASES.items():
        mlir = os.path.join(plans, name + ".mlir")
        must([piperc, "model"] + model + ["--seq", "32", "--batch", "4", "-o",
                                          mlir])
        must([piperc, "compile", mlir] + args + ["-o",
                                                 os.path.join(plans, name)])
        os.remove(mlir)
    print("compiled %d plans into %s" % (len(CASES), plans))


def train(piper_run, plan, ranks, backend, comm, steps, work, limits,
          extra=(), tag=""):
    """(losses, error headline, error detail, seconds); losses is None on an
    error."""
    timeout_s, wall_s = limits
    metrics = os.path.join(work, "%s-%s%s.jsonl" % (os.path.basename(plan),
                                                    backend, tag))
    cmd = [piper_run, plan, "--nproc", str(ranks), "--steps", str(steps),
           "--seed", "3", "--backend", backend, "--metrics", metrics]
    if comm and backend != "cpu":
        cmd += ["--comm", comm]
    if timeout_s:
        cmd += ["--timeout-s", timeout_s]
    cmd += list(extra)
    start = time.time()
    rc, out = run(cmd, wall_s)
    seconds = time.time() - start
    if rc != 0:
        # The end of the output: the rank's error and the watchdog's report.
        return (None, failure(backend, rc, wall_s),
                " ".join(cmd) + "\n" + out.strip()[-6000:], seconds)
    try:
        with open(metrics) as f:
            losses = [json.loads(line)["loss"] for line in f if line.strip()]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, "%s: unreadable --metrics" % backend, repr(e), seconds
    return losses, "", "", seconds


def compare_all(piper_run, plans, backend, comm, steps, only, table, limits):
    work = tempfile.mkdtemp(prefix="piper-backends-",
                            dir=os.environ.get("TEST_TMPDIR"))
    rows, failed = [], 0
    for name, (_, _, ranks, dtype, *extra) in CASES.items():
        if only and name not in only:
            continue
        plan = os.path.join(plans, name)
        want, err, detail, seconds = train(piper_run, plan, ranks, "cpu",
                                           None, steps, work, limits)
        got = None
        if not err:
            got, err, detail, seconds = train(piper_run, plan, ranks, backend,
                                              comm, steps, work, limits,
                                              extra[0] if extra else ())
        if not err and len(extra) > 1:
            # The same backend without extra[1]: the same losses exactly.
            plain = [a for a in extra[0] if a not in extra[1]]
            twin, err, detail, _ = train(piper_run, plan, ranks, backend,
                                         comm, steps, work, limits, plain,
                                         tag="twin")
            if not err and twin != got:
                err = "differs from %s without %s" % (backend,
                                                      " ".join(extra[1]))
                detail = "with %s, without %s" % (got, twin)
        worst = None
        if not err:
            if len(want) != steps or len(got) != steps:
                err = "expected %d losses, got %d and %d" % (steps, len(want),
                                                              len(got))
            else:
                worst = max(abs(g - w) / max(abs(w), 1e-12)
                            for w, g in zip(want, got))
                if not worst <= BOUND[dtype]:
                    err = "losses differ"
                    detail = "cpu %s, %s %s" % (want, backend, got)
        ok = not err
        failed += not ok
        rows.append("| %s | %d | %s | %s | %s | %s | %.1f s |" % (
            name, ranks, dtype,
            " ".join("%.5f" % l for l in (got or [])) or "-",
            "-" if worst is None else "%.1e" % worst,
            "ok" if ok else "FAIL: " + err, seconds))
        if err:
            print("FAIL %s: %s\n%s" % (name, err, detail), flush=True)
    header = ("| case | ranks | dtype | %s losses | worst relative diff vs cpu "
              "| result | time |\n|---|---|---|---|---|---|---|" % backend)
    text = header + "\n" + "\n".join(rows)
    print(text)
    if table:
        with open(table, "w") as f:
            f.write(text + "\n")
    print("%d passed, %d failed" % (len(rows) - failed, failed))
    return 1 if failed else 0


def main(argv):
    if argv == ["list"]:
        print("\n".join(CASES))
        return 0
    if len(argv) >= 3 and argv[0] == "compile":
        compile_all(argv[1], argv[2])
        return 0
    if len(argv) >= 4 and argv[0] in ("run", "test"):
        if argv[0] == "test":
            plans = tempfile.mkdtemp(prefix="piper-plans-",
                                     dir=os.environ.get("TEST_TMPDIR"))
            compile_all(argv[1], plans)
            argv = ["run", argv[2], plans] + argv[3:]
        piper_run, plans, backend = argv[1:4]
        rest = argv[4:]
        opts = {"--comm": None, "--steps": "5", "--only": "", "--table": None,
                "--timeout-s": None, "--wall-s": "900"}
        while rest:
            if rest[0] not in opts or len(rest) < 2:
                sys.exit(__doc__)
            opts[rest[0]] = rest[1]
            rest = rest[2:]
        only = [n for n in opts["--only"].split(",") if n]
        unknown = [n for n in only if n not in CASES]
        if unknown:
            sys.exit("unknown case %s; the cases: %s" % (
                ", ".join(unknown), ", ".join(CASES)))
        limits = (opts["--timeout-s"], int(opts["--wall-s"]))
        return compare_all(piper_run, plans, backend, opts["--comm"],
                           int(opts["--steps"]), only, opts["--table"],
                           limits)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
