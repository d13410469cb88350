#!/usr/bin/env python3
"""Reads `piper-plan --simulate --timeline` text on stdin and prints the
time the named stream of the first device class is busy, as the union of
its timeline entries' intervals (overlapping entries, such as a transfer's
SEND and RECV, count once), e.g. "20.4ms"; "0ms" when the class has no such
stream. Used by bench/context_parallel.sh."""
import re
import sys

UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def main():
    name = sys.argv[1]
    index, intervals, classes = None, [], 0
    for line in sys.stdin:
        if line.startswith("class "):
            classes += 1
        if classes != 1:
            continue
        m = re.match(r"\s+stream (\d+) '([^']*)'", line)
        if m and m.group(2) == name:
            index = int(m.group(1))
            continue
        m = re.match(r"\s+([0-9.]+) (\w+) \.\. ([0-9.]+) (\w+)\s+stream (\d+) ",
                     line)
        if m and index is not None and int(m.group(5)) == index:
            intervals.append((float(m.group(1)) * UNIT[m.group(2)],
                              float(m.group(3)) * UNIT[m.group(4)]))
    busy, until = 0.0, float("-inf")
    for a, b in sorted(intervals):
        a = max(a, until)
        if b > a:
            busy += b - a
        until = max(until, b)
    print("%.6fms" % (busy * 1e3))


if __name__ == "__main__":
    main()
