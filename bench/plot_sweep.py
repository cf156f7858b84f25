#!/usr/bin/env python3
"""Speedup over sequential (cuBLAS + NCCL) per shape and variant, from the
CSV written by `flashoverlap-lab lab-bench --csv` (AllReduce or ReduceScatter: the
collective is read from the file's name). Usage: plot_sweep.py CSV PNG"""
import csv
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
shapes = list(dict.fromkeys(f"{r['M']}x{r['N']}x{r['K']}" for r in rows))
variants = [v for v in ["sequential-ourgemm", "decomposition", "torch-async-tp", "flashoverlap"] if any(r["variant"] == v for r in rows)]
width = 0.8 / max(1, len(variants))
fig, ax = plt.subplots(figsize=(12, 4.5))
for i, v in enumerate(variants):
    ys = []
    for s in shapes:
        match = [r for r in rows if f"{r['M']}x{r['N']}x{r['K']}" == s and r["variant"] == v]
        ys.append(float(match[0]["speedup_vs_sequential"]) if match else 0)
    ax.bar([x + i * width for x in range(len(shapes))], ys, width, label=v)
ideal = []
for s in shapes:
    r = [r for r in rows if f"{r['M']}x{r['N']}x{r['K']}" == s and r["variant"] == "sequential"][0]
    ideal.append(float(r["ms"]) / float(r["ideal_ms"]))
op = "ReduceScatter" if "reducescatter" in os.path.basename(sys.argv[1]) else "AllReduce"
short = "RS" if op == "ReduceScatter" else "AR"
ax.plot([x + 0.4 - width / 2 for x in range(len(shapes))], ideal, "k_", markersize=18, label=f"ideal (max(GEMM, {short}))")
ax.axhline(1.0, color="gray", lw=0.8)
ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))])
ax.set_xticklabels(shapes, rotation=30, ha="right", fontsize=8)
ax.set_ylabel("speedup vs cuBLAS + NCCL")
world = rows[0]["world"] if rows else "?"
ax.set_title(f"GEMM + {op}, {world}x H200, bf16")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
