#!/usr/bin/env python3
"""GEMM + ReduceScatter as PyTorch users run it, next to the library's
binding, on the ReduceScatter sweep's shapes (one process per GPU):

    torchrun --nproc-per-node=N bench/torch_reducescatter.py [--shapes MxNxK,...] [--csv FILE]

Variants (each rank: A m x k, W n x k as nn.Linear's weight; the result is
this rank's m/W rows of the sum of A W^T):
  torch-sequential   F.linear, then dist.reduce_scatter_tensor
  torch-async-tp     torch.ops.symm_mem.fused_matmul_reduce_scatter (Async-TP;
                     enable_symm_mem_for_group first), where this torch has it
  flashoverlap-torch flashoverlap.torch.GemmReduceScatter (path auto)
Each is checked against torch-sequential (within the bf16 bound of a sum of
k products: 2^-7 relative, per element, on the reference's magnitude plus a
k-scaled absolute term), then all are timed in turns: per turn a run of
`--iters` calls between CUDA events, the median over `--turns` turns, the
slowest rank's. The CSV has the sweep's first columns (M,N,K,dtype,world,
variant,ms,speedup_vs_sequential) with the speedup over torch-sequential.
"""
import argparse
import csv
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = ("2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,"
          "1024x8192x8192,8192x4096x2048,4096x7168x5120,3000x8192x8192,8192x4096x7168,8192x8192x4096,8192x5120x2560")


def slowest(ms, device):
    t = torch.tensor([ms], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_in_turns(fns, iters, turns, device):
    for f in fns:  # warm-up
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    per = [[] for _ in fns]
    for _ in range(turns):
        for i, f in enumerate(fns):
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                f()
            e.record()
            e.synchronize()
            per[i].append(s.elapsed_time(e) / iters)
    return [slowest(statistics.median(p), device) for p in per]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--csv", default="")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--turns", type=int, default=5)
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    try:
        import flashoverlap.torch as fo
    except Exception as e:  # (the library not built: the torch variants still run)
        fo = None
        if rank == 0:
            print(f"flashoverlap not importable ({e}): its variant is left out", flush=True)
    symm = None
    try:
        import torch.distributed._symmetric_memory as symm_mem
        symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
        symm = dist.group.WORLD.group_name
    except Exception as e:
        if rank == 0:
            print(f"Async-TP unavailable in torch {torch.__version__} ({e}): left out", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        if M % world:
            if rank == 0:
                print(f"{shape}: M % world != 0, skipped", flush=True)
            continue
        g = torch.Generator(device=device).manual_seed(1000 * rank + M)
        a = torch.rand(M, K, device=device, dtype=torch.bfloat16, generator=g) * 2 - 1
        w = torch.rand(N, K, device=device, dtype=torch.bfloat16, generator=g) * 2 - 1
        ref = torch.empty(M // world, N, device=device, dtype=torch.bfloat16)
        variants = {}

        def sequential():
            dist.reduce_scatter_tensor(ref, F.linear(a, w))
        variants["torch-sequential"] = sequential
        if symm:
            wt = w.t()
            variants["torch-async-tp"] = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, wt, "sum", 0, symm)
        if fo is not None:
            op = fo.GemmReduceScatter(None, M, N, K, torch.bfloat16)
            variants["flashoverlap-torch"] = lambda: op(a, w)
        # Checks first: every variant against the sequential reference.
        sequential()
        bound = (2.0 ** -7) * ref.float().abs() + world * K * (2.0 ** -9)
        checks = []
        for name, f in list(variants.items())[1:]:
            try:
                y = f()
            except Exception as e:  # (a variant this torch refuses for this shape: said, left out)
                checks.append(f"{name}: failed ({str(e)[:120]})")
                del variants[name]
                continue
            bad = int(((y.float() - ref.float()).abs() > bound).sum().item())
            bad = int(slowest(bad, device))
            checks.append(f"{name}: {'ok' if bad == 0 else f'{bad} elements beyond the bound'}")
        names = list(variants)
        ms = time_in_turns([variants[n] for n in names], args.iters, args.turns, device)
        if rank == 0:
            print(f"{shape}  " + "; ".join(checks), flush=True)
            for n, t in zip(names, ms):
                print(f"  {n:20s} {t:8.3f} ms  {ms[0] / t:6.3f}x", flush=True)
        rows += [dict(M=M, N=N, K=K, dtype="bf16", world=world, variant=n, ms=f"{t:.6f}",
                      speedup_vs_sequential=f"{ms[0] / t:.6f}") for n, t in zip(names, ms)]
    if rank == 0 and args.csv:
        with open(args.csv, "w", newline="") as fh:
            out = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["M"])
            out.writeheader()
            out.writerows(rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
