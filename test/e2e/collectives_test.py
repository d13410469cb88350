"""Value-level collectives end to end: `piperc lower` compiles the
hand-written program Inputs/collectives.mlir and `piper-run` runs it on 3 CPU
ranks (Gloo). Each rank embeds its own microbatch x_r; the program sums the
x_r by a value all_reduce (into @a), by reduce_scatter + all_gather with
uneven slices 3/3/2 rows (into @b), and accumulates x_r itself (into @c);
the gradient data-parallel all_reduce then sums every accumulator over the
ranks. So grad(@a) = grad(@b) = 3 * grad(@c), where grad(@c) is the
data-parallel path every strategy test already proves."""
import json
import os
import struct
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN, PROGRAM = sys.argv[1:4]
RTOL = 1e-6


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (proc.returncode, " ".join(cmd),
                                                 proc.stdout))
    return proc.stdout


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = struct.unpack("<%df" % ((end - begin) // 4), data[begin:end])
    return out


def max_rel(a, b):
    scale = max(max(abs(v) for v in b), 1e-30)
    return max(abs(x - y) for x, y in zip(a, b)) / scale


def main():
    work = tempfile.mkdtemp(prefix="piper-coll-", dir=os.environ.get("TEST_TMPDIR"))
    plans = os.path.join(work, "plans")
    run([PIPERC, "lower", PROGRAM, "-o", plans])
    grads_path = os.path.join(work, "grads.safetensors")
    run([PIPER_RUN, plans, "--nproc", "3", "--backend", "cpu", "--steps", "1",
         "--seed", "7", "--save-grads", grads_path])
    g = load_safetensors(grads_path)
    a, b, c = g["a"], g["b"], g["c"]
    if max(abs(v) for v in c) == 0:
        sys.exit("FAIL: grad(@c) is all zeros: the ranks contributed nothing")
    c3 = [3 * v for v in c]
    failed = 0
    for name, got in (("all_reduce", a), ("reduce_scatter + all_gather", b)):
        diff = max_rel(got, c3)
        ok = diff <= RTOL
        failed += not ok
        print("%s: %s of x over 3 ranks vs the data-parallel sum: max rel "
              "diff %.2e" % ("ok" if ok else "FAIL", name, diff))
    # The ranks embed different microbatches: the sum is not 3 * one rank's.
    if all(v == c[0] for v in c):
        failed += 1
        print("FAIL: grad(@c) is constant")
    print("%d passed, %d failed" % (2 - min(failed, 2), failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
