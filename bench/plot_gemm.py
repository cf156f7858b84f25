#!/usr/bin/env python3
"""Our GEMM vs cuBLAS from `flashoverlap-lab bench-gemm --csv`: the ratio of
TFLOP/s per shape, best tile, for each reserved-SM count (plain) and for the
signal epilogue at full grid. Usage: plot_gemm.py CSV PNG"""
import csv
import sys
from collections import defaultdict

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
shapes = list(dict.fromkeys(f"{r['M']}x{r['N']}x{r['K']}" for r in rows))
best = defaultdict(float)  # (shape, reserve, mode) -> best ratio over tiles
for r in rows:
    key = (f"{r['M']}x{r['N']}x{r['K']}", int(r["reserve_sms"]), r["mode"])
    best[key] = max(best[key], float(r["ratio_vs_cublas"]))
series = [(res, "plain") for res in sorted({int(r["reserve_sms"]) for r in rows})] + [(0, "signal")]
width = 0.8 / len(series)
fig, ax = plt.subplots(figsize=(12, 4.5))
for i, (res, mode) in enumerate(series):
    ys = [best.get((s, res, mode), 0) for s in shapes]
    ax.bar([x + i * width for x in range(len(shapes))], ys, width, label=f"{mode}, {res} SMs reserved")
ax.axhline(1.0, color="gray", lw=0.8)
ax.axhline(0.97, color="red", lw=0.8, ls="--", label="0.97 bar")
ax.set_ylim(0.6, 1.2)
ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))])
ax.set_xticklabels(shapes, rotation=30, ha="right", fontsize=8)
ax.set_ylabel("ours / cuBLAS TFLOP/s (best tile)")
ax.set_title("Signalling GEMM vs cuBLAS, H200, bf16 (cuBLAS limited to the same SMs)")
ax.legend(fontsize=7, ncol=3)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
