#!/usr/bin/env python3
"""Checkpoint integrity end to end (issue 18): checkpoints of gpt-tiny,
whole (one rank) and sharded (DP2 ZeRO-1, rank-R.safetensors), corrupted
in each way the issue found, then --resume. Every corruption is refused
(exit 1, never a crash) with a message naming the file and the tensor;
--resume-fallback resumes from the previous checkpoint that verifies, and
continues bit for bit as the uninterrupted run; a state.json with
wrong-typed fields is skipped, with a message, for the previous checkpoint.

Usage: checkpoint_integrity_test.py PIPERC PIPER_RUN
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

PIPERC, PIPER_RUN = (os.path.abspath(p) for p in sys.argv[1:3])
SEED = 3
STEPS = 4

passed = failed = 0


def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    sys.stdout.flush()


def run(cmd, expect=0):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)
    if expect is not None and proc.returncode != expect:
        sys.exit("command exited %d, expected %d: %s\nstdout:\n%s\nstderr:\n%s"
                 % (proc.returncode, expect, " ".join(cmd), proc.stdout,
                    proc.stderr))
    return proc


def piper_run(plans, nproc, ckpt, extra=(), expect=0):
    return run([PIPER_RUN, plans, "--nproc", str(nproc), "--seed", str(SEED),
                "--steps", str(STEPS), "--checkpoint-dir", ckpt,
                "--checkpoint-every", "2", "--keep-checkpoints", "3"]
               + list(extra), expect)


def header(path):
    """(header dict, offset of the data section) of a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def tensor_at(path, offset):
    """The tensor whose bytes hold file offset `offset`."""
    h, base = header(path)
    for name, t in h.items():
        if name != "__metadata__":
            b, e = t["data_offsets"]
            if base + b <= offset < base + e:
                return name
    return None


def element_offset(path, tensor, i):
    h, base = header(path)
    return base + h[tensor]["data_offsets"][0] + 4 * i


def flip(path, offset, mask):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def forge(step_dir, name, tensor, i, value):
    """Writes float `value` into element `i` of `tensor` of file `name` and
    updates every CRC-32 (the file's metadata, state.json) to match, as a
    run that diverged would have written it."""
    path = os.path.join(step_dir, name)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    h, base = header(path)
    b, e = h[tensor]["data_offsets"]
    data[base + b + 4 * i:base + b + 4 * i + 4] = struct.pack("<f", value)
    crc = "%08x" % zlib.crc32(bytes(data[base + b:base + e]))
    old = json.loads(h["__metadata__"]["piper.crc32"])[tensor]
    # The CRC-32s are JSON in a metadata string: quotes escaped.
    key = '\\"%s\\":\\"%s\\"'
    head = bytes(data[8:base])
    assert head.count((key % (tensor, old)).encode()) == 1
    data[8:base] = head.replace((key % (tensor, old)).encode(),
                                (key % (tensor, crc)).encode())
    with open(path, "wb") as f:
        f.write(data)
    state_path = os.path.join(step_dir, "state.json")
    with open(state_path) as f:
        state = json.load(f)
    state["files"][name]["tensors"][tensor] = crc
    state["files"][name]["header_crc32"] = "%08x" % zlib.crc32(bytes(
        data[:base]))
    with open(state_path, "w") as f:
        json.dump(state, f)


def fresh_copy(src, work, tag):
    dst = os.path.join(work, tag)
    shutil.copytree(src, dst)
    return dst


def metrics(path):
    with open(path) as f:
        return [(o["step"], o["loss"], o["grad_norm"])
                for o in map(json.loads, f) if o]


def refused(p, what, *texts):
    """p exited 1 (not a crash) with every one of `texts` on stderr."""
    ok = p.returncode == 1 and all(t in p.stderr for t in texts)
    check(ok, "%s: refused: %s" % (what, p.stderr.strip().splitlines()[-1][:300]
                                   if p.stderr.strip() else "(no message)"))
    if not ok:
        print("  exit %d, wanted %r\n%s" % (p.returncode, texts, p.stderr))


def whole_cases(work, plans):
    """One rank: model.safetensors and optimizer.safetensors."""
    ref_metrics = os.path.join(work, "whole-ref.jsonl")
    ck_a = os.path.join(work, "whole-a")
    ck_b = os.path.join(work, "whole-b")
    piper_run(plans, 1, ck_a, ["--metrics", ref_metrics])
    piper_run(plans, 1, ck_b)
    with open(os.path.join(ck_a, "step-4", "state.json")) as f:
        state = json.load(f)
    model_file = state["files"]["model.safetensors"]
    check(state["version"] == 3 and len(state["run_id"]) == 32 and
          all(len(c) == 8 for c in model_file["tensors"].values()),
          "state.json records the run id and every tensor's CRC-32 (%d "
          "tensors)" % len(model_file["tensors"]))
    meta, _ = header(os.path.join(ck_a, "step-4", "optimizer.safetensors"))
    check(meta["__metadata__"]["piper.run_id"] == state["run_id"],
          "every file records the run id")

    def resume(ckpt, extra=(), expect=1):
        return piper_run(plans, 1, ckpt, ["--resume"] + list(extra), expect)

    model = os.path.join("step-4", "model.safetensors")
    optim = os.path.join("step-4", "optimizer.safetensors")
    params = [n for n in header(os.path.join(ck_a, model))[0]
              if n != "__metadata__"]
    moments = [n for n in header(os.path.join(ck_a, optim))[0]
               if n.endswith(".exp_avg")]

    ck = fresh_copy(ck_a, work, "sign")
    flip(os.path.join(ck, model), element_offset(os.path.join(ck, model),
                                                 params[0], 0) + 3, 0x80)
    refused(resume(ck), "a parameter's sign bit flipped",
            "%s/%s': tensor '%s' does not match its CRC-32 in state.json"
            % (ck, model, params[0]), "--resume-fallback")

    ck = fresh_copy(ck_a, work, "exponent")
    flip(os.path.join(ck, model), element_offset(os.path.join(ck, model),
                                                 params[1], 1) + 3, 0x40)
    refused(resume(ck), "a parameter's exponent MSB flipped",
            "%s/%s': tensor '%s' does not match its CRC-32"
            % (ck, model, params[1]))

    ck = fresh_copy(ck_a, work, "nan")
    path = os.path.join(ck, model)
    with open(path, "r+b") as f:
        f.seek(element_offset(path, params[2], 0))
        f.write(struct.pack("<f", float("nan")))
    refused(resume(ck), "a NaN written into a parameter",
            "%s/%s': tensor '%s' does not match its CRC-32" % (ck, model,
                                                               params[2]))

    ck = fresh_copy(ck_a, work, "nan-forged")
    forge(os.path.join(ck, "step-4"), "model.safetensors", params[2], 0,
          float("nan"))
    refused(resume(ck), "a NaN with matching CRC-32s (a diverged run)",
            "%s/%s': tensor '%s' holds a non-finite value (nan at element 0)"
            % (ck, model, params[2]))

    ck = fresh_copy(ck_a, work, "mid-file")
    path = os.path.join(ck, optim)
    middle = os.path.getsize(path) // 2
    flip(path, middle, 0x01)
    refused(resume(ck), "a byte flipped in the middle of the last file",
            "%s/%s': tensor '%s' does not match its CRC-32"
            % (ck, optim, tensor_at(path, middle)))

    ck = fresh_copy(ck_a, work, "moment")
    path = os.path.join(ck, optim)
    flip(path, element_offset(path, moments[0], 0) + 3, 0x80)
    refused(resume(ck), "an AdamW moment's sign flipped",
            "%s/%s': tensor '%s' does not match its CRC-32"
            % (ck, optim, moments[0]))

    ck = fresh_copy(ck_a, work, "swapped")
    for name in ("model.safetensors", "optimizer.safetensors"):
        shutil.copy(os.path.join(ck_b, "step-4", name),
                    os.path.join(ck, "step-4", name))
    refused(resume(ck), "every file but state.json from another run",
            "%s/%s' is of another run: its run id is" % (ck, model))

    # --resume-fallback: the newest checkpoint that verifies, then the same
    # steps as the uninterrupted run.
    m = os.path.join(work, "fallback.jsonl")
    shutil.copy(ref_metrics, m)
    p = resume(ck, ["--resume-fallback", "--metrics", m], expect=0)
    check("skipping '%s/step-4' (--resume-fallback): checkpoint '%s/%s' is "
          "of another run" % (ck, ck, model) in p.stderr and
          "resuming from '%s/step-2' (step 2)" % ck in p.stderr,
          "--resume-fallback skips the mixed step-4 for step-2")
    check(metrics(m) == metrics(ref_metrics),
          "steps 3-4 after the fallback are bit-identical to the "
          "uninterrupted run")
    p = resume(ck, expect=0)
    check("resuming from '%s/step-4' (step 4)" % ck in p.stderr,
          "the run rewrote step-4, which verifies again")

    # A wrong-typed field of state.json: skipped with a message, never a
    # crash (it threw nlohmann::json's type_error).
    def edit_state(ck, field, value):
        state_path = os.path.join(ck, "step-4", "state.json")
        with open(state_path) as f:
            state = json.load(f)
        state[field] = value
        with open(state_path, "w") as f:
            json.dump(state, f)

    for field, value, message in [
            ("format", 1, '"format" is a number, expected a string'),
            ("version", "2", '"version" is a string, expected an integer'),
            ("layout", 1, '"layout" is a number, expected a string')]:
        ck = fresh_copy(ck_a, work, "state-" + field)
        edit_state(ck, field, value)
        p = resume(ck, expect=0)
        check("skipping '%s/step-4': state.json: %s" % (ck, message)
              in p.stderr and "resuming from '%s/step-2'" % ck in p.stderr,
              "state.json %s: %r: skipped for step-2" % (field, value))
        # The only checkpoint: an error, not a fresh start.
        ck = fresh_copy(ck_a, work, "state-only-" + field)
        edit_state(ck, field, value)
        shutil.rmtree(os.path.join(ck, "step-2"))
        refused(resume(ck), "state.json %s: %r and no other checkpoint"
                % (field, value), "no checkpoint of '%s' can be resumed" % ck,
                message)

    # A checkpoint of an older piper (state.json version 1, sizes only):
    # accepted with a warning.
    ck = fresh_copy(ck_a, work, "old")
    state_path = os.path.join(ck, "step-4", "state.json")
    with open(state_path) as f:
        state = json.load(f)
    state["version"] = 1
    del state["run_id"]
    state["files"] = {n: f["bytes"] for n, f in state["files"].items()}
    with open(state_path, "w") as f:
        json.dump(state, f)
    p = resume(ck, expect=0)
    check("'%s/step-4' was written before checkpoints carried run ids and "
          "CRC-32s (version 1)" % ck in p.stderr and
          "resuming from '%s/step-4'" % ck in p.stderr,
          "a version 1 checkpoint resumes with a warning")

    # --load verifies the CRC-32s a file records.
    bad = os.path.join(work, "bad-load.safetensors")
    shutil.copy(os.path.join(ck_a, model), bad)
    flip(bad, element_offset(bad, params[0], 3) + 3, 0x80)
    p = run([PIPER_RUN, plans, "--nproc", "1", "--steps", "1", "--load", bad],
            expect=1)
    refused(p, "--load of a file with a flipped sign bit",
            "checkpoint '%s': tensor '%s' does not match its CRC-32 in its "
            "metadata" % (bad, params[0]))
    p = run([PIPER_RUN, plans, "--nproc", "1", "--steps", "0", "--load",
             os.path.join(ck_a, model), "--save",
             os.path.join(work, "resaved.safetensors")])
    with open(os.path.join(ck_a, model), "rb") as a, \
            open(os.path.join(work, "resaved.safetensors"), "rb") as b:
        check(a.read() == b.read(), "--load F --steps 0 --save G rewrites F "
              "byte for byte (run id and CRC-32s included)")


def sharded_cases(work, plans):
    """DP2 ZeRO-1: rank-0.safetensors and rank-1.safetensors."""
    ref_metrics = os.path.join(work, "zero-ref.jsonl")
    ck_c = os.path.join(work, "zero-c")
    ck_d = os.path.join(work, "zero-d")
    piper_run(plans, 2, ck_c, ["--metrics", ref_metrics])
    piper_run(plans, 2, ck_d)
    files = sorted(os.listdir(os.path.join(ck_c, "step-4")))
    check(files == ["rank-0.safetensors", "rank-1.safetensors", "state.json"],
          "a sharded checkpoint: %s" % ", ".join(files))

    def resume(ckpt, extra=(), expect=1):
        return piper_run(plans, 2, ckpt, ["--resume"] + list(extra), expect)

    last = os.path.join("step-4", "rank-1.safetensors")
    ck = fresh_copy(ck_c, work, "zero-swap")
    shutil.copy(os.path.join(ck_d, last), os.path.join(ck, last))
    refused(resume(ck), "one rank's file from another run of the same step",
            "checkpoint '%s/%s' is of another run" % (ck, last))
    m = os.path.join(work, "zero-fallback.jsonl")
    shutil.copy(ref_metrics, m)
    p = resume(ck, ["--resume-fallback", "--metrics", m], expect=0)
    check("resuming from '%s/step-2' (step 2)" % ck in p.stderr and
          metrics(m) == metrics(ref_metrics),
          "--resume-fallback: from step-2, bit-identical steps 3-4")

    ck = fresh_copy(ck_c, work, "zero-mid-file")
    path = os.path.join(ck, last)
    middle = os.path.getsize(path) // 2
    flip(path, middle, 0x04)
    refused(resume(ck), "a byte flipped in the middle of the last rank file",
            "%s/%s': tensor '%s' does not match its CRC-32"
            % (ck, last, tensor_at(path, middle)))


def main():
    work = tempfile.mkdtemp(prefix="ckpt-integrity-",
                            dir=os.environ.get("TEST_TMPDIR"))
    try:
        model = os.path.join(work, "gpt-tiny.mlir")
        run([PIPERC, "model", "gpt-tiny", "-o", model])
        one = os.path.join(work, "one")
        run([PIPERC, "compile", model, "-o", one])
        zero = os.path.join(work, "dp2-zero1")
        run([PIPERC, "compile", model, "-o", zero, "--dp", "2", "--zero",
             "1"])
        whole_cases(work, one)
        sharded_cases(work, zero)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
