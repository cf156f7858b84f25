#!/usr/bin/env python3
"""Median of several sweeps (AllReduce or ReduceScatter) (CSVs written by `flashoverlap-lab lab-bench --csv`).

Usage: median_of_sweeps.py OUT.csv RUN1.csv RUN2.csv ...   |   median_of_sweeps.py --self-test

Every numeric column of a row (shape, variant) becomes the median over the
runs of that column; so speedup and gain captured are the medians of each
run's own in-turns readings (each run compares its variants with components
timed in the same turns), not ratios of medians. Text columns (partition,
config) come from the run whose `ms` is the median one. Two columns are
added: runs_ms and runs_gain, each run's value in run order, ';'-separated.
A row that some runs lack (a shape that failed there: sweep.sh
goes on without it) is the median of the runs that have it, '-' in the
runs columns for the others; so is a value some runs leave empty (the gain
captured is empty where the ideal gain is under 1% of the sequential time),
and it stays empty where every run does.
The GPUs are power-capped and a shape's gain moves by several points from one
run to the next; the median of three runs is the reading the results report.
"""
import csv
import statistics
import sys

KEY = ["M", "N", "K", "dtype", "world", "variant"]
NUMERIC = ["ms", "speedup_vs_sequential", "ideal_ms", "gain_captured", "gemm_ms", "comm_ms", "gemm_before_ms",
           "comm_before_ms"]


def median_low_index(values):
    """Index of the median value (the lower middle one for an even count)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(values) - 1) // 2]


def aggregate(runs):
    """runs: list of lists of dict rows. Returns the merged rows, in the order first seen."""
    if not runs:
        raise ValueError("no runs given")
    keyed, order = [], []
    for i, rows in enumerate(runs):
        d = {}
        for r in rows:
            k = tuple(r[c] for c in KEY)
            if k in d:
                raise ValueError(f"run {i + 1}: row {k} twice")
            d[k] = r
            if k not in order and all(k not in e for e in keyed):
                order.append(k)
        keyed.append(d)
    if not order:
        raise ValueError("no rows in any run")
    out = []
    for k in order:
        present = [d[k] if k in d else None for d in keyed]
        rows = [r for r in present if r is not None]
        ms = [float(r["ms"]) for r in rows]
        row = dict(rows[median_low_index(ms)])
        for c in NUMERIC:  # the median of the runs that have a value (empty: none has, e.g. gain n/a)
            values = [float(r[c]) for r in rows if r.get(c, "") != ""]
            if c in rows[0]:
                row[c] = f"{statistics.median(values):.6g}" if values else ""
        row["runs_ms"] = ";".join("-" if r is None else f"{float(r['ms']):.6g}" for r in present)
        row["runs_gain"] = ";".join("-" if r is None or r.get("gain_captured", "") == "" else
                                    f"{float(r['gain_captured']):.4f}" for r in present)
        out.append(row)
    return out


def self_test():
    """Checks aggregate() on made-up runs; prints each check that fails. Returns the exit code.
    (Explicit checks, not assert: those vanish under python -O / PYTHONOPTIMIZE.)"""
    failures = []

    def expect(got, want, what):
        if got != want:
            failures.append(f"{what}: got {got!r}, expected {want!r}")

    def row(variant, ms, gain, part):
        return {"M": "1", "N": "2", "K": "3", "dtype": "bf16", "world": "2", "variant": variant, "ms": str(ms),
                "speedup_vs_sequential": str(1.0 / ms), "ideal_ms": "0.5", "gain_captured": str(gain),
                "partition": part, "gemm_ms": "0.5", "comm_ms": "0.2", "config": part}
    runs = [[row("sequential", 1.0, 0, "a"), row("flashoverlap", 0.70, 0.60, "p1")],
            [row("sequential", 1.2, 0, "b"), row("flashoverlap", 0.60, 0.90, "p2")],
            [row("sequential", 1.1, 0, "c"), row("flashoverlap", 0.65, 0.70, "p3")]]
    out = aggregate(runs)
    expect([r["variant"] for r in out], ["sequential", "flashoverlap"], "rows in the order first seen")
    fo = out[1]
    expect(fo["ms"], "0.65", "median ms")
    expect(fo["gain_captured"], "0.7", "median gain")
    expect(fo["partition"], "p3", "text of the run with the median ms")
    expect(fo["runs_ms"], "0.7;0.6;0.65", "runs_ms")
    expect(fo["runs_gain"], "0.6000;0.9000;0.7000", "runs_gain")
    speedup = float(fo["speedup_vs_sequential"])
    if abs(speedup - 1 / 0.65) >= 1e-4:
        failures.append(f"median speedup: got {speedup}, expected {1 / 0.65:.6g}")
    expect(out[0]["partition"], "c", "sequential row's text")
    # even count: the lower middle run's text, the mean of the middle two for numbers
    even = aggregate(runs[:2])
    expect(even[1]["partition"], "p2", "even count: text of the lower middle run")
    expect(even[1]["ms"], "0.65", "even count: mean of the middle two")
    # a row one run lacks (its shape failed there): the others' median, '-' in its place
    gap = aggregate([runs[0], runs[1][:1], runs[2]])
    expect(gap[1]["runs_ms"], "0.7;-;0.65", "row one run lacks: runs_ms")
    expect(gap[1]["ms"], "0.675", "row one run lacks: median of the others")
    expect(gap[1]["runs_gain"], "0.6000;-;0.7000", "row one run lacks: runs_gain")
    expect(gap[1]["partition"], "p3", "row one run lacks: text of the lower middle ms")
    # gain n/a (empty: the ideal gain is noise, e.g. one GPU) stays empty, '-' in runs_gain
    na = aggregate([[row("flashoverlap", 0.7, "", "p")], [row("flashoverlap", 0.6, "", "q")]])
    expect(na[0]["gain_captured"], "", "gain empty in every run")
    expect(na[0]["runs_gain"], "-;-", "gain empty in every run: runs_gain")
    mixed = aggregate([[row("flashoverlap", 0.7, 0.5, "p")], [row("flashoverlap", 0.6, "", "q")],
                       [row("flashoverlap", 0.65, 0.9, "r")]])
    expect(mixed[0]["gain_captured"], "0.7", "gain empty in one run: median of the others")
    expect(mixed[0]["runs_gain"], "0.5000;-;0.9000", "gain empty in one run: runs_gain")
    # a row only a later run has comes after the others
    late = aggregate([runs[0][:1], runs[1]])
    expect([r["variant"] for r in late], ["sequential", "flashoverlap"], "row only a later run has: order")
    expect(late[1]["runs_ms"], "-;0.6", "row only a later run has: runs_ms")
    for bad in ([], [[], []], [runs[0] + runs[0][:1]]):
        try:
            aggregate(bad)
        except ValueError:
            continue
        failures.append(f"accepted {bad!r}")
    for f in failures:
        print(f"median_of_sweeps self-test: FAILED: {f}", file=sys.stderr)
    if failures:
        return 1
    print("median_of_sweeps self-test passed")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs = [list(csv.DictReader(open(p))) for p in argv[2:]]
    out = aggregate(runs)
    fields = list(out[0].keys())
    with open(argv[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
