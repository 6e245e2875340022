#!/usr/bin/env python3
"""Per-kernel times inside a step from a tools/profile/cupti_trace.cpp trace: for the step with
the most kernels among the last three (steps are split at idle gaps over --gap-us), each kernel
name's grid, count, median duration (start to end: under PDL a kernel starts, and waits, while
the one before runs), median gap from the end of the kernel before it (negative: overlapped),
median time it adds to the step (its end minus the latest end before it) and that time summed; then the step's span and the share of it with no kernel running.

  python3 tools/profile/kernel_gaps.py trace.csv [--gap-us 50] [--show 24]
"""
import argparse
import collections
import csv
import re
import statistics


def short(name):
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|oasis::|kernels::|^void ", "", name)
    name = re.sub(r"\(.*", "", name)  # the parameter list
    return name[:56]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--gap-us", type=float, default=50.0)
    ap.add_argument("--show", type=int, default=24, help="kernels of the step's middle to list")
    a = ap.parse_args()
    # A kernel is its name and grid (the same GEMV for two weights shows as two rows).
    ks = sorted((int(r["start_ns"]), int(r["end_ns"]), f'{short(r["name"])} x{r["grid"]}')
                for r in csv.DictReader(open(a.trace)))
    steps, cur = [], [ks[0]]
    for prev, k in zip(ks, ks[1:]):
        if k[0] - max(prev[1], cur[-1][1]) > a.gap_us * 1000:
            steps.append(cur)
            cur = []
        cur.append(k)
    steps.append(cur)
    step = max(steps[-3:], key=len)
    t0, t1 = step[0][0], max(k[1] for k in step)
    busy, end = 0, t0
    for s, e, _ in step:  # union of kernel intervals
        if e > end:
            busy += e - max(s, end)
            end = e
    print(f"{len(steps)} steps; the one measured: {len(step)} kernels, {(t1 - t0) / 1e3:.1f} us, "
          f"no kernel running {(t1 - t0 - busy) / 1e3:.1f} us")
    # "adds": this kernel's end minus the latest end before it (the time it adds to the step:
    # under PDL a kernel starts, and waits, while the one before runs).
    dur, gap, adds = (collections.defaultdict(list) for _ in range(3))
    latest = step[0][1]
    for prev, k in zip(step, step[1:]):
        dur[k[2]].append((k[1] - k[0]) / 1e3)
        gap[k[2]].append((k[0] - prev[1]) / 1e3)
        adds[k[2]].append(max(0, k[1] - latest) / 1e3)
        latest = max(latest, k[1])
    print(f"{'kernel x grid':64s} {'n':>4s} {'us':>7s} {'gap':>7s} {'adds':>7s} {'Σadds':>8s}")
    for name in sorted(dur, key=lambda n: -sum(adds[n])):
        print(f"{name:64s} {len(dur[name]):4d} {statistics.median(dur[name]):7.2f} "
              f"{statistics.median(gap[name]):7.2f} {statistics.median(adds[name]):7.2f} "
              f"{sum(adds[name]):8.1f}")
    mid = len(step) // 2
    print("--- the step's middle: start (us from the step's start), duration, gap, kernel")
    for prev, k in zip(step[mid - 1:mid + a.show], step[mid:mid + a.show]):
        print(f"{(k[0] - t0) / 1e3:9.2f} {(k[1] - k[0]) / 1e3:7.2f} {(k[0] - prev[1]) / 1e3:7.2f} {k[2]}")


if __name__ == "__main__":
    main()
