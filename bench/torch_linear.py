#!/usr/bin/env python3
"""GEMM + AllReduce or ReduceScatter as PyTorch users run it, next to the
library's binding as they would call it (one process per GPU):

    torchrun --nproc-per-node=N bench/torch_linear.py --op allreduce|reducescatter [--shapes MxNxK,...]
        [--csv FILE] [--cli-csv SWEEP.csv] [--merge-into SWEEP.csv] [--iters 20] [--turns 5]

Each rank: A (M x K) and W (N x K, nn.Linear's weight), random bf16 in [-1, 1).
Variants:
  torch-sequential   F.linear, then dist.all_reduce (allreduce: M x N) or
                     dist.reduce_scatter_tensor into a new tensor (reducescatter: M/W rows each)
  torch-linear       F.linear alone (not checked): the GEMM's part of torch-sequential
  torch-async-tp     reducescatter only: torch.ops.symm_mem.fused_matmul_reduce_scatter
                     (Async-TP; enable_symm_mem_for_group first), where this torch has it
  flashoverlap-torch flashoverlap.torch.GemmAllReduce / GemmReduceScatter (path auto;
                     the picks of $FLASHOVERLAP_TUNING_CACHE where it is set, the
                     library's model otherwise), output allocated per call
Each is checked against torch-sequential (within the bf16 bound of a sum of
W K products: 2^-7 relative, per element, on the reference's magnitude plus a
K-scaled absolute term), then all are timed in turns: per turn a run of
`--iters` calls between CUDA events, the median over `--turns` turns, the
slowest rank's. The CSV starts with a "#" line (GPU, torch, NCCL, library,
world, date), then M,N,K,dtype,world,variant,ms,speedup_vs_sequential (over
torch-sequential), plan (flashoverlap-torch: the op's plan for M), cli_ms and
cli_speedup: with --cli-csv, the sweep's (flashoverlap-lab lab-bench) figure for the
same shape and variant (torch-sequential beside "sequential", cuBLAS + NCCL;
flashoverlap-torch beside "flashoverlap"), so the library as called from
Python stands next to the CLI's measurement of it. --merge-into appends a
torch-async-tp row per shape to that sweep CSV (speedup over the sweep's own
sequential row; config says it is this script's run).
"""
import argparse
import csv
import ctypes
import os
import sys
import tempfile

try:  # (not needed by --self-test)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch_timing import machine_line, slowest, time_in_turns
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {  # (bench/sweep.sh's shape sets)
    "allreduce": "2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,"
                 "1024x8192x8192,8192x4096x2048,4096x7168x5120,3001x8192x8192",
    "reducescatter": "2048x8192x8192,4096x8192x8192,8192x8192x8192,4096x8192x14336,16384x8192x4096,4096x4096x4096,"
                     "1024x8192x8192,8192x4096x2048,4096x7168x5120,3000x8192x8192,8192x4096x7168,8192x8192x4096,"
                     "8192x5120x2560",
}
CLI_VARIANT = {"torch-sequential": "sequential", "flashoverlap-torch": "flashoverlap"}
COLUMNS = ["M", "N", "K", "dtype", "world", "variant", "ms", "speedup_vs_sequential", "plan", "cli_ms", "cli_speedup"]


def loaded_cublas():
    """The cuBLAS libraries this process has loaded (torch's own, the
    library's), each with its version (cublasGetProperty)."""
    try:
        with open("/proc/self/maps") as fh:
            libs = sorted({line.split()[-1] for line in fh if "libcublas.so" in line})
    except OSError:
        return "unknown"
    out = []
    for lib in libs:
        try:
            get = ctypes.CDLL(lib).cublasGetProperty
            v = [ctypes.c_int(0) for _ in range(3)]
            for i in range(3):
                get(i, ctypes.byref(v[i]))
            out.append(f"{lib} ({v[0].value}.{v[1].value}.{v[2].value})")
        except (OSError, AttributeError):
            out.append(lib)
    return ",".join(out) or "none"


def read_sweep(path):
    """{(M, N, K, variant): row} of a sweep CSV ('#' lines skipped); {} without one."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, newline="") as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        return {(int(r["M"]), int(r["N"]), int(r["K"]), r["variant"]): r for r in rows}


def merge_async_tp(path, rows, sweep, config):
    """Appends the torch-async-tp rows of `rows` (M, N, K ints) to the sweep
    CSV at path (its columns; speedup over its own sequential row of the
    shape, config `config`); returns how many."""
    with open(path, newline="") as fh:
        fields = csv.DictReader(line for line in fh if not line.startswith("#")).fieldnames
    added = []
    for r in rows:
        if r["variant"] != "torch-async-tp":
            continue
        seq = sweep.get((r["M"], r["N"], r["K"], "sequential"))
        row = {f: "" for f in fields}
        row.update(M=r["M"], N=r["N"], K=r["K"], dtype=r["dtype"], world=r["world"], variant="torch-async-tp",
                   ms=r["ms"], config=config)
        if seq and "speedup_vs_sequential" in row:
            row["speedup_vs_sequential"] = f"{float(seq['ms']) / float(r['ms']):.6f}"
        added.append(row)
    with open(path, "a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=fields, lineterminator="\n").writerows(added)
    return len(added)


def self_test():
    """read_sweep and merge_async_tp on a small sweep CSV."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "reducescatter-h200x2.csv")
        with open(path, "w") as fh:
            fh.write("M,N,K,dtype,world,variant,ms,speedup_vs_sequential,config\n"
                     "4096,8192,8192,bf16,2,sequential,0.600,1,cuBLAS + NCCL\n"
                     "4096,8192,8192,bf16,2,flashoverlap,0.500,1.2,x\n")
        sweep = read_sweep(path)
        assert sweep[(4096, 8192, 8192, "flashoverlap")]["ms"] == "0.500", sweep
        rows = [dict(M=4096, N=8192, K=8192, dtype="bf16", world=2, variant="torch-async-tp", ms="0.550000"),
                dict(M=4096, N=8192, K=8192, dtype="bf16", world=2, variant="torch-sequential", ms="0.610000"),
                dict(M=1024, N=8192, K=8192, dtype="bf16", world=2, variant="torch-async-tp", ms="0.2")]
        assert merge_async_tp(path, rows, sweep, "c") == 2
        after = read_sweep(path)
        tp = after[(4096, 8192, 8192, "torch-async-tp")]
        assert tp["ms"] == "0.550000" and abs(float(tp["speedup_vs_sequential"]) - 0.6 / 0.55) < 1e-6, tp
        assert after[(1024, 8192, 8192, "torch-async-tp")]["speedup_vs_sequential"] == "", after  # (no sequential)
        assert (4096, 8192, 8192, "torch-sequential") not in after and len(after) == 4, after
        assert read_sweep(os.path.join(d, "none.csv")) == {} and read_sweep("") == {}
    print("torch_linear self-test: ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if torch is None:
        sys.exit("torch_linear: torch is not importable")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=sorted(SHAPES), default="reducescatter")
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: the op's sweep shapes)")
    ap.add_argument("--csv", default="")
    ap.add_argument("--cli-csv", default="", help="the op's sweep CSV: its figures beside this run's")
    ap.add_argument("--merge-into", default="", help="reducescatter: append the torch-async-tp rows to this sweep CSV")
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
        import flashoverlap
        flashoverlap.load()  # (the package loads the library lazily: a missing one shows here)
        library = flashoverlap.__version__
    except Exception as e:  # (the library not built: the torch variants still run)
        fo, library = None, "none"
        print(f"rank {rank}: flashoverlap not loadable ({e}): its variant is left out", flush=True)
    if slowest(0.0 if fo else 1.0, device) > 0:  # (every rank leaves it out if one must: its op is collective)
        fo, library = None, "none"
    symm = None
    if args.op == "reducescatter":
        try:
            import torch.distributed._symmetric_memory as symm_mem
            symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
            symm = dist.group.WORLD.group_name
        except Exception as e:
            if rank == 0:
                print(f"Async-TP unavailable in torch {torch.__version__} ({e}): left out", flush=True)
    cli = read_sweep(args.cli_csv)
    rows = []
    for shape in (args.shapes or SHAPES[args.op]).split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        if args.op == "reducescatter" and M % world:
            if rank == 0:
                print(f"{shape}: M % world != 0, skipped", flush=True)
            continue
        g = torch.Generator(device=device).manual_seed(1000 * rank + M)
        a = torch.rand(M, K, device=device, dtype=torch.bfloat16, generator=g) * 2 - 1
        w = torch.rand(N, K, device=device, dtype=torch.bfloat16, generator=g) * 2 - 1
        variants, plan = {}, ""

        if args.op == "reducescatter":
            def sequential():
                y = torch.empty(M // world, N, device=device, dtype=torch.bfloat16)
                dist.reduce_scatter_tensor(y, F.linear(a, w))
                return y
        else:
            def sequential():
                y = F.linear(a, w)
                dist.all_reduce(y)
                return y
        variants["torch-sequential"] = sequential
        variants["torch-linear"] = lambda: F.linear(a, w)  # (the GEMM alone: what the collective adds, apart)
        if symm:
            wt = w.t()
            variants["torch-async-tp"] = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, wt, "sum", 0, symm)
        if fo is not None:
            op = (fo.GemmReduceScatter if args.op == "reducescatter" else fo.GemmAllReduce)(None, M, N, K,
                                                                                            torch.bfloat16)
            plan = op.plan(M)
            variants["flashoverlap-torch"] = lambda: op(a, w)
        # Checks first: every variant against the sequential reference.
        ref = sequential()
        bound = (2.0 ** -7) * ref.float().abs() + world * K * (2.0 ** -9)
        checks = []
        for name, f in list(variants.items())[1:]:
            if name == "torch-linear":
                continue
            try:
                y, err = f(), ""
            except Exception as e:  # (a variant this torch refuses for this shape: said, left out)
                y, err = None, str(e)[:120]
            if slowest(1.0 if y is None else 0.0, device) > 0:  # (left out on every rank, or they would part)
                checks.append(f"{name}: failed ({err or 'on another rank'})")
                del variants[name]
                continue
            bad = int(((y.float() - ref.float()).abs() > bound).sum().item())
            bad = int(slowest(bad, device))
            checks.append(f"{name}: {'ok' if bad == 0 else f'{bad} elements beyond the bound'}")
        names = list(variants)
        ms = time_in_turns([variants[n] for n in names], args.iters, args.turns, device)
        if rank == 0:
            print(f"{shape}  " + "; ".join(checks) + (f"  (plan: {plan})" if plan else ""), flush=True)
        for n, t in zip(names, ms):
            c = cli.get((M, N, K, CLI_VARIANT.get(n, "")))
            row = dict(M=M, N=N, K=K, dtype="bf16", world=world, variant=n, ms=f"{t:.6f}",
                       speedup_vs_sequential=f"{ms[0] / t:.6f}", plan=plan if n == "flashoverlap-torch" else "",
                       cli_ms=c["ms"] if c else "", cli_speedup=c["speedup_vs_sequential"] if c else "")
            rows.append(row)
            if rank == 0:
                beside = f"   CLI: {float(c['ms']):8.3f} ms {float(c['speedup_vs_sequential']):6.3f}x" if c else ""
                print(f"  {n:20s} {t:8.3f} ms  {ms[0] / t:6.3f}x{beside}", flush=True)
        if fo is not None:
            op.close()
        del a, w, ref, variants
        torch.cuda.empty_cache()
    if rank == 0:
        meta = machine_line(device, world,
                            blas=f"{getattr(torch.backends.cuda, 'preferred_blas_library', lambda: '?')()} "
                                 f"{loaded_cublas()}",
                            flashoverlap=library, op=args.op,
                            tuning_cache=os.environ.get("FLASHOVERLAP_TUNING_CACHE", "") or "none")
        if args.csv:
            with open(args.csv, "w", newline="") as fh:
                fh.write(meta)
                out = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
                out.writeheader()
                out.writerows(rows)
        if args.merge_into and os.path.exists(args.merge_into):
            keyed = [dict(r, M=int(r["M"]), N=int(r["N"]), K=int(r["K"])) for r in rows]
            n = merge_async_tp(args.merge_into, keyed, read_sweep(args.merge_into),
                               f"torch {torch.__version__} symm_mem, bench/torch_linear.py's run")
            print(f"{n} torch-async-tp rows appended to {args.merge_into}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
