#!/usr/bin/env python3
"""The experts' grouped GEMM of a mixture of experts on one GPU: ours
(flashoverlap.torch.GroupedGemm, the public op, path auto and ours) against
what PyTorch users run, on the expert shapes of real models:

    python3 bench/grouped_gemm.py [--out FILE] [--configs NAME,...] [--runs 20] [--warmup 5] [--seed 1]

Each config is (experts per rank, n = hidden, k = the expert's intermediate
size: the down projection before the combine): Mixtral-8x7B at EP 2 (4
experts per rank, 4096, 14336), Qwen3-30B-A3B at EP 8 (16, 2048, 768),
Qwen3-235B-A22B at EP 8 (16, 4096, 1536), DeepSeek-V3 at EP 8 (32, 7168,
2048). Per config three row counts (the rows a rank's experts received) and
two loads: uniform (every expert equally likely) and zipf (expert i with
weight 1/(i+1)^1.2), the counts drawn with torch's RNG from --seed. Rows of
x are grouped by expert, as a dispatch sorts them; x and the stacked weights
[experts, n, k] are random bf16.

Variants, timed in turns (per turn --runs calls between CUDA events; the
median over 5 turns): ours (GroupedGemm, path auto: its pick), ours-kernel
(path ours: our GEMM whatever the measurement), ours-offs (our GEMM with the
offsets on the GPU, as torch._grouped_mm takes them), torch._grouped_mm(x,
w.transpose(-2, -1), offs=<int32 cumulative rows>) where this torch has it,
and a loop of cuBLAS GEMMs (torch.mm per expert into the output's rows).
Checked first: ours and ours-kernel within bf16's bound of the cuBLAS loop.

The CSV (--out, or stdout) starts with a "#" line (GPU, torch, date), then
config,experts,tokens,load,mean_rows_per_expert,n,k,ours_ms,ours_kernel_ms,
ours_offs_ms,torch_grouped_ms,cublas_loop_ms,ratio_vs_torch,pick
(ratio_vs_torch: torch_grouped_ms / ours_ms, or cublas_loop_ms / ours_ms
where torch has no _grouped_mm; pick: ours' last_plan).
"""
import argparse
import csv
import datetime
import os
import sys

import torch

from torch_timing import time_in_turns

CONFIGS = {
    "mixtral-8x7b-ep2": (4, 4096, 14336, (512, 4096, 16384)),
    "qwen3-30b-a3b-ep8": (16, 2048, 768, (256, 2048, 16384)),
    "qwen3-235b-a22b-ep8": (16, 4096, 1536, (256, 2048, 16384)),
    "deepseek-v3-ep8": (32, 7168, 2048, (256, 4096, 16384)),
}
COLUMNS = ["config", "experts", "tokens", "load", "mean_rows_per_expert", "n", "k", "ours_ms", "ours_kernel_ms",
           "ours_offs_ms", "torch_grouped_ms", "cublas_loop_ms", "ratio_vs_torch", "pick"]


def draw_counts(load, experts, rows, gen):
    """Rows per expert summing to `rows`: multinomial draws of each row's expert."""
    if load == "uniform":
        weight = torch.ones(experts, dtype=torch.float64)
    else:
        weight = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** 1.2
    picks = torch.multinomial(weight, rows, replacement=True, generator=gen)
    return torch.bincount(picks, minlength=experts).tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="CSV file (default: stdout)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            sys.exit(f"grouped_gemm.py: unknown config {c!r} (one of {', '.join(CONFIGS)})")
    if not torch.cuda.is_available():
        sys.exit("grouped_gemm.py: no CUDA GPU: nothing to measure")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import flashoverlap.torch as fot

    dev = torch.device("cuda", torch.cuda.current_device())
    grouped_mm = getattr(torch, "_grouped_mm", None)
    gen = torch.Generator().manual_seed(a.seed)
    out = open(a.out, "w", newline="") if a.out else sys.stdout
    out.write(f"# gpu={torch.cuda.get_device_name(dev)}; torch={torch.__version__}; "
              f"torch._grouped_mm={'yes' if grouped_mm else 'no'}; "
              f"date={datetime.datetime.now().isoformat(timespec='seconds')}\n")
    w = csv.writer(out)
    w.writerow(COLUMNS)
    for name in names:
        experts, n, k, row_counts = CONFIGS[name]
        max_rows = max(row_counts)
        weight = (torch.randn(experts, n, k, device=dev) * 0.05).to(torch.bfloat16)
        x_all = (torch.randn(max_rows, k, device=dev)).to(torch.bfloat16)
        auto = fot.GroupedGemm(max_rows, experts, n, k, torch.bfloat16, device=dev)
        ours_kernel = fot.GroupedGemm(max_rows, experts, n, k, torch.bfloat16, device=dev, path="ours")
        for rows in row_counts:
            for load in ("uniform", "zipf"):
                counts = draw_counts(load, experts, rows, gen)
                x = x_all[:rows]
                offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(dev)
                y_ours = torch.empty(rows, n, dtype=torch.bfloat16, device=dev)
                y_kernel = torch.empty_like(y_ours)
                y_offs = torch.empty_like(y_ours)
                y_loop = torch.empty_like(y_ours)
                starts = [0]
                for c in counts:
                    starts.append(starts[-1] + c)

                def loop():
                    for e in range(experts):
                        if counts[e]:
                            torch.mm(x[starts[e]:starts[e + 1]], weight[e].t(), out=y_loop[starts[e]:starts[e + 1]])

                fns = [lambda: auto(x, weight, counts, out=y_ours), lambda: ours_kernel(x, weight, counts, out=y_kernel),
                       loop, lambda: ours_kernel(x, weight, out=y_offs, offs=offs)]
                if grouped_mm is not None:
                    fns.append(lambda: grouped_mm(x, weight.transpose(-2, -1), offs=offs))
                for f in fns:  # (once, then checked)
                    f()
                torch.cuda.synchronize()
                scale = y_loop.float().abs().max().item() + 1e-6
                for label, y in (("ours", y_ours), ("ours-kernel", y_kernel), ("ours-offs", y_offs)):
                    err = (y.float() - y_loop.float()).abs().max().item()
                    if err > 2e-2 * scale:
                        sys.exit(f"grouped_gemm.py: {name} rows {rows} {load}: {label} differs from the cuBLAS loop "
                                 f"by {err} (max |y| {scale})")
                ms = time_in_turns(fns, a.runs, 5, warmup=a.warmup)
                ours_ms, kernel_ms, loop_ms, offs_ms = ms[0], ms[1], ms[2], ms[3]
                torch_ms = ms[4] if grouped_mm is not None else float("nan")
                base = torch_ms if grouped_mm is not None else loop_ms
                w.writerow([name, experts, rows, load, f"{rows / experts:.1f}", n, k, f"{ours_ms:.4f}",
                            f"{kernel_ms:.4f}", f"{offs_ms:.4f}", f"{torch_ms:.4f}", f"{loop_ms:.4f}",
                            f"{base / ours_ms:.3f}",
                            auto.last_plan()])
                out.flush()
    if a.out:
        out.close()


if __name__ == "__main__":
    main()
