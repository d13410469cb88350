"""Value-level collectives end to end: `piperc lower` compiles a
hand-written program and `piper-run` runs it on N CPU ranks (Gloo). Each rank
embeds its own microbatch x_r; the program combines the x_r with collectives
into @a and @b and accumulates x_r itself into @c; the gradient
data-parallel all_reduce then sums every accumulator over the ranks. So
grad(@a) and grad(@b) are multiples of grad(@c) (the data-parallel path
every strategy test already proves), given per program:

- Inputs/collectives.mlir, 3 ranks: a value all_reduce (@a) and
  reduce_scatter + all_gather with uneven slices 3/3/2 rows (@b), both 3x;
- Inputs/subgroups.mlir, 4 ranks: collectives over subgroups of the class,
  consecutive then strided all_reduce (@a, 4x) and reduce_scatter +
  all_gather within pairs (@b, 2x)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

PIPERC, PIPER_RUN, PROGRAM = sys.argv[1:4]
RANKS, FACTOR_A, FACTOR_B = (int(v) for v in sys.argv[4:7])
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
    run([PIPER_RUN, plans, "--nproc", str(RANKS), "--backend", "cpu", "--steps", "1",
         "--seed", "7", "--save-grads", grads_path])
    g = load_safetensors(grads_path)
    a, b, c = g["a"], g["b"], g["c"]
    if max(abs(v) for v in c) == 0:
        sys.exit("FAIL: grad(@c) is all zeros: the ranks contributed nothing")
    failed = 0
    for name, got, factor in (("@a", a, FACTOR_A), ("@b", b, FACTOR_B)):
        diff = max_rel(got, [factor * v for v in c])
        ok = diff <= RTOL
        failed += not ok
        print("%s: grad(%s) vs %d x the data-parallel sum over %d ranks: max "
              "rel diff %.2e" % ("ok" if ok else "FAIL", name, factor, RANKS,
                                 diff))
    # The ranks embed different microbatches: the sum is not N * one rank's.
    if all(v == c[0] for v in c):
        failed += 1
        print("FAIL: grad(@c) is constant")
    print("%d passed, %d failed" % (2 - min(failed, 2), failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
