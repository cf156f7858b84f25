#!/usr/bin/env python3
"""rank_fault.py: a rank killed (SIGKILL) in the middle of a loop of calls of a public op; the other ranks must
fail with a message within a bound instead of hanging.

    python3 bench/rank_fault.py --world W [--op allreduce|reducescatter|alltoall] [--calls 20] [--bound 150]
                                [--out FILE.json]
    python3 bench/rank_fault.py --self-test    # the harness itself on the CPU: gloo's all_reduce, no GPU
    python3 bench/rank_fault.py --self-test-hang    # ... with survivors that hang: must report them, exit 1

Spawns W processes, one per GPU, with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set as torchrun
sets them, but not under torchrun: its agent stops every rank as soon as one dies, which would hide whether the
others fail on their own. Every rank builds the op (flashoverlap.torch's, path auto, bf16; n = k = 4096, m = 2048
rows; alltoall: 2048 tokens routed uniformly, top-1) and calls it in a loop, synchronizing after each call. Rank
W-1 records the time and kills itself after --calls calls; the others go on calling (the next call has a peer
that never joins) until something fails, and record the first exception: its type, its message, and when, in
seconds after the kill. The parent waits --bound seconds after the kill; a survivor still running then is
reported as hung and killed.

Exit status: 0 when every survivor failed with a message within the bound; 1 otherwise (a hang, a survivor that
stopped without an error, the kill never reached); 2: bad arguments; 77: skipped, saying why (no torch, fewer
GPUs than --world), as ctest's SKIP_RETURN_CODE. Output: a line per rank and the verdict; --out: the same as
JSON (the machine, the command, per rank its outcome).
"""
import argparse
import datetime
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import tempfile
import time

N = K = 4096
M = 2048
SETUP_S = 600  # the most the ranks may take to build the op and make --calls calls


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_call(op_name, world, rank, self_test):
    """(call, sync): one call of the op on this rank's inputs, and the wait for it."""
    import torch
    import torch.distributed as dist
    if self_test:
        x = torch.ones(1024)
        return (lambda: dist.all_reduce(x)), (lambda: None)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
    import flashoverlap.torch as fo
    dev = torch.device("cuda", rank)
    g = torch.Generator(device=dev).manual_seed(1000 + rank)
    w = torch.rand(N, K, device=dev, generator=g).to(torch.bfloat16)
    if op_name in ("allreduce", "reducescatter"):
        m = -(-M // world) * world
        x = torch.rand(m, K, device=dev, generator=g).to(torch.bfloat16)
        cls = fo.GemmAllReduce if op_name == "allreduce" else fo.GemmReduceScatter
        op = cls(None, m, N, K, torch.bfloat16)
        return (lambda: op(x, w)), torch.cuda.synchronize
    import torch_alltoall as a2a  # (bench/: the routing draws never_slower.py uses)
    dest, gate = a2a.draw_routing("uniform", world, M, 1, 1)
    counts, send, recv, _, _ = a2a.rank_plan(dest, gate, rank)
    rows = int(counts.sum(0)[rank])
    op = fo.GemmAllToAll(None, max(int(counts.sum(0).max()), 1), M, 1, N, K, torch.bfloat16)
    x = torch.rand(rows, K, device=dev, generator=g).to(torch.bfloat16)
    d_rank, d_token, d_gate = (t.to(dev) for t in a2a.expert_rows(dest, gate, rank))
    return (lambda: op(x, w, d_rank, d_token, d_gate, send, recv, M)), torch.cuda.synchronize


def worker(rank, world, port, op_name, calls, bound, self_test, hang, outdir):
    """One rank: the op in a loop; the last rank kills itself after `calls` calls, the others record how their
    next calls end. Writes outdir/rank-<rank>.json; leaves by os._exit (a communicator with a dead peer may
    block in its destruction)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    result = {"rank": rank, "stage": "setup"}

    def save():
        with open(os.path.join(outdir, f"rank-{rank}.json.tmp"), "w") as fh:
            json.dump(result, fh)
        os.replace(os.path.join(outdir, f"rank-{rank}.json.tmp"), os.path.join(outdir, f"rank-{rank}.json"))

    try:
        import torch
        import torch.distributed as dist
        if self_test:
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=bound))
        else:
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", rank=rank, world_size=world)
        call, sync = build_call(op_name, world, rank, self_test)
        result["stage"] = "calls"
        for _ in range(calls):
            call()
            sync()
        if rank == world - 1:
            with open(os.path.join(outdir, "killed.tmp"), "w") as fh:
                fh.write(repr(time.time()))
            os.replace(os.path.join(outdir, "killed.tmp"), os.path.join(outdir, "killed"))
            os.kill(os.getpid(), signal.SIGKILL)
        result["stage"] = "after the kill"
        save()
        while hang:  # (--self-test-hang: a call that never returns, which the parent must call a hang)
            time.sleep(1)
        start = time.time()
        while time.time() - start < 3 * bound:  # (the parent calls it a hang long before)
            call()
            sync()
        result.update(stage="no error", error=None)
    except BaseException as e:  # (the outcome under test)
        result.update(error=type(e).__name__, message=str(e)[:4000], at=time.time())
    save()
    sys.stdout.flush()
    os._exit(0)


def run(args):
    outdir = tempfile.mkdtemp(prefix="rank_fault_")
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, args.world, port, args.op, args.calls, args.bound, args.self_test,
                                              args.self_test_hang, outdir), daemon=False) for r in range(args.world)]
    for p in procs:
        p.start()
    killed_file = os.path.join(outdir, "killed")
    deadline = time.time() + SETUP_S
    while not os.path.exists(killed_file) and time.time() < deadline and any(p.is_alive() for p in procs[:-1]):
        if not procs[-1].is_alive() and not os.path.exists(killed_file):
            break  # (the last rank ended without reaching the kill: a setup failure)
        time.sleep(0.2)
    killed_at = float(open(killed_file).read()) if os.path.exists(killed_file) else None
    if killed_at is not None:
        end = killed_at + args.bound
        while time.time() < end and any(p.is_alive() for p in procs[:-1]):
            time.sleep(0.2)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        os.kill(procs[r].pid, signal.SIGKILL)
    for p in procs:
        p.join(10)
    ranks = []
    for r in range(args.world - 1):
        path = os.path.join(outdir, f"rank-{r}.json")
        got = json.load(open(path)) if os.path.exists(path) else {"rank": r, "stage": "no record"}
        if r in hung:
            got["hung"] = True
        elif killed_at is not None and got.get("at"):
            got["seconds_after_kill"] = round(got["at"] - killed_at, 3)
        ranks.append(got)
    ok = killed_at is not None and all(
        not g.get("hung") and g.get("error") and g.get("message") and g.get("stage") == "after the kill"
        for g in ranks)
    lines = [f"rank_fault: {args.op if not args.self_test else 'self-test (gloo all_reduce)'}, world {args.world}, "
             f"rank {args.world - 1} killed after {args.calls} calls" +
             ("" if killed_at is not None else " (never reached: see the ranks' errors)")]
    for g in ranks:
        if g.get("hung"):
            what = f"HUNG: still running {args.bound} s after the kill (stage: {g.get('stage')})"
        elif g.get("error"):
            when = f" {g['seconds_after_kill']} s after the kill" if "seconds_after_kill" in g else ""
            what = f"{g['error']}{when} ({g.get('stage')}): {g.get('message', '')[:300]}"
        else:
            what = f"no error ({g.get('stage')})"
        lines.append(f"  rank {g['rank']}: {what}")
    lines.append("verdict: " + ("every survivor failed with a message within the bound" if ok else "FAILED"))
    print("\n".join(lines), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"command": sys.argv, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                       "host": socket.gethostname(), "op": args.op, "world": args.world, "calls": args.calls,
                       "bound_s": args.bound, "self_test": args.self_test, "ok": ok, "ranks": ranks}, fh, indent=1)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=0, help="ranks (default: the GPUs; --self-test: 3)")
    ap.add_argument("--op", default="allreduce", choices=("allreduce", "reducescatter", "alltoall"))
    ap.add_argument("--calls", type=int, default=20, help="calls before the last rank kills itself")
    ap.add_argument("--bound", type=float, default=150.0,
                    help="seconds after the kill within which every survivor must have failed")
    ap.add_argument("--out", default="", help="the outcome as JSON")
    ap.add_argument("--self-test", action="store_true", help="the harness on the CPU (gloo), no GPU, no library")
    ap.add_argument("--self-test-hang", action="store_true", help=argparse.SUPPRESS)  # (survivors that hang)
    args = ap.parse_args()
    if args.self_test_hang:
        args.self_test, args.bound = True, min(args.bound, 3.0)
    if args.calls < 1 or args.bound <= 0:
        ap.error("--calls must be >= 1 and --bound > 0")
    try:
        import torch
    except ImportError as e:
        print(f"rank_fault: torch is not importable ({e}): skipped")
        return 77
    if args.self_test:
        args.world = args.world or 3
        args.bound = min(args.bound, 60.0)
        if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
            print("rank_fault: this torch has no gloo: skipped")
            return 77
    else:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        args.world = args.world or gpus
        if args.world < 2 or gpus < args.world:
            print(f"rank_fault: needs {max(args.world, 2)} GPUs, one per rank; this machine has {gpus}: skipped")
            return 77
    if args.world < 2:
        ap.error("--world must be >= 2")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
