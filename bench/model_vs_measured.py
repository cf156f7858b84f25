#!/usr/bin/env python3
"""The latency model's pick against the measured best, from `flashoverlap-lab lab-bench` logs.

For each shape the bench's tuner times its finalists (the plans the model
ranks best, each with its predicted ms) and prints them on its "tuner's
finalists:" line. The model alone (what the public GemmAllReduce's Auto runs
for an m it has not measured) would take the finalist with the least
predicted time; this script reads those lines and reports, per shape, that
plan's measured time against the fastest finalist's, both from the same
timing round (the first stage: layouts and tiles; the later stage, a
row-band pick's 3-stage twin, is not modelled apart and is left out).

  bench/model_vs_measured.py LOG [LOG ...] [--within 3] [--only "row bands,slots,sequential"]

--only: the finalists whose description names one of these (the public
op's Auto plans among sequential, row bands and slots only).

Several sweeps (several shape blocks per shape, in one log or many): the
median ratio per shape. Prints a table and the count within --within %.
"""
import argparse
import re
import statistics
import sys

SHAPE = re.compile(r"^(\d+x\d+x\d+)\s+GEMM ")
CAND = re.compile(r": ([0-9.]+) ms \(predicted ([0-9.]+)\)")
RUNOFF = re.compile(r"; runoff \(\d+ runs\):[^;]*$")


def first_stage(line):
    """[(description, measured ms, predicted ms)] of the line's first stage."""
    body = line.split("tuner's finalists:", 1)[1]
    stage = RUNOFF.sub("", body.split("; then the ", 1)[0])
    out, start = [], 0
    for m in CAND.finditer(stage):
        desc = stage[start:m.start()].lstrip("; ").strip()
        out.append((desc[2:] if desc.startswith("* ") else desc, float(m.group(1)), float(m.group(2))))
        start = m.end()
    return out


def read(paths, only=()):
    """{shape: [(model's pick, its ms, best, best ms)]} over every block of the logs."""
    per_shape = {}
    for path in paths:
        shape = None
        with open(path) as f:
            for line in f:
                s = SHAPE.match(line.strip())
                if s:
                    shape = s.group(1)
                elif "tuner's finalists:" in line and shape:
                    cands = [c for c in first_stage(line) if not only or any(o in c[0] for o in only)]
                    if len(cands) < 2:
                        continue
                    pick = min(cands, key=lambda c: c[2])
                    best = min(cands, key=lambda c: c[1])
                    per_shape.setdefault(shape, []).append((pick[0], pick[1], best[0], best[1]))
    return per_shape


def self_test():
    line = ("  tuner's finalists: A, 2 groups: 0.500 ms (predicted 0.400); * B (x; y), 4 groups: 0.450 ms "
            "(predicted 0.420); runoff (36 runs): #1 0.5 ms, #2 0.45 ms; then the transports: C: 0.3 ms (predicted 0.1)")
    got = first_stage(line)
    assert [c[0] for c in got] == ["A, 2 groups", "B (x; y), 4 groups"], got
    assert [c[1] for c in got] == [0.5, 0.45] and [c[2] for c in got] == [0.4, 0.42], got
    print("model_vs_measured self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*")
    ap.add_argument("--within", type=float, default=3.0, help="percent over the best that counts as a hit (3)")
    ap.add_argument("--only", default="", help="comma-separated: keep the finalists whose description names one")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.logs:
        ap.error("give one or more bench logs")
    per_shape = read(a.logs, [o.strip() for o in a.only.split(",") if o.strip()])
    if not per_shape:
        sys.exit("model_vs_measured: no tuner's finalists lines in " + ", ".join(a.logs))
    print(f"{'shape':18} {'sweeps':>6} {'model ms':>9} {'best ms':>8} {'over':>7}  model's pick / measured best")
    hits = 0
    for shape, rows in per_shape.items():
        ratio = statistics.median(r[1] / r[3] for r in rows)
        mid = sorted(rows, key=lambda r: r[1] / r[3])[len(rows) // 2]
        hits += ratio <= 1 + a.within / 100
        same = "(the same plan)" if mid[0] == mid[2] else f"{mid[0]} / {mid[2]}"
        print(f"{shape:18} {len(rows):>6} {mid[1]:>9.3f} {mid[3]:>8.3f} {100 * (ratio - 1):>6.1f}%  {same}")
    print(f"within {a.within:g}% of the best: {hits} of {len(per_shape)} shapes")


if __name__ == "__main__":
    main()
