#!/usr/bin/env python3
"""torch._scaled_mm on the shapes of a `flashoverlap-lab bench-fp8` CSV, and
the table of ours against it:

    python3 bench/scaled_mm.py --ours gemm-fp8-lab.csv [--out gemm-fp8-h100.csv] [--runs 20] [--warmup 5]

Per row of the lab's CSV (M, N, K, scales, ours_ms: our GEMM with e4m3
inputs, the kernel alone on the faster of its tiles (ours_tile), timed by
the lab on the same GPU just before: runs of 20 launches back to back, its
stream held until the host had queued the run), torch._scaled_mm(a, b.t(), scale_a, scale_b,
out_dtype=torch.bfloat16) with use_fast_accum=False and True, timed the same
way: in turns, per turn --runs calls between CUDA events queued behind a GPU
sleep (torch_timing.device_ms_in_turns), the median over 5 turns: the
kernels' time, not Python's dispatch (which at M = 256 takes longer than the
kernel). Beside them, use_fast_accum=False called eagerly (host included) for
reference. Scales as torch takes them: per tensor one fp32 each; row-wise
scale_a [M, 1] and scale_b [1, N]. Inputs random e4m3 in +-[1/8, 4] (as the
lab's), scales in [0.5, 2].

The CSV starts with a "#" line (GPU, torch, date), then
M,N,K,scales,ours_ms,scaled_mm_ms,scaled_mm_fast_ms,ours_tflops,ratio
(scaled_mm_ms / ours_ms: above 1, ours is faster),ours_tile,scaled_mm_eager_ms,
scaled_mm_kernel (the kernel torch._scaled_mm ran on that row, from a
profiler trace of one call).
"""
import argparse
import csv
import datetime
import statistics
import sys

import torch

from torch_timing import device_ms_in_turns, time_in_turns

COLUMNS = ["M", "N", "K", "scales", "ours_ms", "scaled_mm_ms", "scaled_mm_fast_ms", "ours_tflops", "ratio", "ours_tile",
           "scaled_mm_eager_ms", "scaled_mm_kernel"]


def random_e4m3(rows, cols, dev, gen):
    """Random e4m3 of magnitudes 2^-3 .. 2^2, any sign (no NaN)."""
    mag = torch.exp2(torch.randint(-3, 3, (rows, cols), generator=gen, device="cpu").float())
    mag *= 1 + torch.randint(0, 8, (rows, cols), generator=gen).float() / 8
    sign = torch.randint(0, 2, (rows, cols), generator=gen).float() * 2 - 1
    return (mag * sign).to(dev).to(torch.float8_e4m3fn)


def kernels_of(fn):
    """The CUDA kernels one call of fn runs, from a profiler trace."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return " + ".join(n[:120] for n in names) or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", required=True, help="the lab's bench-fp8 CSV")
    ap.add_argument("--out", help="CSV file (default: stdout)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("scaled_mm.py: no CUDA GPU: nothing to measure")
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        sys.exit(f"scaled_mm.py: torch {torch.__version__} has no torch._scaled_mm")
    with open(a.ours) as f:
        ours = list(csv.DictReader(line for line in f if not line.startswith("#")))
    if not ours:
        sys.exit(f"scaled_mm.py: no rows in {a.ours}")
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(1)
    rows = []
    for r in ours:
        m, n, k, kind = int(r["M"]), int(r["N"]), int(r["K"]), r["scales"]
        x, w = random_e4m3(m, k, dev, gen), random_e4m3(n, k, dev, gen)
        if kind == "row":
            sa = (torch.rand(m, 1, generator=gen) * 1.5 + 0.5).to(dev)
            sb = (torch.rand(1, n, generator=gen) * 1.5 + 0.5).to(dev)
        else:  # (tensor; "none" as unit scales)
            sa = (torch.rand((), generator=gen) * 1.5 + 0.5).to(dev) if kind == "tensor" else torch.ones((), device=dev)
            sb = (torch.rand((), generator=gen) * 1.5 + 0.5).to(dev) if kind == "tensor" else torch.ones((), device=dev)
        wt = w.t()

        def call(fast, x=x, wt=wt, sa=sa, sb=sb):
            return torch._scaled_mm(x, wt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

        kernel = kernels_of(lambda: call(False))
        slow_ms, fast_ms = device_ms_in_turns([lambda: call(False), lambda: call(True)], a.runs, 5, warmup=a.warmup)
        eager_ms = time_in_turns([lambda: call(False)], a.runs, 5, warmup=a.warmup)[0]
        ours_ms = float(r["ours_ms"])
        rows.append([m, n, k, kind, f"{ours_ms:.4f}", f"{slow_ms:.4f}", f"{fast_ms:.4f}",
                     f"{2.0 * m * n * k / ours_ms / 1e9:.1f}", f"{slow_ms / ours_ms:.3f}",
                     f"128x{r['ours_tile']}" if r.get("ours_tile") else "", f"{eager_ms:.4f}", kernel])
        print(f"{m}x{n}x{k} {kind}: ours {ours_ms:.4f} ms, _scaled_mm {slow_ms:.4f} ms (fast {fast_ms:.4f}), "
              f"ratio {slow_ms / ours_ms:.3f}; eager {eager_ms:.4f} ms; {kernel}", file=sys.stderr, flush=True)
    out = open(a.out, "w", newline="") if a.out else sys.stdout
    out.write(f"# gpu={torch.cuda.get_device_name(dev)}; torch={torch.__version__}; "
              f"date={datetime.datetime.now().isoformat(timespec='seconds')}; ours from {a.ours} "
              f"(flashoverlap-lab bench-fp8: our kernel alone); torch._scaled_mm timed behind a GPU sleep (device time)\n")
    wr = csv.writer(out)
    wr.writerow(COLUMNS)
    wr.writerows(rows)
    ratios = [float(r[8]) for r in rows]
    at256 = [float(r[8]) for r in rows if r[0] >= 256]
    below = sum(1 for x in at256 if x < 0.90)
    print(f"ratio median {statistics.median(ratios):.3f} over {len(ratios)} rows; min at M >= 256 "
          f"{min(at256) if at256 else float('nan'):.3f}; {below} rows at M >= 256 below 0.90", file=sys.stderr)


if __name__ == "__main__":
    main()
